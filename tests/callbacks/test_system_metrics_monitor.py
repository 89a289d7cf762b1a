import sys
import types

import pytest

from jaxcomposer.callbacks import SystemMetricsMonitor
from jaxcomposer.loggers import InMemoryLogger
from tests.loggers.helpers import accuracy_eval, fake_fit, make_state

HOST_KEYS = {"cpu_percentage", "cpu_memory_total", "cpu_memory_available", "cpu_memory_percent", "cpu_memory_used",
             "cpu_memory_free", "disk_memory_total", "disk_memory_used", "disk_memory_free", "disk_memory_percent",
             "network_bytes_sent", "network_bytes_recv", "network_packets_sent", "network_packets_recv",
             "network_errin", "network_errout", "network_dropin", "network_dropout"}


def test_host_metrics_with_composers_keys_every_batch():
    mem = InMemoryLogger()
    monitor = SystemMetricsMonitor()
    assert not monitor.gpu_available  # CPU backend
    fake_fit([monitor, mem], make_state(total_steps=5), [1.0] * 5, eval_every=5, eval_fn=accuracy_eval([0.5]))
    assert HOST_KEYS <= set(mem.data)
    assert not any("gpu" in k for k in mem.data)
    assert len(mem.data["cpu_percentage"]) == 5 + 2  # BATCH_START x5, then the 2 eval batches
    v = mem.most_recent_values
    assert 0 <= v["cpu_percentage"] <= 100 and 0 < v["cpu_memory_used"] <= v["cpu_memory_total"]
    assert 0 < v["disk_memory_used"] <= v["disk_memory_total"] and v["network_bytes_recv"] >= 0


class FakeNVML(types.ModuleType):
    NVML_TEMPERATURE_GPU = 0

    def __init__(self, readings):
        super().__init__("pynvml")
        self.readings, self.initialised = readings, False

    def nvmlInit(self):
        self.initialised = True

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetUtilizationRates(self, h):
        return types.SimpleNamespace(gpu=self.readings[h][0], memory=self.readings[h][1])

    def nvmlDeviceGetTemperature(self, h, sensor):
        return self.readings[h][2]

    def nvmlDeviceGetPowerUsage(self, h):
        return self.readings[h][3] * 1000  # mW


def gpus(n):
    return [types.SimpleNamespace(id=i, platform="gpu", local_hardware_id=i) for i in range(n)]


def test_gpu_metrics_min_max_and_all_ranks(monkeypatch):
    nvml = FakeNVML({0: (90, 40, 60, 300.0), 1: (70, 50, 65, 250.0)})
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    mem = InMemoryLogger()
    monitor = SystemMetricsMonitor(devices=gpus(2))
    assert monitor.gpu_available and nvml.initialised
    fake_fit([monitor, mem], make_state(total_steps=1), [1.0], eval_every=None)
    gpu = {k: v for k, v in mem.most_recent_values.items() if k not in HOST_KEYS and k != "loss/train/total"}
    assert {k: v for k, v in gpu.items() if not k.startswith("cpu_memory_")} == {
        "min_gpu_percentage_rank_1": 70.0, "max_gpu_percentage_rank_0": 90.0,
        "min_memory_percentage_rank_0": 40.0, "max_memory_percentage_rank_1": 50.0,
        "min_gpu_temperature_C_rank_0": 60.0, "max_gpu_temperature_C_rank_1": 65.0,
        "min_gpu_power_usage_W_rank_1": 250.0, "max_gpu_power_usage_W_rank_0": 300.0}

    mem = InMemoryLogger()
    fake_fit([SystemMetricsMonitor(log_all_data=True, devices=gpus(2)), mem], make_state(total_steps=1), [1.0],
             eval_every=None)
    v = mem.most_recent_values
    assert (v["gpu_percentage_rank_0"], v["gpu_percentage_rank_1"]) == (90.0, 70.0)
    assert (v["gpu_power_usage_W_rank_0"], v["gpu_power_usage_W_rank_1"]) == (300.0, 250.0)
    assert HOST_KEYS <= set(v)

    mem = InMemoryLogger()
    fake_fit([SystemMetricsMonitor(gpu_available=False, devices=gpus(2)), mem], make_state(total_steps=1), [1.0],
             eval_every=None)
    assert not any("gpu" in k for k in mem.data)


def test_gpu_without_nvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    with pytest.warns(UserWarning, match="nvidia-ml-py"):
        assert not SystemMetricsMonitor(devices=gpus(1)).gpu_available
    with pytest.raises(ImportError, match="nvidia-ml-py"):
        SystemMetricsMonitor(gpu_available=True)
    with pytest.raises(ValueError, match="gpu_available"):
        SystemMetricsMonitor(gpu_available="yes")
