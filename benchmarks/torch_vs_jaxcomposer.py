"""The quickstart recipe in plain PyTorch vs. jaxcomposer: accuracy over wall time, images/s, time to 91%.

Both sides read ``configs/quickstart.yaml`` and train the same thing:

- model: the config's model (``convnet`` or ``resnet_cifar``) with its kwargs; the torch side is its mirror from
  ``torch_bridge.mirrors`` (the same layers, BN eps 1e-5 and torch momentum ``1 - flax momentum``; kaiming-normal
  fan-out conv init, flax's lecun-normal (truncated) head init, zero bias). Torch runs NCHW tensors in
  channels-last memory, ``torch.set_num_threads(2)``.
- data: the same loaders (``jaxcomposer.data.make_loaders`` with the config's seed, so the same shuffled batches)
  and the same host normalization ``(x / 255 - mean) / std``; batch size and epochs from the config.
- optimizer: Composer's DecoupledSGDW. Torch: ``torch.optim.SGD(lr=lr * alpha_t, momentum, nesterov,
  weight_decay=0)`` after ``p.mul_(1 - alpha_t * wd)``; alpha_t is the config's schedule (cosine with warmup)
  evaluated once with ``jaxcomposer.optim``'s ``schedule(...)`` and handed to torch as Python floats.
- label smoothing: ``F.cross_entropy(label_smoothing=s)``; jaxcomposer: ``LabelSmoothing(s)``.
- EMA of params and float buffers: ``smoothing = 2 ** (-update_interval / half_life)`` per batch, the average
  (re)started from the weights after the first step (jaxcomposer's ``ema_start='0.0dur'``); eval uses EMA weights.

The sides run interleaved by epoch (torch's epoch 1, jaxcomposer's epoch 1, jaxcomposer's epoch 2, torch's epoch
2, ...: who goes first alternates), so a machine whose speed drifts slows both alike; ``--seeds`` repeats the
comparison and reports medians. Torch runs in a child process (this script with ``--torch-worker``), so while one
side trains the other process sleeps on a pipe and neither runtime's threads compete with the other's (in one
process torch's epochs after a JAX epoch run much slower). Each side's wall time counts its own epochs only, from the start of
its training (jaxcomposer: ``trainer.fit()``, so compile is included; the first step, i.e. mostly the compile, is
also reported alone). The jaxcomposer side pauses after each evaluation and continues the same plan and compiled
steps. The jaxcomposer side uses the config's persistent
compilation cache as ``jaxcomposer fit`` does, so a second run of the benchmark loads the compiled steps: its first
step is then the warm figure (``first_step_s``; the cold one is a first run's). Images/s counts training steps only (eval excluded;
jaxcomposer's epochs are closed with ``block_until_ready`` so async dispatch does not hide work in the eval).

Run:  .venv/bin/python benchmarks/torch_vs_jaxcomposer.py [--epochs N] [--only torch|jax] [--seeds 17 18 19]
      .venv/bin/python benchmarks/torch_vs_jaxcomposer.py --smoke     (2 epochs of 5 batches, 1 eval batch)
"""
from __future__ import annotations

import argparse
import copy
import os
import sys
import time

import numpy as np

from common import ROOT, machine_facts as shared_machine_facts, results_path, torch_mirror, write_json  # benchmarks/common.py

NAME = "torch_vs_jaxcomposer"
TARGET_ACC = 0.91


def machine_facts() -> dict:
    import torch
    return shared_machine_facts(torch_threads=torch.get_num_threads())


