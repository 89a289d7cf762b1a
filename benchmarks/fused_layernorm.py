"""FusedLayerNorm against the plain ``nnx.LayerNorm``: forward + backward time of one LayerNorm.

Both sides are jitted ``jax.vjp`` of the layer w.r.t. its input and parameters (the work a training step does for
it), on float32 activations of GPT-like shapes (batch, tokens, features). Rounds are interleaved (plain, fused,
plain, fused, ...) so a change of load on the shared machine hits both sides alike; each round times ``--reps``
calls; the figures are the median and the best round. Also recorded: the number of XLA fusions each compiled
function has (passes over memory, roughly) and the load average before and after.

    .venv/bin/python benchmarks/fused_layernorm.py            # -> benchmarks/results/fused_layernorm.json
    .venv/bin/python benchmarks/fused_layernorm.py --smoke    # tiny, -> fused_layernorm.smoke.json
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import machine_facts, results_path, write_json  # noqa: E402

SHAPES = [(16, 128, 128), (32, 256, 256), (8, 1024, 768)]
SMOKE_SHAPES = [(2, 8, 16)]


def _side(layer, x, ct):
    """A jitted forward + backward of ``layer`` at ``x`` with cotangent ``ct``, and its fusion count."""
    import jax
    from flax import nnx

    graphdef, state = nnx.split(layer)

    def fwd_bwd(state, x, ct):
        _, vjp = jax.vjp(lambda s, x: nnx.merge(graphdef, s)(x), state, x)
        return vjp(ct)

    fn = jax.jit(fwd_bwd)
    hlo = fn.lower(state, x, ct).compile().as_text()
    fusions = len(re.findall(r"\bfusion\(", hlo[hlo.index("ENTRY"):]))
    return (lambda: fn(state, x, ct)), fusions


def measure(shape, rounds: int, reps: int) -> dict:
    import jax
    from flax import nnx

    from jaxcomposer.algorithms.fused_layernorm import FusedLayerNormModule

    d = shape[-1]
    kx, kc = jax.random.split(jax.random.PRNGKey(0))
    x, ct = jax.random.normal(kx, shape), jax.random.normal(kc, shape)
    plain = nnx.LayerNorm(d, epsilon=1e-5, rngs=nnx.Rngs(0))  # as GPT's (flax defaults)
    sides = {"plain": _side(plain, x, ct), "fused": _side(FusedLayerNormModule.from_layer_norm(plain), x, ct)}
    times = {name: [] for name in sides}
    for name, (run, _) in sides.items():  # compile + warm up
        jax.block_until_ready(run())
    for _ in range(rounds):
        for name, (run, _) in sides.items():
            t0 = time.perf_counter()
            for _ in range(reps):
                out = run()
            jax.block_until_ready(out)
            times[name].append((time.perf_counter() - t0) / reps * 1e3)
    med = {name: statistics.median(v) for name, v in times.items()}
    best = {name: min(v) for name, v in times.items()}  # the least disturbed round: less sensitive to the load
    return {"shape": list(shape), "reps_per_round": reps,
            "ms_per_fwd_bwd_median": {k: round(v, 4) for k, v in med.items()},
            "ms_per_fwd_bwd_min": {k: round(v, 4) for k, v in best.items()},
            "ms_per_round": {k: [round(t, 4) for t in v] for k, v in times.items()},
            "fusions": {name: f for name, (_, f) in sides.items()},
            "speedup_plain_over_fused": round(med["plain"] / med["fused"], 3),
            "speedup_plain_over_fused_min": round(best["plain"] / best["fused"], 3)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--reps", type=int, default=0, help="calls per round (0: about 0.2 s worth per shape)")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    load_before = [round(v, 2) for v in os.getloadavg()]
    shapes = SMOKE_SHAPES if args.smoke else SHAPES
    rows = []
    for shape in shapes:
        n = shape[0] * shape[1] * shape[2]
        reps = args.reps or max(2, min(200, int(4e7 / n)))
        row = measure(shape, 2 if args.smoke else args.rounds, 2 if args.smoke else reps)
        rows.append(row)
        print(f"{tuple(shape)}: plain {row['ms_per_fwd_bwd_median']['plain']:.3f} ms, fused "
              f"{row['ms_per_fwd_bwd_median']['fused']:.3f} ms (x{row['speedup_plain_over_fused']} median, "
              f"x{row['speedup_plain_over_fused_min']} best round), fusions "
              f"{row['fusions']}")
    result = {"benchmark": "fused_layernorm", "dtype": "float32",
              "what": "jitted forward + backward (jax.vjp w.r.t. input and params) of one LayerNorm: flax "
                      "nnx.LayerNorm (defaults, as GPT's) vs FusedLayerNormModule; interleaved rounds, median",
              "loadavg_before": load_before, "results": rows,
              "machine": machine_facts(note="other jobs may share the machine: see loadavg_before")}
    path = results_path("fused_layernorm", args.smoke, args.out)
    write_json(path, result)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
