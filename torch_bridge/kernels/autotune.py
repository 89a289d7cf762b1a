"""oneDNN's or XLA's convolution, chosen per shape by a measurement at the first trace (``cudnn.benchmark``'s idea).

Which of the two is faster depends on the CPU (its vector ISA above all), the shape, and the part of the
convolution: oneDNN usually wins the forward and the kernel gradient of small CNNs, by more on CPUs without AVX-512,
while a single-channel stem's input gradient (never needed: its input is the data) is slow on oneDNN. A fixed default
is wrong somewhere, so ``conv_impl='auto'`` (the models' default) and the bridge's convolutions call
:func:`conv_general_dilated` here: the first time a convolution of a given shape is traced it times its forward,
its input gradient and its kernel gradient on both implementations (each jitted alone on random operands,
alternated, best of a few rounds) and runs each part on the faster; mixed parts join in a ``custom_vjp``. The
choice is remembered in the process and on disk, so later runs on the same machine trace without measuring.

The cache is one JSON file per machine fingerprint (CPU model and flags, ISA caps, cores, thread settings, jax and
torch versions) under ``$JAXCOMPOSER_CONV_AUTOTUNE_CACHE`` (default ``<kernel cache>/../conv_autotune``, i.e.
``~/.cache/jaxcomposer/conv_autotune``). Processes sharing it measure each shape once: a file lock is held while
measuring and writing, and an entry already written is always what later processes take.

``JAXCOMPOSER_CONV_AUTOTUNE`` pins the choice instead: ``xla`` or ``onednn`` for every automatic convolution (runs
that must not depend on a timing, tests); unset or ``measure`` measures. Where oneDNN cannot run a convolution
(``kernels._plan`` declines it, or the backend is not the CPU) XLA's is used without measuring.
"""
from __future__ import annotations

import concurrent.futures
import fcntl
import functools
import hashlib
import json
import os
import platform
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import jax
import numpy as np
from jax import lax

from torch_bridge import kernels

POLICY_ENV = "JAXCOMPOSER_CONV_AUTOTUNE"
CACHE_ENV = "JAXCOMPOSER_CONV_AUTOTUNE_CACHE"
POLICIES = ("measure", "xla", "onednn")
IMPLS = ("onednn", "xla")
PARTS = ("forward", "input_grad", "kernel_grad")
# Per implementation: a few rounds of at least this long each, best round kept (timing noise from the other
# threads of a busy machine only ever adds time).
ROUND_S = 0.02
ROUNDS = 3


@dataclass(frozen=True)
class Choice:
    """What each part of a convolution runs on (``'onednn'`` or ``'xla'``): its forward, its input gradient and its
    kernel gradient, and why: ``measured`` here, read from the ``cached`` file, or ``pinned`` by
    ``JAXCOMPOSER_CONV_AUTOTUNE``. ``ms``: per part, each implementation's milliseconds (None when pinned)."""
    forward: str
    input_grad: str
    kernel_grad: str
    ms: dict | None = None
    source: str = "measured"

    @property
    def parts(self) -> tuple[str, str, str]:
        return self.forward, self.input_grad, self.kernel_grad

    @property
    def uses_onednn(self) -> bool:
        return "onednn" in self.parts

    @classmethod
    def pinned(cls, impl: str) -> "Choice":
        return cls(impl, impl, impl, source="pinned")


@dataclass(frozen=True)
class ConvSpec:
    """One convolution as traced: operand shapes and dtype, and ``lax.conv_general_dilated``'s keywords."""
    lhs_shape: tuple
    rhs_shape: tuple
    dtype: str
    params: tuple  # (window_strides, padding, lhs_dilation, rhs_dilation, dimension_numbers, groups, batch_groups)

    @property
    def key(self) -> str:
        strides, padding, _, dilation, dn, groups, _ = self.params
        return (f"{self.dtype} lhs={list(self.lhs_shape)} rhs={list(self.rhs_shape)} dn={dn} stride={list(strides)} "
                f"pad={[list(p) for p in padding]} dilation={list(dilation or (1, 1))} groups={groups}")

    def call(self, impl: str, lhs, rhs):
        strides, padding, lhs_dil, rhs_dil, dn, groups, batch_groups = self.params
        conv = kernels.conv_general_dilated if impl == "onednn" else lax.conv_general_dilated
        return conv(lhs, rhs, strides, padding, lhs_dil, rhs_dil, dn, groups, batch_groups)


