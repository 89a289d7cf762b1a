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
from jaxcomposer.algorithms import GyroDropout, apply_gyro_dropout
from jaxcomposer.errors import NoEffectWarning
from jaxcomposer.algorithms.gyro_dropout import GyroDropoutLayer, gyro_iter_num
from jaxcomposer.core.method import RunInfo, StepCtx
from jaxcomposer.models import MLP, ResNetCIFAR
from torch_bridge.methods.gyro_dropout import GyroDropoutLayer as TorchGyroDropoutLayer, materialize
from torch_bridge.surgery import count_module_instances
from tests.algorithms.algo_testing import Example

# the contract's ResNetCIFAR(dropout=0.2) has one nnx.Dropout; its batch of 32 splits into tau=4 chunks
EXAMPLE = Example(lambda: algorithms.GyroDropout(p=0.5, sigma=8, tau=4))


@functools.cache
def _jitted_layer(iters: int, p: float, sigma: int, tau: int):
    """``f(state, x, key) -> (y, new_state)`` of one training call, jitted once per configuration."""
    layer = GyroDropoutLayer(iters, 1, p, sigma, tau)
    graphdef, state = nnx.split(layer)

    @jax.jit
    def f(state, x, key):
        live = nnx.merge(graphdef, state)
        y = live(x, rngs=key)
        return y, nnx.state(live)

    return layer, f


def _pool(layer, state, features):
    """All ``sigma`` masks of the layer, as the stored key defines them."""
    return np.asarray(layer.masks(jnp.asarray(state["mask_key"][...]), jnp.arange(layer.sigma), features))


# (1) numerics of the layer -------------------------------------------------------------------------------------

def test_iter_num_is_composers_with_a_floor_of_tau():
    assert gyro_iter_num(100 * 10, 256, 16) == int(100 * 10 / 256) * 16 == 48
    assert gyro_iter_num(2, 256, 16) == 16  # Composer: 0, then a ZeroDivisionError


def test_chunks_share_one_of_sigma_masks_scaled_and_fixed_between_reselections():
    # iter_num = max(int(8 / 4), 1) * 2 = 4: indices chosen at calls 0 and 4, kept at 1, 2, 3
    layer, f = _jitted_layer(8, 0.5, 4, 2)
    x = jnp.ones((6, 40))
    state = nnx.state(layer)
    picked, outs = [], []
    for t in range(6):
        y, state = f(state, x, jax.random.PRNGKey(100 + t))
        picked.append(np.asarray(state["picked"][...]))
        outs.append(np.asarray(y))
        assert int(state["training_step"][...]) == t + 1
    pool = _pool(layer, state, 40)
    assert set(np.unique(pool)) == {0.0, 1.0}
    for t in range(6):
        for chunk in range(2):  # rows 0-2 use mask picked[0], rows 3-5 mask picked[1], scaled by 1 / (1 - p)
            expected = pool[picked[t][chunk]] * 2.0
            np.testing.assert_array_equal(outs[t][3 * chunk:3 * chunk + 3], np.broadcast_to(expected, (3, 40)))
    for t in (1, 2, 3):  # new keys, same indices and the same pool: only the first call's key makes the masks
        np.testing.assert_array_equal(picked[t], picked[0])
    assert not np.array_equal(picked[4], picked[0])  # re-chosen at call 4 (a 1-in-16 coincidence with these keys)
    np.testing.assert_array_equal(picked[5], picked[4])
    # the pool is the first call's: the key stored at call 0 never changes
    _, first_state = f(nnx.state(layer), x, jax.random.PRNGKey(100))
    np.testing.assert_array_equal(np.asarray(first_state["mask_key"][...]), np.asarray(state["mask_key"][...]))


def test_keep_rate_and_input_values():
    layer, f = _jitted_layer(1000, 0.25, 16, 4)
    x = jax.random.normal(jax.random.PRNGKey(0), (8, 4096))
    y, state = f(nnx.state(layer), x, jax.random.PRNGKey(1))
    mask = np.asarray(layer.masks(jnp.asarray(state["mask_key"][...]), state["picked"][...], 4096))
    assert abs(mask.mean() - 0.75) < 0.02  # keep probability 1 - p
    ref = np.asarray(x) * np.repeat(mask, 2, axis=0) * (1 / (1 - 0.25))
    np.testing.assert_allclose(np.asarray(y), ref, rtol=1e-6)


