"""``MemoryMonitor``: the accelerator allocator's memory statistics after every batch, as Composer's (in GB)."""
from __future__ import annotations

import math
import resource
import sys
from typing import Any, Mapping, Sequence

import numpy as np

from jaxcomposer.core.events import Callback

__all__ = ["MemoryMonitor"]

# Composer's statistic names, from what XLA's allocator reports (``jax.Device.memory_stats()``): (logged name,
# stat, stat subtracted or None). XLA's BFC allocator has no torch-style "active but awaiting a stream" state, so
# active = allocated; what its pool holds beyond the live buffers is the "inactive" (cached, not released) memory;
# its pool is torch's "reserved".
_DEFAULT_KEYS: tuple[tuple[str, str, str | None], ...] = (
    ("current_allocated_mem", "bytes_in_use", None),
    ("current_active_mem", "bytes_in_use", None),
    ("current_inactive_mem", "pool_bytes", "bytes_in_use"),
    ("current_reserved_mem", "pool_bytes", None),
    ("peak_allocated_mem", "peak_bytes_in_use", None),
    ("peak_active_mem", "peak_bytes_in_use", None),
    ("peak_reserved_mem", "peak_pool_bytes", None),
)


def _gigabytes(n_bytes: float) -> float:
    """Composer's unit: bytes / 1e9, rounded to 5 significant digits."""
    gb = n_bytes / 1.0e9
    if gb != 0:
        gb = round(gb, -int(math.floor(math.log10(abs(gb)))) + 4)
    return gb


def _report(stats: Mapping[str, Any], keys: Sequence[tuple[str, str, str | None]]) -> dict[str, float | int]:
    report = {}
    for name, stat, minus in keys:
        if stat not in stats or (minus is not None and minus not in stats):
            continue
        value = int(stats[stat]) - (int(stats[minus]) if minus is not None else 0)
        if "bytes" in stat:
            report[name.replace("bytes", "gigabytes")] = _gigabytes(value)
        else:
            report[name] = value
    return report


def _host_rss_bytes() -> tuple[int, int]:
    """(current, peak) resident set size of this process."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    peak *= 1 if sys.platform == "darwin" else 1024  # Linux reports KiB
    try:
        with open("/proc/self/statm", "rb") as f:
            rss = int(f.read().split()[1]) * resource.getpagesize()
    except (OSError, ValueError, IndexError):
        import psutil  # macOS and others without /proc
        rss = psutil.Process().memory_info().rss
    return rss, max(peak, rss)  # the kernel updates its high-water mark lazily


class MemoryMonitor(Callback):
    """Composer's ``MemoryMonitor(memory_keys=None, dist_aggregate_batch_interval=None)``: at every BATCH_END (Composer:
    AFTER_TRAIN_BATCH), logs ``memory/<statistic>`` for this process's first device, in gigabytes (1e9 bytes,
    5 significant digits), as Composer:

    - ``memory/current_allocated_mem``, ``memory/current_active_mem``: bytes held by live buffers (XLA's
      ``bytes_in_use``; XLA has no separate "active" state, so both are the same);
    - ``memory/current_inactive_mem``: what the allocator's pool holds beyond live buffers (``pool_bytes -
      bytes_in_use``);
    - ``memory/current_reserved_mem``: the allocator's pool (``pool_bytes``);
    - ``memory/peak_allocated_mem``, ``memory/peak_active_mem``, ``memory/peak_reserved_mem``: their peaks.

    Composer's ``peak_inactive_mem`` and ``alloc_retries`` have no XLA counterpart and are not logged. A statistic
    the device does not report is left out.

    ``memory_keys`` maps names in ``jax.Device.memory_stats()`` (e.g. ``'bytes_limit'``, ``'num_allocs'``,
    ``'largest_free_block_bytes'``) to the names to log; names containing ``bytes`` are converted to gigabytes and
    ``bytes`` in the logged name becomes ``gigabytes``, as Composer does with torch's names.

    On a device without allocator statistics (the CPU backend) the host process is measured instead:
    ``memory/host_rss_mem`` and ``memory/peak_host_rss_mem``, the resident set size and its peak, in gigabytes.

    ``dist_aggregate_batch_interval``: every this many batches, also log ``<statistic>_avg``, ``_min`` and ``_max``
    over every device of every process (a collective across processes when there are several).

    Reading the statistics does not wait for the device (it asks the allocator, not the computation); it costs a
    few microseconds per batch.
    """

    def __init__(self, memory_keys: dict[str, str] | None = None, dist_aggregate_batch_interval: int | None = None,
                 *, devices: Sequence[Any] | None = None) -> None:
        if memory_keys is not None and not (isinstance(memory_keys, Mapping) and
                                            all(isinstance(k, str) and isinstance(v, str)
                                                for k, v in memory_keys.items())):
            raise ValueError(f"MemoryMonitor: memory_keys must map memory_stats() names to names to log (str -> str), "
                             f"got {memory_keys!r}.")
        if dist_aggregate_batch_interval is not None and (isinstance(dist_aggregate_batch_interval, bool) or
                                                          not isinstance(dist_aggregate_batch_interval, int) or
                                                          dist_aggregate_batch_interval < 1):
            raise ValueError(f"MemoryMonitor: dist_aggregate_batch_interval must be None or an int >= 1, got "
                             f"{dist_aggregate_batch_interval!r}.")
        self.memory_keys = dict(memory_keys) if memory_keys is not None else None
        self._keys = _DEFAULT_KEYS if memory_keys is None else tuple((name, stat, None)
                                                                     for stat, name in memory_keys.items())
        self.dist_aggregate_batch_interval = dist_aggregate_batch_interval
        self._devices = list(devices) if devices is not None else None

    def _local_devices(self) -> list:
        if self._devices is None:
            import jax
            self._devices = jax.local_devices()
        return self._devices

    def _device_report(self, device) -> dict[str, float | int] | None:
        stats = device.memory_stats() if hasattr(device, "memory_stats") else None
        if not stats:
            return None
        return _report(stats, self._keys)

    def _host_report(self) -> dict[str, float]:
        rss, peak = _host_rss_bytes()
        return {"host_rss_mem": _gigabytes(rss), "peak_host_rss_mem": _gigabytes(peak)}

    def batch_end(self, state, logger) -> None:
        devices = self._local_devices()
        report = self._device_report(devices[0])
        on_host = report is None
        if on_host:
            report = self._host_report()
        interval = self.dist_aggregate_batch_interval
        if interval is not None and state.timestamp.batch % interval == 0:
            report.update(self._aggregate(report, devices, on_host))
        logger.log_metrics({f"memory/{name}": value for name, value in report.items()})

    def _aggregate(self, report: dict, devices: list, on_host: bool) -> dict[str, float]:
        names = list(report)
        if on_host:
            rows = [[report[n] for n in names]]
        else:
            rows = []
            for device in devices:
                r = self._device_report(device) or {}
                rows.append([r.get(n, float("nan")) for n in names])
        values = np.asarray(rows, dtype=np.float64)
        import jax
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils
            values = np.asarray(multihost_utils.process_allgather(values)).reshape(-1, len(names))
        out = {}
        for i, name in enumerate(names):
            column = values[:, i]
            out[f"{name}_avg"] = float(np.nanmean(column))
            out[f"{name}_min"] = float(np.nanmin(column))
            out[f"{name}_max"] = float(np.nanmax(column))
        return out