def _part(spec: ConvSpec, impl: str, part: str):
    """``part`` of ``spec`` on ``impl`` alone, jitted: a gradient's jitted function computes no forward (XLA drops
    the unused value)."""
    conv = functools.partial(spec.call, impl)

    def run(lhs, rhs, dy):
        if part == "forward":
            return conv(lhs, rhs)
        if part == "input_grad":
            return jax.vjp(lambda x: conv(x, rhs), lhs)[1](dy)[0]
        return jax.vjp(lambda w: conv(lhs, w), rhs)[1](dy)[0]
    return jax.jit(run)


def measure(spec: ConvSpec) -> Choice:
    """Each part's best time on both implementations, alternated round by round, and the faster per part (oneDNN
    on a tie). Parts are timed apart because a step does not always need all three (the first layer's input
    gradient is never used), and either implementation can win any of them. Runs on a thread of its own: a
    convolution is chosen while the step that holds it is being traced, and JAX runs calls eagerly only outside the
    tracing thread."""
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="conv-autotune") as pool:
        return pool.submit(_measure_here, spec).result()


def _measure_here(spec: ConvSpec) -> Choice:
    rng = np.random.default_rng(0)
    dtype = jax.numpy.dtype(spec.dtype)
    lhs = rng.standard_normal(spec.lhs_shape, np.float32).astype(dtype)
    rhs = rng.standard_normal(spec.rhs_shape, np.float32).astype(dtype)
    out = jax.eval_shape(functools.partial(spec.call, "xla"), lhs, rhs)
    dy = rng.standard_normal(out.shape, np.float32).astype(dtype)
    lhs, rhs, dy = jax.device_put((lhs, rhs, dy))  # once: a transfer per call would be timed with each part
    chosen, ms = [], {}
    for part in PARTS:
        runs = {impl: _part(spec, impl, part) for impl in IMPLS}
        reps = {}
        for impl, run in runs.items():  # compile and warm up; size each round to ROUND_S
            jax.block_until_ready(run(lhs, rhs, dy))
            start = time.perf_counter()
            jax.block_until_ready(run(lhs, rhs, dy))
            reps[impl] = max(1, min(1000, int(ROUND_S / max(time.perf_counter() - start, 1e-6))))
        best = {impl: float("inf") for impl in IMPLS}
        for _ in range(ROUNDS):
            for impl, run in runs.items():
                start = time.perf_counter()
                for _ in range(reps[impl]):
                    result = run(lhs, rhs, dy)
                jax.block_until_ready(result)
                best[impl] = min(best[impl], (time.perf_counter() - start) / reps[impl])
        chosen.append("onednn" if best["onednn"] <= best["xla"] else "xla")
        ms[part] = {impl: round(t * 1e3, 4) for impl, t in best.items()}
    kernels.release_openmp_team()
    return Choice(*chosen, ms=ms)


def fingerprint() -> dict:
    """What a measurement depends on besides the shape: the CPU, what caps its ISA, the threads, the versions."""
    env = {name: os.environ.get(name) for name in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY",
                                                     "PJRT_NPROC", "NPROC", "OMP_NUM_THREADS")}
    env["XLA_FLAGS"] = " ".join(f for f in os.environ.get("XLA_FLAGS", "").split() if "isa" in f) or None
    return {**_machine(), "env": env}


