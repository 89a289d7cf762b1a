"""One model trained three ways on CPU: torch eager vs. torch_bridge in the Trainer vs. native NNX in the Trainer.

The model is the ResNet-8 workload (``configs/resnet8_fashion_mnist.yaml``: depth 8, width 16, stem_stride 2, one input
channel, 10 classes), batch size and lr from the same file, SGD with momentum 0.9 and Nesterov, no weight decay,
no schedule, no algorithms, no eval:

- ``torch``: ``torch_bridge.mirrors.TorchResNetCIFAR`` trained eagerly (NCHW, ``torch.optim.SGD``,
  ``F.cross_entropy``, ``torch.set_num_threads(--torch-threads)``, 2 by default), in a child process driven round
  by round (``ChildTorchSide``: torch's OpenMP team beside the oneDNN kernels' own would slow every side here).
- ``bridged``: ``torch_bridge.from_torch`` of that same torch module (the child builds it from the same seed, so
  both start from identical weights) in ``jaxcomposer.Trainer`` (``DecoupledSGDW``, ``weight_decay=0``,
  ``progress_bar=False``, ``devices=jax.devices()[:1]``), NCHW batches.
- ``native``: ``jaxcomposer.models.ResNetCIFAR`` with the same kwargs in the same Trainer setup, NHWC batches.

All three train on the same pool of host numpy batches (Fashion-MNIST normalized on the host, or random data of
its shape when the dataset is missing), the same number of steps. Per side: conversion time (bridged), the first
step alone (compile for the JAX sides), then the rest of ``--warmup`` untimed, then ``--rounds`` interleaved rounds
(torch, bridged, native, torch, ...) of ``--steps`` steps. JAX rounds end with ``block_until_ready``; nobody reads
the loss per step. Reported: per-round and median steps/s and images/s, per-round ratios bridged/native (goal
>= 0.90) and bridged/torch, and each side's final loss. Torch and bridged start from the same weights and see the
same batches, yet their losses drift apart within a few steps at lr 0.2: checked against a float64 torch reference,
the bridged fp32 gradients of this model are exact to ~1e-6 (relative) while torch's own fp32 CPU gradients are off
by up to ~1e-2, so the drift is torch-side rounding, not a bridge error.

Note: torch's OpenMP threads degrade badly on a machine whose cores are busy (benchmarks/README.md); the JSON
records the load average; measure on a quiet machine.

Run:  .venv/bin/python benchmarks/bridge_speed.py            (full)
      .venv/bin/python benchmarks/bridge_speed.py --smoke    (a few steps, < 60 s)
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import jax
import numpy as np
import torch
import torch.nn.functional as F
from flax import nnx

import torch_bridge
from common import (ROOT, CyclingLoader, TrainerSide, add_round_args, fashion_mnist_batches,  # benchmarks/common.py
                    load_benchmark_config, machine_facts, results_path, torch_model_kwargs, write_json)
from torch_bridge.mirrors import TorchResNetCIFAR
from jaxcomposer import ComposerClassifier
from jaxcomposer.models import ResNetCIFAR
from jaxcomposer.optim import DecoupledSGDW

NAME = "bridge_speed"


def resnet8_setup(path: Path) -> dict:
    """The ResNet-8 workload config with this benchmark's model defaults (10 classes, 1 channel) and SGD fields."""
    q = load_benchmark_config(path)
    opt = q.pop("optimizer")
    return {**q, "model": {"num_classes": 10, "in_channels": 1, **q["model"]}, "lr": float(opt["lr"]),
            "momentum": float(opt.get("momentum", 0.9)), "nesterov": bool(opt.get("nesterov", False))}


def to_nchw(pool: list[dict]) -> list[dict]:
    return [{"input": np.ascontiguousarray(b["input"].transpose(0, 3, 1, 2)), "target": b["target"]} for b in pool]


