"""WandBLogger, offline by default, read back from the run file wandb wrote (``offline-run-*/run-*.wandb``).
(wandb is imported inside the tests: collection in every xdist worker would pay for it otherwise.)"""
import json
import sys
from pathlib import Path

import pytest

from jaxcomposer.core.events import Event
from jaxcomposer.loggers import WandBLogger
from tests.loggers.helpers import accuracy_eval, fake_fit, fire, make_state

LOSSES = [1.0 / (i + 1) for i in range(10)]


def read_records(path: Path) -> list:
    """wandb's run file: a 7-byte header (':W&B', magic, version), then LevelDB-style log records in 32 KiB blocks
    (4-byte CRC, 2-byte length, 1-byte type: full, first, middle, last), each holding one protobuf ``Record``."""
    from wandb.proto import wandb_internal_pb2 as pb
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, payloads, part, block = 7, [], b"", 32768
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        if pos + 7 + length > len(data):  # a record the writer has not finished flushing
            break
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 1:
            payloads.append(chunk)
        elif kind == 2:
            part = chunk
        elif kind == 3:
            part += chunk
        elif kind == 4:
            payloads.append(part + chunk)
    return [pb.Record.FromString(p) for p in payloads]


def read_finished_run(run_dir: Path, timeout_s: float = 60.0) -> list:
    """The records of the one offline run under ``run_dir``, once wandb's service has written its exit record:
    ``run.finish()`` returns when the service has the records, and the service's writer flushes the file moments
    later (on a loaded machine a read can find its header only)."""
    import time
    deadline = time.monotonic() + timeout_s
    while True:
        (path,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
        records = read_records(path)
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.1)


def test_offline_run_holds_metrics_config_and_names(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    state = make_state(run_name="wb-run", total_steps=10)
    state.run_dir = tmp_path / "run"
    log = WandBLogger(project="proj", group="g", tags=["a", "b"])
    log.log_hyperparameters({"lr": 0.1})
    fake_fit([log], state, LOSSES, eval_fn=accuracy_eval([0.5, 0.75]))
    records = read_finished_run(tmp_path / "run")  # offline, in the run directory
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert (run.display_name, run.project, run.run_group, list(run.tags)) == ("wb-run", "proj", "g", ["a", "b"])
    key = lambda item: item.key or "/".join(item.nested_key)
    config = {key(i): json.loads(i.value_json) for r in records if r.WhichOneof("record_type") == "config"
              for i in r.config.update}
    assert config["lr"] == 0.1
    rows = [{key(i): json.loads(i.value_json) for i in r.history.item} for r in records
            if r.WhichOneof("record_type") == "history"]
    assert [(row["_step"], row["loss/train/total"]) for row in rows] == [(i + 1, pytest.approx(v))
                                                                          for i, v in enumerate(LOSSES)]
    assert [(row["_step"], row["metrics/eval/accuracy"]) for row in rows if "metrics/eval/accuracy" in row] == [
        (5, 0.5), (10, 0.75)]
    assert any(r.WhichOneof("record_type") == "exit" for r in records)  # finished at close
    assert log.run is None


def test_bad_arguments_and_missing_package(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="log_artifacts=True .* is not offered"):
        WandBLogger(log_artifacts=True)
    with pytest.raises(ValueError, match=r"\['project'\] given both"):
        WandBLogger(project="a", init_kwargs={"project": "b"})
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ImportError, match=r"pip install jaxcomposer\[wandb\]"):
        fire(Event.FIT_START, [WandBLogger()], make_state(), None)