@functools.cache
def _machine() -> dict:
    """The fingerprint's fixed part, read once per process (every traced convolution asks for its cache file)."""
    import importlib.metadata as md
    cpu = {"model": platform.processor() or platform.machine(), "flags": ""}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            name, _, value = line.partition(":")
            if name.strip() == "model name":
                cpu["model"] = value.strip()
            elif name.strip() == "flags":
                cpu["flags"] = " ".join(sorted(f for f in value.split() if f.startswith(("avx", "amx", "fma"))))
                break
    except OSError:
        pass
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count()
    return {"cpu": cpu, "cores": cores, "versions": {name: md.version(name) for name in ("jax", "jaxlib", "torch")}}


class ConvAutotuner:
    """Choices per convolution shape: in memory, then in the cache file ``path`` (None: memory only), else from
    ``measure``. ``choices`` holds every choice this process made or read, in order."""

    def __init__(self, path: Path | None, measure=measure, policy: str = "measure"):
        if policy not in POLICIES:
            raise ValueError(f"{POLICY_ENV}={policy!r}: expected one of {POLICIES} (unset measures)")
        self.path, self.policy, self._measure = path, policy, measure
        self.choices: dict[str, Choice] = {}
        self.traced: list[str] = []  # the key of every convolution traced, in order (``summary(since=...)``)
        self._lock = threading.Lock()

    def choose(self, spec: ConvSpec) -> Choice:
        with self._lock:
            if spec.key not in self.choices:
                self.choices[spec.key] = (Choice.pinned(self.policy) if self.policy != "measure"
                                          else self._from_file_or_measured(spec))
            self.traced.append(spec.key)
            return self.choices[spec.key]

    def _from_file_or_measured(self, spec: ConvSpec) -> Choice:
        if self.path is None:
            return self._measure(spec)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one measurer per shape among the processes sharing the file
            entries = self._read()
            try:
                return Choice(**{**entries[spec.key], "source": "cached"})
            except (KeyError, TypeError):  # not measured yet, or written in another format: measure it now
                pass
            choice = self._measure(spec)
            entries[spec.key] = {k: v for k, v in asdict(choice).items() if k != "source"}
            tmp = self.path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps({"fingerprint": fingerprint(), "choices": entries}, indent=1))
            os.replace(tmp, self.path)  # readers never see a partial file
            return choice

    def _read(self) -> dict:
        try:
            return json.loads(self.path.read_text()).get("choices", {})
        except (OSError, ValueError):  # absent, or unreadable: measure again and rewrite it
            return {}

    def summary(self, since: int = 0) -> str | None:
        """The choices of the convolutions traced since ``len(traced)`` was ``since``, in words: how many shapes run
        each part on oneDNN, and how that was decided. None when none was traced."""
        chosen = [self.choices[k] for k in dict.fromkeys(self.traced[since:])]
        if not chosen:
            return None
        sources = {s: sum(c.source == s for c in chosen) for s in ("measured", "cached", "pinned")}
        how = ", ".join(f"{n} {s}" for s, n in sources.items() if n)
        if self.policy != "measure":
            how += f" by {POLICY_ENV}"
        elif self.path is not None:
            how += f"; cache {self.path}"
        onednn = [sum(c.parts[i] == "onednn" for c in chosen) for i in range(3)]
        return (f"oneDNN for {onednn[0]} forward, {onednn[1]} input-gradient and {onednn[2]} kernel-gradient "
                f"convolutions of {len(chosen)} shapes, XLA for the rest ({how})")


def cache_path() -> Path:
    """The cache file for this machine's fingerprint."""
    directory = os.environ.get(CACHE_ENV) or str(kernels.cache_dir().parent / "conv_autotune")
    digest = hashlib.sha256(json.dumps(fingerprint(), sort_keys=True).encode()).hexdigest()[:16]
    return Path(directory).expanduser() / f"{digest}.json"


@functools.cache
def _tuner(policy: str, path: Path) -> ConvAutotuner:
    return ConvAutotuner(path, policy=policy)