# ---------------------------------------------------------------------------------------------------------------
# the shared setup
def load_setup(config: str, epochs: int | None, smoke: bool, seed: int | None = None) -> dict:
    from jaxcomposer import config as config_lib
    from jaxcomposer.data import make_loaders

    overrides = ["progress_bar=false", "log_to_console=false"]
    if epochs is not None:
        overrides.append(f"max_duration={epochs}ep")
    if smoke:
        overrides += ["max_duration=2ep", "train_subset_num_batches=5", "eval_subset_num_batches=1"]
    if seed is not None:
        overrides.append(f"seed={seed}")
    cfg = config_lib.load_config(config, overrides)
    md = str(cfg.max_duration)
    if not md.endswith("ep"):
        raise SystemExit(f"max_duration {md!r}: this benchmark needs a duration in epochs")
    n_epochs = int(md[:-2])
    d = cfg.data
    train, evals, info = make_loaders(d.name, d.batch_size, d.eval_batch_size, seed=cfg.seed, data_dir=d.data_dir)
    spe = len(train) if cfg.train_subset_num_batches < 0 else min(len(train), cfg.train_subset_num_batches)
    total = spe * n_epochs
    schedulers = [config_lib.build_component(s, config_lib.SCHEDULERS) for s in cfg.schedulers]
    from jaxcomposer.optim import compose_schedules
    import jax.numpy as jnp
    alpha = compose_schedules(schedulers, max_batches=total, steps_per_epoch=spe, ssr=cfg.scale_schedule_ratio)
    alphas = [float(a) for a in np.asarray(alpha(jnp.arange(total)))]
    opt = dict(cfg.optimizer)
    if opt.pop("name") != "decoupled_sgdw":
        raise SystemExit("this benchmark mirrors decoupled_sgdw only")
    algos = {k.lower(): (v or {}) for k, v in cfg.algorithms.items()}
    unknown = set(algos) - {"label_smoothing", "ema"}
    if unknown:
        raise SystemExit(f"the torch side mirrors label_smoothing and ema only, config also has {sorted(unknown)}")
    ema = None
    if "ema" in algos:
        e = algos["ema"]
        half, interval = str(e.get("half_life", "1000ba")), str(e.get("update_interval") or "1ba")
        if not (half.endswith("ba") and interval.endswith("ba")) or str(e.get("ema_start", "0.0dur")) not in (
                "0.0dur", "0dur", "0ba"):
            raise SystemExit("the torch EMA mirrors half_life/update_interval in 'ba' started at step 0 only")
        if int(interval[:-2]) != 1:
            raise SystemExit("the torch EMA mirrors update_interval '1ba' only")
        ema = {"half_life_batches": int(half[:-2]), "update_interval_batches": 1,
               "smoothing": 2.0 ** (-1.0 / int(half[:-2])) if int(half[:-2]) else 0.0}
    return {"cfg": cfg, "overrides": overrides, "epochs": n_epochs, "train": train, "evals": evals, "info": info,
            "steps_per_epoch": spe, "total_steps": total, "alphas": alphas, "optimizer": opt,
            "label_smoothing": float(algos.get("label_smoothing", {}).get("smoothing", 0.1))
            if "label_smoothing" in algos else 0.0, "ema": ema}


def rewind(s: dict) -> None:
    """Both sides start from epoch 0, batch 0 of the same (seeded) loaders, so they see the same batches."""
    for loader in (s["train"], s["evals"]):
        loader.set_state({"epoch": 0, "batch_index": 0})


def runner_module():
    """The module behind ``jaxcomposer.fit`` (``jaxcomposer.runner``; ``jaxcomposer.fit`` in older trees)."""
    import importlib
    for name in ("jaxcomposer.runner", "jaxcomposer.fit"):
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError:
            continue
        if hasattr(mod, "build_trainer"):
            return mod
    raise SystemExit("cannot find jaxcomposer's fit module (build_trainer)")


def normalization(info):
    return (info.mean, info.std) if getattr(info, "mean", None) is not None else None


