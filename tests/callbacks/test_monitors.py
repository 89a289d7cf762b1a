import datetime

import jax.numpy as jnp
import optax
import pytest

from jaxcomposer.callbacks import LRMonitor, NaNMonitor, NonFiniteLossError, SpeedMonitor
from jaxcomposer.core.events import Event
from jaxcomposer.loggers import InMemoryLogger, Logger
from tests.loggers.helpers import FakeClock, accuracy_eval, fake_fit, make_state


def test_speed_monitor_excludes_first_batch_and_eval_time():
    clock, mem = FakeClock(), InMemoryLogger()
    speed = SpeedMonitor(window_size=100, clock=clock)
    state = make_state(batch_size=16)
    logger = Logger([mem])
    speed.run_event(Event.FIT_START, state, logger)
    for step in range(1, 21):
        clock.advance(30.0 if step == 1 else 0.25)  # the first step compiles
        state.timestamp = state.timestamp.to_next_batch(samples=16, tokens=16 * 128)
        logger.set_step(step)
        speed.run_event(Event.BATCH_END, state, logger)
        if step == 10:  # a long evaluation must not count as training time
            speed.run_event(Event.EVAL_START, state, logger)
            clock.advance(100.0)
            speed.run_event(Event.EVAL_END, state, logger)
    data = mem.data
    assert data["throughput/batches_per_sec"][0][0].batch == 2  # nothing logged at step 1
    assert all(v == pytest.approx(4.0) for _, v in data["throughput/batches_per_sec"])
    assert all(v == pytest.approx(64.0) for _, v in data["throughput/samples_per_sec"])
    assert mem.most_recent_values["throughput/tokens_per_sec"] == pytest.approx(64.0 * 128)


def test_speed_monitor_sliding_window():
    clock, mem = FakeClock(), InMemoryLogger()
    speed = SpeedMonitor(window_size=4, clock=clock)
    state = make_state(batch_size=2)
    logger = Logger([mem])
    for step in range(1, 13):
        clock.advance(1.0 if step <= 6 else 0.5)  # twice as fast from step 7 on
        state.timestamp = state.timestamp.to_next_batch(samples=2)
        speed.run_event(Event.BATCH_END, state, logger)
    # The last 4 batches took 0.5 s each: the window forgets the slow ones.
    assert mem.most_recent_values["throughput/batches_per_sec"] == pytest.approx(2.0)
    assert mem.most_recent_values["throughput/samples_per_sec"] == pytest.approx(4.0)
    assert "throughput/tokens_per_sec" not in mem.data
    with pytest.raises(ValueError, match="window_size"):
        SpeedMonitor(window_size=0)


def test_lr_monitor_float_schedule_and_none():
    mem = InMemoryLogger()
    schedule = optax.linear_schedule(1.0, 0.0, transition_steps=10)
    fake_fit([LRMonitor(), mem], make_state(learning_rate=schedule), [1.0] * 5, eval_every=None)
    # The rate each finished step used: schedule(0) for step 1, ..., schedule(4) for step 5.
    assert [(ts.batch, v) for ts, v in mem.data["lr"]] == [(s, pytest.approx(1.0 - 0.1 * (s - 1))) for s in range(1, 6)]

    mem = InMemoryLogger()
    fake_fit([LRMonitor(), mem], make_state(learning_rate=3e-4), [1.0] * 3, eval_every=None)
    assert [(ts.batch, v) for ts, v in mem.data["lr"]] == [(1, 3e-4), (2, 3e-4), (3, 3e-4)]

    mem = InMemoryLogger()
    fake_fit([LRMonitor(), mem], make_state(learning_rate=None), [1.0] * 3, eval_every=None)
    assert "lr" not in mem.data


