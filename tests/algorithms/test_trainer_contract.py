"""Items 3 and 4 of every method's contract (DESIGN §7), for every method in ``jaxcomposer.algorithms``:
(3) two steps inside the Trainer give a finite, changing loss with one compile; (4) resume equality: two straight
steps equal one step + save + restore in a fresh Trainer + one step, bit for bit (on CPU).

A new method cannot land without passing here: the parametrization comes from the registry itself.
"""
import jax
import numpy as np
import pytest
from flax import nnx

from jaxcomposer import Trainer, algorithms
from jaxcomposer.data import ArrayLoader
from jaxcomposer.models import MLP, ResNetCIFAR
from jaxcomposer.models.tasks import ComposerClassifier
from jaxcomposer.optim import CosineAnnealingScheduler, DecoupledSGDW
from tests.algorithms.algo_testing import EXAMPLE_METHODS
from tests.trainer.helpers import digits

FACTORIES = sorted(algorithms.REGISTRY.values())
# these change the image size, and an MLP's fan-in is fixed: their contract runs on the ResNet (global pooling)
IMAGE_SIZE_CHANGING = {"ColOut", "ProgressiveResizing", "SeqLengthWarmup"}


def test_every_registered_method_has_an_example():
    assert sorted(EXAMPLE_METHODS) == FACTORIES


def _trainer(method_name, model, **kw):
    data = digits("train", n=256)
    task = ComposerClassifier(
        MLP(64, hidden=(32,), num_classes=10, dropout=0.2, rngs=nnx.Rngs(0)) if model == "mlp"
        else ResNetCIFAR(depth=8, width=4, num_classes=10, in_channels=1, rngs=nnx.Rngs(0)), num_classes=10)
    return Trainer(model=task, train_dataloader=ArrayLoader(data, 32, seed=3), max_duration="2ba",
                   optimizers=DecoupledSGDW(lr=0.1, momentum=0.9, weight_decay=1e-4),
                   schedulers=[CosineAnnealingScheduler()], algorithms=[EXAMPLE_METHODS[method_name]()],
                   seed=7, progress_bar=False, devices=jax.devices()[:1], **kw)


@pytest.mark.parametrize("name", FACTORIES)
def test_two_steps_in_trainer(name):
    from jaxcomposer.loggers import InMemoryLogger
    logger = InMemoryLogger()
    trainer = _trainer(name, "resnet" if name in IMAGE_SIZE_CHANGING else "mlp", loggers=[logger])
    before = [np.asarray(x) for x in jax.tree_util.tree_leaves(trainer.state.train_state.params)]
    trainer.fit()
    losses = [v for _, v in logger.data["loss/train/total"]]
    assert len(losses) == 2 and np.all(np.isfinite(losses)) and losses[0] != losses[1]
    after = jax.tree_util.tree_leaves(trainer.state.train_state.params)
    assert any(not np.array_equal(a, b) for a, b in zip(before, after))
    (step,) = trainer._train_steps.values()
    data = trainer.train_dataloader
    data.set_state({"epoch": 0, "batch_index": 0})
    shapes = {k: tuple(v.shape) for k, v in next(iter(data)).items()}
    stages = {trainer.composed.stage(s, trainer.total_steps, shapes) for s in range(trainer.total_steps)}
    assert step._cache_size() == len(stages)  # one compile per stage, none more


def _bits(train_state):
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(train_state)]


@pytest.mark.parametrize("model", ["mlp", "resnet"])
@pytest.mark.parametrize("name", FACTORIES)
def test_resume_is_bitwise(name, model, tmp_path):
    if model == "mlp" and name in IMAGE_SIZE_CHANGING:
        pytest.skip("changes the image size, and the MLP's fan-in is fixed; covered on the ResNet")
    straight = _trainer(name, model)
    straight.fit()

    first = _trainer(name, model, )
    first.max_duration = type(first.max_duration)(1, "ba")
    first.fit()
    first.save_checkpoint(tmp_path / "ckpt")
    resumed = _trainer(name, model, load_path=tmp_path / "ckpt")
    assert resumed.state.timestamp.batch == 1
    resumed.fit()

    assert resumed.state.timestamp.batch == straight.state.timestamp.batch == 2
    a, b = _bits(straight.state.train_state), _bits(resumed.state.train_state)
    assert len(a) == len(b)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
