import jax.numpy as jnp
import pytest

from jaxcomposer.loggers import InMemoryLogger, Logger, LoggerDestination
from jaxcomposer.loggers.logger import PendingMetrics, format_metric


class Recorder(LoggerDestination):
    def __init__(self):
        self.calls, self.hparams = [], []

    def log_metrics(self, metrics, step):
        self.calls.append((step, dict(metrics)))

    def log_hyperparameters(self, hparams):
        self.hparams.append(dict(hparams))


class NotYet:
    """A device value stand-in whose computation has not finished."""

    def __init__(self, value):
        self.value, self.ready, self.floats = value, False, 0

    def is_ready(self):
        return self.ready

    def __float__(self):
        self.floats += 1
        return float(self.value)


def test_fan_out_and_default_step():
    a, b = Recorder(), Recorder()
    logger = Logger([a, b])
    assert logger.destinations == [a, b]
    logger.log_metrics({"x": 1.0})
    logger.set_step(7)
    logger.log_metrics({"y": 2.0})
    logger.log_metrics({"z": 3.0}, step=3)
    logger.log_hyperparameters({"lr": 0.1})
    for d in (a, b):
        assert d.calls == [(0, {"x": 1.0}), (7, {"y": 2.0}), (3, {"z": 3.0})]
        assert d.hparams == [{"lr": 0.1}]


def test_rejects_non_destinations():
    with pytest.raises(TypeError, match="LoggerDestination"):
        Logger([object()])


def test_pending_metrics_waits_for_device_values_in_order():
    q = PendingMetrics(max_pending=2)
    v1, v2 = NotYet(1.0), NotYet(2.0)
    q.push(1, {"a": v1})
    q.push(2, {"a": v2})
    assert q.pop() == [] and v1.floats == 0  # nothing ready: nothing waits
    v2.ready = True
    assert q.pop() == []  # order is kept: step 1 still pending
    v1.ready = True
    assert [(r.step, r.metrics) for r in q.pop()] == [(1, {"a": 1.0}), (2, {"a": 2.0})]
    # Overflow forces the oldest entries.
    for s in range(3):
        q.push(s, {"a": NotYet(s)})
    assert [r.step for r in q.pop()] == [0]
    assert [r.step for r in q.pop(force=True)] == [1, 2]
    assert len(q) == 0


def test_in_memory_logger_values_and_jax_scalars():
    mem = InMemoryLogger()
    logger = Logger([mem])
    for step in range(1, 4):
        logger.set_step(step)
        logger.log_metrics({"loss/train/total": jnp.asarray(step * 0.5), "lr": 0.1 * step})
    logger.log_hyperparameters({"batch_size": 8})
    logger.log_hyperparameters({"seed": 1})
    # without a run state (no INIT) the timestamp is the step's batch
    assert [(ts.batch, v) for ts, v in mem.data["loss/train/total"]] == [(1, 0.5), (2, 1.0), (3, 1.5)]
    assert all(type(v) is float for _, v in mem.data["loss/train/total"])
    assert mem.most_recent_values == pytest.approx({"loss/train/total": 1.5, "lr": 0.3})
    assert mem.hyperparameters == mem.hparams == {"batch_size": 8, "seed": 1}


def test_format_metric():
    assert format_metric(0.123456) == "0.1235"
    assert format_metric(1e-5) == "1.000e-05"
    assert format_metric(float("nan")) == "nan"
