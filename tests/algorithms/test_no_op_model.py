import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxcomposer import algorithms
from jaxcomposer.algorithms import NoOpModel
from jaxcomposer.algorithms.no_op_model import NoOpModelClass, NoOpModule
from jaxcomposer.core.method import RunInfo, StepCtx
from jaxcomposer.models import ResNetCIFAR
from jaxcomposer.models.tasks import ComposerClassifier
from tests.algorithms.algo_testing import Example

EXAMPLE = Example(lambda: algorithms.NoOpModel())


def _task():
    return ComposerClassifier(ResNetCIFAR(depth=8, width=4, num_classes=10, in_channels=1, rngs=nnx.Rngs(0)),
                              num_classes=10)


def test_replacement_is_composers_noop_model():
    original = _task()
    task = NoOpModel().model(original, StepCtx(step=0, run=RunInfo(2)))
    assert isinstance(task, NoOpModelClass) and isinstance(task.source, NoOpModule)
    assert task.num_classes == 10 and original.source is not task.source  # the user's model is left alone
    params = jax.tree_util.tree_leaves(task.params)
    assert len(params) == 1 and np.asarray(params[0]).tolist() == [1.5] and task.state == nnx.State({})
    batch = {"input": np.zeros((4, 8, 8, 1), np.float32), "target": np.array([0, 1, 3, 9], np.int32)}
    out, _ = jax.jit(lambda p, s, b: task.forward(p, s, b, train=True))(task.params, task.state, batch)
    np.testing.assert_array_equal(np.asarray(out), [0.0, 1.5, 4.5, 13.5])  # targets * 1.5, the targets' shape
    np.testing.assert_allclose(np.asarray(task.loss(out, batch)), [0.0, 0.25, 2.25, 20.25])  # (0.5 y) ** 2
    assert task.metric_inputs(out, batch) == (batch["target"], batch["target"])
    (name, metric), = task.get_metrics().items()
    assert name == "BinaryAccuracy"
    state = metric.update(metric.init(), batch["target"], batch["target"], jnp.ones(4))
    assert float(metric.compute(state)) == 1.0
    # dense (mixed) targets: the loss is Composer's mse_loss once averaged over the batch
    dense = {"target": np.eye(3, dtype=np.float32)[[0, 2]] * 0.8}
    out = task.source(jnp.asarray(dense["target"]))
    np.testing.assert_allclose(float(task.loss(out, dense).mean()), float(((0.5 * dense["target"]) ** 2).mean()),
                               rtol=1e-6)
    with pytest.raises(ValueError, match="no 'target' entry"):
        NoOpModelClass(object()).model_inputs({"input": np.zeros(2)})


def test_language_model_batches_use_the_original_inputs():
    from jaxcomposer.models import GPT
    from jaxcomposer.models.tasks import ComposerCausalLM
    task = NoOpModelClass(ComposerCausalLM(GPT(vocab_size=32, seq_len=8, d_model=8, n_layers=1, n_heads=2,
                                                   rngs=nnx.Rngs(0))))
    batch = {"input_ids": np.arange(18, dtype=np.int32).reshape(2, 9)}
    out, _ = task.forward(task.params, task.state, batch, train=True)
    np.testing.assert_array_equal(np.asarray(out), batch["input_ids"][:, :-1] * 1.5)  # what the GPT would read
    assert task.loss(out, batch).shape == (2,)


def test_gradient_moves_the_weight_towards_one():
    task = NoOpModelClass(_task())
    batch = {"target": np.array([1, 2, 3, 0], np.int32)}

    def mean_loss(p):
        out, _ = task.forward(p, task.state, batch, train=True)
        return task.loss(out, batch).mean()

    grad = jax.tree_util.tree_leaves(jax.jit(jax.grad(mean_loss))(task.params))[0]
    np.testing.assert_allclose(np.asarray(grad), [2 * 0.5 * np.mean(np.square([1, 2, 3, 0]))], rtol=1e-6)


def _fit(task, **kw):
    from jaxcomposer import Trainer
    from jaxcomposer.data import ArrayLoader
    from jaxcomposer.loggers import InMemoryLogger
    from jaxcomposer.optim import DecoupledSGDW
    from tests.trainer.helpers import digits

    logger = InMemoryLogger()
    data = digits("train", n=64)
    trainer = Trainer(model=task, train_dataloader=ArrayLoader(data, 32, seed=0), max_duration="2ba",
                      optimizers=DecoupledSGDW(lr=0.01, momentum=0.0), algorithms=[NoOpModel()], seed=0,
                      progress_bar=False, devices=jax.devices()[:1], loggers=[logger],
                      eval_dataloader=ArrayLoader(data, 32, seed=0), **kw)
    trainer.fit()
    losses = [v for _, v in logger.data["loss/train/total"]]
    assert len(losses) == 2 and np.all(np.isfinite(losses)) and losses[1] < losses[0]
    w = np.asarray(jax.tree_util.tree_leaves(trainer.state.train_state.params)[0])
    assert w.shape == (1,) and 1.0 < w[0] < 1.5  # plain SGD on (w - 1)^2 mean(y^2): towards 1, not past it
    assert trainer.state.model is trainer.task.source and isinstance(trainer.state.model, NoOpModule)
    assert logger.data["metrics/eval/BinaryAccuracy"][-1][1] == 1.0
    return trainer, losses, data


def test_trains_in_trainer_on_an_nnx_task():
    task = _task()
    trainer, losses, data = _fit(task)
    assert isinstance(task.source, ResNetCIFAR)  # the user's model was not trained or edited
    # the first step, by hand: SGD (lr 0.01) on the mean over the first batch of (0.5 y) ** 2
    y = np.asarray(next(iter(trainer.train_dataloader.__class__(data, 32, seed=0)))["target"], np.float64)
    np.testing.assert_allclose(losses[0], np.mean((0.5 * y) ** 2), rtol=1e-6)


def test_trains_in_trainer_on_a_torch_task():
    import torch
    from torch import nn

    module = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
    before = [p.detach().clone() for p in module.parameters()]
    _fit(ComposerClassifier(module, num_classes=10))
    assert all(torch.equal(a, b) for a, b in zip(before, module.parameters()))  # never exported, never trained
