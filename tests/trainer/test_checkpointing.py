"""Composer's saving names over orbax's CheckpointManager: periodic saves, pruning, autoresume, torn saves."""
import numpy as np
import pytest

from jaxcomposer import Trainer
from jaxcomposer.data import ArrayLoader
from jaxcomposer.optim import CosineAnnealingScheduler, DecoupledSGDW
from jaxcomposer.algorithms import EMA, MixUp
from jaxcomposer.trainer.trainer import ConfigurationError
from tests.trainer.helpers import digits, leaves, mlp_task


def trainer(max_duration, **kw):
    return Trainer(model=mlp_task(dropout=0.2), train_dataloader=ArrayLoader(digits("train", 256), 32, seed=1),
                   max_duration=max_duration, optimizers=DecoupledSGDW(lr=0.1, momentum=0.9),
                   schedulers=[CosineAnnealingScheduler(t_max="10ba")], algorithms=[MixUp(), EMA(half_life="3ba")],
                   seed=0, progress_bar=False, run_name="ckpt-test", **kw)


def test_periodic_saves_are_pruned_and_the_end_is_saved(tmp_path):
    t = trainer("10ba", save_folder=tmp_path / "ck", save_interval="3ba", save_num_checkpoints_to_keep=2)
    t.fit()
    t.close()
    assert t.store.all_steps() == [9, 10]


@pytest.mark.parametrize("steps_per_execution", [1, 3])
def test_autoresume_continues_bit_for_bit(tmp_path, steps_per_execution):
    # with 3 batches per call, the saves every 2 batches cut the calls differently in the interrupted run and in
    # the straight one; each step still computes the same
    straight = trainer("10ba", steps_per_execution=steps_per_execution)
    straight.fit()
    first = trainer("5ba", save_folder=tmp_path / "ck", save_interval="2ba", steps_per_execution=steps_per_execution)
    first.fit()
    first.close()
    assert first.store.all_steps() == [2, 4, 5]
    resumed = trainer("10ba", save_folder=tmp_path / "ck", save_interval="2ba", autoresume=True,
                      steps_per_execution=steps_per_execution)
    assert resumed.state.timestamp.batch == 5
    resumed.fit()
    resumed.close()
    assert resumed.state.timestamp.batch == 10
    for a, b in zip(leaves(straight.state.train_state), leaves(resumed.state.train_state)):
        np.testing.assert_array_equal(a, b)


def test_torn_save_is_never_loaded(tmp_path):
    first = trainer("4ba", save_folder=tmp_path / "ck", save_interval="2ba")
    first.fit()
    first.close()
    (tmp_path / "ck" / "6.orbax-checkpoint-tmp").mkdir()  # what a save killed midway leaves behind
    resumed = trainer("6ba", save_folder=tmp_path / "ck", autoresume=True)
    assert resumed.state.timestamp.batch == 4


def test_saving_arguments_are_checked_before_anything_runs(tmp_path):
    with pytest.raises(ConfigurationError, match="autoresume: needs save_folder"):
        trainer("2ba", autoresume=True)
    with pytest.raises(ConfigurationError, match="save_interval"):
        trainer("2ba", save_folder=tmp_path / "a", save_interval="10epochs")
    assert not (tmp_path / "a").exists()
    t = trainer("2ba", save_folder=tmp_path / "b", save_interval="1ba")
    t.fit()
    t.close()
    with pytest.raises(ConfigurationError, match="already holds checkpoints"):
        trainer("4ba", save_folder=tmp_path / "b")


def _files(step_dir):
    return sorted(p for p in step_dir.rglob("*") if p.is_file() and p.name != "checksums.json" and p.stat().st_size)


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_corrupt_checkpoint_is_detected_and_autoresume_falls_back(tmp_path, damage):
    from jaxcomposer.trainer.checkpoint import CorruptCheckpointError
    first = trainer("4ba", save_folder=tmp_path / "ck", save_interval="2ba")
    first.fit()
    first.close()
    assert (tmp_path / "ck" / "4" / "checksums.json").is_file()
    victim = max(_files(tmp_path / "ck" / "4"), key=lambda p: p.stat().st_size)
    data = bytearray(victim.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0xFF
        victim.write_bytes(bytes(data))
    else:
        victim.write_bytes(bytes(data[: len(data) // 3]))
    with pytest.raises(CorruptCheckpointError, match=r"checkpoint step 4: file .* does not match"):
        first.store.restore(4, first.state.train_state)
    with pytest.warns(UserWarning, match="skipping checkpoint step 4"):
        resumed = trainer("6ba", save_folder=tmp_path / "ck", autoresume=True)
    assert resumed.state.timestamp.batch == 2


def test_two_fresh_runs_with_one_seed_give_identical_bits():
    a, b = trainer("6ba"), trainer("6ba")
    a.fit()
    b.fit()
    for x, y in zip(leaves(a.state.train_state), leaves(b.state.train_state)):
        np.testing.assert_array_equal(x, y)


def test_restore_onto_a_different_device_count(tmp_path):
    import jax
    two = trainer("3ba", save_folder=tmp_path / "ck", save_interval="3ba", devices=jax.devices()[:2])
    two.fit()
    two.close()
    one = trainer("3ba", save_folder=tmp_path / "ck", autoresume=True, devices=jax.devices()[:1])
    assert one.state.timestamp.batch == 3
    for x, y in zip(leaves(two.state.train_state), leaves(one.state.train_state)):
        np.testing.assert_array_equal(x, y)
    assert {d.id for x in jax.tree_util.tree_leaves(one.state.train_state.params) for d in x.devices()} == \
        {jax.devices()[0].id}
