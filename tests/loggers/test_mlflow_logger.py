"""MLFlowLogger, read back with mlflow's own client from the store it wrote (a SQLite file in the run directory).
(mlflow is imported inside the tests: collection in every xdist worker would pay for it otherwise.)"""
import sys

import pytest

from jaxcomposer.loggers import MLFlowLogger
from tests.loggers.helpers import accuracy_eval, fake_fit, fire, make_state
from jaxcomposer.core.events import Event

LOSSES = [1.0 / (i + 1) for i in range(20)]


def run_of(logger: MLFlowLogger):
    from mlflow.tracking import MlflowClient
    client = MlflowClient(logger.tracking_uri)
    return client, client.get_run(logger.run_id)


def history(client, run, key):
    return sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))


def test_metrics_params_and_tags_read_back(tmp_path):
    state = make_state(run_name="ml-run")
    state.run_dir = tmp_path / "run"
    log = MLFlowLogger(experiment_name="exp", tags={"team": "vision"}, run_group="sweep-1", flush_interval=3,
                       ignore_metrics=["metrics/eval/cross*"], ignore_hyperparameters=["secret*"])
    log.log_hyperparameters({"lr": 0.1, "secret_token": "x"})  # before the run opens: kept, sent at fit start
    fake_fit([log], state, LOSSES, eval_fn=accuracy_eval([0.25, 0.5, 0.75, 1.0]))
    assert log.tracking_uri == f"sqlite:///{tmp_path / 'run' / 'mlflow.db'}"
    client, run = run_of(log)
    assert run.info.run_name == "ml-run" and run.info.status == "FINISHED"
    assert client.get_experiment(run.info.experiment_id).name == "exp"
    assert run.data.tags["team"] == "vision" and run.data.tags["run_group"] == "sweep-1"
    assert run.data.params == {"lr": "0.1"}
    assert history(client, run, "loss/train/total") == [(i + 1, pytest.approx(v)) for i, v in enumerate(LOSSES)]
    assert history(client, run, "metrics/eval/accuracy") == [(5, 0.25), (10, 0.5), (15, 0.75), (20, 1.0)]
    assert history(client, run, "metrics/eval/cross_entropy") == []  # ignored by pattern


def test_resume_continues_the_same_run(tmp_path):
    """An autoresumed run keeps one MLflow run: metrics append, a param keeps its first value (MLflow params are
    immutable) and a changed one is kept as a tag."""
    uri = f"sqlite:///{tmp_path / 'ml.db'}"
    first = MLFlowLogger(experiment_name="exp", run_name="same", tracking_uri=uri)
    first.log_hyperparameters({"lr": 0.1})
    fake_fit([first], make_state(), LOSSES[:10], eval_every=None)
    second = MLFlowLogger(experiment_name="exp", run_name="same", tracking_uri=uri, resume=True)
    second.log_hyperparameters({"lr": 0.2, "resumed_from": "ckpt/10"})
    state = make_state()
    state.timestamp = state.timestamp.copy(batch=10)
    fake_fit([second], state, LOSSES[10:], eval_every=None)
    assert second.run_id == first.run_id
    client, run = run_of(second)
    assert [s for s, _ in history(client, run, "loss/train/total")] == list(range(1, 21))
    assert run.data.params == {"lr": "0.1", "resumed_from": "ckpt/10"}
    assert run.data.tags["param_changed.lr"] == "0.2"
    third = MLFlowLogger(experiment_name="exp", run_name="same", tracking_uri=uri)  # no resume: a new run
    fake_fit([third], make_state(), LOSSES[:2], eval_every=None)
    assert third.run_id != first.run_id


def test_only_rank_zero_opens_a_run_and_nothing_before_fit(tmp_path, monkeypatch):
    log = MLFlowLogger(tracking_uri=f"sqlite:///{tmp_path / 'ml.db'}")
    log.log_metrics({"loss": 1.0}, 1)  # before fit: dropped, nothing opened
    assert log.run_id is None
    monkeypatch.setattr("jax.process_index", lambda: 1)
    fire(Event.FIT_START, [log], make_state(), None)
    assert log.run_id is None and not (tmp_path / "ml.db").exists()


@pytest.mark.parametrize("kwargs,error,match", [
    ({"flush_interval": 0}, ValueError, "flush_interval must be a positive number of steps, got 0"),
    ({"ignore_metrics": "loss*"}, TypeError, "ignore_metrics must be a list of glob patterns"),
    ({"log_system_metrics": True}, ValueError, "log_system_metrics=True is not offered"),
])
def test_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        MLFlowLogger(**kwargs)


def test_missing_package_names_the_extra(tmp_path, monkeypatch):
    for name in [m for m in sys.modules if m == "mlflow" or m.startswith("mlflow.")] + ["mlflow"]:
        monkeypatch.setitem(sys.modules, name, None)  # as if not installed, even after other tests imported it
    log = MLFlowLogger(tracking_uri=f"sqlite:///{tmp_path / 'ml.db'}")
    with pytest.raises(ImportError, match=r"pip install jaxcomposer\[mlflow\]"):
        fire(Event.FIT_START, [log], make_state(), None)