# ---------------------------------------------------------------------------------------------------------------
# torch
def run_torch(s: dict):
    """Yields each epoch's record (own wall time, accuracy); returns the side's summary."""
    import torch
    import torch.nn.functional as F
    from jaxcomposer.data.datasets import normalize_images

    torch.set_num_threads(2)
    cfg, info = s["cfg"], s["info"]
    torch.manual_seed(cfg.seed)
    kwargs = {k: v for k, v in cfg.model.items() if k != "name"}
    model = torch_mirror(cfg.model["name"], {"num_classes": info.num_classes, "in_channels": info.input_shape[-1],
                                             **kwargs})
    n_params = sum(p.numel() for p in model.parameters())
    channels_last = s["torch_memory_format"] == "channels_last"
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    o = s["optimizer"]
    lr, wd = float(o["lr"]), float(o.get("weight_decay", 0.0))
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=float(o.get("momentum", 0.0)),
                          dampening=float(o.get("dampening", 0.0)), nesterov=bool(o.get("nesterov", False)),
                          weight_decay=0.0)
    params = [p for p in model.parameters()]
    ema_cfg = s["ema"]
    ema_model, ema_tensors, model_tensors = None, None, None
    norm = normalization(info)

    def to_input(x_uint8):
        x = normalize_images(x_uint8, *norm) if norm else x_uint8.astype(np.float32)
        # NHWC host memory viewed as NCHW: exactly torch's channels-last layout, no copy
        x = torch.from_numpy(x).permute(0, 3, 1, 2)
        return x if channels_last else x.contiguous()

    def evaluate(m) -> float:
        m.eval()
        correct = count = 0
        ev, sub = s["evals"], cfg.eval_subset_num_batches
        ev.set_state({"epoch": 0, "batch_index": 0})  # in order, from the start, every time
        with torch.no_grad():
            for i, b in enumerate(ev):
                if sub >= 0 and i >= sub:
                    break
                pred = m(to_input(b["input"])).argmax(-1)
                correct += int((pred == torch.from_numpy(b["target"]).long()).sum())
                count += len(b["target"])
        return correct / count

    train, spe, alphas = s["train"], s["steps_per_epoch"], s["alphas"]
    rewind(s)
    history, step, train_time, first_step_s, images, own_s = [], 0, 0.0, None, 0, 0.0
    for epoch in range(s["epochs"]):
        t_resume = time.perf_counter()
        model.train()
        train.set_epoch(epoch)
        t_ep = time.perf_counter()
        for i, b in enumerate(train):
            if i >= spe:
                break
            x, y = to_input(b["input"]), torch.from_numpy(b["target"]).long()
            a = alphas[step]
            loss = F.cross_entropy(model(x), y, label_smoothing=s["label_smoothing"])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            with torch.no_grad():
                if wd:
                    torch._foreach_mul_(params, 1.0 - a * wd)
                for g in opt.param_groups:
                    g["lr"] = lr * a
                opt.step()
                if ema_cfg is not None:
                    if ema_model is None:  # started from the weights after the first step
                        ema_model = copy.deepcopy(model)
                        ema_tensors = [t for t in list(ema_model.parameters()) + list(ema_model.buffers())
                                       if t.is_floating_point()]
                        model_tensors = [t for t in list(model.parameters()) + list(model.buffers())
                                         if t.is_floating_point()]
                    else:
                        torch._foreach_lerp_(ema_tensors, model_tensors, 1.0 - ema_cfg["smoothing"])
            step += 1
            images += len(y)
            if first_step_s is None:
                first_step_s = time.perf_counter() - t_ep
        train_time += time.perf_counter() - t_ep
        acc = evaluate(ema_model if ema_model is not None else model)
        own_s += time.perf_counter() - t_resume
        history.append({"epoch": epoch + 1, "accuracy": acc, "wall_s": own_s, "train_s_cumulative": train_time})
        yield history[-1]
    out = summarize("torch", history, images, train_time, first_step_s, s)
    out["num_params"] = n_params
    return out


