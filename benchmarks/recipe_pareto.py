"""Time to target accuracy: a recipe of speedup methods against its own baseline, Composer-style (Pareto curves).

Composer compares methods by training *complete* schedules of several lengths and plotting final accuracy against
training time: a method pays when its curve lies left of the baseline's. This script does that for a config
(default ``configs/quickstart.yaml``): the **recipe** is the config as written; the **baseline** is the same config
with ``algorithms`` emptied (same model, data, optimizer, schedule, seed). For every duration in ``--durations``
(epochs, fractions allowed: a full cosine schedule of that length each time) and every seed, both are trained once,
interleaved (baseline then recipe, the order alternating by seed), so a machine whose speed drifts slows both alike.
``--baseline-durations`` gives the baseline its own lengths: its quality at its full schedule is usually the target,
which its shorter schedules cannot reach, so only that one need be run.

- training time: from the start of ``fit`` to the last batch's result (``block_until_ready``), evaluation excluded,
  compile included. The persistent compilation cache is on (as ``jaxcomposer fit`` runs), and a 2-batch warm-up
  of each side's schedule fills it before that schedule is timed, so timed runs load their steps instead of
  compiling them
  (a method that changes shapes mid-run, like ProgressiveResizing, compiles its later stages in its first timed
  run; the median over seeds leaves that one out when there are three seeds).
- score: the evaluation metric ``--metric`` (default test accuracy, ``MulticlassAccuracy``; for language models
  e.g. ``LanguagePerplexity`` with ``--mode min``) on the whole eval set after the last batch (EMA weights where
  the recipe has EMA).
- time to target: per side, the shortest duration whose **median** score over the seeds reaches ``--target``
  (>= with ``--mode max``, <= with ``--mode min``); its median training time. The speedup is baseline / recipe.

Writes ``benchmarks/results/recipe_pareto.json`` (or ``--out``) and a PNG beside it (score against time, one curve
per side, the seeds as dots); prints a table last. ``--smoke`` runs two tiny durations of a few batches (numbers mean
nothing). Run on a quiet machine.

Run:  .venv/bin/python benchmarks/recipe_pareto.py [--config configs/quickstart.yaml] [--durations 1 2 3 4]
                                                   [--baseline-durations 4] [--seeds 17 18 19] [--target 0.91]
                                                   [--metric M --mode max|min]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

from common import ROOT, machine_facts, results_path, write_json

NAME = "recipe_pareto"


def configs(path: str, duration: str, seed: int, smoke: bool):
    """(baseline, recipe) configs for one schedule length."""
    from jaxcomposer import config as config_lib
    overrides = ["progress_bar=false", "log_to_console=false", f"max_duration={duration}", f"seed={seed}",
                 f"eval_interval={duration}"]
    if smoke:
        overrides += ["eval_subset_num_batches=1"]
    recipe = config_lib.load_config(path, overrides)
    baseline = recipe.model_copy(update={"algorithms": {}})
    return baseline, recipe


def train(cfg, metric: str, stop_after: int | None = None) -> dict:
    """One complete schedule; training seconds (eval excluded) and the final ``metric``. ``stop_after``: a
    warm-up that stops after that many batches (same compiled steps as the full schedule, which fills the cache)."""
    import jax
    from jaxcomposer import runner
    from jaxcomposer.core.events import Callback

    class Clock(Callback):
        def __init__(self):
            self.start, self.train_s = None, None

        def fit_start(self, state, logger):
            self.start = time.perf_counter()

        def batch_end(self, state, logger):
            if stop_after is not None and state.timestamp.batch >= stop_after:
                state.stop_training("warm-up done")

        def eval_start(self, state, logger):
            jax.block_until_ready(state.train_state)
            self.train_s = time.perf_counter() - self.start

    runner.prepare_process(cfg)  # as `jaxcomposer fit`: compilation cache, XLA:CPU threads
    clock = Clock()
    trainer, _ = runner.build_trainer(cfg, callbacks=[clock], loggers=[])
    state = trainer.fit()
    trainer.close()
    if stop_after is not None:
        return {}
    return {"train_s": round(clock.train_s, 3), "batches": int(state.timestamp.batch),
            "score": round(float(state.eval_metrics["eval"][metric]), 4)}


def in_batches(epochs: float, steps_per_epoch: int) -> str:
    return f"{epochs:g}ep" if float(epochs).is_integer() else f"{round(epochs * steps_per_epoch)}ba"


def time_to_target(points: list[dict], target: float, mode: str = "max") -> dict | None:
    """The shortest duration whose median score reaches ``target`` (points: one per duration, medians)."""
    reached = [p for p in points if (_score(p, "score_median") >= target if mode == "max"
                                     else _score(p, "score_median") <= target)]
    return min(reached, key=lambda p: p["train_s_median"]) if reached else None


def _score(p: dict, key: str = "score") -> float:  # results written before --metric called it "accuracy"
    return p[key] if key in p else p[key.replace("score", "accuracy")]


def plot(sides: dict, target: float, path, title: str, ylabel: str = "final test accuracy", mode: str = "max") -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 5))
    for (label, side), color in zip(sides.items(), ("black", "tab:red")):
        pts = side["points"]
        ax.plot([p["train_s_median"] for p in pts], [_score(p, "score_median") for p in pts], marker="o", color=color,
                lw=2, label=f"{label}: {side['description']}")
        for p in pts:
            ax.scatter([r["train_s"] for r in p["runs"]], [_score(r) for r in p["runs"]], s=10, color=color,
                       alpha=0.35)
            ax.annotate(p.get("label", p["duration"]), (p["train_s_median"], _score(p, "score_median")),
                        textcoords="offset points",
                        xytext=(4, -10), fontsize=7, color=color)
    ax.axhline(target, ls=":", color="gray")
    ax.set(xlabel="training time (s; compile included, evaluation excluded)", ylabel=ylabel,
           title=title)
    ax.legend(fontsize=8, loc="lower right" if mode == "max" else "upper right")  # away from the good end
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "configs" / "quickstart.yaml"))
    ap.add_argument("--durations", type=float, nargs="+", default=[1, 2, 3, 4], help="schedule lengths in epochs")
    ap.add_argument("--baseline-durations", type=float, nargs="+", default=None,
                    help="the baseline's schedule lengths, when not --durations (its curve is only needed near the "
                         "target: often just its full schedule, whose quality is the target)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[17, 18, 19])
    ap.add_argument("--target", type=float, default=0.91)
    ap.add_argument("--metric", default="MulticlassAccuracy", help="the eval metric to reach the target in")
    ap.add_argument("--mode", choices=("max", "min"), default="max", help="max: higher is better (accuracy)")
    ap.add_argument("--smoke", action="store_true", help="two schedules of a few batches; checks the script only")
    ap.add_argument("--out", default=None)
    ap.add_argument("--replot", action="store_true", help="redraw the PNG from the saved JSON; train nothing")
    ap.add_argument("--retarget", action="store_true",
                    help="with --replot: recompute the times to --target from the saved runs and rewrite the JSON")
    args = ap.parse_args(argv)
    if args.replot:
        path = results_path(NAME, args.smoke, args.out)
        saved = json.loads(path.read_text())
        if args.retarget:
            mode = saved["setup"].get("mode", "max")
            for side in saved["sides"].values():
                side["time_to_target"] = time_to_target(side["points"], args.target, mode)
            saved["setup"]["target"] = args.target
            t_base, t_recipe = (saved["sides"][k]["time_to_target"] for k in ("baseline", "recipe"))
            saved["speedup_to_target"] = (round(t_base["train_s_median"] / t_recipe["train_s_median"], 3)
                                          if t_base is not None and t_recipe is not None else None)
            write_json(path, saved, indent=1)
            print(f"speedup to {args.target:g}: {saved['speedup_to_target']}")
        plot(saved["sides"], saved["setup"]["target"], path.with_suffix(".png"), saved["title"],
             f"final {saved['setup'].get('metric', 'test accuracy')}", saved["setup"].get("mode", "max"))
        return 0

    from jaxcomposer.runner import loaders_from_config
    probe, _ = configs(args.config, "1ep", args.seeds[0], args.smoke)
    spe = len(loaders_from_config(probe)[0])
    recipe_durations = ["3ba", "6ba"] if args.smoke else [in_batches(e, spe) for e in args.durations]
    baseline_durations = recipe_durations if args.smoke or args.baseline_durations is None else \
        [in_batches(e, spe) for e in args.baseline_durations]
    runs = {"baseline": {d: [] for d in baseline_durations}, "recipe": {d: [] for d in recipe_durations}}
    durations = sorted(set(baseline_durations) | set(recipe_durations),
                       key=lambda d: float(d[:-2]) * (spe if d.endswith("ep") else 1))  # in batches
    for duration in durations:
        sides_here = [label for label in runs if duration in runs[label]]
        # the schedule's length is compiled into the step: fill the cache for both sides before timing them
        for label, cfg in zip(runs, configs(args.config, duration, args.seeds[0], args.smoke)):
            if label in sides_here:
                train(cfg, args.metric, stop_after=2)
        for i, seed in enumerate(args.seeds):
            baseline, recipe = configs(args.config, duration, seed, args.smoke)
            order = [("baseline", baseline), ("recipe", recipe)][:: 1 if i % 2 == 0 else -1]
            for label, cfg in (o for o in order if o[0] in sides_here):
                r = train(cfg, args.metric)
                runs[label][duration].append({"seed": seed, **r})
                print(f"{label:<9} {duration:>7} seed {seed}: {args.metric} {r['score']:.4f} in {r['train_s']:.1f} s",
                      flush=True)

    recipe_cfg = configs(args.config, durations[0], args.seeds[0], args.smoke)[1]
    sides = {}
    for label in ("baseline", "recipe"):
        points = [{"duration": d, "label": f"{rs[0]['batches'] / spe:g} ep", "runs": rs,
                   "score_median": statistics.median(r["score"] for r in rs),
                   "train_s_median": round(statistics.median(r["train_s"] for r in rs), 3)}
                  for d, rs in runs[label].items()]
        names = sorted(recipe_cfg.algorithms) if label == "recipe" else []
        sides[label] = {"description": " + ".join(names) or "no methods", "algorithms": names, "points": points,
                        "time_to_target": time_to_target(points, args.target, args.mode)}
    t_base, t_recipe = (sides[k]["time_to_target"] for k in ("baseline", "recipe"))
    speedup = (round(t_base["train_s_median"] / t_recipe["train_s_median"], 3)
               if t_base is not None and t_recipe is not None else None)
    out = results_path(NAME, args.smoke, args.out)
    model = {k: v for k, v in recipe_cfg.model.items()}
    title = f"{recipe_cfg.data.name}, {model.get('name')}: recipe vs baseline (median of {len(args.seeds)} seeds)"
    write_json(out, {"benchmark": NAME, "smoke": args.smoke, "machine": machine_facts(),
                     "setup": {"config": str(args.config), "model": model, "data": recipe_cfg.data.name,
                               "batch_size": recipe_cfg.data.batch_size, "steps_per_epoch": spe,
                               "optimizer": recipe_cfg.optimizer, "schedulers": recipe_cfg.schedulers,
                               "recipe_algorithms": recipe_cfg.algorithms, "seeds": args.seeds,
                               "durations": {"baseline": baseline_durations, "recipe": recipe_durations},
                               "target": args.target, "metric": args.metric,
                               "mode": args.mode},
                     "sides": sides, "speedup_to_target": speedup, "title": title}, indent=1)
    plot(sides, args.target, out.with_suffix(".png"), title, f"final {args.metric}", args.mode)

    print(f"\n{'side':<10}{'duration':>9}{'median score':>14}{'median train s':>16}")
    for label, side in sides.items():
        for p in side["points"]:
            print(f"{label:<10}{p['duration']:>9}{p['score_median']:>14.4f}{p['train_s_median']:>16.1f}")
    for label, side in sides.items():
        t = side["time_to_target"]
        print(f"time to {args.metric} {args.target:g} ({label}): " +
              ("not reached" if t is None else f"{t['train_s_median']:.1f} s ({t['duration']})"))
    print(f"speedup to target: {speedup if speedup is not None else '-'}   results: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
