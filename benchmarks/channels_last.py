"""A bridged torch ResNet on XLA's convolutions: torch's NCHW layout vs channels-last activations (the default).

The model is the ResNet-8 workload as a torch module (``torch_bridge.mirrors.TorchResNetCIFAR``: depth 8, width 16,
stem_stride 2, one input channel, 10 classes), batch 128 of 28x28x1 (Fashion-MNIST, or random data of its shape
when the dataset is missing), trained in ``jaxcomposer.Trainer`` (DecoupledSGDW with the ResNet-8 workload's lr and
momentum, no weight decay, schedule or eval) from the same weights on the same batches, two ways:

- ``nchw``: ``torch_bridge.from_torch(..., conv_layout='NCHW')``: ``lax.conv_general_dilated`` on NCHW/OIHW.
- ``nhwc``: the same module after ``apply_channels_last`` (Composer's ``model.to(memory_format=channels_last)``),
  bridged with the default ``conv_layout='NHWC'``: activations stay NHWC between convolutions
  (``torch_bridge.channels_last``). Results: benchmarks/README.md.

The bridge's oneDNN convolutions (its default for float32 2-D convolutions on CPU, channels-last inside already)
are switched off for both sides (``torch_bridge.kernels.available`` patched to False), so both run XLA's own
kernels: the path the switch changes, as on GPU/TPU. Per side: the first step alone (compile), the rest of
``--warmup`` untimed, then ``--rounds`` interleaved rounds (nchw, nhwc, nchw, ...) of ``--steps`` steps, each round
ending with ``block_until_ready``. Reported: per-round and median steps/s, per-round ratio nhwc/nchw, final
losses, and the load average before and after (other jobs on the machine skew single rounds; the median of the
interleaved ratios and the best round of each side are the figures to read), and what XLA compiled: the
convolutions of one forward+backward by the ``dim_labels`` XLA chose, and the transposes and copies around them.

Run:  .venv/bin/python benchmarks/channels_last.py            (full)
      .venv/bin/python benchmarks/channels_last.py --smoke    (a few steps, < 2 min)
"""
from __future__ import annotations

import argparse
import collections
import copy
import os
import re
import statistics
import sys
import time
from pathlib import Path

import jax
import numpy as np
import torch

import torch_bridge
import torch_bridge.kernels
from common import (CyclingLoader, TrainerSide, add_round_args, fashion_mnist_batches,  # benchmarks/common.py
                    load_benchmark_config, machine_facts, results_path, torch_model_kwargs, write_json)
from torch_bridge.mirrors import TorchResNetCIFAR
from jaxcomposer import ComposerClassifier
from jaxcomposer.algorithms import apply_channels_last
from jaxcomposer.optim import DecoupledSGDW

NAME = "channels_last"