# ---------------------------------------------------------------------------------------------------------------
# jaxcomposer
def run_jax(s: dict):
    """Yields each epoch's record (own wall time from fit's start, accuracy); returns the side's summary."""
    import jax
    from jaxcomposer.core.events import Callback
    cfg = s["cfg"]
    # as `jaxcomposer fit` runs: with the config's persistent compilation cache (a rerun loads the compiled steps)
    cache_dir = runner_module().use_compilation_cache(cfg.compilation_cache_dir)

    class Recorder(Callback):
        """Times the run; stops ``fit`` after each epoch's evaluation, so the other side's epoch can run between
        (the next ``fit()`` continues the same plan and compiled steps)."""

        def __init__(self):
            self.history, self.train_time, self.first_step_s, self.images, self.own_s = [], 0.0, None, 0, 0.0

        def fit_start(self, state, logger):
            self.t_resume = time.perf_counter()

        def epoch_start(self, state, logger):
            self.t_ep = time.perf_counter()

        def batch_end(self, state, logger):
            self.images += state.batch_size
            if self.first_step_s is None:
                jax.block_until_ready(state.train_state)
                self.first_step_s = time.perf_counter() - self.t_ep

        def epoch_end(self, state, logger):
            jax.block_until_ready(state.train_state)
            self.train_time += time.perf_counter() - self.t_ep

        def eval_end(self, state, logger):
            self.own_s += time.perf_counter() - self.t_resume
            self.history.append({"epoch": int(state.timestamp.epoch),
                                 "accuracy": float(state.eval_metrics["eval"]["MulticlassAccuracy"]),
                                 "wall_s": self.own_s, "train_s_cumulative": self.train_time})
            state.stop_training("benchmark: the other side's epoch runs next")

    # Built as jaxcomposer.fit builds it (runner.build_trainer), with the recorder as the only callback, no loggers
    rec = Recorder()
    t_build = time.perf_counter()
    trainer, _ = runner_module().build_trainer(cfg, callbacks=[rec], loggers=[])
    build_s = time.perf_counter() - t_build
    if trainer.total_steps != s["total_steps"]:
        raise SystemExit(f"schedule length mismatch: trainer {trainer.total_steps}, torch side {s['total_steps']}")
    for epoch in range(s["epochs"]):
        trainer.fit()
        if len(rec.history) != epoch + 1:
            raise SystemExit(f"jaxcomposer side: expected one evaluation per epoch, got {len(rec.history)} after "
                             f"epoch {epoch + 1}")
        yield rec.history[-1]
    out = summarize("jaxcomposer", rec.history, rec.images, rec.train_time, rec.first_step_s, s)
    out["trainer_build_s"] = round(build_s, 3)
    out["compilation_cache_dir"] = cache_dir
    out["xla_cpu_threads"] = s["xla_cpu_threads"]
    out["num_params"] = int(sum(x.size for x in jax.tree_util.tree_leaves(trainer.state.train_state.params)))
    return out


# ---------------------------------------------------------------------------------------------------------------
def summarize(name, history, images, train_time, first_step_s, s) -> dict:
    bs = s["cfg"].data.batch_size
    hit = next((h for h in history if h["accuracy"] >= TARGET_ACC), None)
    steady_t = train_time - (first_step_s or 0.0)
    return {"side": name, "epochs": [{k: round(v, 4) if isinstance(v, float) else v for k, v in h.items()}
                                     for h in history],
            "final_accuracy": history[-1]["accuracy"] if history else None,
            "total_wall_s": round(history[-1]["wall_s"], 3) if history else None,
            "train_images": images, "train_s": round(train_time, 3),
            "images_per_s": round(images / train_time, 1) if train_time else None,
            "images_per_s_after_first_step": round((images - bs) / steady_t, 1) if steady_t > 0 and images > bs
            else None,
            "first_step_s": round(first_step_s, 3) if first_step_s is not None else None,
            f"time_to_{int(TARGET_ACC * 100)}pct_s": round(hit["wall_s"], 3) if hit else None,
            f"epoch_to_{int(TARGET_ACC * 100)}pct": hit["epoch"] if hit else None}


