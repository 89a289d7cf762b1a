import pytest

from jaxcomposer.callbacks import RuntimeEstimator
from jaxcomposer.core.run_state import RunPlan, RunState
from jaxcomposer.core.time import Time, Timestamp
from jaxcomposer.loggers import InMemoryLogger
from tests.loggers.helpers import FakeClock, accuracy_eval, fake_fit, make_state


def estimates(mem):
    return [(ts.batch, v) for ts, v in mem.data["time/remaining_estimate"]]


def test_remaining_time_skips_the_first_batch():
    clock, mem = FakeClock(), InMemoryLogger()
    fake_fit([RuntimeEstimator(time_unit="seconds", clock=clock), mem], make_state(total_steps=20), [1.0] * 20,
             eval_every=None, clock=clock, batch_time=1.0)
    # the clock starts at batch 2; every batch takes 1 s, so after batch k, 20 - k seconds are left
    assert estimates(mem) == [(k, pytest.approx(20.0 - k)) for k in range(2, 21)]
    assert mem.hyperparameters == {"time/remaining_estimate_unit": "seconds"}


def test_units_and_skip_batches():
    clock, mem = FakeClock(), InMemoryLogger()
    fake_fit([RuntimeEstimator(skip_batches=3, clock=clock), mem], make_state(total_steps=10), [1.0] * 10,
             eval_every=None, clock=clock, batch_time=36.0)
    assert estimates(mem)[0] == (4, pytest.approx(6 * 36 / 3600))  # hours by default
    with pytest.raises(ValueError, match="Invalid time_unit: weeks"):
        RuntimeEstimator(time_unit="weeks")
    with pytest.raises(ValueError, match="skip_batches"):
        RuntimeEstimator(skip_batches=-1)


def test_evaluation_time_is_excluded_and_added_back_for_the_evaluations_to_come():
    clock, mem = FakeClock(), InMemoryLogger()
    fake_fit([RuntimeEstimator(time_unit="seconds", clock=clock), mem], make_state(total_steps=20), [1.0] * 20,
             eval_every=5, eval_fn=accuracy_eval([0.1] * 4), clock=clock, batch_time=1.0, eval_time=10.0)
    got = dict(estimates(mem))
    assert got[4] == pytest.approx(16.0)  # no evaluation yet
    # after the first evaluation (10 s, at 5/20 of the run, the clock started at 1/20): one evaluation per 4/20
    # of the run, so (1 - 1/20) / (4/20) = 4.75 in all, 3.75 to come, 10 s each, plus 14 s of training
    assert got[6] == pytest.approx(14.0 + 3.75 * 10.0)
    # after the second (at 10/20): one evaluation per (10/20 - 1/20) / 2 of the run, Composer's rate; the first
    # evaluation (compilation) is left out of the mean: still 10 s each here
    assert got[11] == pytest.approx(9.0 + (0.95 / 0.225 - 2) * 10.0)


def test_epoch_durations_progress_within_an_epoch():
    clock, mem = FakeClock(), InMemoryLogger()
    state = RunState(run_name="r", run_dir=None, plan=RunPlan(Time(2, "ep"), 8, 4), timestamp=Timestamp(),
                     batch_size=8)
    fake_fit([RuntimeEstimator(time_unit="seconds", clock=clock), mem], state, [1.0] * 8, eval_every=None,
             clock=clock, batch_time=1.0)
    assert estimates(mem) == [(k, pytest.approx(8.0 - k)) for k in range(2, 9)]


def test_no_max_duration_warns_and_logs_nothing():
    clock, mem = FakeClock(), InMemoryLogger()
    state = RunState(run_name="r", run_dir=None, plan=RunPlan(None, 1, None), timestamp=Timestamp(), batch_size=8)
    with pytest.warns(UserWarning, match="max_duration"):
        fake_fit([RuntimeEstimator(clock=clock), mem], state, [1.0] * 3, eval_every=None, clock=clock)
    assert "time/remaining_estimate" not in mem.data