def compiled_conv_facts(bridged, x: np.ndarray) -> dict:
    """What XLA made of one train-mode forward+backward: its convolutions by ``dim_labels`` (the layout XLA
    convolves in after its own layout assignment) and its transposes and copies."""
    grad = jax.jit(jax.grad(lambda p, s: bridged.apply(p, s, None, x, train=True)[0].sum()))
    lines = grad.lower(bridged.params, bridged.buffers).compile().as_text().splitlines()
    labels = re.findall(r"dim_labels=[^\s,}]+", "\n".join(line for line in lines if " convolution(" in line))
    return {"convolutions_by_dim_labels": dict(collections.Counter(labels)),
            "transposes": sum(" transpose(" in line for line in lines),
            "copies": sum(" copy(" in line for line in lines)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_round_args(ap, warmup_help="untimed steps first (the first one alone: compile)")
    ap.add_argument("--smoke", action="store_true", help="a few steps per round, for checking the script")
    ap.add_argument("--out", default=None, help=f"default: benchmarks/results/{NAME}[.smoke].json")
    ap.set_defaults(steps=10, rounds=16, warmup=3)
    args = ap.parse_args(argv)
    args.out = results_path(NAME, args.smoke, args.out)
    if args.smoke:
        args.steps, args.rounds, args.warmup = 2, 2, 2
    if args.warmup < 1 or args.steps < 1 or args.rounds < 1:
        ap.error("--warmup, --steps and --rounds must be >= 1")
    load_before = [round(x, 2) for x in os.getloadavg()]
    onednn_was_available = torch_bridge.kernels.available()
    torch_bridge.kernels.available = lambda: False  # XLA's convolutions on both sides: the path the switch changes

    q = load_benchmark_config(Path(args.config))
    bs, opt = q["batch_size"], q["optimizer"]
    pool, source = fashion_mnist_batches(bs, count=min(max(args.steps, 4), 32), seed=0)
    pool = [{"input": np.ascontiguousarray(b["input"].transpose(0, 3, 1, 2)), "target": b["target"]} for b in pool]
    total = args.warmup + args.rounds * args.steps

    torch.manual_seed(q["seed"])
    module = TorchResNetCIFAR(**torch_model_kwargs(q["model"]), num_classes=10, in_channels=1)
    example = (torch.from_numpy(pool[0]["input"]),)
    bridged = {"nchw": torch_bridge.from_torch(copy.deepcopy(module), example, dynamic_batch=True,
                                               conv_layout="NCHW"),
               "nhwc": torch_bridge.from_torch(apply_channels_last(copy.deepcopy(module)), example,
                                               dynamic_batch=True)}
    assert [b.conv_layout for b in bridged.values()] == ["NCHW", "NHWC"]

    sides = {name: TrainerSide(model=ComposerClassifier(b, num_classes=10),
                               train_dataloader=CyclingLoader(pool, args.steps), eval_dataloader=None,
                               max_duration=f"{total}ba",
                               optimizers=DecoupledSGDW(lr=float(opt["lr"]), momentum=float(opt.get("momentum", 0.9)),
                                                        nesterov=bool(opt.get("nesterov", False)), weight_decay=0.0),
                               schedulers=None, algorithms=None, progress_bar=False, log_to_console=False,
                               seed=q["seed"], devices=jax.devices()[:1])
             for name, b in bridged.items()}
    hlo = {name: compiled_conv_facts(b, pool[0]["input"]) for name, b in bridged.items()}
    first_step, times = {}, {k: [] for k in sides}
    for name, side in sides.items():
        first_step[name] = round(side.run(1), 3)
        if args.warmup > 1:
            side.run(args.warmup - 1)
    for _ in range(args.rounds):  # interleaved, so load changes hit both sides alike
        for name, side in sides.items():
            times[name].append(side.run(args.steps))

    sps = {k: [args.steps / t for t in v] for k, v in times.items()}
    ratio = [b / a for a, b in zip(sps["nchw"], sps["nhwc"])]
    med = {k: statistics.median(v) for k, v in sps.items()}
    best = {k: max(v) for k, v in sps.items()}  # the round least disturbed by other jobs
    results = {"steps_per_s": {k: [round(x, 3) for x in v] for k, v in sps.items()},
               "median_steps_per_s": {k: round(v, 3) for k, v in med.items()},
               "median_ms_per_step": {k: round(1000 / v, 1) for k, v in med.items()},
               "ratio_nhwc_over_nchw": [round(x, 4) for x in ratio],
               "median_ratio_nhwc_over_nchw": round(statistics.median(ratio), 4),
               "best_ms_per_step": {k: round(1000 / v, 1) for k, v in best.items()},
               "ratio_best_nhwc_over_best_nchw": round(best["nhwc"] / best["nchw"], 4),
               "final_loss": {k: round(s.last_loss, 5) for k, s in sides.items()}}
    out = {"benchmark": NAME, "smoke": args.smoke,
           "machine": machine_facts(loadavg_before_1_5_15=load_before,
                                    onednn_available_but_disabled=onednn_was_available,
                                    note="shared machine: other engineers' jobs run alongside; see loadavg"),
           "setup": {"model": {"name": "TorchResNetCIFAR (bridged)", **torch_model_kwargs(q["model"]),
                               "num_classes": 10, "in_channels": 1},
                     "batch_size": bs, "input": "28x28x1, NCHW batches", "data": source,
                     "optimizer": {"name": "DecoupledSGDW", "lr": float(opt["lr"]), "weight_decay": 0.0},
                     "convolutions": "XLA's (oneDNN kernels disabled on both sides)",
                     "sides": {"nchw": "from_torch(conv_layout='NCHW')",
                               "nhwc": "after apply_channels_last, the default conv_layout NHWC"},
                     "steps_per_round": args.steps, "rounds": args.rounds, "warmup_steps": args.warmup},
           "first_step_s": first_step, "compiled_forward_backward": hlo, "results": results}
    write_json(args.out, out)

    print(f"\n{NAME}: bridged TorchResNetCIFAR, batch {bs}, {args.rounds} rounds x {args.steps} steps, XLA convs, "
          f"load {load_before} -> {out['machine']['loadavg_1_5_15']}{'  [SMOKE]' if args.smoke else ''}")
    print(f"first step (compile): " + ", ".join(f"{k} {v:.2f} s" for k, v in first_step.items()))
    print(f"{'round':>5} {'nchw st/s':>10} {'nhwc st/s':>10} {'nhwc/nchw':>10}")
    for i in range(args.rounds):
        print(f"{i:>5} {sps['nchw'][i]:>10.2f} {sps['nhwc'][i]:>10.2f} {ratio[i]:>10.3f}")
    print(f"{'med':>5} {med['nchw']:>10.2f} {med['nhwc']:>10.2f} {results['median_ratio_nhwc_over_nchw']:>10.3f}")
    print(f"{'best':>5} {best['nchw']:>10.2f} {best['nhwc']:>10.2f} {best['nhwc'] / best['nchw']:>10.3f}")
    print(f"ms/step: median nchw {1000 / med['nchw']:.1f}, nhwc {1000 / med['nhwc']:.1f}; best nchw "
          f"{1000 / best['nchw']:.1f}, nhwc {1000 / best['nhwc']:.1f}; final loss "
          + ", ".join(f"{k} {v:.4f}" for k, v in results["final_loss"].items()))
    for name, facts in hlo.items():
        print(f"compiled {name}: convolutions {facts['convolutions_by_dim_labels']}, transposes {facts['transposes']}, "
              f"copies {facts['copies']}")
    print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
