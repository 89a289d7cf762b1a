import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from torch import nn

from jaxcomposer import algorithms
from jaxcomposer.algorithms import GhostBatchNorm, apply_ghost_batchnorm
from jaxcomposer.errors import NoEffectWarning
from jaxcomposer.algorithms.ghost_batchnorm import GhostBatchNormModule, ghost_chunk_sizes
from jaxcomposer.core.method import RunInfo, StepCtx
from jaxcomposer.models import MLP, ResNetCIFAR
from torch_bridge.methods.ghost_batchnorm import GhostBatchNorm1d, GhostBatchNorm2d, apply_ghost_batchnorm_torch
from torch_bridge.surgery import count_module_instances
from tests.algorithms.algo_testing import Example

# the contract's batches have 32 examples (2 ghost batches: each one more BatchNorm per layer to compile), the
# composition table's surgery check 16 (one)
EXAMPLE = Example(lambda: algorithms.GhostBatchNorm(ghost_batch_size=16), surgery=GhostBatchNormModule)

EPS = 1e-5


def _reference(x: np.ndarray, ghost: int, momentum_torch: float, mean0, var0, *, unbiased: bool):
    """Composer's ghost BatchNorm in float64 numpy on (B, ..., C) data: chunks as torch.chunk, each normalized by
    its own biased variance, running stats updated chunk by chunk with momentum / n_chunks."""
    n = int(np.ceil(x.shape[0] / ghost))
    m = momentum_torch / n
    mean, var, outs = np.float64(mean0), np.float64(var0), []
    size = -(-x.shape[0] // n)  # torch.chunk: chunks of ceil(B / n) rows, the last one smaller
    for chunk in (x[i:i + size].astype(np.float64) for i in range(0, x.shape[0], size)):
        axes = tuple(range(chunk.ndim - 1))
        mu, v = chunk.mean(axes), chunk.var(axes)
        count = chunk.size // chunk.shape[-1]
        outs.append((chunk - mu) / np.sqrt(v + EPS))
        mean = (1 - m) * mean + m * mu
        var = (1 - m) * var + m * (v * count / (count - 1) if unbiased else v)
    return np.concatenate(outs), mean, var


@functools.cache
def _jit_train():
    return nnx.jit(lambda module, x: module(x, use_running_average=False))


def _nnx_gbn(c: int, ghost: int, seed: int = 0) -> GhostBatchNormModule:
    bn = nnx.BatchNorm(c, momentum=0.9, epsilon=EPS, rngs=nnx.Rngs(seed))
    bn.mean[...] = jnp.linspace(-0.5, 0.5, c)
    bn.var[...] = jnp.linspace(0.5, 2.0, c)
    return GhostBatchNormModule(bn, ghost)


# (1) chunking and numerics --------------------------------------------------------------------------------------

def test_chunk_sizes_match_torch_chunk():
    for b in range(1, 70):
        for g in range(1, b + 1):
            n, sizes = ghost_chunk_sizes(b, g)
            assert n == -(-b // g)
            assert sizes == tuple(c.shape[0] for c in torch.arange(b).chunk(n))
    assert ghost_chunk_sizes(10, 4) == (3, (4, 4, 2))  # uneven: torch.chunk's last chunk is the small one
    assert ghost_chunk_sizes(9, 4) == (3, (3, 3, 3))


@pytest.mark.parametrize("batch", [10, 12])  # uneven (4, 4, 2) and even (4, 4, 4) chunks
def test_nnx_outputs_and_running_stats_match_numpy(batch):
    x = np.random.default_rng(0).standard_normal((batch, 3, 3, 5)).astype(np.float32) * 2 + 1
    gbn = _nnx_gbn(5, 4)
    mean0, var0 = np.asarray(gbn.batchnorm.mean[...]), np.asarray(gbn.batchnorm.var[...])
    y = np.asarray(_jit_train()(gbn, jnp.asarray(x)))
    ref_y, ref_mean, ref_var = _reference(x, 4, 0.1, mean0, var0, unbiased=False)  # flax: biased variance
    np.testing.assert_allclose(y, ref_y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(gbn.batchnorm.mean[...]), ref_mean, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(np.asarray(gbn.batchnorm.var[...]), ref_var, rtol=1e-6, atol=1e-7)
    assert gbn.batchnorm.momentum == 0.9  # restored after the call


@pytest.mark.parametrize("batch", [10, 12])
def test_torch_outputs_and_running_stats_match_numpy(batch):
    x = np.random.default_rng(1).standard_normal((batch, 5, 3, 3)).astype(np.float32) * 2 + 1
    bn = nn.BatchNorm2d(5, eps=EPS)
    with torch.no_grad():
        bn.running_mean.copy_(torch.linspace(-0.5, 0.5, 5))
        bn.running_var.copy_(torch.linspace(0.5, 2.0, 5))
    mean0, var0 = bn.running_mean.numpy().copy(), bn.running_var.numpy().copy()
    gbn = GhostBatchNorm2d(bn, ghost_batch_size=4).train()
    with torch.no_grad():
        y = gbn(torch.from_numpy(x)).numpy()
    nhwc = x.transpose(0, 2, 3, 1)
    ref_y, ref_mean, ref_var = _reference(nhwc, 4, 0.1, mean0, var0, unbiased=True)  # torch: unbiased variance
    np.testing.assert_allclose(y, ref_y.transpose(0, 3, 1, 2), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(bn.running_mean.numpy(), ref_mean, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(bn.running_var.numpy(), ref_var, rtol=1e-6, atol=1e-7)
    assert bn.momentum == 0.1 and int(bn.num_batches_tracked) == 3  # one update per chunk, as Composer


def test_nnx_matches_torch_layer():
    x = np.random.default_rng(2).standard_normal((10, 6)).astype(np.float32)
    tbn = nn.BatchNorm1d(6, eps=EPS)
    with torch.no_grad():
        tbn.weight.copy_(torch.linspace(0.5, 1.5, 6))
        tbn.bias.copy_(torch.linspace(-1, 1, 6))
    jgbn = _nnx_gbn(6, 4)
    jgbn.batchnorm.scale[...] = jnp.asarray(tbn.weight.detach().numpy())
    jgbn.batchnorm.bias[...] = jnp.asarray(tbn.bias.detach().numpy())
    jgbn.batchnorm.mean[...] = jnp.zeros(6)
    jgbn.batchnorm.var[...] = jnp.ones(6)
    tgbn = GhostBatchNorm1d(tbn, 4).train()
    with torch.no_grad():
        ty = tgbn(torch.from_numpy(x)).numpy()
    jy = np.asarray(_jit_train()(jgbn, jnp.asarray(x)))
    np.testing.assert_allclose(jy, ty, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(jgbn.batchnorm.mean[...]), tbn.running_mean.numpy(), atol=1e-6)
    # eval: both normalize with the running statistics; copy torch's so both hold the same
    jgbn.batchnorm.var[...] = jnp.asarray(tbn.running_var.numpy())
    with torch.no_grad():
        te = tgbn.eval()(torch.from_numpy(x[:3])).numpy()  # smaller than the ghost batch: allowed in eval
    np.testing.assert_allclose(np.asarray(jgbn(jnp.asarray(x[:3]), use_running_average=True)), te, atol=1e-5)


def test_one_chunk_is_plain_batchnorm_and_jit_equals_eager():
    x = jax.random.normal(jax.random.key(0), (8, 4, 4, 3))
    plain = nnx.BatchNorm(3, momentum=0.9, rngs=nnx.Rngs(0))
    ghost = GhostBatchNormModule(nnx.clone(plain), 8)
    np.testing.assert_array_equal(np.asarray(ghost(x, use_running_average=False)),
                                  np.asarray(plain(x, use_running_average=False)))
    np.testing.assert_array_equal(np.asarray(ghost.batchnorm.var[...]), np.asarray(plain.var[...]))
    eager, jitted = _nnx_gbn(3, 3), _nnx_gbn(3, 3)
    np.testing.assert_allclose(np.asarray(eager(x, use_running_average=False)),
                               np.asarray(_jit_train()(jitted, x)), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(eager.batchnorm.mean[...]), np.asarray(jitted.batchnorm.mean[...]),
                               rtol=1e-6, atol=1e-7)


def test_small_training_batch_raises():
    with pytest.raises(ValueError, match="batch size 3 < ghost_batch_size 4"):
        _nnx_gbn(3, 4)(jnp.ones((3, 3)), use_running_average=False)
    with pytest.raises(ValueError, match="batch size 3 < ghost_batch_size 4"):
        GhostBatchNorm1d(nn.BatchNorm1d(3), 4).train()(torch.ones(3, 3))
    with pytest.raises(ValueError, match="batch axis"):
        GhostBatchNormModule(nnx.BatchNorm(3, axis=0, rngs=nnx.Rngs(0)), 4)


# (2) surgery ----------------------------------------------------------------------------------------------------

def _tiny_resnet():
    return ResNetCIFAR(depth=8, width=4, num_classes=10, in_channels=1, rngs=nnx.Rngs(0))


def test_nnx_surgery_counts_and_original_untouched():
    model = _tiny_resnet()
    new = apply_ghost_batchnorm(model, 16)
    wrapped = [m for _, m in nnx.iter_graph(new) if isinstance(m, GhostBatchNormModule)]
    assert len(wrapped) == 9  # stem + 3 blocks x 2 + 2 projection shortcuts
    assert all(w.ghost_batch_size == 16 for w in wrapped)
    assert not any(isinstance(m, GhostBatchNormModule) for _, m in nnx.iter_graph(model))
    assert isinstance(new.blocks[1].proj_bn, GhostBatchNormModule)
    np.testing.assert_array_equal(np.asarray(new.stem_bn.batchnorm.scale[...]), np.asarray(model.stem_bn.scale[...]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second application wraps nothing again and does not warn
        twice = apply_ghost_batchnorm(new, 4)
    assert sum(isinstance(m, GhostBatchNormModule) for _, m in nnx.iter_graph(twice)) == 9
    assert twice.stem_bn.ghost_batch_size == 16
    same = apply_ghost_batchnorm(model, 16, inplace=True)
    assert same is model and isinstance(model.stem_bn, GhostBatchNormModule)


def test_torch_surgery_in_place_as_composer():
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 8),
                          nn.BatchNorm1d(8))
    bn2 = model[1]
    same = apply_ghost_batchnorm(model, 4)
    assert same is model and isinstance(model[1], GhostBatchNorm2d) and isinstance(model[5], GhostBatchNorm1d)
    assert model[1].batchnorm is bn2 and count_module_instances(model, nn.BatchNorm2d) == 1
    assert "1.batchnorm.running_mean" in model.state_dict()
    _, replaced = apply_ghost_batchnorm_torch(model, 4)  # wrapped BatchNorms are not wrapped again
    assert replaced == {}


def test_nothing_replaced_warns():
    with pytest.warns(NoEffectWarning, match="no BatchNorm"):
        apply_ghost_batchnorm(MLP(16, hidden=(8,), num_classes=4, rngs=nnx.Rngs(0)))
    with pytest.warns(NoEffectWarning):
        apply_ghost_batchnorm(nn.Sequential(nn.Linear(3, 3)))
    with pytest.raises(TypeError, match="flax.nnx.Module or a torch.nn.Module"):
        apply_ghost_batchnorm(object())


def test_hyperparameter_validation():
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="ghost_batch_size"):
            GhostBatchNorm(ghost_batch_size=bad)
        with pytest.raises(ValueError, match="ghost_batch_size"):
            apply_ghost_batchnorm(_tiny_resnet(), bad)


def test_method_equals_functional_and_edits_in_place():
    from jaxcomposer.models.tasks import ComposerClassifier
    model = _tiny_resnet()
    functional = apply_ghost_batchnorm(model, 16)
    task = ComposerClassifier(model, num_classes=10)
    method = GhostBatchNorm(16)
    assert method.name == "GhostBatchNorm" and method.model is not None and method.batch is None
    new_task = method.model(task, StepCtx(step=0, run=RunInfo(total_steps=2)))
    assert new_task.source is model and isinstance(model.stem_bn, GhostBatchNormModule)
    x = jax.random.normal(jax.random.key(1), (32, 8, 8, 1))
    run = nnx.jit(lambda m, x: m(x, train=True))
    np.testing.assert_array_equal(np.asarray(run(model, x)), np.asarray(run(functional, x)))
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(new_task.params)[0]]
    assert any("['stem_bn']['batchnorm']['scale']" in p for p in paths)


# (3) inside the Trainer -----------------------------------------------------------------------------------------

def _fit(task, methods):
    from jaxcomposer import Trainer
    from jaxcomposer.data import ArrayLoader
    from jaxcomposer.loggers import InMemoryLogger
    from jaxcomposer.optim import DecoupledSGDW
    from tests.trainer.helpers import digits

    logger = InMemoryLogger()
    trainer = Trainer(model=task, train_dataloader=ArrayLoader(digits("train", n=64), 32, seed=0),
                      max_duration="2ba", optimizers=DecoupledSGDW(lr=0.05, momentum=0.9), algorithms=methods,
                      seed=0, progress_bar=False, devices=jax.devices()[:1], loggers=[logger])
    trainer.fit()
    return trainer, [v for _, v in logger.data["loss/train/total"]]


class _ToNCHW(nn.Module):
    def forward(self, x):
        return x.permute(0, 3, 1, 2)


def test_trains_bridged_torch_cnn():
    from jaxcomposer.models.tasks import ComposerClassifier

    torch.manual_seed(0)
    module = nn.Sequential(_ToNCHW(), nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                           nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))
    trainer, losses = _fit(ComposerClassifier(module, num_classes=10), [GhostBatchNorm(ghost_batch_size=8)])
    assert len(losses) == 2 and np.all(np.isfinite(losses))
    assert trainer.state.model.module is module and isinstance(module[2], GhostBatchNorm2d)
    assert "2.batchnorm.weight" in set(trainer.task.pure.params)
    # the torch module computes what the trainer's jitted forward computes (eval: running statistics)
    x = np.random.default_rng(0).standard_normal((4, 8, 8, 1)).astype(np.float32)
    (ours,) = trainer.predict([{"input": x, "target": np.zeros(4, np.int32)}])
    with torch.no_grad():
        theirs = module.eval()(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)
    assert int(module[2].batchnorm.num_batches_tracked) == 2 * 4  # 2 steps x 4 ghost batches, as torch would


def test_bridged_layer_matches_eager_torch_on_uneven_batches():
    from torch_bridge import from_torch

    torch.manual_seed(0)
    module = nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4))
    apply_ghost_batchnorm(module, 4)
    bridged = from_torch(module, (torch.zeros(8, 2, 5, 5),), dynamic_batch=True)
    x = np.random.default_rng(3).standard_normal((10, 2, 5, 5)).astype(np.float32)  # chunks of 4, 4, 2
    y, buffers = jax.jit(lambda p, b, x: bridged.apply(p, b, None, x, train=True))(bridged.params, bridged.buffers, x)
    with torch.no_grad():
        ref = module.train()(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(np.asarray(y), ref, rtol=1e-5, atol=1e-5)
    bn = module[1].batchnorm
    np.testing.assert_allclose(np.asarray(buffers["1.batchnorm.running_mean"]), bn.running_mean.numpy(), atol=1e-6)
    np.testing.assert_allclose(np.asarray(buffers["1.batchnorm.running_var"]), bn.running_var.numpy(), atol=1e-6)
    assert int(buffers["1.batchnorm.num_batches_tracked"]) == int(bn.num_batches_tracked) == 3
    with pytest.raises(ValueError, match="batch size 3 < ghost_batch_size 4"):
        bridged.apply(bridged.params, bridged.buffers, None, x[:3], train=True)
