"""What the benchmark scripts share: the machine facts recorded beside every result, where results are written, the
ResNet-8 workload config, the input batches, and the pieces of the Trainer-vs-something throughput harnesses."""
from __future__ import annotations

import datetime
import json
import os
import platform
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def host_facts(**extra) -> dict:
    """CPU, platform, library versions, load and date, without importing JAX (for a parent that only watches a
    child process); ``extra`` adds script-specific facts."""
    from importlib import metadata

    def version(dist: str):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    facts = {
        "cpu_count": os.cpu_count(),
        "sched_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "platform": platform.platform(), "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(), "cpu": cpu_facts(),
        **{name: version(name) for name in ("jax", "jaxlib", "flax", "optax", "torch", "jaxcomposer")},
        "loadavg_1_5_15": [round(x, 2) for x in os.getloadavg()],
        # the allocator changes step times (jemalloc's default returns large blocks to the system at once)
        "allocator": {name: os.environ.get(name) for name in ("LD_PRELOAD", "MALLOC_CONF")},
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
    }
    return {**facts, **extra}


def cpu_facts() -> dict:
    """The CPU's model and vector ISA class (AVX2, AVX-512, AVX-512 with bf16), and any ISA cap in the environment:
    the same code runs up to several times faster or slower across these, so an absolute time names them."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            name, _, value = line.partition(":")
            if name.strip() == "model name":
                model = value.strip()
            elif name.strip() == "flags":
                flags = set(value.split())
                break
    except OSError:
        pass
    isa = ("AVX-512 with bf16" if "avx512_bf16" in flags else "AVX-512" if "avx512f" in flags
           else "AVX2" if "avx2" in flags else "older than AVX2" if flags else "unknown")
    caps = {name: os.environ[name] for name in ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY") if name in os.environ}
    xla_caps = [f for f in os.environ.get("XLA_FLAGS", "").split() if "max_isa" in f]
    if xla_caps:
        caps["XLA_FLAGS"] = " ".join(xla_caps)
    return {"model": model, "isa": isa, "isa_caps": caps}


def machine_facts(**extra) -> dict:
    """:func:`host_facts` plus the JAX backend and devices; ``extra`` adds script-specific facts."""
    import jax
    return host_facts(jax_backend=jax.default_backend(), jax_devices=[str(d) for d in jax.devices()], **extra)


def results_path(name: str, smoke: bool, out: str | None = None) -> Path:
    """``--out`` when given, else ``benchmarks/results/<name>.json`` (``<name>.smoke.json`` for a smoke run, which
    git ignores, so checking a script never overwrites a measured result)."""
    return Path(out) if out else RESULTS / f"{name}{'.smoke' if smoke else ''}.json"


def write_json(path: Path | str, obj: dict, indent: int = 2) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=indent) + "\n")


def add_round_args(ap, warmup_help: str) -> None:
    """``--config`` (the ResNet-8 workload by default), ``--steps``, ``--rounds``, ``--warmup``: the interleaved-rounds
    options of the throughput benchmarks."""
    ap.add_argument("--config", default=str(ROOT / "configs" / "resnet8_fashion_mnist.yaml"))
    ap.add_argument("--steps", type=int, default=100, help="steps per timed round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=10, help=warmup_help)


def load_benchmark_config(path: Path | str) -> dict:
    """``configs/resnet8_fashion_mnist.yaml`` (or another config) as the throughput benchmarks use it: ``model``
    kwargs (without ``name``), ``model_name``, ``batch_size``, ``optimizer`` kwargs of its ``decoupled_sgdw``
    (without ``name``), ``seed`` and ``steps_per_execution``."""
    import yaml

    path = Path(path)
    cfg = yaml.safe_load(path.read_text())
    opt = dict(cfg["optimizer"])
    if opt.pop("name") != "decoupled_sgdw":
        raise SystemExit(f"{path}: this benchmark expects optimizer.name decoupled_sgdw")
    return {"model": {k: v for k, v in cfg["model"].items() if k != "name"}, "model_name": cfg["model"]["name"],
            "batch_size": int(cfg["data"]["batch_size"]), "optimizer": opt, "seed": int(cfg.get("seed", 0)),
            "steps_per_execution": int(cfg.get("steps_per_execution", 1))}


def threads_as_fit_sets(q: dict) -> str:
    """XLA:CPU's thread pool as ``jaxcomposer fit`` sets it for this model (``jaxcomposer.core.cpu_threads``), before
    the script's first JAX array; the decision in words, for the JSON."""
    from jaxcomposer.core import cpu_threads
    return cpu_threads.one_xla_thread_for_onednn(q["model"])


