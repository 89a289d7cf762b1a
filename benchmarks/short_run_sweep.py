"""Which changes make the ResNet-8 workload reach 91% Fashion-MNIST test accuracy in fewer epochs?

Issue 11 asks for a recipe that reaches 91% in <= 30 s of ``fit`` on 2 cores and 1.5x faster than its own
baseline. At the ResNet-8 step's CPU speed (``step_profile.py``), 30 s including the compile is about 2 epochs,
so the question is one of accuracy per epoch. This sweep trains the ResNet-8 model
(width 16, stride-2 stem) with one change at a time and records the final test accuracy (the schedule
always ends at the given duration: cosine with 10% warmup) and, for each run, the accuracy with test-time flip
averaging (mean of the logits of the image and its mirror).

Variants (``VARIANTS``): the plain baseline at 1.5, 2 and 2.5 epochs; label smoothing; progressive resizing
(Composer's default ramp from half size, and a two-size variant that trains 14 px then 28 px); weight
standardization; random horizontal flips in training (a batch-slot method defined here: the library has no flip,
because Composer leaves it to the dataloader); batch 64 at LR 0.1 and 0.2; widths 24 and 32; depth 14; and the
schedule at 2 epochs: LR 0.4 and 0.1, 2% warmup, weight decay 5e-5, EMA with a 30-batch half-life, batch 256.

Each run is a child process (``--one``), so no compile or thread pool carries over. Accuracy is a function of
the seed and the code; the wall times are the child's ``fit`` including the compile, and are only comparable
between runs of one quiet invocation (the JSON records the load average).

Run:  .venv/bin/python benchmarks/short_run_sweep.py [--seeds 17 18] [--only LABEL ...]
      .venv/bin/python benchmarks/short_run_sweep.py --smoke        (two variants, 5 batches each)
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

from common import ROOT, host_facts, results_path, write_json  # benchmarks/common.py

NAME = "short_run_sweep"
CONFIG = ROOT / "configs" / "resnet8_fashion_mnist.yaml"
PR_DEFAULT = {"initial_scale": 0.5, "delay_fraction": 0.0, "finetune_fraction": 0.2, "size_increment": 4}
PR_TWO_SIZES = {**PR_DEFAULT, "size_increment": 14}  # widths pin to 14 or 28: 14 px for 40% of the run, then 28

# (label, max_duration, algorithms, config overrides, train with random flips)
VARIANTS = [
    ("baseline 1.5ep", "702ba", {}, [], False),
    ("baseline 2ep", "2ep", {}, [], False),
    ("baseline 2.5ep", "1170ba", {}, [], False),
    ("label smoothing 0.1, 2ep", "2ep", {"label_smoothing": {"smoothing": 0.1}}, [], False),
    ("progressive resizing (Composer ramp), 2ep", "2ep", {"progressive_resizing": PR_DEFAULT}, [], False),
    ("progressive resizing (Composer ramp), 2.5ep", "1170ba", {"progressive_resizing": PR_DEFAULT}, [], False),
    ("progressive resizing (14 then 28 px), 2.5ep", "1170ba", {"progressive_resizing": PR_TWO_SIZES}, [], False),
    ("weight standardization, 2ep", "2ep", {"weight_standardization": {}}, [], False),
    ("random flips, 2ep", "2ep", {}, [], True),
    ("batch 64 lr 0.1, 1.5ep", "1406ba", {}, ["data.batch_size=64", "optimizer.lr=0.1"], False),
    ("batch 64 lr 0.2, 1.5ep", "1406ba", {}, ["data.batch_size=64", "optimizer.lr=0.2"], False),
    ("batch 64 lr 0.1, 2ep", "2ep", {}, ["data.batch_size=64", "optimizer.lr=0.1"], False),
    ("width 24, batch 64 lr 0.1, 1ep", "1ep", {}, ["model.width=24", "data.batch_size=64", "optimizer.lr=0.1"], False),
    ("depth 14, batch 64 lr 0.1, 1ep", "1ep", {}, ["model.depth=14", "data.batch_size=64", "optimizer.lr=0.1"], False),
    ("width 32, 1ep", "1ep", {}, ["model.width=32"], False),
    ("width 32, 2ep", "2ep", {}, ["model.width=32"], False),
    ("lr 0.4, 2ep", "2ep", {}, ["optimizer.lr=0.4"], False),
    ("lr 0.1, 2ep", "2ep", {}, ["optimizer.lr=0.1"], False),
    ("warmup 2%, 2ep", "2ep", {}, ["schedulers.0.t_warmup=0.02dur"], False),
    ("weight decay 5e-5, 2ep", "2ep", {}, ["optimizer.weight_decay=5.0e-5"], False),
    ("EMA half-life 30ba, 2ep", "2ep", {"ema": {"half_life": "30ba", "update_interval": "1ba"}}, [], False),
    ("batch 256 lr 0.4, 2ep", "2ep", {}, ["data.batch_size=256", "optimizer.lr=0.4"], False),
]


def run_one(duration: str, seed: int, algorithms: dict, overrides: list[str], flip: bool, smoke: bool) -> dict:
    """Train one variant in this process; returns its accuracy with and without test-time flips."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jaxcomposer import config as config_lib
    from jaxcomposer.core.method import Method
    from jaxcomposer.data import data_spec
    from jaxcomposer.runner import build_trainer, use_compilation_cache
    from jaxcomposer.trainer import step as steps

    over = ["progress_bar=false", "log_to_console=false", f"max_duration={duration}", f"seed={seed}",
            "eval_interval=null", *overrides]
    if smoke:
        over += ["train_subset_num_batches=5", "max_duration=5ba"]
    cfg = config_lib.load_config(CONFIG, over).model_copy(update={"algorithms": algorithms})
    use_compilation_cache(cfg.compilation_cache_dir)

    def random_flip(batch, ctx):  # each image mirrored left-right with probability 1/2 (NHWC: width is axis 2)
        x = batch["input"]
        mirror = jax.random.bernoulli(ctx.key, 0.5, (x.shape[0], 1, 1, 1))
        return {**batch, "input": jnp.where(mirror, jnp.flip(x, 2), x)}

    methods = [config_lib.build_component({"name": n, **kw}, config_lib.ALGORITHMS) for n, kw in algorithms.items()]
    if flip:
        methods.append(Method(name="RandomFlip", batch=random_flip))
    trainer, _ = build_trainer(cfg, loggers=[], callbacks=[], algorithms=methods)
    start = time.perf_counter()
    trainer.fit()
    fit_s = time.perf_counter() - start

    normalize = data_spec.whole_batch_transform(trainer.eval_data_spec)  # fit's loaders yield uint8 images

    @jax.jit
    def both_logits(state, x):
        params, model_state = steps.eval_weights(trainer.composed, state, trainer.run_info)
        x = x if normalize is None else normalize({"input": x})["input"]
        plain, _ = trainer.task.forward(params, model_state, {"input": x}, train=False)
        mirrored, _ = trainer.task.forward(params, model_state, {"input": jnp.flip(x, 2)}, train=False)
        return plain, mirrored

    right = right_tta = n = 0
    subset = 1 if smoke else -1
    for batch in trainer._device_batches(trainer.eval_dataloader, subset, check=False):
        plain, mirrored = both_logits(trainer.state.train_state, batch["input"])
        target = np.asarray(batch["target"])
        right += int((np.asarray(plain).argmax(-1) == target).sum())
        right_tta += int((np.asarray(plain + mirrored).argmax(-1) == target).sum())
        n += len(target)
    return {"fit_s": round(fit_s, 2), "batches": int(trainer.state.timestamp.batch), "accuracy": right / n,
            "accuracy_flip_tta": right_tta / n, "eval_examples": n}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[17, 18])
    ap.add_argument("--only", nargs="+", help="labels to run (default: all)")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # child mode: a JSON [duration, seed, algorithms, overrides, flip]
    args = ap.parse_args()
    if args.one:
        duration, seed, algorithms, overrides, flip = json.loads(args.one)
        print("RESULT " + json.dumps(run_one(duration, seed, algorithms, overrides, flip, args.smoke)), flush=True)
        return
    variants = VARIANTS[:2] if args.smoke else VARIANTS
    if args.only:
        unknown = set(args.only) - {v[0] for v in VARIANTS}
        if unknown:
            raise SystemExit(f"--only: unknown labels {sorted(unknown)}; choose from {[v[0] for v in VARIANTS]}")
        variants = [v for v in VARIANTS if v[0] in args.only]
    facts = host_facts()
    rows = []
    for label, duration, algorithms, overrides, flip in variants:
        runs = []
        for seed in args.seeds[:1] if args.smoke else args.seeds:
            cmd = [sys.executable, __file__, "--one", json.dumps([duration, seed, algorithms, overrides, flip])]
            out = subprocess.run(cmd + (["--smoke"] if args.smoke else []), capture_output=True, text=True,
                                 cwd=ROOT)
            line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
            if line is None:
                raise SystemExit(f"{label} (seed {seed}) failed:\n{out.stderr[-3000:]}")
            runs.append({"seed": seed, **json.loads(line[len("RESULT "):])})
            print(f"{label:<48} seed {seed}: {runs[-1]['accuracy']:.4f} (flip TTA {runs[-1]['accuracy_flip_tta']:.4f})"
                  f" in {runs[-1]['fit_s']:.1f} s", flush=True)
        rows.append({"label": label, "max_duration": duration, "algorithms": algorithms, "overrides": overrides,
                     "random_flips": flip, "runs": runs,
                     "accuracy_median": statistics.median(r["accuracy"] for r in runs),
                     "accuracy_flip_tta_median": statistics.median(r["accuracy_flip_tta"] for r in runs),
                     "reaches_91pct_all_seeds": all(r["accuracy"] >= 0.91 for r in runs)})
    result = {"benchmark": NAME, "smoke": args.smoke, "machine": facts, "load_after": host_facts()["loadavg_1_5_15"],
              "setup": {"config": "configs/resnet8_fashion_mnist.yaml without its methods (label smoothing, EMA) "
                                  "unless a variant names them", "seeds": args.seeds, "target_accuracy": 0.91,
                        "eval": "once, after the last batch, on the 10,000 test images"},
              "variants": rows}
    path = results_path(NAME, args.smoke, args.out)
    write_json(path, result)
    print(f"\n{'variant':<48} {'acc (median)':>12} {'flip TTA':>9}  91% on all seeds")
    for r in rows:
        print(f"{r['label']:<48} {r['accuracy_median']:>12.4f} {r['accuracy_flip_tta_median']:>9.4f}  "
              f"{r['reaches_91pct_all_seeds']}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
