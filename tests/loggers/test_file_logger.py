import sys

import jax.numpy as jnp
import pytest

from jaxcomposer.core.events import Event
from jaxcomposer.loggers import FileLogger, Logger
from tests.loggers.helpers import NotYet, accuracy_eval, fake_fit, make_state


def _lines(path):
    return path.read_text().splitlines()


def test_composer_line_format_and_filename_pattern(tmp_path):
    fl = FileLogger(str(tmp_path / "{run_name}" / "logs-rank{rank}.txt"), capture_stdout=False, capture_stderr=False)
    with pytest.raises(RuntimeError, match="INIT"):
        fl.filename
    fl.log_hyperparameters({"lr": 0.1, "optimizer": "DecoupledSGDW", "seed": 17})  # before INIT: kept
    state = make_state(total_steps=3, run_name="my-run")
    fake_fit([fl], state, [jnp.asarray(2.0), jnp.asarray(1.5), 1.25], eval_every=None)
    path = tmp_path / "my-run" / "logs-rank0.txt"
    assert fl.filename == str(path)
    assert path.read_text() == (
        "[hyperparameter]: lr: 0.1000 \n"
        "[hyperparameter]: optimizer: \"DecoupledSGDW\" \n"
        "[hyperparameter]: seed: 17 \n"
        "[metric][batch=1]: loss/train/total: 2.0000 \n"
        "[metric][batch=2]: loss/train/total: 1.5000 \n"
        "[metric][batch=3]: loss/train/total: 1.2500 \n")
    assert fl.file is None  # closed by close()


def test_values_formats_traces_and_remote_file_name(tmp_path):
    fl = FileLogger(str(tmp_path / "log.txt"), capture_stdout=False, capture_stderr=False, log_traces=True)
    logger, state = Logger([fl]), make_state()
    fl.run_event(Event.INIT, state, logger)
    logger.set_step(4)
    logger.log_metrics({"n": 3, "flag": True, "none": None, "dict": {"a": 1.0}, "list": [1, 2.5],
                        "vector": jnp.arange(3), "scalar_int": jnp.asarray(7)})
    logger.log_traces({"algorithm_traces/MixUp/BATCH_START": 1})
    fl.close(state, logger)
    assert _lines(tmp_path / "log.txt") == [
        "[metric][batch=4]: n: 3 ", "[metric][batch=4]: flag: True ", "[metric][batch=4]: none: None ",
        '[metric][batch=4]: dict: { "a": 1.0000, } ', "[metric][batch=4]: list: [1, 2.5000] ",
        "[metric][batch=4]: vector: Array of shape (3,) ", "[metric][batch=4]: scalar_int: 7 ",
        "[trace]: algorithm_traces/MixUp/BATCH_START:1"]
    with pytest.raises(ValueError, match="remote_file_name is the log's name in the bucket"):
        FileLogger(remote_file_name="s3://bucket/{run_name}.txt")  # a name in the uploader's bucket, not a URI
    with pytest.raises(ValueError, match="is a URI; the log is written locally and uploaded by a "
                                         "RemoteUploaderDownloader"):
        FileLogger("s3://bucket/{run_name}/log.txt")
    for kwargs in (dict(log_interval=0), dict(flush_interval=0), dict(buffer_size=True)):
        with pytest.raises(ValueError, match=next(iter(kwargs))):
            FileLogger(**kwargs)


def test_overwrite(tmp_path):
    path = tmp_path / "log.txt"
    path.write_text("old\n")
    fl = FileLogger(str(path), overwrite=False, capture_stdout=False, capture_stderr=False)
    with pytest.raises(FileExistsError):
        fl.run_event(Event.INIT, make_state(), Logger([fl]))
    fl = FileLogger(str(path), capture_stdout=False, capture_stderr=False)  # overwrite=True by default
    fake_fit([fl], make_state(total_steps=1), [1.0], eval_every=None)
    assert _lines(path) == ["[metric][batch=1]: loss/train/total: 1.0000 "]


def test_captures_stdout_and_stderr_until_close(tmp_path):
    fl = FileLogger(str(tmp_path / "log.txt"))
    state, logger = make_state(), Logger([fl])
    before_out, before_err = sys.stdout, sys.stderr
    fl.run_event(Event.INIT, state, logger)
    print("hello\nworld")
    sys.stdout.write("partial ")
    sys.stdout.write("line\n")
    print("oops", file=sys.stderr)
    assert sys.stdout.isatty() == before_out.isatty()  # everything else is the original stream's
    fl.close(state, logger)
    assert sys.stdout is before_out and sys.stderr is before_err
    print("not captured")
    assert _lines(tmp_path / "log.txt") == ["[stdout]: hello", "[stdout]: world", "[stdout]: partial line",
                                            "[stderr]: oops"]


def test_log_interval_filters_training_metrics_only(tmp_path):
    fl = FileLogger(str(tmp_path / "log.txt"), log_interval=2, capture_stdout=False, capture_stderr=False)
    fake_fit([fl], make_state(total_steps=5), [1.0, 2.0, 3.0, 4.0, 5.0], eval_every=3,
             eval_fn=accuracy_eval([0.5]))
    assert _lines(tmp_path / "log.txt") == [
        "[metric][batch=2]: loss/train/total: 2.0000 ",
        "[metric][batch=3]: metrics/eval/accuracy: 0.5000 ",
        "[metric][batch=3]: metrics/eval/cross_entropy: 0.5000 ",
        "[metric][batch=4]: loss/train/total: 4.0000 "]


def test_device_values_are_written_once_ready_in_order(tmp_path):
    fl = FileLogger(str(tmp_path / "log.txt"), capture_stdout=False, capture_stderr=False, buffer_size=1)
    state, logger = make_state(), Logger([fl])
    fl.run_event(Event.INIT, state, logger)
    first, second = NotYet(1.0), NotYet(2.0)
    logger.log_metrics({"loss": first}, step=1)
    logger.log_metrics({"loss": second}, step=2)
    assert (tmp_path / "log.txt").read_text() == ""  # nothing waited for the device
    first.ready = True
    logger.log_metrics({"lr": 0.1}, step=3)
    assert _lines(tmp_path / "log.txt") == ["[metric][batch=1]: loss: 1.0000 "]
    fl.run_event(Event.EPOCH_END, state, logger)
    assert _lines(tmp_path / "log.txt")[1:] == ["[metric][batch=2]: loss: 2.0000 ", "[metric][batch=3]: lr: 0.1000 "]
    fl.close(state, logger)
