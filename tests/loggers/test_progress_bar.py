import io
import re

from jaxcomposer.loggers import ProgressBarLogger
from tests.loggers.helpers import FakeClock, accuracy_eval, fake_fit, make_state


class CountingScalar:
    """Counts float() calls: each one would wait for the device step."""

    calls = 0

    def __init__(self, value):
        self.value = value

    def __float__(self):
        CountingScalar.calls += 1
        return self.value


def test_bar_shows_loss_throughput_eta_and_eval():
    stream, clock = io.StringIO(), FakeClock()
    bar = ProgressBarLogger(log_interval_s=0.5, stream=stream, clock=clock, mode="bar")
    losses = [1.0 / (i + 1) for i in range(20)]
    fake_fit([bar], make_state(batch_size=8), losses, eval_fn=accuracy_eval([0.1, 0.2, 0.3, 0.875]), clock=clock,
             batch_time=1.0)
    text = stream.getvalue()
    final = text.replace("\r", "\n").strip().splitlines()[-1]
    assert "20/20" in final and "test-run" in final
    assert re.search(r"\d\d:\d\d<\d\d:\d\d", final), final  # elapsed<ETA
    assert "loss=0.05" in final  # last loss, 1/20
    assert "samples/s=8.0" in final  # 8 samples per fake second
    assert "eval/accuracy=0.875" in final
    assert bar._bar is None  # closed at FIT_END


def test_loss_read_at_most_every_interval():
    CountingScalar.calls = 0
    stream, clock = io.StringIO(), FakeClock()
    bar = ProgressBarLogger(log_interval_s=0.5, stream=stream, clock=clock, mode="bar")
    fake_fit([bar], make_state(), [CountingScalar(0.5) for _ in range(20)], eval_every=None, clock=clock,
             batch_time=0.1)
    # 2 s of fake time at one read per 0.5 s, plus the final read at FIT_END.
    assert 3 <= CountingScalar.calls <= 5
    assert "loss=0.5" in stream.getvalue()


def test_invalid_interval():
    import pytest

    with pytest.raises(ValueError, match="log_interval_s"):
        ProgressBarLogger(log_interval_s=-1)



def test_a_log_file_gets_plain_periodic_lines():
    """Not a terminal (a CI log, a file): whole lines every line_interval_s and at the end, no carriage returns."""
    stream, clock = io.StringIO(), FakeClock()
    bar = ProgressBarLogger(log_interval_s=0.5, stream=stream, clock=clock, line_interval_s=5.0)
    losses = [1.0 / (i + 1) for i in range(20)]
    fake_fit([bar], make_state(batch_size=8), losses, eval_fn=accuracy_eval([0.1, 0.2, 0.3, 0.875]), clock=clock,
             batch_time=1.0)
    text = stream.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert len(lines) == 5  # at 5, 10, 15 and 20 s of fake time, and the final one
    assert lines[0].startswith("test-run: ") and "5/20" in lines[0]
    assert "20/20" in lines[-1] and "loss=0.05" in lines[-1] and "eval/accuracy=0.875" in lines[-1]
    assert re.search(r"\d\d:\d\d<\d\d:\d\d", lines[1]), lines[1]  # elapsed<ETA
