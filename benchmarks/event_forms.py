"""A method written as a Composer ``Algorithm`` (traced into the step by the event engine) against the same method
as a built-in slot, in the same process: train images/s of each pair, interleaved rounds.

Pairs (``jaxcomposer/algorithms/event_forms.py``, which train to the same bits: tests/algorithms/test_event_forms.py):
label smoothing (loss events), gradient clipping by norm (AFTER_TRAIN_BATCH), progressive resizing at scale 0.5
(AFTER_DATALOADER; the run's plan is twice the benchmark's length, so every timed batch is at the first size). The
model, batch size and optimizer come from ``--config`` (default the ResNet-8 Fashion-MNIST workload); one CPU device,
no evaluation, the loss read at every batch end (as a progress bar does). The engine's host work per batch (``match``,
the replay of ``apply``) is timed apart.

Run:  .venv/bin/python benchmarks/event_forms.py            (full)
      .venv/bin/python benchmarks/event_forms.py --smoke    (a few steps per round)
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import jax
from flax import nnx

from common import (ROOT, CyclingLoader, TrainerSide, add_round_args, fashion_mnist_batches,  # benchmarks/common.py
                    load_benchmark_config, machine_facts, results_path, threads_as_fit_sets, write_json)
from jaxcomposer import ComposerClassifier
from jaxcomposer.algorithms import GradientClipping, LabelSmoothing, ProgressiveResizing
from jaxcomposer.algorithms.event_forms import (GradientClippingAlgorithm, LabelSmoothingAlgorithm,
                                                ProgressiveResizingAlgorithm)
from jaxcomposer.core.events import Callback
from jaxcomposer.models import BUILDERS
from jaxcomposer.optim import DecoupledSGDW

NAME = "event_forms"
PR = dict(initial_scale=0.5, delay_fraction=0.5, finetune_fraction=0.2)
PAIRS = {  # name -> (slot version, Algorithm version)
    "label_smoothing": (lambda: LabelSmoothing(0.1), lambda: LabelSmoothingAlgorithm(0.1)),
    "gradient_clipping": (lambda: GradientClipping("norm", 1.0), lambda: GradientClippingAlgorithm("norm", 1.0)),
    # the same Algorithm replayed before every batch (trace_once off): what a Composer-style apply costs the host
    "gradient_clipping_replayed": (lambda: GradientClipping("norm", 1.0), lambda: replayed(GradientClippingAlgorithm,
                                                                                           "norm", 1.0)),
    "progressive_resizing": (lambda: ProgressiveResizing(**PR), lambda: ProgressiveResizingAlgorithm(**PR)),
}


def replayed(cls, *args):
    alg = cls(*args)
    alg.trace_once = False
    return alg


class ReadLoss(Callback):
    def batch_end(self, state, logger):
        self.last = float(state.batch_metrics["loss"])


def side(q: dict, pool: list, steps: int, total: int, method) -> TrainerSide:
    module = BUILDERS[q["model_name"]](**{"num_classes": 10, "in_channels": 1, **q["model"]},
                                       rngs=nnx.Rngs(q["seed"]))
    s = TrainerSide(model=ComposerClassifier(module, num_classes=10), train_dataloader=CyclingLoader(pool, steps),
                    max_duration=f"{2 * total}ba", optimizers=DecoupledSGDW(**q["optimizer"]),
                    algorithms=[method()], progress_bar=False, seed=q["seed"], devices=jax.devices()[:1],
                    callbacks=[ReadLoss()])
    s.host_s = 0.0
    engine = s.trainer.engine
    if engine is not None:  # the engine's host work per batch, timed apart
        prepare = engine.prepare_step

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return prepare(*args, **kwargs)
            finally:
                s.host_s += time.perf_counter() - t0

        engine.prepare_step = timed
    return s


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_round_args(ap, warmup_help="untimed steps first (includes compile)")
    ap.add_argument("--pairs", default=",".join(PAIRS), help=f"comma list of {sorted(PAIRS)}")
    ap.add_argument("--smoke", action="store_true", help="a few steps per round, for checking the script")
    ap.add_argument("--out", default=None, help=f"default: benchmarks/results/{NAME}[.smoke].json")
    args = ap.parse_args(argv)
    args.out = results_path(NAME, args.smoke, args.out)
    if args.smoke:
        args.steps, args.rounds, args.warmup = 4, 2, 2
    names = [p.strip() for p in args.pairs.split(",") if p.strip()]
    if not names or any(p not in PAIRS for p in names):
        ap.error(f"--pairs: a comma list of {sorted(PAIRS)}")
    q = load_benchmark_config(Path(args.config))
    threads_note = threads_as_fit_sets(q)
    bs = q["batch_size"]
    pool, source = fashion_mnist_batches(bs, count=min(max(args.steps, 4), 64), seed=0)
    total = args.warmup + args.rounds * args.steps

    sides = {}
    for name in names:
        slot, algorithm = PAIRS[name]
        sides[(name, "slot")] = side(q, pool, args.steps, total, slot)
        sides[(name, "algorithm")] = side(q, pool, args.steps, total, algorithm)
    warm = {f"{k[0]}/{k[1]}": round(s.run(args.warmup), 3) for k, s in sides.items()}
    for s in sides.values():
        s.host_s = 0.0
    times: dict = {k: [] for k in sides}
    order = list(sides)
    for r in range(args.rounds):  # interleaved, every other round reversed, so neither side always goes first
        for key in (order if r % 2 == 0 else order[::-1]):
            times[key].append(sides[key].run(args.steps))

    results = {}
    for name in names:
        slot_ips = [bs * args.steps / t for t in times[(name, "slot")]]
        alg_ips = [bs * args.steps / t for t in times[(name, "algorithm")]]
        ratios = [a / b for a, b in zip(alg_ips, slot_ips)]
        alg_side = sides[(name, "algorithm")]
        results[name] = {
            "slot_images_per_s": [round(v, 1) for v in slot_ips],
            "algorithm_images_per_s": [round(v, 1) for v in alg_ips],
            "ratio_algorithm_over_slot": [round(v, 4) for v in ratios],
            "median_ratio": round(statistics.median(ratios), 4),
            "engine_host_ms_per_batch": round(1e3 * alg_side.host_s / (args.rounds * args.steps), 3),
            "step_ms_per_batch_algorithm": round(1e3 * statistics.median(times[(name, "algorithm")]) / args.steps, 3),
            "compiled_steps": {"slot": sides[(name, "slot")].trainer.compiled_programs()[1],
                               "algorithm": alg_side.trainer.compiled_programs()[1]}}

    out = {"benchmark": NAME, "smoke": args.smoke, "machine": machine_facts(),
           "setup": {"config": os.path.relpath(args.config, ROOT), "xla_cpu_threads": threads_note,
                     "model": {"name": q["model_name"], **q["model"]}, "batch_size": bs, "data": source,
                     "steps_per_round": args.steps, "rounds": args.rounds, "warmup_steps": args.warmup,
                     "progressive_resizing": PR, "devices": "one CPU device"},
           "warmup_s": warm, "results": results}
    write_json(args.out, out)

    print(f"\n{NAME}: batch {bs}, {args.rounds} rounds x {args.steps} steps{'  [SMOKE]' if args.smoke else ''}")
    print(f"{'pair':<22} {'slot img/s':>11} {'alg img/s':>10} {'ratio':>7} {'host ms/batch':>14}")
    for name, r in results.items():
        print(f"{name:<22} {statistics.median(r['slot_images_per_s']):>11.1f} "
              f"{statistics.median(r['algorithm_images_per_s']):>10.1f} {r['median_ratio']:>7.3f} "
              f"{r['engine_host_ms_per_batch']:>14.3f}")
    print(f"results: {os.path.relpath(args.out, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
