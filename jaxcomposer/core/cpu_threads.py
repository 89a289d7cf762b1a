"""XLA:CPU's thread pool beside oneDNN's OpenMP team: one XLA thread where the two would fight over few cores.

A model built with ``conv_impl='onednn'`` (or ``'auto'``, which may choose it) runs its convolutions through ATen,
whose OpenMP team holds one thread per core and keeps them spinning for a while after every convolution (spinning is
what makes its next parallel region start at once). Between convolutions XLA:CPU runs the step's other kernels on
its own pool, also one thread per core. On a small machine the two then share the cores: XLA's threads run beside a
spinning OpenMP thread, and the kernel scheduler hands each a time slice. On a small machine the spinning takes a
large share of the process's CPU, and one XLA thread makes the steps faster (``benchmarks/README.md``, "One XLA:CPU
thread beside oneDNN"). Making OpenMP spin less (``GOMP_SPINCOUNT``, ``OMP_WAIT_POLICY=passive``) is slower still:
the convolutions' own barriers need the spinning.

XLA reads the pool's size once, from ``PJRT_NPROC``, when it creates its CPU client (the first array, compile or
device query of the process), so this can only be arranged before that: ``jaxcomposer fit`` and
``jaxcomposer.fit(config)`` do it for configs whose model uses oneDNN. A script that builds such a model itself sets
``PJRT_NPROC=1`` in its environment (or calls :func:`one_xla_thread_for_onednn` before its first JAX array). A value
the user set (``PJRT_NPROC`` or XLA's other spelling, ``NPROC``) is always kept.

It applies up to :data:`MAX_CORES` usable cores, as only small machines were measured; on a larger machine XLA's
elementwise kernels would lose more from running on one thread, and that trade is unmeasured.
"""
from __future__ import annotations

import os
from typing import Any, Mapping

from jaxcomposer.core import adapters

ENV = "PJRT_NPROC"
MAX_CORES = 4  # the largest machine the single XLA thread is chosen for (the module's docstring says why)


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask, which containers and ``taskset`` narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def jax_backend_started() -> bool:
    """Whether this process has created its JAX backends already (after which their thread pools are fixed)."""
    from jax._src import xla_bridge  # no public query; the dict is filled when the first backend is created
    # a JAX without the dict: say not started (setting the variable after the start only has no effect)
    return bool(getattr(xla_bridge, "_backends", None))


# the config models built with ``conv_impl`` (default 'auto'), and what 'auto' needs to be able to pick oneDNN
CONV_MODELS = ("convnet", "resnet_cifar", "resnet")


def uses_onednn_convolutions(model: Mapping[str, Any]) -> bool:
    """A config's ``model`` section may run oneDNN's convolutions: ``conv_impl: onednn``, or ``auto`` (the default)
    where the torch adapter is installed. An ``auto`` model whose shapes all measure faster on XLA then runs on one
    XLA thread too; its measurement was made on that thread, so the choice is right for the process it runs in."""
    impl = model.get("conv_impl", "auto" if model.get("name") in CONV_MODELS else None)
    return impl == "onednn" or (impl == "auto" and adapters.installed("torch"))


def one_xla_thread_for_onednn(model: Mapping[str, Any]) -> str:
    """Sets ``PJRT_NPROC=1`` for a model with oneDNN convolutions on a machine of at most :data:`MAX_CORES` cores,
    when nobody set the pool size and JAX's backends do not exist yet. Returns what it did, or why not, in words
    (benchmarks record it)."""
    if not uses_onednn_convolutions(model):
        return "XLA's default pool (the model has no oneDNN convolutions)"
    for name in (ENV, "NPROC"):
        if name in os.environ:
            return f"{name}={os.environ[name]} (set in the environment, kept)"
    cores = usable_cores()
    if cores > MAX_CORES:
        return f"XLA's default pool ({cores} cores: more than the {MAX_CORES} a single XLA thread is chosen for)"
    if jax_backend_started():
        return "XLA's default pool (JAX's backends existed already: set PJRT_NPROC=1 before the first JAX array)"
    os.environ[ENV] = "1"
    return f"{ENV}=1 (oneDNN convolutions on {cores} cores)"
