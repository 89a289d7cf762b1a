"""Composer's remaining checkpoint options: save_weights_only / load_weights_only, load_ignore_keys,
save_overwrite, a callable save_interval, and load_path pointing at a save_folder."""
import jax
import numpy as np
import optax
import pytest

from jaxcomposer import Trainer
from jaxcomposer.core.events import Event
from jaxcomposer.data import ArrayLoader
from jaxcomposer.optim import DecoupledSGDW
from jaxcomposer.trainer.checkpoint import CheckpointError, flat_paths
from jaxcomposer.trainer.trainer import ConfigurationError
from tests.trainer.helpers import digits, leaves, mlp_task


def trainer(max_duration="4ba", task=None, optimizer=None, **kw):
    return Trainer(model=task or mlp_task(), train_dataloader=ArrayLoader(digits("train", 256), 32, seed=1),
                   max_duration=max_duration, optimizers=optimizer or DecoupledSGDW(lr=0.1, momentum=0.9),
                   seed=0, progress_bar=False, run_name="opts", **kw)


def test_weights_only_saves_and_loads_weights_into_a_fresh_run(tmp_path):
    first = trainer(save_folder=tmp_path / "ck", save_interval="2ba", save_weights_only=True)
    first.fit()
    first.close()
    assert [p.name for p in sorted((tmp_path / "ck" / "4").iterdir()) if p.is_dir()] == ["meta", "weights"]
    with pytest.raises(CheckpointError, match="holds weights only .* load_weights_only=True"):
        trainer(load_path=tmp_path / "ck" / "4")
    # fine-tuning with another optimizer: the weights come over, the run starts at batch 0 with a fresh Adam state
    tuned = trainer(load_path=tmp_path / "ck", load_weights_only=True, optimizer=optax.adam(1e-3))
    assert tuned.state.timestamp.batch == 0 and int(tuned.state.train_state.step) == 0
    for a, b in zip(leaves(first.state.train_state.params), leaves(tuned.state.train_state.params)):
        np.testing.assert_array_equal(a, b)
    tuned.fit()
    assert tuned.state.timestamp.batch == 4


def test_autoresume_refuses_weights_only_and_overwrite(tmp_path):
    with pytest.raises(ConfigurationError, match="save_weights_only: autoresume needs full checkpoints"):
        trainer(save_folder=tmp_path / "ck", autoresume=True, save_weights_only=True)
    with pytest.raises(ConfigurationError, match="save_overwrite: cannot be True with autoresume"):
        trainer(save_folder=tmp_path / "ck", autoresume=True, save_overwrite=True)
    with pytest.raises(ConfigurationError, match="autoresume: needs run_name"):
        Trainer(model=mlp_task(), train_dataloader=ArrayLoader(digits("train", 64), 32), max_duration="1ba",
                save_folder=tmp_path / "ck", autoresume=True, progress_bar=False)
    assert not (tmp_path / "ck").exists()


def test_changed_head_needs_ignore_keys_and_then_keeps_its_fresh_init(tmp_path):
    from flax import nnx

    from jaxcomposer.models import MLP
    from jaxcomposer.models.tasks import ComposerClassifier
    first = trainer()
    first.fit()
    first.save_checkpoint(tmp_path / "ck")
    new_task = lambda: ComposerClassifier(MLP(64, hidden=(32,), num_classes=5, rngs=nnx.Rngs(3)), num_classes=5)
    with pytest.raises(CheckpointError) as err:
        trainer(task=new_task(), load_path=tmp_path / "ck")
    assert "params.head.kernel: checkpoint has (32, 10) float32, the model/recipe has (32, 5) float32" in str(err.value)
    assert "load_ignore_keys" in str(err.value)
    fresh = flat_paths(trainer(task=new_task()).state.train_state.params)
    tuned = trainer(task=new_task(), load_path=tmp_path / "ck", load_weights_only=True,
                    load_ignore_keys=["params.head.*"])
    got, saved = flat_paths(tuned.state.train_state.params), flat_paths(first.state.train_state.params)
    assert sorted(got) == ["head.bias", "head.kernel", "hidden.0.bias", "hidden.0.kernel"]
    np.testing.assert_array_equal(got["hidden.0.kernel"], saved["hidden.0.kernel"])
    np.testing.assert_array_equal(got["head.kernel"], fresh["head.kernel"])