def torch_in_subprocess(args, seed):
    """The torch side in a child process (this script with ``--torch-worker``), one epoch per request: while
    one side trains, the other process sleeps on a pipe, so neither runtime's threads compete with the other's."""
    import json
    import subprocess
    cmd = [sys.executable, __file__, "--torch-worker", "--config", args.config,
           "--torch-memory-format", args.torch_memory_format]
    cmd += (["--epochs", str(args.epochs)] if args.epochs is not None else []) + (["--smoke"] if args.smoke else [])
    cmd += ["--seeds", str(seed)] if seed is not None else []
    child = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        while True:
            child.stdin.write("next\n")
            child.stdin.flush()
            line = child.stdout.readline()
            if not line:
                raise SystemExit(f"the torch worker ended early (exit code {child.wait()})")
            reply = json.loads(line)
            if "summary" in reply:
                return reply["summary"]
            yield reply["epoch"]
    finally:
        child.stdin.close()
        child.wait(timeout=60)


def torch_worker(args) -> int:
    """``--torch-worker``: answer each line on stdin with the next epoch's record (a JSON line), then the summary."""
    import json
    s = load_setup(args.config, args.epochs, args.smoke, args.seeds[0] if args.seeds else None)
    s["torch_memory_format"] = args.torch_memory_format
    epochs = run_torch(s)
    for _ in sys.stdin:
        try:
            reply = {"epoch": next(epochs)}
        except StopIteration as done:
            reply = {"summary": done.value}
        print(json.dumps(reply), flush=True)
        if "summary" in reply:
            return 0
    return 0


def interleaved(sides: dict) -> dict:
    """Run the sides' epoch generators in turns, the first side alternating by epoch; each side's summary."""
    results, live, turn = {}, dict(sides), 0
    while live:
        for name in (list(live) if turn % 2 == 0 else list(reversed(live))):
            try:
                next(live[name])
            except StopIteration as done:
                results[name] = done.value
                del live[name]
        turn += 1
    return results


def _median(values):
    values = [v for v in values if v is not None]
    return round(float(np.median(values)), 4) if values else None