def test_sequence_inputs_get_one_mask_per_example_element():
    # (B, T, D): Composer's masks cover everything but the batch axis; each chunk shares one (T, D) mask
    layer, f = _jitted_layer(8, 0.5, 4, 2)
    y, state = f(nnx.state(layer), jnp.ones((4, 3, 5)), jax.random.PRNGKey(0))
    pool = np.asarray(layer.masks(jnp.asarray(state["mask_key"][...]), jnp.arange(4), (3, 5)))
    expected = np.repeat(pool[np.asarray(state["picked"][...])], 2, axis=0) * 2.0
    np.testing.assert_array_equal(np.asarray(y), expected)


def test_eval_is_identity_and_jit_equals_eager():
    layer, f = _jitted_layer(8, 0.5, 4, 2)
    x = jax.random.normal(jax.random.PRNGKey(0), (4, 10))
    np.testing.assert_array_equal(np.asarray(layer(x, deterministic=True)), np.asarray(x))
    y_jit, s_jit = f(nnx.state(layer), x, jax.random.PRNGKey(3))
    eager = nnx.clone(layer)
    y_eager = eager(x, rngs=jax.random.PRNGKey(3))
    np.testing.assert_array_equal(np.asarray(y_jit), np.asarray(y_eager))
    np.testing.assert_array_equal(np.asarray(s_jit["picked"][...]), np.asarray(eager.picked[...]))
    assert int(layer.training_step[...]) == 0  # the jitted call left the layer itself alone


def test_layer_errors_are_clear():
    layer = GyroDropoutLayer(8, 1, 0.5, 4, 4)
    with pytest.raises(ValueError, match="multiple of tau=4"):
        layer(jnp.ones((6, 3)), rngs=jax.random.PRNGKey(0))
    with pytest.raises(ValueError, match=r"\(batch, features, ...\)"):
        layer(jnp.ones((4,)), rngs=jax.random.PRNGKey(0))
    with pytest.raises(ValueError, match="PRNG key"):
        layer(jnp.ones((4, 3)))


# (2) torch layer and parity ------------------------------------------------------------------------------------

def test_torch_layer_semantics_and_nnx_parity():
    torch.manual_seed(0)
    tl = TorchGyroDropoutLayer(8, 1, 0.5, 4, 2).train()
    x = torch.randn(6, 40)
    y0 = tl(x)
    assert tl.preselect_masks.shape == (4, 40) and int(tl.training_step) == 1
    pool, picked = tl.preselect_masks.clone(), tl.selected_idx.clone()
    ref = x * pool[picked].repeat_interleave(3, dim=0) * 2.0  # Composer's construction
    torch.testing.assert_close(y0, ref, rtol=0, atol=0)
    for _ in range(3):  # calls 1-3 keep pool and indices (iter_num 4)
        torch.testing.assert_close(tl(x), ref, rtol=0, atol=0)
    tl(x)
    assert torch.equal(tl.preselect_masks, pool) and int(tl.training_step) == 5
    assert torch.equal(tl.eval()(x), x)
    with pytest.raises(ValueError, match="multiple of tau=2"):
        tl.train()(torch.randn(5, 40))

    # parity: the NNX layer with the torch layer's masks and indices computes the same values, mid-period
    layer, f = _jitted_layer(8, 0.5, 4, 2)
    _, state = f(nnx.state(layer), jnp.ones((6, 40)), jax.random.PRNGKey(7))
    nnx_pool = _pool(layer, state, 40)
    with torch.no_grad():
        tl.preselect_masks.copy_(torch.from_numpy(nnx_pool.copy()))
        tl.selected_idx.copy_(torch.from_numpy(np.array(state["picked"][...])).long())
        tl.training_step.fill_(1)
    xs = np.random.default_rng(0).standard_normal((6, 40)).astype(np.float32)
    y_nnx, _ = f(state, jnp.asarray(xs), jax.random.PRNGKey(8))
    np.testing.assert_allclose(np.asarray(y_nnx), tl.train()(torch.from_numpy(xs)).detach().numpy(), rtol=0,
                               atol=1e-6)