def torch_model_kwargs(model_kwargs: dict) -> dict:
    """A jaxcomposer model's kwargs for its torch mirror: ``conv_impl`` picks JAX's convolution kernels, not the model."""
    return {k: v for k, v in model_kwargs.items() if k != "conv_impl"}


def torch_mirror(model_name: str, model_kwargs: dict):
    """A config's model (``model.name`` and its kwargs, ``num_classes`` and ``in_channels`` included) as its torch
    mirror from ``torch_bridge.mirrors``: the same layers and init distributions."""
    from torch_bridge.mirrors import TorchConvNet, TorchResNetCIFAR

    mirrors = {"resnet_cifar": TorchResNetCIFAR, "convnet": TorchConvNet}
    if model_name not in mirrors:
        raise SystemExit(f"model.name {model_name!r}: this benchmark has torch mirrors for {sorted(mirrors)} only")
    return mirrors[model_name](**torch_model_kwargs(model_kwargs))


def fashion_mnist_batches(batch_size: int, count: int, seed: int) -> tuple[list[dict], str]:
    """``count`` host batches ``{'input': float32 (B,28,28,1) normalized, 'target': int32 (B,)}`` (NHWC), from
    Fashion-MNIST when installed, else random data of its shape; also says which."""
    import numpy as np

    from jaxcomposer.data import (FASHION_MNIST_MEAN, FASHION_MNIST_STD, fashion_mnist_available,
                                  load_fashion_mnist, normalize_images)

    rng = np.random.default_rng(seed)
    if fashion_mnist_available():
        train = load_fashion_mnist("train")
        idx = rng.permutation(len(train["target"]))[: batch_size * count]
        x, y = train["input"][idx], train["target"][idx].astype(np.int32)
        source = "fashion_mnist (real, /usr/share/datasets/fashion-mnist)"
    else:
        x = rng.integers(0, 256, (batch_size * count, 28, 28, 1), dtype=np.uint8)
        y = rng.integers(0, 10, (batch_size * count,), dtype=np.int32)
        source = "random uint8 data of Fashion-MNIST's shape (dataset not installed)"
    x = normalize_images(x, FASHION_MNIST_MEAN, FASHION_MNIST_STD)
    return [{"input": np.ascontiguousarray(x[i * batch_size:(i + 1) * batch_size]),
             "target": np.ascontiguousarray(y[i * batch_size:(i + 1) * batch_size])} for i in range(count)], source


class CyclingLoader:
    """``steps`` batches per epoch, cycling through a shared pool of numpy batches."""

    def __init__(self, pool: list[dict], steps: int):
        self.pool, self.steps, self.offset = pool, steps, 0

    def __len__(self):
        return self.steps

    def set_state(self, state: dict) -> None:
        # The Trainer seeks here at every fit(): batches its prefetcher read ahead before the last stop are served
        # again, so a Trainer side trains on exactly the batch sequence of a side that cycles the pool by hand.
        self.offset = state["epoch"] * self.steps + state["batch_index"]

    def __iter__(self):
        for i in range(self.offset, self.offset + self.steps - self.offset % self.steps):
            yield self.pool[i % len(self.pool)]


def pause_callback():
    """A callback whose ``at`` attribute stops ``fit()`` after that batch without touching the run's plan, so a
    benchmark times one long run in chunks with one compiled step (``fit(duration=...)`` would re-plan the run
    and compile again)."""
    from jaxcomposer import Callback

    class PauseAt(Callback):
        at = 0

        def batch_end(self, state, logger):
            if state.timestamp.batch >= self.at:
                state.stop_training("benchmark: chunk done")

    return PauseAt()


class TrainerSide:
    """A ``Trainer`` (built from these keyword arguments) trained ``n`` more batches at a time, timed: one side of
    an interleaved comparison."""

    def __init__(self, **trainer_kwargs):
        from jaxcomposer import Trainer

        self.pause = pause_callback()
        callbacks = list(trainer_kwargs.pop("callbacks", None) or [])
        self.trainer, self.done = Trainer(callbacks=callbacks + [self.pause], **trainer_kwargs), 0

    def run(self, n: int) -> float:
        """Train ``n`` more batches; returns seconds (ends synced)."""
        import jax

        self.done += n
        self.pause.at = self.done
        t0 = time.perf_counter()
        self.trainer.fit()
        jax.block_until_ready(self.trainer.state.train_state)
        return time.perf_counter() - t0

    @property
    def last_loss(self) -> float:
        return float(self.trainer.state.batch_metrics["loss"])
