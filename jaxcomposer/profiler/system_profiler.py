"""Host counters (CPU, memory, disk, network) sampled into the JSON trace while a profiling window is open."""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from jaxcomposer.profiler.profiler import Profiler

_GIB = 2**30
_DISK_FIELDS = ("read_count", "write_count", "read_bytes", "write_bytes", "read_time", "write_time", "busy_time")


class SystemProfiler:
    """Composer's ``SystemProfiler``, as counter events (``'ph': 'C'``) with Composer's names: ``cpu``
    (``cpu_percent``), ``memory/virtual`` and ``memory/swap`` (``used_gb``, ``available_gb``/``free_gb``),
    ``memory/device<id>/<stat>`` (JAX's ``Device.memory_stats()``, where Composer reads CUDA's),
    ``disk/<disk>/<field>`` and ``network/<nic>/kb_sent``, ``kb_recv``.

    Composer samples from a thread for the whole run; here the thread runs only while a window is open (nothing
    else would be recorded) and samples every ``interval`` seconds and when the window closes, so a window
    shorter than the interval still has a sample (memory, disk and network are also read when it opens). CPU use
    is the system's since the previous sample, from ``psutil.cpu_times()`` (``psutil.cpu_percent()`` keeps one
    reading per process, which another user of it, such as ``SystemMetricsMonitor``, would move). Each sample
    costs this thread's time, not the training loop's. Memory is in GiB (Composer divides bytes
    by 2**9 and calls it GB).
    """

    def __init__(self, cpu: bool, memory: bool, disk: bool, net: bool, interval: float) -> None:
        import psutil  # a dependency of orbax-checkpoint, so always installed with jaxcomposer
        self._psutil = psutil
        self.cpu, self.memory, self.disk, self.net, self.interval = cpu, memory, disk, net, interval
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def start(self, profiler: "Profiler") -> None:
        if self._thread is not None:
            return
        devices = []
        if self.memory:
            import jax
            devices = jax.local_devices()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, args=(profiler, devices), name="System Profiler",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None

    def _run(self, profiler: "Profiler", devices: list) -> None:
        cpu = self._sample(profiler, devices, None)  # (CPU use needs two readings: none yet)
        while not self._stop.wait(self.interval):
            cpu = self._sample(profiler, devices, cpu)
        self._sample(profiler, devices, cpu)  # the window's end

    def _cpu_times(self) -> tuple[float, float]:
        """(busy, total) CPU seconds of the system since boot, counted as psutil counts them."""
        times = self._psutil.cpu_times()
        total = sum(times) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)  # (in user/nice)
        return total - times.idle - getattr(times, "iowait", 0.0), total

    def _sample(self, profiler: "Profiler", devices: list, cpu: tuple[float, float] | None) -> tuple[float, float]:
        psutil = self._psutil
        now = profiler._now_ns()
        record = lambda name, category, values: profiler._record_counter(name, (category,), now, values)
        cpu_now = self._cpu_times()
        if self.cpu and cpu is not None:
            busy, total = cpu_now[0] - cpu[0], cpu_now[1] - cpu[1]
            record("cpu", "cpu", {"cpu_percent": 100.0 * busy / total if total > 0 else 0.0})
        if self.memory:
            for device in devices:
                for stat, value in (device.memory_stats() or {}).items():
                    if isinstance(value, (int, float)):
                        record(f"memory/device{device.id}/{stat}", "memory", {stat: value})
            swap, virtual = psutil.swap_memory(), psutil.virtual_memory()
            record("memory/swap", "memory", {"used_gb": swap.used / _GIB, "free_gb": swap.free / _GIB})
            record("memory/virtual", "memory", {"used_gb": virtual.used / _GIB,
                                                "available_gb": virtual.available / _GIB})
        if self.disk:
            for disk, stats in (psutil.disk_io_counters(perdisk=True) or {}).items():
                for field in _DISK_FIELDS:
                    if hasattr(stats, field):
                        record(f"disk/{disk}/{field}", "disk", {field: getattr(stats, field)})
        if self.net:
            for nic, stats in (psutil.net_io_counters(pernic=True) or {}).items():
                record(f"network/{nic}/kb_sent", "net", {"kb_sent": stats.bytes_sent / 1024})
                record(f"network/{nic}/kb_recv", "net", {"kb_recv": stats.bytes_recv / 1024})
        return cpu_now
