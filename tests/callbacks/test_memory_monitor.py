import jax
import pytest

from jaxcomposer.callbacks import MemoryMonitor
from jaxcomposer.core.events import Event
from jaxcomposer.loggers import InMemoryLogger, Logger
from tests.loggers.helpers import fake_fit, make_state

GB = 10**9


class FakeGPU:
    """What ``jax.Device.memory_stats()`` returns on a GPU (XLA's BFC allocator), with chosen numbers."""

    def __init__(self, in_use=1_234_567_890, peak=2 * GB, pool=3 * GB, peak_pool=3_500_000_000):
        self.stats = {"bytes_in_use": in_use, "peak_bytes_in_use": peak, "pool_bytes": pool,
                      "peak_pool_bytes": peak_pool, "bytes_limit": 80 * GB, "num_allocs": 1234,
                      "largest_alloc_size": 512 * 2**20}

    def memory_stats(self):
        return self.stats


def run(monitor, batches=2):
    mem = InMemoryLogger()
    fake_fit([monitor, mem], make_state(total_steps=batches), [1.0] * batches, eval_every=None)
    return mem


def test_composer_keys_in_gigabytes_from_xla_stats():
    mem = run(MemoryMonitor(devices=[FakeGPU()]))
    memory = {k: v for k, v in mem.most_recent_values.items() if k.startswith("memory/")}
    assert memory == {
        "memory/current_allocated_mem": 1.2346,  # 5 significant digits, as Composer
        "memory/current_active_mem": 1.2346,
        "memory/current_inactive_mem": 1.7654,  # pool_bytes - bytes_in_use
        "memory/current_reserved_mem": 3.0,
        "memory/peak_allocated_mem": 2.0,
        "memory/peak_active_mem": 2.0,
        "memory/peak_reserved_mem": 3.5,
    }
    assert len(mem.data["memory/peak_allocated_mem"]) == 2  # every batch, as Composer's


def test_custom_memory_keys():
    mem = run(MemoryMonitor(memory_keys={"bytes_limit": "limit_bytes", "num_allocs": "allocs", "absent": "x"},
                            devices=[FakeGPU()]))
    memory = {k: v for k, v in mem.most_recent_values.items() if k.startswith("memory/")}
    # names with 'bytes' are converted to gigabytes and renamed, as Composer does with torch's names
    assert memory == {"memory/limit_gigabytes": 80.0, "memory/allocs": 1234}


def test_cpu_falls_back_to_host_rss():
    assert jax.local_devices()[0].memory_stats() is None  # the CPU backend has no allocator statistics
    mem = run(MemoryMonitor())
    memory = {k: v for k, v in mem.most_recent_values.items() if k.startswith("memory/")}
    assert set(memory) == {"memory/host_rss_mem", "memory/peak_host_rss_mem"}
    assert 0.01 < memory["memory/host_rss_mem"] <= memory["memory/peak_host_rss_mem"] < 1000  # gigabytes


def test_dist_aggregate_over_devices_at_the_interval():
    devices = [FakeGPU(in_use=1 * GB, peak=2 * GB), FakeGPU(in_use=3 * GB, peak=4 * GB)]
    monitor = MemoryMonitor(dist_aggregate_batch_interval=2, devices=devices)
    state, mem = make_state(), InMemoryLogger()
    logger = Logger([mem])
    for batch in (1, 2):
        state.timestamp = state.timestamp.to_next_batch(samples=8)
        logger.set_step(batch)
        monitor.run_event(Event.BATCH_END, state, logger)
    assert "memory/current_allocated_mem_avg" in mem.data
    assert [ts.batch for ts, _ in mem.data["memory/current_allocated_mem_avg"]] == [2]  # at the interval only
    v = mem.most_recent_values
    assert v["memory/current_allocated_mem"] == 1.0  # the report itself is the first device's
    assert (v["memory/current_allocated_mem_avg"], v["memory/current_allocated_mem_min"],
            v["memory/current_allocated_mem_max"]) == (2.0, 1.0, 3.0)
    assert (v["memory/peak_allocated_mem_avg"], v["memory/peak_allocated_mem_max"]) == (3.0, 4.0)


@pytest.mark.parametrize("kwargs", [dict(memory_keys={"a": 1}), dict(memory_keys=["a"]),
                                    dict(dist_aggregate_batch_interval=0), dict(dist_aggregate_batch_interval=True)])
def test_validation(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        MemoryMonitor(**kwargs)
