"""``SystemMetricsMonitor``: host CPU, memory, disk and network usage (and GPU utilisation through NVML) at every
batch, with Composer's keys."""
from __future__ import annotations

import os
import warnings
from typing import Any, Sequence

import numpy as np

from jaxcomposer.core.events import Callback

__all__ = ["SystemMetricsMonitor"]

_GPU_METRICS = ("gpu_percentage", "memory_percentage", "gpu_temperature_C", "gpu_power_usage_W")


class SystemMetricsMonitor(Callback):
    """Composer's ``SystemMetricsMonitor(log_all_data=False)``, plus ``gpu_available``.

    Logged at every BATCH_START, EVAL_BATCH_END and PREDICT_BATCH_END (Composer: every batch start of training,
    evaluation and prediction), with Composer's keys, from ``psutil``:

    - ``cpu_percentage``: system-wide CPU use since the previous reading (the first reading is 0.0);
    - ``cpu_memory_<field>``: ``psutil.virtual_memory()`` (``total``, ``available``, ``percent``, ``used``,
      ``free``, and on Linux ``active``, ``inactive``, ``buffers``, ``cached``, ``shared``, ``slab``), bytes;
    - ``disk_memory_<field>``: ``psutil.disk_usage('/')`` (``total``, ``used``, ``free``, ``percent``);
    - ``network_<field>``: ``psutil.net_io_counters()`` (``bytes_sent``, ``bytes_recv``, ``packets_sent``,
      ``packets_recv``, ``errin``, ``errout``, ``dropin``, ``dropout``), counters since boot.

    With GPUs, per GPU through NVML (``pip install nvidia-ml-py``): ``gpu_percentage``, ``memory_percentage``,
    ``gpu_temperature_C``, ``gpu_power_usage_W``. A JAX process drives all of its host's GPUs, so each GPU plays the
    part of a Composer rank, numbered by ``jax.Device.id``: logged as ``min_<metric>_rank_<r>`` and
    ``max_<metric>_rank_<r>`` (the GPUs with the lowest and highest value), or ``<metric>_rank_<r>`` for every GPU
    with ``log_all_data``. With several processes the GPU readings are gathered across processes (a collective
    every batch, as Composer's ``all_gather_object``).

    ``gpu_available``: ``None`` detects (JAX's devices are GPUs; without NVML's Python package the GPU metrics are
    skipped with a warning), ``True`` requires NVML, ``False`` logs host metrics only.

    Nothing here waits for the device; the host readings run every batch, as Composer's (their cost is measured in
    benchmarks/callback_overhead.py).
    """

    def __init__(self, log_all_data: bool = False, gpu_available: bool | None = None, *,
                 devices: Sequence[Any] | None = None) -> None:
        if gpu_available not in (None, True, False):
            raise ValueError(f"SystemMetricsMonitor: gpu_available must be None, True or False, got {gpu_available!r}.")
        self.log_all_data = bool(log_all_data)
        self._devices = list(devices) if devices is not None else None
        self._nvml = None
        self._handles: list = []
        import psutil  # a dependency of orbax-checkpoint, so always installed with jaxcomposer
        self._psutil = psutil
        if gpu_available is None:
            gpu_available = any(getattr(d, "platform", "") in ("gpu", "cuda") for d in self._local_devices())
            if gpu_available and not self._import_nvml(required=False):
                warnings.warn("SystemMetricsMonitor: GPU metrics need NVML's Python package (`pip install "
                              "nvidia-ml-py`); logging host metrics only.", stacklevel=2)
                gpu_available = False
        elif gpu_available:
            self._import_nvml(required=True)
        self.gpu_available = bool(gpu_available)

    def _local_devices(self) -> list:
        if self._devices is None:
            import jax
            self._devices = jax.local_devices()
        return self._devices

    def _import_nvml(self, required: bool) -> bool:
        try:
            import pynvml
        except ImportError as e:
            if required:
                raise ImportError("SystemMetricsMonitor(gpu_available=True) needs NVML's Python package; install "
                                  "it with `pip install nvidia-ml-py`.") from e
            return False
        pynvml.nvmlInit()
        self._nvml = pynvml
        return True

    def _gpu_handles(self) -> list:
        if not self._handles:
            # NVML numbers GPUs physically; JAX's local_hardware_id is the CUDA ordinal, the same unless
            # CUDA_VISIBLE_DEVICES reorders or hides GPUs
            for i, device in enumerate(self._local_devices()):
                index = getattr(device, "local_hardware_id", None)
                handle = self._nvml.nvmlDeviceGetHandleByIndex(i if index is None else index)
                self._handles.append((device.id, handle))
        return self._handles

    def _gpu_rows(self) -> np.ndarray:
        """One row per GPU of this process: (device id, the four metrics)."""
        nvml = self._nvml
        rows = []
        for device_id, handle in self._gpu_handles():
            utilization = nvml.nvmlDeviceGetUtilizationRates(handle)
            rows.append([device_id, utilization.gpu, utilization.memory,
                         nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU),
                         nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0])  # mW -> W
        rows = np.asarray(rows, dtype=np.float64)
        import jax
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils
            rows = np.asarray(multihost_utils.process_allgather(rows)).reshape(-1, rows.shape[-1])
        return rows

    def host_metrics(self) -> dict[str, float]:
        psutil = self._psutil
        metrics: dict[str, float] = {"cpu_percentage": psutil.cpu_percent()}
        metrics.update({f"cpu_memory_{k}": v for k, v in psutil.virtual_memory()._asdict().items()})
        metrics.update({f"disk_memory_{k}": v for k, v in psutil.disk_usage(os.sep)._asdict().items()})
        metrics.update({f"network_{k}": v for k, v in psutil.net_io_counters()._asdict().items()})
        return metrics

    def gpu_metrics(self) -> dict[str, float]:
        rows = self._gpu_rows()
        ranks = rows[:, 0].astype(int)
        out: dict[str, float] = {}
        for j, key in enumerate(_GPU_METRICS, start=1):
            column = rows[:, j]
            if self.log_all_data:
                out.update({f"{key}_rank_{r}": float(v) for r, v in zip(ranks, column)})
            else:
                lo, hi = int(np.argmin(column)), int(np.argmax(column))
                out[f"min_{key}_rank_{ranks[lo]}"] = float(column[lo])
                out[f"max_{key}_rank_{ranks[hi]}"] = float(column[hi])
        return out

    def _log(self, logger) -> None:
        metrics = self.gpu_metrics() if self.gpu_available else {}
        metrics.update(self.host_metrics())
        logger.log_metrics(metrics)

    def batch_start(self, state, logger) -> None:
        self._log(logger)

    def eval_batch_end(self, state, logger) -> None:
        self._log(logger)

    def predict_batch_end(self, state, logger) -> None:
        self._log(logger)