# (3) surgery ---------------------------------------------------------------------------------------------------

def test_nnx_surgery_replaces_dropout_and_leaves_the_original():
    model = ResNetCIFAR(depth=8, width=4, num_classes=10, in_channels=1, dropout=0.2, rngs=nnx.Rngs(0))
    new = apply_gyro_dropout(model, 10, 3, 0.5, 8, 4)
    assert isinstance(new.drop, GyroDropoutLayer) and isinstance(model.drop, nnx.Dropout)
    assert new.drop.iter_num == int(30 / 8) * 4 and new.drop.p == 0.5
    assert sum(isinstance(m, GyroDropoutLayer) for _, m in nnx.iter_graph(new)) == 1
    # a dropout module shared by the MLP's hidden layers stays one shared layer
    mlp = MLP(16, hidden=(8, 8), dropout=0.1, rngs=nnx.Rngs(0))
    same = apply_gyro_dropout(mlp, 10, 1, 0.5, 8, 4, inplace=True)
    assert same is mlp and isinstance(mlp.drop, GyroDropoutLayer)
    x = jnp.ones((4, 16))
    np.testing.assert_array_equal(np.asarray(new(jnp.ones((2, 8, 8, 1)), train=False)),
                                  np.asarray(model(jnp.ones((2, 8, 8, 1)), train=False)))  # eval unchanged
    assert mlp(x, train=True, key=jax.random.PRNGKey(0)).shape == (4, 10)
    assert int(mlp.drop.training_step[...]) == 2  # called once per hidden layer, as Composer's counter


def test_model_with_dropout_rate_zero_gets_a_key_for_its_replaced_dropout():
    # ResNetCIFAR(dropout=0) has a rate-0 nnx.Dropout; the model still hands it a key, so GyroDropout can train
    model = ResNetCIFAR(depth=8, width=4, num_classes=10, in_channels=1, dropout=0.0, rngs=nnx.Rngs(0))
    new = apply_gyro_dropout(model, 10, 3, 0.5, 8, 4)
    x = jnp.ones((8, 8, 8, 1))
    train = nnx.jit(lambda m, x, key: m(x, train=True, key=key))
    y = np.asarray(train(new, x, jax.random.PRNGKey(0)))
    assert y.shape == (8, 10) and np.isfinite(y).all()
    assert not np.allclose(y, np.asarray(train(model, x, jax.random.PRNGKey(0))))  # half the features dropped


def test_torch_surgery_in_place():
    model = nn.Sequential(nn.Linear(6, 8), nn.Dropout(0.1), nn.ReLU(), nn.Dropout(0.3), nn.Linear(8, 3))
    same = apply_gyro_dropout(model, 10, 2, 0.5, 8, 4)
    assert same is model and count_module_instances(model, TorchGyroDropoutLayer) == 2
    assert count_module_instances(model, nn.Dropout) == 0 and model[1].iter_num == int(20 / 8) * 4
    materialize(model, np.zeros((4, 6), np.float32))
    assert model[1].preselect_masks.shape == (8, 8) and model.training  # the mode is restored


def test_no_dropout_warns_and_bad_hyperparameters_raise():
    with pytest.warns(NoEffectWarning, match="no dropout layers"):
        apply_gyro_dropout(ResNetCIFAR(depth=8, width=4, rngs=nnx.Rngs(0)).blocks[0], 10, 1, 0.5, 8, 4)
    with pytest.warns(NoEffectWarning):
        apply_gyro_dropout(nn.Sequential(nn.Linear(2, 2)), 10, 1, 0.5, 8, 4)
    for kwargs, match in [({"p": 1.0}, "p must be in"), ({"p": -0.1}, "p must be in"), ({"sigma": 0}, "sigma"),
                          ({"tau": 2.5}, "tau"), ({"tau": True}, "tau")]:
        with pytest.raises(ValueError, match=match):
            GyroDropout(**kwargs)
    with pytest.raises(ValueError, match="iters_per_epoch"):
        apply_gyro_dropout(MLP(4, dropout=0.1, rngs=nnx.Rngs(0)), 0, 1, 0.5, 8, 4)
    with pytest.raises(TypeError, match="flax.nnx.Module or a torch.nn.Module"):
        apply_gyro_dropout(object(), 10, 1, 0.5, 8, 4)


