"""Composer's checkpoint names: ``save_filename``/``save_latest_filename`` links to verified step directories,
``load_path`` taking them, ``trainer.save_checkpoint('name.pt')``, and a checkpoint's weights back as a torch
``state_dict`` or Composer's ``.pt`` file."""
import os

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from jaxcomposer.errors import ConfigurationError

pytestmark = pytest.mark.xdist_group("test_checkpoint_names")


def _trainer(tmp_path, duration="2ep", **kwargs):
    from jaxcomposer.models import ComposerClassifier
    from jaxcomposer.trainer import Trainer

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 4))
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(64, 1, 4, 4, generator=g), torch.randint(0, 4, (64,), generator=g))
    return Trainer(model=ComposerClassifier(net, num_classes=4), train_dataloader=DataLoader(data, batch_size=16),
                   max_duration=duration, progress_bar=False, **kwargs)


def test_composer_names_link_to_committed_steps_and_follow_pruning(tmp_path):
    folder = tmp_path / "r1" / "checkpoints"
    trainer = _trainer(tmp_path, save_folder=str(tmp_path / "{run_name}" / "checkpoints"), run_name="r1",
                       save_interval="2ba", save_num_checkpoints_to_keep=2)
    trainer.fit()
    trainer.close()
    assert sorted(os.listdir(folder)) == ["6", "8", "ep1-ba6-rank0.pt", "ep2-ba8-rank0.pt", "latest-rank0.pt"]
    assert os.readlink(folder / "ep1-ba6-rank0.pt") == "6"
    assert os.readlink(folder / "latest-rank0.pt") == "ep2-ba8-rank0.pt"  # as Composer's symlink to the newest

    # load_path takes Composer's names; the timestamp is the named step's
    again = _trainer(tmp_path, duration="3ep", load_path=str(folder / "ep1-ba6-rank0.pt"))
    assert int(again.state.timestamp.batch) == 6 and int(again.state.timestamp.epoch) == 1
    latest = _trainer(tmp_path, duration="3ep", load_path=str(folder / "latest-rank0.pt"))
    assert int(latest.state.timestamp.batch) == 8


def test_custom_patterns_and_no_latest(tmp_path):
    trainer = _trainer(tmp_path, duration="1ep", save_folder=str(tmp_path / "ck"), run_name="run7",
                       save_filename="{run_name}/ba{batch}-of-{world_size}.pt", save_latest_filename=None)
    trainer.fit()
    trainer.close()
    assert sorted(os.listdir(tmp_path / "ck")) == ["4", "run7"]
    assert os.listdir(tmp_path / "ck" / "run7") == ["ba4-of-1.pt"]
    assert (tmp_path / "ck" / "run7" / "ba4-of-1.pt").resolve() == (tmp_path / "ck" / "4").resolve()


@pytest.mark.parametrize("pattern, message", [("ep{epochs}.pt", "not one of Composer's variables"),
                                              ("../outside.pt", "inside save_folder")])
def test_bad_patterns_are_refused_before_anything_is_written(tmp_path, pattern, message):
    with pytest.raises(ConfigurationError, match=message):
        _trainer(tmp_path, save_folder=str(tmp_path / "ck"), save_filename=pattern)
    assert not (tmp_path / "ck").exists()


def test_weights_come_back_as_a_torch_state_dict_and_composers_pt(tmp_path):
    from torch_bridge.checkpoints import save_composer_checkpoint, weights_from_checkpoint

    trainer = _trainer(tmp_path, duration="2ba")
    trainer.fit()
    saved = trainer.save_checkpoint(tmp_path / "final.pt")  # Composer's call; a verified checkpoint directory
    model = trainer.state.model
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    torch.nn.init.zeros_(model.module[1].weight)  # the checkpoint, not the live module, is read back
    state_dict = weights_from_checkpoint(saved, model)
    assert list(state_dict) == list(expected)
    for name, value in expected.items():
        assert torch.equal(state_dict[name], value), name
    pt = save_composer_checkpoint(saved, model, tmp_path / "composer.pt")
    loaded = torch.load(pt, weights_only=True)["state"]["model"]
    model.load_state_dict(loaded)
    assert torch.equal(model.module[1].weight, expected["module.1.weight"])
    assert int(_trainer(tmp_path, duration="3ba", load_path=str(saved)).state.timestamp.batch) == 2
    with pytest.raises(KeyError, match="not in Linear.state_dict"):
        weights_from_checkpoint(saved, torch.nn.Linear(3, 3))


def test_composers_checkpoint_saver_callback(tmp_path):
    from jaxcomposer.callbacks import CheckpointSaver

    saver = CheckpointSaver(folder=str(tmp_path / "{run_name}"), save_interval="3ba", num_checkpoints_to_keep=2)
    trainer = _trainer(tmp_path, callbacks=[saver], run_name="cs")
    trainer.fit()
    trainer.close()
    assert saver.saved == [3, 6, 8]  # every 3 batches, and the end of training
    assert sorted(os.listdir(tmp_path / "cs")) == ["6", "8", "ep1-ba6-rank0.pt", "ep2-ba8-rank0.pt",
                                                   "latest-rank0.pt"]
    resumed = _trainer(tmp_path, load_path=str(tmp_path / "cs" / "ep1-ba6-rank0.pt"))
    resumed.fit()
    for a, b in zip(resumed.state.model.parameters(), trainer.state.model.parameters()):
        assert torch.equal(a, b)  # batches 7-8 again from the saved state: the same weights
    with pytest.raises(ConfigurationError, match=r"\['CheckpointSaver'\] read the train state at every batch"):
        _trainer(tmp_path, callbacks=[CheckpointSaver(folder=str(tmp_path / "x"))], steps_per_execution=2)
    with pytest.raises(ValueError, match="remote_file_name='s3://b/x' is not supported"):
        CheckpointSaver(remote_file_name="s3://b/x")
    with pytest.raises(ConfigurationError, match="already holds checkpoints"):
        _trainer(tmp_path, callbacks=[CheckpointSaver(folder=str(tmp_path / "cs"))])
