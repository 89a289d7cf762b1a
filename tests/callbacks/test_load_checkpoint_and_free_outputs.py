"""LoadCheckpoint in real (tiny) runs: the run's weights after loading are the checkpoint's, a full load continues
the saved run exactly; FreeOutputs runs in a Trainer as a no-op."""
import jax
import numpy as np
import pytest
from flax import nnx

from jaxcomposer import Trainer
from jaxcomposer.callbacks import FreeOutputs, LoadCheckpoint
from jaxcomposer.core.events import Callback, Event
from jaxcomposer.errors import CheckpointError
from jaxcomposer.models import MLP
from jaxcomposer.models.tasks import ComposerClassifier
from jaxcomposer.optim import DecoupledSGDW
from jaxcomposer.trainer import checkpoint
from tests.trainer.helpers import loaders, mlp_task


def _trainer(task, duration="8ba", **kw):
    train, _ = loaders(batch_size=32, n_train=128)  # 4 batches per epoch
    return Trainer(model=task, train_dataloader=train, max_duration=duration, progress_bar=False,
                   optimizers=DecoupledSGDW(lr=0.3, momentum=0.9), **kw)


def _flat(tree) -> dict:
    return {name: np.asarray(x) for name, x in checkpoint.flat_paths(tree).items()}


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory):
    """A straight 8-batch run saving at batch 4 and 8: (its folder, its final params)."""
    folder = tmp_path_factory.mktemp("run") / "ckpt"
    trainer = _trainer(mlp_task(seed=0), seed=0, save_folder=folder, save_interval="4ba")
    trainer.fit()
    trainer.close()
    return folder, _flat(trainer.state.train_state.params)


def test_full_load_at_init_continues_the_saved_run_exactly(saved_run):
    folder, straight = saved_run
    # another init, another seed: everything that matters comes from the checkpoint
    trainer = _trainer(mlp_task(seed=1), seed=1, callbacks=[LoadCheckpoint(folder / "4")])
    saved = checkpoint.read_weights(folder / "4")
    for name, value in _flat(trainer.state.train_state.params).items():
        np.testing.assert_array_equal(value, saved[f"params.{name}"], err_msg=name)
    assert trainer.state.timestamp.batch == 4 and trainer.state.timestamp.epoch == 1
    trained = []

    class Count(Callback):
        def batch_end(self, state, logger):
            trained.append(state.timestamp.batch)

    trainer.callbacks.append(Count())
    trainer.fit()
    assert trained == [5, 6, 7, 8]
    for name, value in _flat(trainer.state.train_state.params).items():
        np.testing.assert_array_equal(value, straight[name], err_msg=name)
    # and the user's module holds them after fit
    module_params = _flat(nnx.state(trainer.state.model, nnx.Param))
    for name, value in straight.items():
        np.testing.assert_array_equal(module_params[name], value, err_msg=name)


def test_weights_only_at_fit_start_keeps_the_clock_and_optimizer(saved_run):
    folder, _ = saved_run
    seen = {}

    class AtFitStart(Callback):  # after LoadCheckpoint in the list: sees the loaded state
        def fit_start(self, state, logger):
            seen["params"] = _flat(state.train_state.params)
            seen["opt_state"] = [np.asarray(x) for x in jax.tree.leaves(state.train_state.opt_state)]
            seen["batch"] = state.timestamp.batch

    trainer = _trainer(mlp_task(seed=1), duration="1ba", seed=1,
                       callbacks=[LoadCheckpoint(folder, load_weights_only=True, event="FIT_START"), AtFitStart()])
    fresh_opt = [np.asarray(x) for x in jax.tree.leaves(trainer.state.train_state.opt_state)]
    trainer.fit()
    newest = checkpoint.read_weights(folder / "8")  # a save_folder: its newest checkpoint
    for name, value in seen["params"].items():
        np.testing.assert_array_equal(value, newest[f"params.{name}"], err_msg=name)
    assert seen["batch"] == 0
    for loaded, fresh in zip(seen["opt_state"], fresh_opt):  # the momentum is not the checkpoint's
        np.testing.assert_array_equal(loaded, fresh)


def test_ignore_keys_keep_the_runs_own_values(saved_run):
    folder, _ = saved_run
    task = mlp_task(seed=1)
    initial = _flat(nnx.state(task.source, nnx.Param))
    trainer = _trainer(task, callbacks=[LoadCheckpoint(folder / "8", load_weights_only=True,
                                                       ignore_keys=["params.head.*"])])
    saved = checkpoint.read_weights(folder / "8")
    params = _flat(trainer.state.train_state.params)
    np.testing.assert_array_equal(params["head.kernel"], initial["head.kernel"])
    np.testing.assert_array_equal(params["hidden.0.kernel"], saved["params.hidden.0.kernel"])


def test_strict_model_weights_false_loads_the_shared_weights(saved_run):
    folder, _ = saved_run
    wider = lambda: ComposerClassifier(MLP(64, hidden=(32, 32), num_classes=10, rngs=nnx.Rngs(3)), num_classes=10)
    with pytest.raises(CheckpointError, match=r"params\.hidden\.1\.kernel: in the model/recipe but not in the "):
        _trainer(wider(), callbacks=[LoadCheckpoint(folder / "8", load_weights_only=True)])
    task = wider()
    initial = _flat(nnx.state(task.source, nnx.Param))
    trainer = _trainer(task, callbacks=[LoadCheckpoint(folder / "8", load_weights_only=True,
                                                       strict_model_weights=False)])
    saved = checkpoint.read_weights(folder / "8")
    params = _flat(trainer.state.train_state.params)
    for name in ("hidden.0.kernel", "hidden.0.bias", "head.kernel", "head.bias"):
        np.testing.assert_array_equal(params[name], saved[f"params.{name}"], err_msg=name)
    for name in ("hidden.1.kernel", "hidden.1.bias"):  # not in the checkpoint: as initialised
        np.testing.assert_array_equal(params[name], initial[name], err_msg=name)


def test_events_and_refusals():
    assert LoadCheckpoint("x").event == Event.INIT  # Composer's BEFORE_LOAD
    assert LoadCheckpoint("x", event="after_load").event == Event.INIT
    assert LoadCheckpoint("x", event="EPOCH_START").event == Event.EPOCH_START
    assert LoadCheckpoint("x", event=Event.FIT_START).event == Event.FIT_START
    with pytest.raises(ValueError, match="event must be one of"):
        LoadCheckpoint("x", event="before_forward")
    with pytest.raises(NotImplementedError, match="globs"):
        LoadCheckpoint("x", ignore_keys=lambda state_dict: None)
    with pytest.raises(ValueError, match="list of glob strings"):
        LoadCheckpoint("x", ignore_keys="params.*")


def test_free_outputs_runs_and_outputs_stay_unavailable():
    seen = []

    class Outputs(Callback):
        def batch_end(self, state, logger):
            with pytest.raises(AttributeError, match="state.outputs: the model's outputs stay inside"):
                state.outputs
            seen.append(state.timestamp.batch)

    trainer = _trainer(mlp_task(), duration="2ba", callbacks=[FreeOutputs(), Outputs()])
    trainer.fit()
    assert seen == [1, 2]
