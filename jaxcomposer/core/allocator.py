"""A check of the process's malloc: jemalloc with its default settings slows a CPU train step down.

jemalloc (often preloaded for its speed: ``LD_PRELOAD=libjemalloc.so.2``) serves every block over its
``oversize_threshold`` (8 MiB by default) from a dedicated arena that hands freed memory back to the system at once.
XLA:CPU allocates a step's buffers anew on every execution, so each step then faults its memory in again, which
makes a small model's step markedly slower than under glibc's malloc or under jemalloc with
``MALLOC_CONF=oversize_threshold:0`` (benchmarks/README.md, "Setup and suite"). jemalloc reads ``MALLOC_CONF``
when the process starts, so the fix cannot be applied from Python; the Trainer warns instead.
"""
from __future__ import annotations

import ctypes

FIX = "MALLOC_CONF=oversize_threshold:0"


def jemalloc_oversize_threshold() -> int | None:
    """jemalloc's ``opt.oversize_threshold`` in bytes when jemalloc is this process's malloc, else None."""
    try:
        mallctl = ctypes.CDLL(None).mallctl  # exported only when jemalloc (unprefixed) is loaded
    except (AttributeError, OSError):
        return None
    value, size = ctypes.c_size_t(), ctypes.c_size_t(ctypes.sizeof(ctypes.c_size_t))
    if mallctl(b"opt.oversize_threshold", ctypes.byref(value), ctypes.byref(size), None, 0) != 0:
        return None  # a jemalloc older than 5.2 has no oversize arena
    return value.value


def slow_allocator_warning() -> str | None:
    """Why this process's malloc will slow CPU train steps down, with the fix; None when it will not."""
    threshold = jemalloc_oversize_threshold()
    if not threshold:
        return None
    return (f"jemalloc is this process's malloc with oversize_threshold={threshold} bytes: it returns every freed "
            f"block above that size to the system at once, and XLA:CPU's per-step buffers then fault in anew each "
            f"step, which slows the steps down. Start the process with {FIX} in the environment "
            f"(make demo and make test do), or without jemalloc.")