def print_run(run: dict, s: dict, smoke: bool) -> None:
    sides, names = run["sides"], list(run["sides"])
    key = f"time_to_{int(TARGET_ACC * 100)}pct_s"
    print(f"\n{NAME}: {s['info'].name}, seed {run['seed']}, {s['epochs']} epoch(s) x {s['steps_per_epoch']} steps, "
          f"batch {s['cfg'].data.batch_size}{'  [SMOKE]' if smoke else ''}")
    print(f"{'epoch':>5} " + " ".join(f"{n + ' acc':>16} {n + ' wall s':>18}" for n in names))
    for e in range(s["epochs"]):
        row = []
        for n in names:
            h = next((h for h in sides[n]["epochs"] if h["epoch"] == e + 1), None)
            row.append(f"{fmt(h and h['accuracy'], '.4f'):>16} {fmt(h and h['wall_s'], '.1f'):>18}")
        print(f"{e + 1:>5} " + " ".join(row))
    print(f"{'':>5} " + " ".join(f"{n:>35}" for n in names))
    for label, k, spec in (("train img/s", "images_per_s", ".1f"),
                           ("img/s excl. 1st step", "images_per_s_after_first_step", ".1f"),
                           ("first step s", "first_step_s", ".2f"),
                           ("params", "num_params", "d"),
                           (f"time to {TARGET_ACC:.0%} s", key, ".1f"),
                           ("total wall s", "total_wall_s", ".1f"),
                           ("final acc", "final_accuracy", ".4f")):
        print(f"{label:<21}" + "".join(f"{fmt(sides[n][k], spec):>20}" for n in names))


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "configs" / "quickstart.yaml"))
    ap.add_argument("--epochs", type=int, default=None, help="default: the config's max_duration")
    ap.add_argument("--only", choices=["torch", "jax"], default=None)
    ap.add_argument("--torch-memory-format", choices=["channels_last", "contiguous"], default="channels_last")
    ap.add_argument("--seeds", type=int, nargs="*", default=None, help="run the comparison once per seed (default: "
                                                                        "the config's seed); medians are reported")
    ap.add_argument("--smoke", action="store_true", help="2 epochs of 5 batches, 1 eval batch: checks the script")
    ap.add_argument("--out", default=None, help=f"default: benchmarks/results/{NAME}[.smoke].json")
    ap.add_argument("--torch-worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.torch_worker:
        return torch_worker(args)
    args.out = results_path(NAME, args.smoke, args.out)
    # this process as `jaxcomposer fit` prepares its own, before anything here starts JAX (XLA:CPU's threads)
    from jaxcomposer import config as config_lib
    threads_note = runner_module().prepare_process(config_lib.load_config(args.config, []))

    key = f"time_to_{int(TARGET_ACC * 100)}pct_s"
    runs = []
    for seed in args.seeds or [None]:
        s = load_setup(args.config, args.epochs, args.smoke, seed)
        s["torch_memory_format"], s["xla_cpu_threads"] = args.torch_memory_format, threads_note
        sides = {}
        if args.only in (None, "torch"):
            sides["torch"] = torch_in_subprocess(args, seed)
        if args.only in (None, "jax"):
            sides["jaxcomposer"] = run_jax(s)
        runs.append({"seed": s["cfg"].seed, "sides": interleaved(sides)})
        print_run(runs[-1], s, args.smoke)

    cfg = s["cfg"]
    medians = {n: {k: _median([r["sides"][n][k] for r in runs])
                   for k in ("images_per_s_after_first_step", "first_step_s", key, "final_accuracy")}
               for n in runs[0]["sides"]}
    out = {"benchmark": NAME, "smoke": args.smoke, "machine": machine_facts(),
           "setup": {"config": os.path.relpath(args.config, ROOT), "overrides": s["overrides"][:-1] if args.seeds
                     else s["overrides"], "seeds": [r["seed"] for r in runs],
                     "data": s["info"].name, "data_fallback": s["info"].fallback_note,
                     "model": cfg.model, "batch_size": cfg.data.batch_size, "eval_batch_size": cfg.data.eval_batch_size,
                     "epochs": s["epochs"], "steps_per_epoch": s["steps_per_epoch"], "total_steps": s["total_steps"],
                     "optimizer": cfg.optimizer, "schedulers": cfg.schedulers, "label_smoothing": s["label_smoothing"],
                     "ema": s["ema"], "eval": "after every epoch, with EMA weights on both sides",
                     "schedule": "torch in a child process; the sides' epochs alternate (who goes first alternates by "
                                 "epoch), so the machine's drift lands on both; each side's wall time counts its own "
                                 "epochs only",
                     "torch": f"torch.set_num_threads(2), NCHW tensors, memory format {args.torch_memory_format}, "
                              "eager (no torch.compile)",
                     "jax": "Trainer on the default device(s), fp32, progress bar and loggers off",
                     "known_differences": ["BN running variance: torch keeps the unbiased batch variance, flax the "
                                           "biased one", "weight init draws differ (same distributions)"]},
           "target_accuracy": TARGET_ACC, "medians_over_seeds": medians, "runs": runs}
    write_json(args.out, out)

    if len(runs) > 1:
        print(f"\nmedians over seeds {[r['seed'] for r in runs]}:")
        for label, k, spec in (("img/s excl. 1st step", "images_per_s_after_first_step", ".1f"),
                               ("first step s", "first_step_s", ".2f"), (f"time to {TARGET_ACC:.0%} s", key, ".1f"),
                               ("final acc", "final_accuracy", ".4f")):
            print(f"{label:<21}" + "".join(f"{fmt(medians[n][k], spec):>20}" for n in medians))
    print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
