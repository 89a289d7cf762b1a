"""Items 3 and 4 of every method's contract (docs/design.md, "Tests"), for every registered method, on a ResNet
with BatchNorm (state that a step updates) and dropout (randomness that a resumed step must replay):

(3) two steps inside the Trainer give a finite, changing loss and changed params, with one compile per stage; as in
    Composer, the module passed in is the one trained (surgered in place, where the method's ``EXAMPLE`` names its
    ``surgery``) and holds the trained weights;
(4) resume equality: the run saves after its first step, and a fresh Trainer that loads that checkpoint and takes
    the second step ends with the same bits as the straight run (on CPU).

A new method cannot land without passing here: the parametrization comes from the registry itself. One case
builds two Trainers, and the resumed one's step is the straight one's executable again (the persistent
compilation cache the test session shares), so each case compiles its step once.
"""
import jax
import numpy as np
import pytest
from flax import nnx

from jaxcomposer import Trainer, algorithms
from jaxcomposer.core.method import StepCtx
from jaxcomposer.data import ArrayLoader
from jaxcomposer.loggers import InMemoryLogger
from jaxcomposer.models import ResNetCIFAR
from jaxcomposer.models.tasks import ComposerClassifier
from jaxcomposer.optim import CosineAnnealingScheduler, DecoupledSGDW
from tests.algorithms.algo_testing import examples
from tests.trainer.helpers import digits

FACTORIES = sorted(algorithms.REGISTRY.values())


def test_every_registered_method_has_an_example():
    assert sorted(examples()) == FACTORIES  # an EXAMPLE in every method's test file


def _task():
    return ComposerClassifier(ResNetCIFAR(depth=8, width=4, num_classes=10, in_channels=1, dropout=0.2,
                                          rngs=nnx.Rngs(0)), num_classes=10)


def _trainer(method_name, task=None, **kw):
    data = digits("train", n=256)
    return Trainer(model=task or _task(), train_dataloader=ArrayLoader(data, 32, seed=3), max_duration="2ba",
                   optimizers=DecoupledSGDW(lr=0.1, momentum=0.9, weight_decay=1e-4),
                   schedulers=[CosineAnnealingScheduler()], algorithms=[examples()[method_name].make()],
                   seed=7, progress_bar=False, devices=jax.devices()[:1], **kw)


def _bits(train_state):
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(train_state)]


def _stages(trainer) -> set:
    data = trainer.train_dataloader
    data.set_state({"epoch": 0, "batch_index": 0})
    shapes = {k: tuple(v.shape) for k, v in next(iter(data)).items()}
    return {trainer.composed.stage(shapes, StepCtx(step=s, run=trainer.run_info)) for s in range(trainer.total_steps)}


@pytest.mark.parametrize("name", sorted(examples()))
def test_two_steps_then_resume_is_bitwise(name, tmp_path):
    logger, task = InMemoryLogger(), _task()
    straight = _trainer(name, task, loggers=[logger], save_folder=tmp_path / "ckpt", save_interval="1ba")
    before = _bits(straight.state.train_state.params)
    stats_before = _bits(straight.state.train_state.model_state)
    straight.fit()
    straight.close()

    losses = [v for _, v in logger.data["loss/train/total"]]
    assert len(losses) == 2 and np.all(np.isfinite(losses)) and losses[0] != losses[1]
    after = _bits(straight.state.train_state.params)
    assert any(not np.array_equal(a, b) for a, b in zip(before, after))
    # BatchNorm's running statistics moved too (unless the model has none: NoOpModel's replacement)
    stats_after = _bits(straight.state.train_state.model_state)
    assert not stats_before or any(not np.array_equal(a, b) for a, b in zip(stats_before, stats_after))
    # one compile per stage, none more
    assert list(straight.compiled_programs().values()) == [len(_stages(straight))]
    module = straight.state.model
    assert module is task.source or name == "NoOpModel"  # which swaps the whole model, as Composer's
    surgery = examples()[name].surgery
    assert surgery is None or any(isinstance(m, surgery) for _, m in nnx.iter_modules(module)), surgery
    held = jax.tree_util.tree_leaves_with_path(nnx.state(module, nnx.Param))
    trained = jax.tree_util.tree_leaves_with_path(straight.state.train_state.params)
    assert [p for p, _ in held] == [p for p, _ in trained]
    for (path, x), (_, y) in zip(held, trained):
        np.testing.assert_array_equal(x, y, err_msg=jax.tree_util.keystr(path))

    resumed = _trainer(name, load_path=tmp_path / "ckpt" / "1")
    assert resumed.state.timestamp.batch == 1
    resumed.fit()
    assert resumed.state.timestamp.batch == straight.state.timestamp.batch == 2
    a, b = _bits(straight.state.train_state), _bits(resumed.state.train_state)
    assert len(a) == len(b)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
