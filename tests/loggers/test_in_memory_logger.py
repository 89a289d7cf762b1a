import jax.numpy as jnp
import numpy as np
import pytest

from jaxcomposer.core.time import Timestamp
from jaxcomposer.loggers import InMemoryLogger, Logger
from tests.loggers.helpers import accuracy_eval, fake_fit, make_state


class NotYet:
    """A device value stand-in whose computation has not finished; counts how often it is converted."""

    def __init__(self, value):
        self.value, self.ready, self.converted = value, False, 0

    def is_ready(self):
        return self.ready

    def __array__(self, dtype=None, copy=None):
        self.converted += 1
        return np.asarray(self.value, dtype=dtype)


def test_data_holds_the_runs_timestamps():
    mem = InMemoryLogger()
    state = make_state(total_steps=10, steps_per_epoch=5)
    fake_fit([mem], state, [jnp.asarray(float(i)) for i in range(10)], eval_every=5, eval_fn=accuracy_eval([0.5, 0.7]))
    loss = mem.data["loss/train/total"]
    assert [v for _, v in loss] == [float(i) for i in range(10)]
    assert all(isinstance(ts, Timestamp) for ts, _ in loss)
    assert [ts.batch for ts, _ in loss] == list(range(1, 11))
    assert [ts.epoch for ts, _ in loss] == [0] * 5 + [1] * 5
    assert [ts.sample for ts, _ in loss] == [8 * b for b in range(1, 11)]
    acc = mem.data["metrics/eval/accuracy"]
    assert [(ts.batch, v) for ts, v in acc] == [(5, 0.5), (10, 0.7)]
    assert mem.most_recent_values["metrics/eval/accuracy"] == 0.7
    assert mem.most_recent_values["loss/train/total"] == 9.0
    assert mem.most_recent_timestamps["metrics/eval/accuracy"].batch == 10
    assert mem.most_recent_timestamps["loss/train/total"] is loss[-1][0]


def test_get_timeseries_has_composers_keys():
    mem = InMemoryLogger()
    fake_fit([mem], make_state(total_steps=6, steps_per_epoch=3), [3.0, 2.0, 1.0, 0.5, 0.25, 0.125],
             eval_every=None, batch_time=0.5)
    ts = mem.get_timeseries("loss/train/total")
    assert set(ts) == {"loss/train/total", "iteration", "epoch", "batch", "sample", "token", "epoch_in_iteration",
                       "token_in_iteration", "batch_in_epoch", "sample_in_epoch", "token_in_epoch", "total_wct",
                       "iteration_wct", "epoch_wct", "batch_wct"}
    assert all(isinstance(v, np.ndarray) and len(v) == 6 for v in ts.values())
    np.testing.assert_array_equal(ts["loss/train/total"], [3.0, 2.0, 1.0, 0.5, 0.25, 0.125])
    np.testing.assert_array_equal(ts["batch"], [1, 2, 3, 4, 5, 6])
    np.testing.assert_array_equal(ts["epoch"], [0, 0, 0, 1, 1, 1])
    np.testing.assert_array_equal(ts["batch_in_epoch"], [1, 2, 3, 1, 2, 3])
    np.testing.assert_allclose(ts["total_wct"], [0.5, 1.0, 1.5, 2.0, 2.5, 3.0])
    np.testing.assert_allclose(ts["batch_wct"], [0.5] * 6)
    with pytest.raises(ValueError, match="Invalid value for argument `metric`: nope"):
        mem.get_timeseries("nope")


def test_values_keep_their_type_and_device_values_convert_lazily():
    mem = InMemoryLogger()
    logger = Logger([mem])
    pending = NotYet(2.5)
    logger.log_metrics({"loss": pending, "count": 3, "name": "x", "int32": jnp.asarray(4, jnp.int32),
                        "vector": jnp.arange(3)}, step=1)
    assert pending.converted == 0  # logging did not wait for the device
    data = mem.data  # reading converts what is pending
    assert pending.converted == 1 and data["loss"][0][1] == 2.5 and type(data["loss"][0][1]) is float
    assert data["count"][0][1] == 3 and type(data["count"][0][1]) is int
    assert data["name"][0][1] == "x"
    assert data["int32"][0][1] == 4 and type(data["int32"][0][1]) is int
    np.testing.assert_array_equal(data["vector"][0][1], [0, 1, 2])
    logger.log_hyperparameters({"a": 1})
    logger.log_hyperparameters({"b": [1, 2]})
    assert mem.hyperparameters == {"a": 1, "b": [1, 2]}


def test_pending_values_are_bounded():
    mem = InMemoryLogger(max_pending=2)
    logger = Logger([mem])
    values = [NotYet(float(i)) for i in range(4)]
    for i, v in enumerate(values):
        logger.log_metrics({"loss": v}, step=i)
    assert [v.converted for v in values] == [1, 1, 0, 0]  # only the overflow was forced
