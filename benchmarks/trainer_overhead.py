"""Trainer step throughput vs. a hand-written jitted loop of the same model (goal: within 3%).

Model, batch size and optimizer come from ``--config`` (default ``configs/resnet8_fashion_mnist.yaml``; any config
whose model ``jaxcomposer.models.BUILDERS`` builds). No schedulers, no algorithms, no eval, ``progress_bar=False``,
one CPU device (``devices=jax.devices()[:1]``; the hand loop uses no sharding). Both sides train on the same pool
of host numpy batches (Fashion-MNIST, normalized on the host as ``jaxcomposer fit`` does; random data of the same
shape when the dataset is missing).

Two sync modes, both measured, interleaved A, B, A, B ... over ``--rounds`` rounds of ``--steps`` steps after a
warm-up (compile) round:

- ``loss``: the loss is read every step on both sides (hand loop: ``float(loss)``; trainer: a callback that reads
  ``state.batch_metrics['loss']`` at BATCH_END, as a progress bar or console logger would). This is the headline.
- ``async``: nobody reads the loss per step (the trainer as configured here logs to no destination, so it never
  syncs); each round ends with ``jax.block_until_ready``.

Run:  .venv/bin/python benchmarks/trainer_overhead.py            (full)
      .venv/bin/python benchmarks/trainer_overhead.py --smoke    (a few steps, < 60 s)
"""
from __future__ import annotations

import argparse
import math
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
from jaxcomposer.core.events import Callback
from jaxcomposer.loss import soft_cross_entropy
from jaxcomposer.models import BUILDERS
from jaxcomposer.optim import DecoupledSGDW

NAME = "trainer_overhead"
GOAL_RATIO = 0.97  # the trainer keeps >= 97% of the hand loop's images/s


class ReadLoss(Callback):
    """Reads the step loss on the host every batch, like a progress bar does (a device sync per step)."""

    def batch_end(self, state, logger):
        self.last = float(state.batch_metrics["loss"])


# ---------------------------------------------------------------------------------------------------------------
def config_model(q: dict) -> nnx.Module:
    """The config's model (``model.name`` from ``jaxcomposer.models.BUILDERS``) for 10-class, 1-channel images."""
    return BUILDERS[q["model_name"]](**{"num_classes": 10, "in_channels": 1, **q["model"]}, rngs=nnx.Rngs(q["seed"]))


def trainer_side(q: dict, pool: list[dict], steps: int, total: int, read_loss: bool,
                 steps_per_execution: int) -> TrainerSide:
    module = config_model(q)
    return TrainerSide(model=ComposerClassifier(module, num_classes=10),
                       train_dataloader=CyclingLoader(pool, steps), eval_dataloader=None,
                       max_duration=f"{total}ba", optimizers=DecoupledSGDW(**q["optimizer"]),
                       schedulers=None, algorithms=None, progress_bar=False, log_to_console=False,
                       seed=q["seed"], devices=jax.devices()[:1], steps_per_execution=steps_per_execution,
                       callbacks=[ReadLoss()] if read_loss else None)


class HandSide:
    def __init__(self, q: dict, pool: list[dict], read_loss: bool):
        graphdef, params, bn_state = nnx.split(config_model(q), nnx.Param, ...)
        tx = DecoupledSGDW(**q["optimizer"])

        def step(params, bn_state, opt_state, x, y):
            def loss_fn(p):
                model = nnx.merge(graphdef, p, bn_state, copy=True)
                logits = model(x, train=True)
                _, _, new_state = nnx.split(model, nnx.Param, ...)
                return soft_cross_entropy(logits, y).mean(), new_state

            (loss, new_state), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
            updates, opt_state = tx.update(grads, opt_state, params)
            params = jax.tree.map(lambda p, u: p + u, params, updates)
            return params, new_state, opt_state, loss

        self.step = jax.jit(step, donate_argnums=(0, 1, 2))
        self.params, self.bn_state, self.opt_state = params, bn_state, tx.init(params)
        self.pool, self.read_loss, self.i = pool, read_loss, 0
        self.last = None

    def run(self, n: int) -> float:
        t0 = time.perf_counter()
        loss = None
        for _ in range(n):
            b = self.pool[self.i % len(self.pool)]
            self.i += 1
            x, y = jax.device_put(b["input"]), jax.device_put(b["target"])
            self.params, self.bn_state, self.opt_state, loss = self.step(self.params, self.bn_state,
                                                                 self.opt_state, x, y)
            if self.read_loss:
                self.last = float(loss)
        jax.block_until_ready((self.params, self.bn_state, self.opt_state))
        return time.perf_counter() - t0


def geomean_ci(ratios: list[float]) -> list[float]:
    """``[low, geometric mean, high]`` of paired ratios: the mean of their logs +- 2 standard errors."""
    logs = [math.log(r) for r in ratios]
    mean = statistics.fmean(logs)
    half = 2 * statistics.stdev(logs) / math.sqrt(len(logs)) if len(logs) > 1 else 0.0
    return [round(math.exp(mean - half), 4), round(math.exp(mean), 4), round(math.exp(mean + half), 4)]


