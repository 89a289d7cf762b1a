"""What each of Composer's callbacks and loggers costs per batch in the Trainer: µs per batch over a Trainer without
it, and the ratio of their batch times, measured side by side (interleaved rounds, the same model, data and step).

The model is a small MLP on 8x32 batches, so a step is short and a callback's host work shows at its largest; on a
real model the same µs are a smaller share. A torch optimizer (``torch.optim.SGD``, translated to torch's update
rule) is compared with ``jaxcomposer.optim.DecoupledSGDW`` on the same bridged torch MLP, and its write-back
(``state_dict`` in torch's layout) is timed apart.

Run:  .venv/bin/python benchmarks/callback_overhead.py            (full, a few minutes)
      .venv/bin/python benchmarks/callback_overhead.py --smoke    (seconds, for checking the script)
"""
from __future__ import annotations

import argparse
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path

import jax
import numpy as np
from flax import nnx

from common import CyclingLoader, TrainerSide, machine_facts, results_path, write_json  # benchmarks/common.py
from jaxcomposer import ComposerClassifier
from jaxcomposer.callbacks import (LRMonitor, MemoryMonitor, OptimizerMonitor, RuntimeEstimator, SpeedMonitor,
                                   SystemMetricsMonitor)
from jaxcomposer.loggers import ConsoleLogger, FileLogger, InMemoryLogger
from jaxcomposer.models import MLP
from jaxcomposer.optim import DecoupledSGDW
from jaxcomposer.profiler import JSONTraceHandler, Profiler, cyclic_schedule

NAME = "callback_overhead"


def candidates(tmp: Path) -> dict:
    """name -> (callbacks, loggers) factories: a fresh object per Trainer."""
    return {
        "SpeedMonitor": lambda: ([SpeedMonitor(window_size=50)], []),
        "LRMonitor": lambda: ([LRMonitor()], []),
        "MemoryMonitor": lambda: ([MemoryMonitor()], []),
        "RuntimeEstimator": lambda: ([RuntimeEstimator()], []),
        "SystemMetricsMonitor": lambda: ([SystemMetricsMonitor()], []),
        "OptimizerMonitor(batch_log_interval=10)": lambda: ([OptimizerMonitor(batch_log_interval=10)], []),
        "InMemoryLogger": lambda: ([], [InMemoryLogger()]),
        "ConsoleLogger('1ba')": lambda: ([], [ConsoleLogger(log_interval="1ba", stream=io.StringIO())]),
        "FileLogger": lambda: ([], [FileLogger(str(tmp / f"log-{time.perf_counter_ns()}.txt"),
                                               capture_stdout=False, capture_stderr=False)]),
        "Profiler (outside its window)": lambda: ([Profiler(
            schedule=cyclic_schedule(skip_first=10**9), trace_handlers=[JSONTraceHandler(
                folder=str(tmp / f"traces-{time.perf_counter_ns()}"))])], []),
    }


def pool(n: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"input": rng.normal(size=(8, 32)).astype(np.float32), "target": rng.integers(0, 4, 8).astype(np.int32)}
            for _ in range(n)]


def native_side(batches, steps, total, callbacks, loggers) -> TrainerSide:
    return TrainerSide(model=ComposerClassifier(MLP(32, (64,), 4, rngs=nnx.Rngs(0)), num_classes=4),
                       train_dataloader=CyclingLoader(batches, steps), max_duration=f"{total}ba",
                       optimizers=DecoupledSGDW(lr=0.1, momentum=0.9), progress_bar=False, seed=0,
                       devices=jax.devices()[:1], callbacks=callbacks, loggers=loggers)


def torch_side(batches, steps, total, torch_optimizer: bool) -> TrainerSide:
    import torch

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9) if torch_optimizer else \
        DecoupledSGDW(lr=0.1, momentum=0.9)
    return TrainerSide(model=net, train_dataloader=CyclingLoader(batches, steps), max_duration=f"{total}ba",
                       optimizers=opt, progress_bar=False, seed=0, devices=jax.devices()[:1])


def interleaved(a: TrainerSide, b: TrainerSide, steps: int, rounds: int) -> dict:
    """Median seconds per batch of each side over ``rounds`` alternating rounds (after one warm-up round each)."""
    a.run(steps), b.run(steps)
    ta, tb = [], []
    for i in range(rounds):
        for side, out in ((a, ta), (b, tb)) if i % 2 == 0 else ((b, tb), (a, ta)):
            out.append(side.run(steps) / steps)
    ma, mb = statistics.median(ta), statistics.median(tb)
    return {"baseline_us_per_batch": round(ma * 1e6, 1), "with_us_per_batch": round(mb * 1e6, 1),
            "overhead_us_per_batch": round((mb - ma) * 1e6, 1), "ratio": round(mb / ma, 3)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200, help="batches per timed round")
    ap.add_argument("--rounds", type=int, default=6, help="timed rounds per side (alternating)")
    ap.add_argument("--smoke", action="store_true", help="a few batches per round, for checking the script")
    ap.add_argument("--out", default=None, help=f"default: benchmarks/results/{NAME}[.smoke].json")
    args = ap.parse_args(argv)
    if args.smoke:
        args.steps, args.rounds = 10, 2
    out = results_path(NAME, args.smoke, args.out)
    total = args.steps * (args.rounds + 1) * 2
    batches = pool(64)
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, make in candidates(Path(tmp)).items():
            callbacks, loggers = make()
            rows[name] = interleaved(native_side(batches, args.steps, total, None, None),
                                     native_side(batches, args.steps, total, callbacks, loggers),
                                     args.steps, args.rounds)
            print(f"{name:42s} {rows[name]['overhead_us_per_batch']:8.1f} us/batch  x{rows[name]['ratio']}",
                  flush=True)
        optim_row = interleaved(torch_side(batches, args.steps, total, torch_optimizer=False),
                                torch_side(batches, args.steps, total, torch_optimizer=True), args.steps, args.rounds)
        side = torch_side(batches, args.steps, total, torch_optimizer=True)
        side.run(args.steps)
        t0 = time.perf_counter()
        for _ in range(20):
            side.trainer._synced_params = None  # force the write-back of weights and optimizer state
            side.trainer._sync_model()
        optim_row["write_back_ms"] = round((time.perf_counter() - t0) / 20 * 1e3, 3)
    result = {"name": NAME, "machine": machine_facts(), "steps_per_round": args.steps, "rounds": args.rounds,
              "model": "MLP 32-64-4, batch 8, DecoupledSGDW(lr=0.1, momentum=0.9), steps_per_execution=1",
              "callbacks": rows,
              "torch_sgd_vs_decoupled_sgdw": {**optim_row, "model": "bridged torch MLP 32-64-4, batch 8"}}
    write_json(out, result)
    print(f"\n{'torch.optim.SGD vs DecoupledSGDW (bridged MLP)':42s} {optim_row['overhead_us_per_batch']:8.1f} "
          f"us/batch  x{optim_row['ratio']}  (write-back {optim_row['write_back_ms']} ms)")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