def default_tuner() -> ConvAutotuner:
    """The process's tuner for the current ``JAXCOMPOSER_CONV_AUTOTUNE`` and cache: one per (policy, file), so the
    choices stay fixed for the process's life."""
    return _tuner(os.environ.get(POLICY_ENV) or "measure", cache_path())


def choice(lhs, rhs, window_strides, padding, lhs_dilation=None, rhs_dilation=None, dimension_numbers=None,
           feature_group_count=1, batch_group_count=1, preferred_element_type=None, out_sharding=None) -> Choice | None:
    """What this convolution's parts run on, as measured (or cached, or pinned) for its shape; None (XLA's, without
    measuring) where oneDNN cannot run it."""
    plan = kernels._plan(lhs, rhs, window_strides, padding, lhs_dilation, rhs_dilation, dimension_numbers,
                         feature_group_count, batch_group_count, preferred_element_type)
    if plan is None or out_sharding is not None or not kernels.available():
        return None
    extra, (strides, symmetric, dilation, groups), _, layout = plan
    pads = tuple((s + lo, s + hi) for s, (lo, hi) in zip(symmetric, extra))
    spec = ConvSpec(tuple(lhs.shape), tuple(rhs.shape), jax.numpy.dtype(lhs.dtype).name,
                    (strides, pads, None, dilation, _dn_names(layout), groups, 1))
    return default_tuner().choose(spec)


def conv_general_dilated(lhs, rhs, window_strides, padding, lhs_dilation=None, rhs_dilation=None,
                         dimension_numbers=None, feature_group_count=1, batch_group_count=1, precision=None,
                         preferred_element_type=None, out_sharding=None):
    """``lax.conv_general_dilated``'s signature and result; its forward and each gradient on oneDNN or XLA, as
    measured for this shape."""
    args = (window_strides, padding, lhs_dilation, rhs_dilation, dimension_numbers, feature_group_count,
            batch_group_count, precision, preferred_element_type)
    chosen = choice(lhs, rhs, *args[:7], preferred_element_type=preferred_element_type, out_sharding=out_sharding)
    return convolve(chosen, lhs, rhs, *args, out_sharding=out_sharding)


def convolve(chosen: Choice | None, lhs, rhs, window_strides, padding, lhs_dilation=None, rhs_dilation=None,
             dimension_numbers=None, feature_group_count=1, batch_group_count=1, precision=None,
             preferred_element_type=None, out_sharding=None):
    """The convolution with each part where ``chosen`` says (None: all on XLA): callers that looked at the
    :func:`choice` first (the bridge, which has a path of its own for XLA's depthwise convolutions) run it here."""
    args = (window_strides, padding, lhs_dilation, rhs_dilation, dimension_numbers, feature_group_count,
            batch_group_count, precision, preferred_element_type)
    impls = {"onednn": lambda x, w: kernels.conv_general_dilated(x, w, *args),
             "xla": lambda x, w: lax.conv_general_dilated(x, w, *args, out_sharding=out_sharding)}
    parts = ("xla",) * 3 if chosen is None else chosen.parts
    if len(set(parts)) == 1:
        return impls[parts[0]](lhs, rhs)
    forward, input_grad, kernel_grad = (impls[p] for p in parts)

    @jax.custom_vjp
    def conv(x, w):
        return forward(x, w)

    def conv_fwd(x, w):
        return forward(x, w), (x, w)

    def conv_bwd(residuals, dy):
        x, w = residuals
        # each gradient's own forward is unused, so XLA drops it; an unused gradient (the image's) is dropped too
        return (jax.vjp(lambda x: input_grad(x, w), x)[1](dy)[0], jax.vjp(lambda w: kernel_grad(x, w), w)[1](dy)[0])

    conv.defvjp(conv_fwd, conv_bwd)
    return conv(lhs, rhs)


def _dn_names(layout: str) -> tuple:
    return ("NHWC", "HWIO", "NHWC") if layout == "NHWC" else ("NCHW", "OIHW", "NCHW")
