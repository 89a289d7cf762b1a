"""Each speedup method alone, and the ResNet-8 recipe (LS + EMA), against the baseline on Fashion-MNIST (CPU).

Usage: python benchmarks/methods_fashion_mnist.py [--smoke] [--budget SECONDS] [--seeds 17 ...] [--only NAME ...]

Every run is the ResNet-8 workload (width 16 with a stride-2 stem, decoupled SGDW with Nesterov momentum,
cosine with 10% warmup over 3 epochs, batch 128) plus one method, with the same seeds. A run stops when its
*training* time (evaluation excluded) reaches the budget or the schedule ends. It is evaluated on 5,000 test
images every half epoch. Reported per method:

- step throughput cost (%): how much longer a training batch takes than the baseline's, on average;
- accuracy at the budget: the last evaluation within it;
- time to 91%: the training time of the first evaluation at or above 0.91, where reached.

Methods with host-side data work (RandAugment, AugMix) pay for it in the same cores as the step, as they would
in a real run. SeqLengthWarmup, Alibi, GatedLinearUnits and the LayerNorm methods are for transformers, ChannelsLast
changes nothing on an NNX (NHWC) model and NoOpModel has no accuracy to report: none of them is run here.
Writes benchmarks/results/methods_fashion_mnist.json and methods_fashion_mnist.png; prints a table last.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from flax import nnx

from common import ROOT, machine_facts, results_path, write_json
from jaxcomposer import Trainer
from jaxcomposer import config as config_lib
from jaxcomposer.core.events import Callback
from jaxcomposer.data import make_loaders
from jaxcomposer.models import ResNetCIFAR
from jaxcomposer.models.tasks import ComposerClassifier
from jaxcomposer.optim import CosineAnnealingWithWarmupScheduler, DecoupledSGDW
from jaxcomposer.runner import NormalizedLoader, _with_normalization
TARGET = 0.91

# (label, [(registry name, kwargs), ...]): Composer's defaults unless a short run needs otherwise
RUNS = [
    ("baseline", []),
    ("quickstart recipe (LS + EMA)", [("label_smoothing", {"smoothing": 0.1}),
                                      ("ema", {"half_life": "100ba", "update_interval": "1ba"})]),
    ("LabelSmoothing", [("label_smoothing", {"smoothing": 0.1})]),
    ("EMA", [("ema", {"half_life": "100ba", "update_interval": "1ba"})]),
    ("MixUp", [("mixup", {"alpha": 0.2})]),
    ("CutMix", [("cutmix", {"alpha": 1.0})]),
    ("CutOut", [("cutout", {"num_holes": 1, "length": 0.5})]),
    ("ColOut", [("colout", {})]),
    ("BlurPool", [("blurpool", {"min_channels": 16})]),
    ("GradientClipping", [("gradient_clipping", {"clipping_type": "norm", "clipping_threshold": 1.0})]),
    ("ProgressiveResizing", [("progressive_resizing", {})]),
    ("SelectiveBackprop", [("selective_backprop", {})]),
    ("LayerFreezing", [("layer_freezing", {})]),
    ("SAM", [("sam", {})]),
    ("SWA", [("swa", {"swa_start": "0.7dur", "swa_end": "0.97dur", "update_interval": "20ba"})]),
    ("RandAugment", [("randaugment", {})]),
    ("AugMix", [("augmix", {})]),
    # the model-rewriting methods, with thresholds this small model reaches (Composer's defaults target ImageNet
    # ResNets: no conv here has the 128 channels SqueezeExcite's default min_channels asks for)
    ("SqueezeExcite", [("squeeze_excite", {"latent_channels": 0.25, "min_channels": 32})]),
    ("StochasticDepth", [("stochastic_depth", {"target_layer_name": "ResNetBasicBlock", "drop_rate": 0.1})]),
    ("GhostBatchNorm", [("ghost_batchnorm", {"ghost_batch_size": 32})]),
    ("WeightStandardization", [("weight_standardization", {})]),
    ("Factorize", [("factorize", {"min_channels": 32, "latent_channels": 0.5, "min_features": 32})]),
    ("GyroDropout", [("gyro_dropout", {"p": 0.1})]),
]


class BudgetRecorder(Callback):
    """Training time (wall time minus evaluation), accuracy at each evaluation, and a stop at the budget."""

    def __init__(self, budget_s: float):
        self.budget_s, self.train_s, self.batches, self.curve = budget_s, 0.0, 0, []
        self._mark = None

    def fit_start(self, state, logger):
        self._mark = time.perf_counter()

    def batch_end(self, state, logger):
        now = time.perf_counter()
        self.train_s += now - self._mark
        self._mark, self.batches = now, self.batches + 1
        if self.train_s >= self.budget_s:
            state.stop_training(f"time budget {self.budget_s:g} s")

    def eval_start(self, state, logger):
        self.train_s += time.perf_counter() - self._mark

    def eval_end(self, state, logger):
        self.curve.append((round(self.train_s, 2), int(state.timestamp.batch),
                           round(float(state.eval_metrics["eval"]["MulticlassAccuracy"]), 4)))
        self._mark = time.perf_counter()


def run(label: str, methods: list, seed: int, budget_s: float, epochs: int, eval_batches: int,
        train_batches: int) -> dict:
    train, evals, info = make_loaders("fashion_mnist", 128, 1000, seed=seed)
    if info.mean is not None:
        train, evals = (NormalizedLoader(x, info.mean, info.std) for x in (train, evals))
    task = ComposerClassifier(ResNetCIFAR(depth=8, width=16, stem_stride=2, num_classes=info.num_classes,
                                          in_channels=info.input_shape[-1], rngs=nnx.Rngs(seed)),
                              num_classes=info.num_classes)
    algorithms = [config_lib.build_component(_with_normalization({"name": n, **kw}, info),
                                             config_lib.ALGORITHMS) for n, kw in methods]
    steps_per_epoch = min(len(train), train_batches) if train_batches > 0 else len(train)
    recorder = BudgetRecorder(budget_s)
    trainer = Trainer(model=task, train_dataloader=train, eval_dataloader=evals, max_duration=f"{epochs}ep",
                      optimizers=DecoupledSGDW(lr=0.2, momentum=0.9, nesterov=True, weight_decay=5e-4),
                      schedulers=[CosineAnnealingWithWarmupScheduler(t_warmup="0.1dur")], algorithms=algorithms,
                      eval_interval=f"{max(1, steps_per_epoch // 2)}ba", eval_subset_num_batches=eval_batches,
                      train_subset_num_batches=train_batches, callbacks=[recorder], seed=seed, progress_bar=False)
    trainer.fit()
    trainer.close()
    reached = [t for t, _, acc in recorder.curve if acc >= TARGET]
    within = [acc for t, _, acc in recorder.curve if t <= budget_s * 1.02]
    return {"label": label, "seed": seed, "methods": methods, "data": info.name,
            "train_s": round(recorder.train_s, 2), "batches": recorder.batches,
            "ms_per_batch": round(1e3 * recorder.train_s / max(recorder.batches, 1), 2),
            "accuracy_at_budget": within[-1] if within else None,
            "final_accuracy": recorder.curve[-1][2] if recorder.curve else None,
            "time_to_target_s": reached[0] if reached else None, "curve": recorder.curve}


def plot(results: list[dict], path: Path, budget_s: float, machine: dict) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 6))
    lowest = 0.8
    for i, r in enumerate(results):
        if r["curve"]:
            t, _, acc = zip(*r["curve"])
            style = {"lw": 2.5, "color": "black"} if r["label"] == "baseline" else \
                {"lw": 1.2, "color": plt.cm.tab20(i % 20), "ls": ("-", "--", "-.")[i % 3]}
            below = " (below the axis)" if max(acc) < lowest else ""
            ax.plot(t, acc, marker=".", label=f"{r['label']} (seed {r['seed']}){below}", **style)
    ax.axhline(TARGET, ls=":", color="gray")
    ax.axvline(budget_s, ls="--", color="gray")
    ax.set(xlabel="training wall time (s, evaluation excluded)", ylabel="test accuracy (5,000 images)",
           title="Fashion-MNIST, ResNet-8: each method alone vs the baseline "
                 f"({machine.get('sched_affinity') or machine.get('cpu_count')} CPU cores)")
    ax.set_ylim(lowest, 0.94)
    ax.legend(fontsize=7, ncol=2, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true", help="a few batches per method: checks that everything runs")
    ap.add_argument("--budget", type=float, default=60.0, help="training seconds per run")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--seeds", type=int, nargs="+", default=[17])
    ap.add_argument("--only", nargs="+", default=None, help="labels to run (baseline always runs)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--replot", action="store_true", help="redraw the PNG from the JSON results, run nothing")
    args = ap.parse_args()
    if args.replot:
        saved = json.loads((ROOT / "benchmarks" / "results" / "methods_fashion_mnist.json").read_text())
        plot(saved["results"], ROOT / "benchmarks" / "results" / "methods_fashion_mnist.png", saved["budget_s"],
             saved["machine"])
        return
    budget, train_batches, eval_batches = (args.budget, -1, 5) if not args.smoke else (5.0, 6, 1)
    runs = [r for r in RUNS if args.only is None or r[0] in args.only or r[0] == "baseline"]
    results = []
    for seed in args.seeds:
        for label, methods in runs:
            print(f"--- {label} (seed {seed})", flush=True)
            results.append(run(label, methods, seed, budget, 1 if args.smoke else args.epochs, eval_batches,
                               train_batches))
    base = {r["seed"]: r for r in results if r["label"] == "baseline"}
    for r in results:
        r["throughput_cost_pct"] = round(100 * (r["ms_per_batch"] / base[r["seed"]]["ms_per_batch"] - 1), 1)
    out = results_path("methods_fashion_mnist", args.smoke, args.out)
    machine = machine_facts()
    write_json(out, {"benchmark": "methods_fashion_mnist", "smoke": args.smoke, "budget_s": budget,
                     "epochs": args.epochs, "target": TARGET, "eval_images": eval_batches * 1000,
                     "machine": machine, "results": results}, indent=1)
    plot(results, out.with_suffix(".png"), budget, machine)
    print(f"\n{'method':<30}{'seed':>5}{'cost %':>8}{'ms/batch':>10}{'acc@budget':>12}{'t to 91% s':>12}")
    for r in results:
        t = "-" if r["time_to_target_s"] is None else f"{r['time_to_target_s']:.1f}"
        acc = "-" if r["accuracy_at_budget"] is None else f"{r['accuracy_at_budget']:.4f}"
        print(f"{r['label']:<30}{r['seed']:>5}{r['throughput_cost_pct']:>8}{r['ms_per_batch']:>10}{acc:>12}{t:>12}")
    print(f"results: {out}")


if __name__ == "__main__":
    main()