# ---------------------------------------------------------------------------------------------------------------
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_round_args(ap, warmup_help="untimed steps first (includes compile)")
    ap.add_argument("--modes", default="loss,async", help="comma list of sync modes: loss, async")
    ap.add_argument("--steps-per-execution", type=int, default=None,
                    help="the Trainer's steps_per_execution (default: the config's); the hand loop makes one call "
                         "per batch. --steps and --warmup are rounded up to multiples of it")
    ap.add_argument("--smoke", action="store_true", help="a few steps per round, for checking the script")
    ap.add_argument("--out", default=None, help=f"default: benchmarks/results/{NAME}[.smoke].json")
    args = ap.parse_args(argv)
    args.out = results_path(NAME, args.smoke, args.out)
    if args.smoke:
        args.steps, args.rounds, args.warmup = 4, 2, 2
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or any(m not in ("loss", "async") for m in modes):
        ap.error("--modes: a comma list of 'loss' and 'async'")

    q = load_benchmark_config(Path(args.config))
    spe = q["steps_per_execution"] if args.steps_per_execution is None else args.steps_per_execution
    if spe < 1:
        ap.error(f"--steps-per-execution: expected an int >= 1, got {spe}")
    # a round that ends inside a call would train past its end: rounds hold whole calls
    args.steps, args.warmup = (-(-n // spe) * spe for n in (args.steps, args.warmup))
    threads_note = threads_as_fit_sets(q)
    bs = q["batch_size"]
    pool, source = fashion_mnist_batches(bs, count=min(max(args.steps, 4), 64), seed=0)
    total = args.warmup + args.rounds * args.steps

    sides = {}
    for m in modes:
        sides[("trainer", m)] = trainer_side(q, pool, args.steps, total, read_loss=(m == "loss"),
                                             steps_per_execution=spe)
        sides[("hand", m)] = HandSide(q, pool, read_loss=(m == "loss"))
    warm = {}
    for key, side in sides.items():  # warm-up: compile + first steps, untimed in the rounds
        warm[f"{key[0]}/{key[1]}"] = round(side.run(args.warmup), 3)

    times: dict = {k: [] for k in sides}
    order = list(sides)
    for r in range(args.rounds):  # interleaved, and every other round in reverse, so neither side always goes first
        for key in (order if r % 2 == 0 else order[::-1]):
            times[key].append(sides[key].run(args.steps))

    results = {}
    for m in modes:
        tr = [bs * args.steps / t for t in times[("trainer", m)]]
        hd = [bs * args.steps / t for t in times[("hand", m)]]
        ratios = [a / b for a, b in zip(tr, hd)]
        results[m] = {"trainer_images_per_s": [round(v, 1) for v in tr],
                      "hand_images_per_s": [round(v, 1) for v in hd],
                      "ratio_trainer_over_hand": [round(v, 4) for v in ratios],
                      "median_trainer_images_per_s": round(statistics.median(tr), 1),
                      "median_hand_images_per_s": round(statistics.median(hd), 1),
                      "median_ratio": round(statistics.median(ratios), 4),
                      # a shared machine's speed drifts between rounds: the spread of the paired ratios says how far
                      # the median can be trusted (geometric mean +- 2 standard errors)
                      "geomean_ratio_ci95": geomean_ci(ratios),
                      "within_goal": statistics.median(ratios) >= GOAL_RATIO}

    out = {"benchmark": NAME, "smoke": args.smoke, "goal": f"trainer within {1 - GOAL_RATIO:.0%} of the hand-written "
           f"loop (median ratio trainer/hand >= {GOAL_RATIO})", "machine": machine_facts(),
           "setup": {"config": os.path.relpath(args.config, ROOT), "xla_cpu_threads": threads_note,
                     "model": {"name": q["model_name"], **q["model"]},
                     "batch_size": bs, "optimizer": {"name": "decoupled_sgdw", **q["optimizer"]},
                     "schedulers": None, "algorithms": None, "data": source, "host_batches_in_pool": len(pool),
                     "steps_per_round": args.steps, "trainer_steps_per_execution": spe, "rounds": args.rounds,
                     "warmup_steps": args.warmup,
                     "devices": "single CPU device: Trainer(devices=jax.devices()[:1]); hand loop unsharded "
                        "jax.device_put to the default device",
                     "loss": "soft cross-entropy on integer targets (mean over the batch), both sides",
                     "modes": {"loss": "loss read on the host every step on both sides (hand: float(loss); "
                               "trainer: BATCH_END callback float(batch_metrics['loss']))",
                       "async": "no per-step read; each round ends with block_until_ready"}},
           "warmup_s": warm, "results": results}
    write_json(args.out, out)

    print(f"\n{NAME}: batch {bs}, {args.rounds} rounds x {args.steps} steps, data: {source.split(' (')[0]}"
          f"{'  [SMOKE]' if args.smoke else ''}")
    print(f"{'mode':<7} {'round':>5} {'trainer img/s':>14} {'hand img/s':>12} {'ratio':>7}")
    for m in modes:
        r = results[m]
        for i in range(args.rounds):
            print(f"{m:<7} {i:>5} {r['trainer_images_per_s'][i]:>14.1f} {r['hand_images_per_s'][i]:>12.1f} "
                  f"{r['ratio_trainer_over_hand'][i]:>7.3f}")
        print(f"{m:<7} {'med':>5} {r['median_trainer_images_per_s']:>14.1f} {r['median_hand_images_per_s']:>12.1f} "
              f"{r['median_ratio']:>7.3f}  {'OK' if r['within_goal'] else 'SLOWER than'} (goal {GOAL_RATIO}); "
              f"geometric mean {r['geomean_ratio_ci95'][1]:.3f}, 95% CI {r['geomean_ratio_ci95'][0]:.3f}-"
              f"{r['geomean_ratio_ci95'][2]:.3f}")
    print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