def test_lr_monitor_composer_keys_from_state_optimizers():
    from jaxcomposer.callbacks.monitors import optimizer_name
    from jaxcomposer.optim import DecoupledAdamW, DecoupledSGDW

    mem = InMemoryLogger()
    state = make_state(learning_rate=optax.linear_schedule(1.0, 0.0, transition_steps=10))
    state.optimizers = [DecoupledSGDW(lr=1.0, momentum=0.9)]
    fake_fit([LRMonitor(), mem], state, [1.0] * 3, eval_every=None)
    assert "lr" not in mem.data
    assert [(ts.batch, v) for ts, v in mem.data["lr-DecoupledSGDW/group0"]] == \
        [(1, pytest.approx(1.0)), (2, pytest.approx(0.9)), (3, pytest.approx(0.8))]

    class SGD:  # a torch-style optimizer: one rate per parameter group, read as it is now
        def __init__(self):
            self.param_groups = [{"lr": 0.1, "params": []}, {"lr": 0.01, "params": []}]

    mem, state = InMemoryLogger(), make_state(learning_rate=None)
    torch_like = SGD()
    state.optimizers = [torch_like]
    logger = Logger([mem])
    lr_monitor = LRMonitor()
    lr_monitor.run_event(Event.BATCH_END, state, logger)
    torch_like.param_groups[1]["lr"] = 0.005
    lr_monitor.run_event(Event.BATCH_END, state, logger)
    assert [v for _, v in mem.data["lr-SGD/group0"]] == [0.1, 0.1]
    assert [v for _, v in mem.data["lr-SGD/group1"]] == [0.01, 0.005]

    assert optimizer_name(DecoupledAdamW(lr=1e-3)) == "DecoupledAdamW"
    assert optimizer_name(optax.adam(1e-3)) == "GradientTransformationExtraArgs"


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_nan_monitor_raises_naming_step(bad):
    losses = [1.0] * 6 + [bad] + [1.0] * 13
    state = make_state()
    with pytest.raises(NonFiniteLossError, match=r"'loss' is -?(nan|inf) at step 7") as info:
        fake_fit([NaNMonitor()], state, losses, eval_every=None)
    assert isinstance(info.value, RuntimeError)
    assert state.timestamp.batch == 7


def test_nan_monitor_device_values_and_finite_run():
    with pytest.raises(NonFiniteLossError, match="at step 3"):
        fake_fit([NaNMonitor()], make_state(), [jnp.asarray(1.0), jnp.asarray(2.0), jnp.log(jnp.asarray(-1.0))],
                 eval_every=None)
    fake_fit([NaNMonitor()], make_state(), [jnp.asarray(float(i)) for i in range(20)],
             eval_fn=accuracy_eval([0.1] * 4))  # no error


class Pending:
    def __init__(self, value):
        self.value, self.ready = value, False

    def is_ready(self):
        return self.ready

    def __float__(self):
        return self.value


def test_nan_monitor_lags_at_most_one_step_and_checks_all_at_fit_end():
    mon, state = NaNMonitor(max_lag=1), make_state()
    logger = Logger([])
    values = [Pending(1.0), Pending(float("nan"))]
    for v in values:
        state.timestamp = state.timestamp.to_next_batch(samples=8)
        state.batch_metrics = {"loss": v}
        mon.run_event(Event.BATCH_END, state, logger)  # step 1 is forced when step 2 is queued: fine
    with pytest.raises(NonFiniteLossError, match="at step 2"):
        mon.run_event(Event.FIT_END, state, logger)
    with pytest.raises(ValueError, match="monitor"):
        NaNMonitor(monitor="")


def test_speed_monitor_logs_composers_wall_clock_keys():
    """wall_clock/train leaves the evaluations out of the timestamp's clock (which runs through them, as the Trainer's
    does: evaluations happen between two batches' ends), wall_clock/val counts them, wall_clock/total both."""
    clock, mem = FakeClock(), InMemoryLogger()
    speed = SpeedMonitor(window_size=4, clock=clock)
    state = make_state(batch_size=2)
    logger = Logger([mem])
    for step in range(1, 5):
        spent = 0.5 + (3.0 if step == 3 else 0.0)  # the evaluation after batch 2 shows in batch 3's duration
        clock.advance(0.5)
        state.timestamp = state.timestamp.to_next_batch(samples=2, duration=datetime.timedelta(seconds=spent))
        speed.run_event(Event.BATCH_END, state, logger)
        if step == 2:
            speed.run_event(Event.EVAL_START, state, logger)
            clock.advance(3.0)
            speed.run_event(Event.EVAL_END, state, logger)
    assert [v for _, v in mem.data["wall_clock/train"]] == pytest.approx([0.5, 1.0, 1.5, 2.0])
    assert [v for _, v in mem.data["wall_clock/val"]] == pytest.approx([0.0, 0.0, 3.0, 3.0])
    assert [v for _, v in mem.data["wall_clock/total"]] == pytest.approx([0.5, 1.0, 4.5, 5.0])
