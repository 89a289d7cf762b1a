"""How much of core ATen torch_bridge can lower: covered/total, the uncovered overloads grouped, registry size.

"Core ATen" is the set of overloads torch tags ``torch.Tag.core`` (``torch_bridge.ops.registry.
core_aten_overloads()``), the opset torch.export's decompositions aim at. An overload counts as covered when
``registry.supported(op)`` finds a lowering for it (the exact overload or its overload packet). Uncovered ones are
grouped as:

- ``backward``: autograd's own kernels (``*_backward``); a bridged model is differentiated by JAX, so these never
  appear in the graphs we lower (they only would in a joint forward+backward export).
- ``data_dependent``: output shape depends on input values (tags ``dynamic_output_shape`` /
  ``data_dependent_output``), hard under jit's static shapes; the ones that are lowered anyway are listed under
  ``covered_data_dependent`` in the JSON.
- ``other``: everything else, i.e. the real to-do list.

Cheap (no training, a few seconds): there is no ``--smoke`` difference except the output file name.

Run:  .venv/bin/python benchmarks/bridge_coverage.py
"""
from __future__ import annotations

import argparse
import sys
from collections import Counter

from common import machine_facts, results_path, write_json  # benchmarks/common.py

NAME = "bridge_coverage"


def group_of(op) -> str:
    import torch
    if "backward" in op._schema.name:
        return "backward"
    if {torch.Tag.dynamic_output_shape, torch.Tag.data_dependent_output} & set(op.tags):
        return "data_dependent"
    return "other"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="same work; writes bridge_coverage.smoke.json")
    ap.add_argument("--out", default=None, help=f"default: benchmarks/results/{NAME}[.smoke].json")
    args = ap.parse_args(argv)
    args.out = results_path(NAME, args.smoke, args.out)

    import torch

    import torch_bridge  # noqa: F401  (importing it registers every lowering)
    from torch_bridge.ops import registry

    core = sorted(registry.core_aten_overloads(), key=str)
    covered = [op for op in core if registry.supported(op)]
    uncovered = [op for op in core if not registry.supported(op)]
    groups: dict[str, list[str]] = {"backward": [], "data_dependent": [], "other": []}
    for op in uncovered:
        groups[group_of(op)].append(str(op))
    covered_dd = [str(op) for op in covered if group_of(op) == "data_dependent"]

    registered = registry.registered_ops()
    kinds = Counter("overload" if isinstance(op, torch._ops.OpOverload) else
                    "packet" if isinstance(op, torch._ops.OpOverloadPacket) else "other" for op in registered)
    core_set = set(core)
    core_packets = {op.overloadpacket for op in core}
    beyond_core = [str(op) for op in registered
                   if (op not in core_set if isinstance(op, torch._ops.OpOverload) else op not in core_packets)]

    ratio = len(covered) / len(core)
    fwd_total = len(core) - sum(1 for op in core if group_of(op) == "backward")
    fwd_covered = sum(1 for op in covered if group_of(op) != "backward")
    out = {"benchmark": NAME, "smoke": args.smoke, "machine": machine_facts(),
           "definition": "core ATen = overloads tagged torch.Tag.core; covered = torch_bridge.ops.registry."
                         "supported(op) (exact overload or its overload packet registered)",
           "core_total": len(core), "core_covered": len(covered), "core_uncovered": len(uncovered),
           "coverage": round(ratio, 4),
           "forward_only": {"total": fwd_total, "covered": fwd_covered, "coverage": round(fwd_covered / fwd_total, 4),
                            "note": "core ATen without *_backward overloads"},
           "uncovered": groups,
           "covered_data_dependent": covered_dd,
           "registered": {"entries": len(registered), "overloads": kinds["overload"], "packets": kinds["packet"],
                          "beyond_core": len(beyond_core)},
           "registered_beyond_core": sorted(beyond_core)}
    write_json(args.out, out)

    print(f"\n{NAME}: torch {torch.__version__}{'  [SMOKE]' if args.smoke else ''}")
    for name, ops in groups.items():
        print(f"uncovered, {name} ({len(ops)}):")
        for op in ops:
            print(f"    {op}")
    print(f"{'':<38} {'count':>6}")
    print(f"{'core ATen overloads':<38} {len(core):>6}")
    print(f"{'  covered':<38} {len(covered):>6}  ({100 * ratio:.1f}%)")
    print(f"{'  uncovered':<38} {len(uncovered):>6}")
    for name, ops in groups.items():
        print(f"{'    ' + name:<38} {len(ops):>6}")
    print(f"{'forward-only core (no *_backward)':<38} {fwd_covered:>3}/{fwd_total:<3} "
          f"({100 * fwd_covered / fwd_total:.1f}%)")
    print(f"{'registered entries (overload/packet)':<38} {len(registered):>6}  "
          f"({kinds['overload']} overloads, {kinds['packet']} packets; {len(beyond_core)} beyond core)")
    print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
