"""Each bad config or input fails early with a jaxcomposer error that names the key,
the value and the expectation, before anything is compiled or written (no run directory, no checkpoint)."""
import jax
import numpy as np
import pytest

import jaxcomposer
from jaxcomposer import Trainer
from jaxcomposer.data import ArrayLoader
from jaxcomposer.errors import JaxComposerError
from tests.trainer.helpers import digits, mlp_task

_compiles: list[str] = []
jax.monitoring.register_event_duration_secs_listener(
    lambda event, duration, **kw: _compiles.append(event) if "backend_compile" in event else None)


def _base(tmp_path) -> dict:
    return {"run_name": "bad", "run_dir": str(tmp_path / "runs"), "max_duration": "2ba", "progress_bar": False,
            "log_to_console": False, "model": {"name": "mlp", "hidden": [8]},
            "data": {"name": "digits", "batch_size": 16}, "save_folder": str(tmp_path / "ck")}


# (what, change to the base config, text the error must contain: key, value and expectation or suggestion)
CONFIG_CASES = [
    ("misspelt key", {"save_intervall": "1ep"}, ["save_intervall", "did you mean 'save_interval'"]),
    ("misspelt nested key", {"data": {"name": "digits", "batch_sise": 16}}, ["data.batch_sise", "'batch_size'"]),
    ("wrong type", {"seed": "abc"}, ["seed", "valid integer", "'abc'"]),
    ("lr <= 0", {"optimizer": {"name": "decoupled_sgdw", "lr": 0}}, ["optimizer.lr", "lr=0", "lr > 0"]),
    ("bad time string", {"max_duration": "10epochs"}, ["max_duration", "'10epochs'", "e.g. '10ep'"]),
    ("missing max_duration", {"max_duration": None}, ["max_duration", "required", "'10ep'"]),
    ("nonexistent load_path", {"load_path": "no/such/ckpt"}, ["load_path", "'no/such/ckpt' does not exist"]),
    ("unknown algorithm", {"algorithms": {"mix_up_x": {}}}, ["algorithms.mix_up_x", "unknown name"]),
    ("bad method argument", {"algorithms": {"mixup": {"alpha": -1}}}, ["algorithms.mixup.alpha", "-1", ">= 0"]),
    ("batch larger than the dataset", {"data": {"name": "digits", "batch_size": 5000}},
     ["batch_size=5000", "larger than the dataset size", "batch_size <="]),
]


def _written(tmp_path) -> list[str]:
    return sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))


@pytest.mark.parametrize("what,change,expect", CONFIG_CASES, ids=[c[0] for c in CONFIG_CASES])
def test_bad_config_fails_first_with_a_clear_error(tmp_path, what, change, expect):
    cfg = {**_base(tmp_path), **change}
    cfg = {k: v for k, v in cfg.items() if v is not None}
    before = _written(tmp_path)
    _compiles.clear()
    with pytest.raises(JaxComposerError) as err:
        jaxcomposer.fit(cfg)
    for text in expect:
        assert text in str(err.value), (what, str(err.value))
    assert _written(tmp_path) == before, f"{what}: files were written"
    assert not _compiles, f"{what}: something was compiled first"


def _loader(n=256, batch=32, **kw):
    return ArrayLoader(digits("train", n), batch, seed=0, **kw)


def test_empty_dataset_and_batch_larger_than_dataset():
    empty = {"input": np.zeros((0, 64), np.float32), "target": np.zeros((0,), np.int32)}
    with pytest.raises(JaxComposerError, match=r"dataset is empty \(arrays \['input', 'target'\] have 0 examples\)"):
        ArrayLoader(empty, 8)
    with pytest.raises(JaxComposerError, match="batch_size=32 is larger than the dataset size 10 and drop_last=True"):
        ArrayLoader(digits("train", 10), 32)


def test_an_empty_loader_fails_before_compiling_or_saving(tmp_path):
    trainer = Trainer(model=mlp_task(), train_dataloader=[], max_duration="2ba", progress_bar=False,
                      save_folder=tmp_path / "ck", run_name="bad")
    _compiles.clear()
    with pytest.raises(JaxComposerError, match="train_dataloader: yielded no batches"):
        trainer.fit()
    assert not _compiles and not (tmp_path / "ck").exists()


def test_resume_with_a_changed_model_shape_names_each_difference(tmp_path):
    from flax import nnx

    from jaxcomposer.models import MLP
    from jaxcomposer.models.tasks import ComposerClassifier
    first = Trainer(model=mlp_task(), train_dataloader=_loader(), max_duration="1ba", progress_bar=False, seed=0)
    first.fit()
    first.save_checkpoint(tmp_path / "ck")
    before = _written(tmp_path)
    wider = ComposerClassifier(MLP(64, hidden=(48,), num_classes=10, rngs=nnx.Rngs(0)), num_classes=10)
    _compiles.clear()
    with pytest.raises(JaxComposerError) as err:
        Trainer(model=wider, train_dataloader=_loader(), max_duration="2ba", progress_bar=False,
                load_path=tmp_path / "ck", save_folder=tmp_path / "new")
    msg = str(err.value)
    for text in ["params.hidden.0.kernel: checkpoint has (64, 32) float32, the model/recipe has (64, 48) float32",
                 "params.head.kernel: checkpoint has (32, 10) float32, the model/recipe has (48, 10) float32",
                 "load_ignore_keys"]:
        assert text in msg, msg
    assert _written(tmp_path) == before
    assert not any("train_step" in c for c in _compiles)


TRAINER_CASES = [
    ("max_duration", {"max_duration": "10epochs"}, ["max_duration", "'10epochs'"]),
    ("max_duration", {"max_duration": -3}, ["max_duration", "-3", "positive"]),
    ("precision", {"precision": "fp8"}, ["precision", "'fp8'", "fp32"]),
    ("save_interval", {"save_interval": "2 epochs"}, ["save_interval", "2 epochs"]),
    ("eval_interval", {"eval_interval": "-1ba"}, ["eval_interval", "'-1ba'", "positive"]),
    ("microbatch", {"device_train_microbatch_size": 0}, ["device_train_microbatch_size", "0", "greater than 0"]),
    ("keep", {"save_num_checkpoints_to_keep": 0}, ["save_num_checkpoints_to_keep", "0", "-1 (keep all) or >= 1"]),
    ("nonfinite", {"nonfinite": "ignore"}, ["nonfinite", "'ignore'", "'skip'"]),
    ("load_path", {"load_path": "missing-dir"}, ["load_path", "'missing-dir' does not exist"]),
    ("model", {"model": object()}, ["model", "ComposerClassifier"]),
]


@pytest.mark.parametrize("what,change,expect", TRAINER_CASES, ids=[c[0] for c in TRAINER_CASES])
def test_bad_trainer_arguments_fail_first(tmp_path, what, change, expect):
    kwargs = {"model": mlp_task(), "train_dataloader": _loader(), "max_duration": "2ba", "progress_bar": False,
              "save_folder": tmp_path / "ck", "run_dir": tmp_path / "run", **change}
    _compiles.clear()
    with pytest.raises(JaxComposerError) as err:
        Trainer(**kwargs)
    for text in expect:
        assert text in str(err.value), (what, str(err.value))
    assert _written(tmp_path) == [] and not _compiles
