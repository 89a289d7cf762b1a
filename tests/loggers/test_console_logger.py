import io
import sys

import pytest

from jaxcomposer.core.events import Event

from jaxcomposer.core.run_state import RunPlan, RunState
from jaxcomposer.core.time import Time, Timestamp
from jaxcomposer.loggers import ConsoleLogger, Logger
from tests.loggers.helpers import FakeClock, NotYet, accuracy_eval, fake_fit, make_state


def _eval_and_summary(lines):
    """The lines that are not Composer's training blocks."""
    return [line for line in lines if not line.startswith(("[batch=", "[epoch=", "\t"))]


def test_eval_lines_and_summary():
    stream, clock = io.StringIO(), FakeClock()
    console = ConsoleLogger(stream=stream, clock=clock)
    state = make_state()

    class StopAt15:
        def run_event(self, event, state, logger):
            if event.value == "eval_end" and state.timestamp.batch == 15:
                state.stop_training("enough")

        def close(self, state, logger):
            pass

    fake_fit([console, StopAt15()], state, [1.0] * 20, eval_fn=accuracy_eval([0.5, 0.9, 0.7, 0.8]), clock=clock,
             batch_time=2.0)
    lines = _eval_and_summary(stream.getvalue().splitlines())
    assert lines[0] == "[epoch 0 batch 5] eval: accuracy=0.5  cross_entropy=0.5"
    assert lines[1].startswith("[epoch 1 batch 10] eval: accuracy=0.9")
    assert lines[2].startswith("[epoch 2 batch 15] eval: accuracy=0.7")
    summary = "\n".join(lines[3:])
    assert "[fit end] test-run: 15 batches" in summary and "in 30.0s" in summary
    assert "final eval: accuracy=0.7" in summary
    assert "best eval/accuracy: 0.9" in summary
    assert "stopped early: enough" in summary


def test_train_lines_every_batch_by_default_in_composers_format():
    stream = io.StringIO()
    fake_fit([ConsoleLogger(stream=stream)], make_state(total_steps=3), [2.0, 1.5, 1.25], eval_every=None)
    text = stream.getvalue()
    assert text.startswith("[batch=1/3]:\n\t Train loss/train/total: 2.0000\n"
                           "[batch=2/3]:\n\t Train loss/train/total: 1.5000\n"
                           "[batch=3/3]:\n\t Train loss/train/total: 1.2500\n"
                           "[fit end] test-run: 3 batches")
    assert ConsoleLogger().log_interval == Time(1, "ba")


def test_batch_interval_keeps_latest_values_and_prints_the_rest_at_fit_end():
    stream = io.StringIO()
    console = ConsoleLogger(log_interval="3ba", stream=stream)

    class LogsExtra:
        def run_event(self, event, state, logger):
            if event == Event.BATCH_END:
                logger.log_metrics({"count": state.timestamp.batch, "name": "x"})

        def close(self, state, logger):
            pass

    fake_fit([LogsExtra(), console], make_state(total_steps=7), [float(i) for i in range(7)], eval_every=None)
    blocks = stream.getvalue().split("[fit end]")[0].strip().split("\n[")
    # The first batch is always printed (Composer's last_logged_batch == 0), then batches 3 and 6, then FIT_END
    # prints what was logged after batch 6.
    assert blocks == ["[batch=1/7]:\n\t Train loss/train/total: 0.0000\n\t Train count: 1\n\t Train name: \"x\"",
                      "batch=3/7]:\n\t Train loss/train/total: 2.0000\n\t Train count: 3\n\t Train name: \"x\"",
                      "batch=6/7]:\n\t Train loss/train/total: 5.0000\n\t Train count: 6\n\t Train name: \"x\"",
                      "batch=7/7]:\n\t Train loss/train/total: 6.0000\n\t Train count: 7\n\t Train name: \"x\""]