def test_method_equals_functional_and_edits_in_place():
    from jaxcomposer.models.tasks import ComposerClassifier
    model = MLP(16, hidden=(8,), dropout=0.1, rngs=nnx.Rngs(0))
    functional = apply_gyro_dropout(model, 12, 1, 0.3, 4, 2)
    task = ComposerClassifier(model, num_classes=10)
    new_task = GyroDropout(p=0.3, sigma=4, tau=2).model(task, StepCtx(step=0, run=RunInfo(12, 4)))
    assert new_task.source is model and isinstance(model.drop, GyroDropoutLayer)
    assert (model.drop.iter_num, model.drop.p, model.drop.tau) == (functional.drop.iter_num, 0.3, 2)
    x, key = jnp.ones((4, 16)), jax.random.PRNGKey(5)
    np.testing.assert_array_equal(np.asarray(model(x, train=True, key=key)),
                                  np.asarray(functional(x, train=True, key=key)))


# (4) inside the Trainer, with bitwise resume --------------------------------------------------------------------

def _trainer(task, method, **kw):
    from jaxcomposer import Trainer
    from jaxcomposer.data import ArrayLoader
    from jaxcomposer.optim import DecoupledSGDW
    from tests.trainer.helpers import digits

    return Trainer(model=task, train_dataloader=ArrayLoader(digits("train", n=64), 16, seed=0),
                   max_duration="3ba", optimizers=DecoupledSGDW(lr=0.05, momentum=0.9), algorithms=[method],
                   seed=0, progress_bar=False, devices=jax.devices()[:1], **kw)


def _bits(tree):
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(tree)]


def _straight_and_resumed(make_task, tmp_path):
    from jaxcomposer.loggers import InMemoryLogger
    logger = InMemoryLogger()
    straight = _trainer(make_task(), GyroDropout(p=0.5, sigma=4, tau=4), loggers=[logger],
                        save_folder=tmp_path / "ckpt", save_interval="1ba")
    straight.fit()
    straight.close()
    resumed = _trainer(make_task(), GyroDropout(p=0.5, sigma=4, tau=4), load_path=tmp_path / "ckpt" / "2")
    resumed.fit()
    for a, b in zip(_bits(straight.state.train_state), _bits(resumed.state.train_state), strict=True):
        np.testing.assert_array_equal(a, b)
    losses = [v for _, v in logger.data["loss/train/total"]]
    assert len(losses) == 3 and np.all(np.isfinite(losses))
    return straight


def test_trains_nnx_mlp_and_resumes_bitwise(tmp_path):
    from jaxcomposer.models.tasks import ComposerClassifier
    straight = _straight_and_resumed(
        lambda: ComposerClassifier(MLP(64, hidden=(16,), dropout=0.1, rngs=nnx.Rngs(0)), num_classes=10), tmp_path)
    gyro = straight.state.model.drop
    assert isinstance(gyro, GyroDropoutLayer) and gyro.iter_num == 4  # max(int(3 / 4), 1) * 4
    assert int(gyro.training_step[...]) == 3  # the trained module holds the layer's state


def test_trains_bridged_torch_mlp_and_resumes_bitwise(tmp_path):
    from torch_bridge.mirrors import TorchMLP
    from jaxcomposer.models.tasks import ComposerClassifier

    def make():
        torch.manual_seed(0)
        return ComposerClassifier(TorchMLP(64, hidden=(16,), dropout=0.1), num_classes=10)

    straight = _straight_and_resumed(make, tmp_path)
    module = straight.state.model.module  # ComposerClassifier(torch module) is the torch wrapper
    assert isinstance(module.drop, TorchGyroDropoutLayer)
    state = straight.state.train_state.model_state
    assert int(state["drop.training_step"]) == 3 and state["drop.preselect_masks"].shape == (4, 16)
    np.testing.assert_array_equal(module.drop.preselect_masks.numpy(), state["drop.preselect_masks"])
