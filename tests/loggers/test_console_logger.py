import io

from jaxcomposer.loggers import ConsoleLogger
from tests.loggers.helpers import FakeClock, accuracy_eval, fake_fit, make_state


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
    lines = stream.getvalue().splitlines()
    assert lines[0] == "[epoch 0 batch 5] eval: accuracy=0.5  cross_entropy=0.5"
    assert lines[1].startswith("[epoch 1 batch 10] eval: accuracy=0.9")
    assert lines[2].startswith("[epoch 2 batch 15] eval: accuracy=0.7")
    summary = "\n".join(lines[3:])
    assert "[fit end] test-run: 15 batches" in summary and "in 30.0s" in summary
    assert "final eval: accuracy=0.7" in summary
    assert "best eval/accuracy: 0.9" in summary
    assert "stopped early: enough" in summary
