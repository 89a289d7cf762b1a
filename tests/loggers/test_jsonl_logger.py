import json
import math

import jax.numpy as jnp

from jaxcomposer.core.events import Event
from jaxcomposer.loggers import InMemoryLogger, JSONLLogger, Logger, read_jsonl
from tests.loggers.helpers import accuracy_eval, fake_fit, make_state

ACC = [0.2, 0.4, 0.6, 0.8]


def test_lines_match_what_was_logged(tmp_path):
    run_dir = tmp_path / "runs" / "r1"
    jl, mem = JSONLLogger(run_dir), InMemoryLogger()
    assert not (tmp_path / "runs").exists()
    state = make_state()
    losses = [jnp.asarray(2.0 - 0.05 * i) for i in range(20)]
    fake_fit([jl, mem], state, losses, eval_fn=accuracy_eval(ACC))

    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert records == read_jsonl(run_dir)
    train = [r for r in records if "loss/train/total" in r["metrics"]]
    evals = [r for r in records if "metrics/eval/accuracy" in r["metrics"]]
    assert len(train) == 20 and len(evals) == 4 and len(records) == 24
    assert [(r["step"], r["metrics"]["loss/train/total"]) for r in train] == \
        [(ts.batch, v) for ts, v in mem.data["loss/train/total"]]
    assert [r["metrics"]["metrics/eval/accuracy"] for r in evals] == ACC
    assert [r["step"] for r in evals] == [5, 10, 15, 20]
    # Epoch and wall time come from the state at log time: 5 batches per epoch, 0.1 s per batch.
    assert [r["epoch"] for r in train] == [i // 5 for i in range(20)]
    assert all(math.isclose(r["wall_time_s"], 0.1 * (i + 1), rel_tol=1e-6) for i, r in enumerate(train))
    # Step order is the order of the calls.
    assert [r["step"] for r in records] == sorted(r["step"] for r in records)


def test_no_directory_before_first_write(tmp_path):
    target = tmp_path / "never" / "created.jsonl"
    jl = JSONLLogger(target)
    state = make_state()
    logger = Logger([jl])
    for event in (Event.INIT, Event.FIT_START, Event.EPOCH_START):
        jl.run_event(event, state, logger)
    assert not (tmp_path / "never").exists()
    jl.close(state, logger)
    assert not (tmp_path / "never").exists()
    logger.log_metrics({"a": 1.0}, step=1)
    assert target.exists() and json.loads(target.read_text())["metrics"] == {"a": 1.0}


def test_hparams_nonfinite_and_append(tmp_path):
    path = tmp_path / "m.jsonl"
    first = JSONLLogger(path)
    first.log_hyperparameters({"lr": 0.1, "model": "mlp", "sizes": (3, 4)})
    first.log_metrics({"loss": float("nan"), "inf": float("inf")}, 1)
    first.close(None, None)
    second = JSONLLogger(path)  # a resumed run appends
    second.log_metrics({"loss": 0.5}, 2)
    second.close(None, None)
    records = read_jsonl(path)
    assert records[0] == {"hparams": {"lr": 0.1, "model": "mlp", "sizes": [3, 4]}}
    assert records[1]["metrics"] == {"loss": "nan", "inf": "inf"}
    assert records[2]["step"] == 2 and records[2]["metrics"] == {"loss": 0.5}
    assert records[1]["epoch"] == 0 and records[1]["wall_time_s"] == 0.0