def test_ignore_keys_on_a_full_restore_keep_chosen_state_fresh(tmp_path):
    first = trainer()
    first.fit()
    first.save_checkpoint(tmp_path / "ck")
    again = trainer(load_path=tmp_path / "ck", load_ignore_keys=["opt_state.*"])
    assert again.state.timestamp.batch == 4
    for a, b in zip(leaves(first.state.train_state.params), leaves(again.state.train_state.params)):
        np.testing.assert_array_equal(a, b)
    assert all(not np.any(x) for x in leaves(again.state.train_state.opt_state))  # momentum starts from zero
    with pytest.raises(ConfigurationError, match="load_ignore_keys: .* without load_path"):
        trainer(load_ignore_keys=["params.*"])
    with pytest.raises(CheckpointError, match=r"load_ignore_keys: \['params.haed.\*'\] match no leaf"):
        trainer(load_path=tmp_path / "ck", load_ignore_keys=["opt_state.*", "params.haed.*"])  # a typo is named


def test_save_overwrite_replaces_the_old_run_at_its_first_save(tmp_path):
    old = trainer(save_folder=tmp_path / "ck", save_interval="2ba")
    old.fit()
    old.close()
    assert old.store.all_steps() == [2, 4]
    new = trainer("3ba", save_folder=tmp_path / "ck", save_interval="3ba", save_overwrite=True)
    assert sorted(p.name for p in (tmp_path / "ck").iterdir() if p.name.isdigit()) == ["2", "4"]  # not yet
    new.fit()
    new.close()
    assert new.store.all_steps() == [3]
    resumed = trainer("3ba", save_folder=tmp_path / "ck", autoresume=True)
    assert resumed.state.timestamp.batch == 3


def test_callable_save_interval_is_asked_at_batch_and_epoch_ends(tmp_path):
    asked = []

    def every_odd_batch(state, event):
        asked.append(event)
        return event == Event.BATCH_END and state.timestamp.batch % 2 == 1

    t = trainer("5ba", save_folder=tmp_path / "ck", save_interval=every_odd_batch)
    t.fit()
    t.close()
    assert t.store.all_steps() == [1, 3, 5]
    assert asked.count(Event.BATCH_END) == 5


def test_load_path_may_be_a_save_folder_and_then_takes_its_newest_step(tmp_path):
    first = trainer("6ba", save_folder=tmp_path / "ck", save_interval="2ba")
    first.fit()
    first.close()
    later = trainer("8ba", load_path=tmp_path / "ck")
    assert later.state.timestamp.batch == 6
    for a, b in zip(leaves(first.state.train_state), leaves(later.state.train_state)):
        np.testing.assert_array_equal(a, b)


def test_weights_only_single_directory_checkpoint(tmp_path):
    first = trainer("2ba")
    first.fit()
    first.save_checkpoint(tmp_path / "w", weights_only=True)
    assert not (tmp_path / "w" / "train").exists()
    tuned = trainer("2ba", load_path=tmp_path / "w", load_weights_only=True)
    for a, b in zip(leaves(first.state.train_state.model_state), leaves(tuned.state.train_state.model_state)):
        np.testing.assert_array_equal(a, b)
    assert not any(p.name.endswith("tmp") or "orbax-checkpoint-tmp" in p.name for p in tmp_path.iterdir())
    assert jax.tree_util.tree_structure(tuned.state.train_state) == jax.tree_util.tree_structure(first.state.train_state)