# ---------------------------------------------------------------------------------------------------------------
class TorchSide:
    def __init__(self, module: torch.nn.Module, q: dict, pool_nchw: list[dict]):
        self.model = module.train()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=q["lr"], momentum=q["momentum"],
                           nesterov=q["nesterov"], weight_decay=0.0)
        self.pool = [(torch.from_numpy(b["input"]), torch.from_numpy(b["target"]).long()) for b in pool_nchw]
        self.i, self.last_loss = 0, None

    def run(self, n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            x, y = self.pool[self.i % len(self.pool)]
            self.i += 1
            self.opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(self.model(x), y)  # = soft cross-entropy of the one-hot targets
            loss.backward()
            self.opt.step()
        self.last_loss = float(loss.detach())
        return time.perf_counter() - t0


class ChildTorchSide:
    """``TorchSide`` in a child process (this script with ``--torch-worker``), driven round by round over a pipe.

    In this process the bridged and native sides run the oneDNN kernels, whose thread keeps an OpenMP team; a torch
    team here beside it makes libgomp sleep at every barrier on a machine with few cores, slowing all three sides
    (``torch_bridge/kernels/onednn_conv.cc``). The child builds the same module from the same seed, so it starts
    from the weights the bridge converted."""

    def __init__(self, args):
        import subprocess
        cmd = [sys.executable, __file__, "--torch-worker", "--config", str(args.config), "--steps", str(args.steps),
               "--torch-threads", str(args.torch_threads)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        self.last_loss = None

    def _ask(self, line: str) -> float:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        reply = self.proc.stdout.readline()
        if not reply:
            raise SystemExit(f"the torch child exited (code {self.proc.wait()})")
        return float(reply)

    def run(self, n: int) -> float:
        elapsed = self._ask(str(n))
        self.last_loss = self._ask("loss")
        return elapsed

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def torch_worker(args) -> int:
    """The child's side of ``ChildTorchSide``: a number runs that many steps (replies the seconds), ``loss`` replies
    the last loss."""
    torch.set_num_threads(args.torch_threads)
    q = resnet8_setup(Path(args.config))
    pool, _ = fashion_mnist_batches(q["batch_size"], count=min(max(args.steps, 4), 64), seed=0)
    torch.manual_seed(q["seed"])
    side = TorchSide(TorchResNetCIFAR(**torch_model_kwargs(q["model"])), q, to_nchw(pool))
    for line in sys.stdin:
        reply = side.last_loss if line.strip() == "loss" else side.run(int(line))
        print(repr(float(reply)), flush=True)
    return 0


def trainer_side(model, q: dict, pool: list[dict], steps: int, total: int) -> TrainerSide:
    return TrainerSide(model=ComposerClassifier(model, num_classes=10),
                       train_dataloader=CyclingLoader(pool, steps), eval_dataloader=None,
                       max_duration=f"{total}ba",
                       optimizers=DecoupledSGDW(lr=q["lr"], momentum=q["momentum"], nesterov=q["nesterov"],
                                                weight_decay=0.0),
                       schedulers=None, algorithms=None, progress_bar=False, log_to_console=False,
                       seed=q["seed"], devices=jax.devices()[:1])


# ---------------------------------------------------------------------------------------------------------------
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_round_args(ap, warmup_help="untimed steps first (the first one alone: compile)")
    ap.add_argument("--torch-threads", type=int, default=2)
    ap.add_argument("--static-batch", action="store_true",
                    help="from_torch(dynamic_batch=False) instead of the Trainer's default dynamic batch dim")
    ap.add_argument("--without-torch", action="store_true",
                    help="leave the torch side out: its OpenMP team on the main thread, beside the oneDNN kernels' "
                         "own, slows both JAX sides on a machine with few cores (torch_bridge/kernels/onednn_conv.cc)")
    ap.add_argument("--smoke", action="store_true", help="a few steps per round, for checking the script")
    ap.add_argument("--out", default=None, help=f"default: benchmarks/results/{NAME}[.smoke].json")
    ap.add_argument("--torch-worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.torch_worker:
        return torch_worker(args)
    args.out = results_path(NAME, args.smoke, args.out)
    if args.smoke:
        args.steps, args.rounds, args.warmup = 3, 3, 2
    if args.warmup < 1 or args.steps < 1 or args.rounds < 1:
        ap.error("--warmup, --steps and --rounds must be >= 1")
    torch.set_num_threads(args.torch_threads)

    q = resnet8_setup(Path(args.config))
    bs = q["batch_size"]
    pool, source = fashion_mnist_batches(bs, count=min(max(args.steps, 4), 64), seed=0)
    pool_nchw = to_nchw(pool)
    total = args.warmup + args.rounds * args.steps

    torch.manual_seed(q["seed"])
    module = TorchResNetCIFAR(**torch_model_kwargs(q["model"]))
    t0 = time.perf_counter()
    bm = torch_bridge.from_torch(module, (torch.from_numpy(pool_nchw[0]["input"]),),
                         dynamic_batch=not args.static_batch)
    convert_s = time.perf_counter() - t0

    sides = {"torch": ChildTorchSide(args),
             "bridged": trainer_side(bm, q, pool_nchw, args.steps, total),
             "native": trainer_side(ResNetCIFAR(**q["model"], rngs=nnx.Rngs(q["seed"])), q, pool, args.steps, total)}
    if args.without_torch:
        sides.pop("torch").close()
    first_step, warm = {}, {}
    for name, side in sides.items():  # first step alone (compile for JAX), then the rest of the warm-up
        first_step[name] = round(side.run(1), 3)
        warm[name] = round(side.run(args.warmup - 1), 3) if args.warmup > 1 else 0.0

    times: dict = {k: [] for k in sides}
    for _ in range(args.rounds):  # interleaved: torch, bridged, native, torch, ...
        for name, side in sides.items():
            times[name].append(side.run(args.steps))

    if "torch" in sides:
        sides["torch"].close()
    sps = {k: [args.steps / t for t in v] for k, v in times.items()}
    r_native = [b / n for b, n in zip(sps["bridged"], sps["native"])]
    r_torch = [b / t for b, t in zip(sps["bridged"], sps.get("torch", [float("nan")] * args.rounds))]
    med = {k: statistics.median(v) for k, v in sps.items()}
    results = {"steps_per_s": {k: [round(x, 3) for x in v] for k, v in sps.items()},
               "images_per_s": {k: [round(bs * x, 1) for x in v] for k, v in sps.items()},
               "median_steps_per_s": {k: round(v, 3) for k, v in med.items()},
               "median_images_per_s": {k: round(bs * v, 1) for k, v in med.items()},
               "ratio_bridged_over_native": [round(x, 4) for x in r_native],
               "ratio_bridged_over_torch": [round(x, 4) for x in r_torch],
               "median_ratio_bridged_over_native": round(statistics.median(r_native), 4),
               "median_ratio_bridged_over_torch": round(statistics.median(r_torch), 4),
               "bridged_within_10pct_of_native": statistics.median(r_native) >= 0.90,
               "final_loss": {k: round(s.last_loss, 5) for k, s in sides.items()}}
    if args.without_torch:
        results["ratio_bridged_over_torch"] = results["median_ratio_bridged_over_torch"] = None

    out = {"benchmark": NAME, "smoke": args.smoke,
           "goal": "bridged within 10% of native (median ratio bridged/native >= 0.90)",
           "machine": machine_facts(torch_threads=torch.get_num_threads()),
           "setup": {"config": os.path.relpath(args.config, ROOT), "model": {"name": "resnet_cifar", **q["model"]},
                     "batch_size": bs, "optimizer": {"lr": q["lr"], "momentum": q["momentum"],
                                             "nesterov": q["nesterov"], "weight_decay": 0.0,
                                             "torch": "torch.optim.SGD", "jax": "DecoupledSGDW"},
                     "loss": "cross-entropy on integer targets, mean over the batch (torch: F.cross_entropy; "
                             "Trainer: soft cross-entropy)",
                     "schedulers": None, "algorithms": None, "data": source, "host_batches_in_pool": len(pool),
                     "layouts": {"torch": "NCHW (contiguous)", "bridged": "NCHW", "native": "NHWC"},
                     "bridge": {"dynamic_batch": not args.static_batch, "params": len(bm.params),
                        "buffers": len(bm.buffers)},
                     "torch_threads": args.torch_threads, "torch_side": not args.without_torch,
                     "devices": "JAX: single CPU device, Trainer(devices=jax.devices()[:1])",
                     "steps_per_round": args.steps, "rounds": args.rounds, "warmup_steps": args.warmup,
                     "sync": "no per-step loss read; JAX rounds end with block_until_ready",
                     "final_loss_note": "torch vs bridged drift is torch fp32 CPU gradient rounding (bridged grads "
                                "match a float64 torch reference to ~1e-6, torch fp32 to ~1e-2)"},
           "convert_s": round(convert_s, 3), "first_step_s": first_step, "rest_of_warmup_s": warm,
           "results": results}
    write_json(args.out, out)

    print(f"\n{NAME}: batch {bs}, {args.rounds} rounds x {args.steps} steps, data: {source.split(' (')[0]}, "
          f"torch threads {args.torch_threads}{'  [SMOKE]' if args.smoke else ''}")
    print(f"from_torch conversion: {convert_s:.2f} s; first step (compile): "
          + ", ".join(f"{k} {v:.2f} s" for k, v in first_step.items()))
    print(f"final loss: " + ", ".join(f"{k} {v:.4f}" for k, v in results["final_loss"].items()))
    print(f"{'round':>5} {'torch st/s':>11} {'bridged st/s':>13} {'native st/s':>12} {'br/native':>10} "
          f"{'br/torch':>9}")
    sps.setdefault("torch", [float("nan")] * args.rounds)
    med.setdefault("torch", float("nan"))
    for i in range(args.rounds):
        print(f"{i:>5} {sps['torch'][i]:>11.2f} {sps['bridged'][i]:>13.2f} {sps['native'][i]:>12.2f} "
              f"{r_native[i]:>10.3f} {r_torch[i]:>9.3f}")
    print(f"{'med':>5} {med['torch']:>11.2f} {med['bridged']:>13.2f} {med['native']:>12.2f} "
          f"{results['median_ratio_bridged_over_native']:>10.3f} {statistics.median(r_torch):>9.3f}"
          f"  {'OK (within 10% of native)' if results['bridged_within_10pct_of_native'] else 'SLOWER than 10%'}")
    print(f"{'img/s':>5} {bs * med['torch']:>11.0f} {bs * med['bridged']:>13.0f} {bs * med['native']:>12.0f}")
    print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