def test_epoch_interval_with_epoch_progress_and_print_indices():
    stream = io.StringIO()
    console = ConsoleLogger(log_interval=1, stream=stream, print_indices=True, clock=FakeClock())  # int: epochs
    state = RunState(run_name="r", run_dir=None, plan=RunPlan(Time(2, "ep"), 8, 4), timestamp=Timestamp(),
                     batch_size=8)
    fake_fit([console], state, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0], eval_every=None)
    lines = stream.getvalue().splitlines()
    # printed at EPOCH_END only. fake_fit fires EPOCH_END before advancing the epoch counter, the trainer after:
    # both print the epoch that just ended (the second case is below)
    assert lines[:5] == ["[epoch=1][batch=4/4][ba=4][sp=32]:", "\t Train loss/train/total: 4.0000",
                         "[epoch=2][batch=4/4][ba=8][sp=64]:", "\t Train loss/train/total: 8.0000",
                         "[fit end] r: 8 batches, 2 epochs, 64 samples in 0.0s"]

    stream = io.StringIO()
    console = ConsoleLogger(log_interval="1ep", stream=stream)
    state = RunState(run_name="r", run_dir=None, plan=RunPlan(Time(2, "ep"), 8, 4),
                     timestamp=Timestamp(epoch=1, batch=4), batch_size=8)
    console.log_metrics({"loss/train/total": 0.5}, 4)
    console.run_event(Event.EPOCH_END, state, Logger([console]))  # the trainer's counters at EPOCH_END
    assert stream.getvalue() == "[epoch=1][batch=4/4]:\n\t Train loss/train/total: 0.5000\n"


def test_device_values_are_printed_once_ready_and_forced_at_epoch_end():
    stream = io.StringIO()
    console, state = ConsoleLogger(stream=stream), make_state(steps_per_epoch=2)
    logger = Logger([console])
    values = [NotYet(1.0), NotYet(2.0)]
    for v in values:
        state.timestamp = state.timestamp.to_next_batch(samples=8)
        logger.log_metrics({"loss/train/total": v})
        console.run_event(Event.BATCH_END, state, logger)
    assert stream.getvalue() == ""  # nothing waited for the device
    values[0].ready = True
    state.timestamp = state.timestamp.to_next_batch(samples=8)
    logger.log_metrics({"loss/train/total": 3.0})
    console.run_event(Event.BATCH_END, state, logger)
    # batch 1 is ready; batch 2 is not, and lines keep their order, so batch 3 waits behind it
    assert stream.getvalue() == "[batch=1/20]:\n\t Train loss/train/total: 1.0000\n"
    console.run_event(Event.EPOCH_END, state, logger)  # the host waits here anyway: everything is printed
    assert stream.getvalue() == ("[batch=1/20]:\n\t Train loss/train/total: 1.0000\n"
                                 "[batch=2/20]:\n\t Train loss/train/total: 2.0000\n"
                                 "[batch=3/20]:\n\t Train loss/train/total: 3.0000\n")


def test_stream_names_hparams_and_validation(capsys):
    console = ConsoleLogger(stream="stdout")
    console.log_hyperparameters({"seed": 1, "run": "a"})
    fake_fit([console], make_state(total_steps=1), [1.0], eval_every=None)
    out = capsys.readouterr()
    assert out.err == ""
    assert out.out.startswith("******************************\nConfig:\nrun: a\nseed: 1\n"
                              "******************************\n[batch=1/1]:\n\t Train loss/train/total: 1.0000\n")
    console = ConsoleLogger(stream=sys.stderr, log_traces=True)
    console.log_traces({"algorithm_traces/MixUp/BATCH_START": 1})
    assert capsys.readouterr().err == "[trace]: algorithm_traces/MixUp/BATCH_START:1\n"
    with pytest.raises(ValueError, match="stream"):
        ConsoleLogger(stream="stdin")
    with pytest.raises(ValueError, match="log_interval"):
        ConsoleLogger(log_interval="0.5dur")
    with pytest.raises(ValueError, match="log_interval"):
        ConsoleLogger(log_interval=0)
