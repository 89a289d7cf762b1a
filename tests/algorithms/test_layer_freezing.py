import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxcomposer import Trainer
from jaxcomposer.algorithms import LayerFreezing, apply_blurpool, freeze_layers
from jaxcomposer.algorithms.layer_freezing import (LayerFreezingState, _depth, _thresholds, get_layers,
                                                   layer_freezing_tx)
from jaxcomposer.core.events import Callback
from jaxcomposer.core.method import RunInfo
from jaxcomposer.core.time import Time
from jaxcomposer.data import ArrayLoader
from jaxcomposer.models import MLP
from jaxcomposer.models.tasks import ComposerClassifier
from jaxcomposer.optim import DecoupledSGDW
from tests.algorithms.algo_testing import EXAMPLE_METHODS, check_composes_with
from tests.trainer.helpers import digits

class _Net(nnx.Module):
    """Attributes deliberately not alphabetical, 11 list items ('10' sorts before '2'), a strided conv for BlurPool."""

    def __init__(self, rngs):
        self.stem = nnx.Conv(1, 4, (3, 3), strides=2, rngs=rngs)
        self.norm = nnx.BatchNorm(4, rngs=rngs)
        self.blocks = nnx.List([nnx.Linear(4, 4, rngs=rngs) for _ in range(11)])
        self.head = nnx.Linear(4, 3, rngs=rngs)


NET_LAYERS = ["stem", "norm"] + [f"blocks/{i}" for i in range(11)] + ["head"]


def _params(key, names=("stem", "block1", "block2", "block3", "head")):
    """A plain dict in definition (insertion) order, deliberately not alphabetical."""
    keys = jax.random.split(key, len(names))
    return {n: {"w": jax.random.normal(k, (3, 2)), "b": jax.random.normal(k, (2,))} for n, k in zip(names, keys)}


# (1) functional numerics ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def net():
    return _Net(nnx.Rngs(0))


def test_layers_follow_definition_order(net):
    params = nnx.split(net, nnx.Param, ...)[1]
    assert get_layers(params, net) == NET_LAYERS  # nnx.State alone would sort 'blocks' first, then 'head'
    with pytest.raises(ValueError, match="nnx.State sorts its keys"):
        get_layers(params)
    # a rebuilt module has sorted attributes: refuse rather than freeze the head first
    with pytest.raises(ValueError, match="rebuilt"):
        get_layers(params, nnx.clone(net))
    # surgery after the order was read: BlurPool's new 'conv' level takes its parent's place
    blurred = apply_blurpool(net, min_channels=1)
    assert get_layers(nnx.split(blurred, nnx.Param, ...)[1], net) == ["stem/conv"] + NET_LAYERS[1:]
    mlp = MLP(64, hidden=(8,), rngs=nnx.Rngs(0))  # the contract tests' model family: hidden layers, then head
    assert get_layers(nnx.split(mlp, nnx.Param, ...)[1], mlp) == ["hidden/0", "head"]
    # dicts: insertion order; a module with children keeps its own params unfrozen (Composer's leaf modules)
    tree = {"stem": {"w": 1.0}, "block": {"a": {"w": 1.0}, "b": {"w": 2.0}, "own": 3.0}, "head": {"w": 1.0}}
    assert get_layers(tree) == ["stem", "block/a", "block/b", "head"]
    # bridged torch params: one flat dict of dotted names
    flat = {"conv.weight": 1.0, "conv.bias": 1.0, "layer1.0.fc.weight": 1.0, "fc.weight": 1.0}
    assert get_layers(flat) == ["conv", "layer1/0/fc", "fc"]
    # an explicit order (paths in definition order) overrides the container's, and must cover every layer
    assert get_layers(_params(jax.random.PRNGKey(0)), ["head", "block3", "block2", "block1", "stem"])[0] == "head"
    with pytest.raises(ValueError, match="not covered"):
        get_layers(_params(jax.random.PRNGKey(0)), ["head", "stem"])


@pytest.mark.parametrize("t,start,level,depth,pct", [
    (0.0, 0.5, 1.0, 0, 0.0),
    (0.5, 0.5, 1.0, 0, 0.0),  # t <= freeze_start: nothing frozen
    (0.75, 0.5, 1.0, 2, 0.5),  # int(0.5 * 4)
    (0.9, 0.5, 1.0, 3, 0.8),
    (1.0, 0.5, 1.0, 4, 1.0),  # everything but the head
    (1.0, 0.5, 0.5, 2, 0.5),  # freeze_level caps the fraction
    (0.3, 0.0, 1.0, 1, 0.3),
])
def test_freeze_layers_hand_checked(t, start, level, depth, pct, key):
    params = _params(key)
    frozen, d, p = freeze_layers(params, t, freeze_start=start, freeze_level=level)
    assert d == depth and p == pytest.approx(pct)
    names = list(params)
    for i, n in enumerate(names):
        assert bool(frozen[n]["w"]) == bool(frozen[n]["b"]) == (i < depth), (n, frozen)
    # traced duration (float32 in jit) gives the same answer away from exact boundaries
    tf, td, tp = jax.jit(lambda x: freeze_layers(params, x, start, level))(jnp.float32(t))
    assert int(td) == depth and float(tp) == pytest.approx(pct, abs=1e-6)
    assert jax.tree.map(bool, tf) == jax.tree.map(bool, frozen)


def test_freeze_layers_validates():
    with pytest.raises(ValueError, match="freeze_start"):
        freeze_layers({"a": {"w": 1.0}}, 0.5, freeze_start=1.0)
    with pytest.raises(ValueError, match="freeze_level"):
        LayerFreezing(freeze_level=1.5)
    with pytest.raises(ValueError, match="update_interval"):
        LayerFreezing(update_interval="0.5dur")
    with pytest.raises(ValueError, match="steps_per_epoch"):
        layer_freezing_tx(optax.sgd(0.1), RunInfo(total_steps=10), 0.0, 1.0, "1ep")


@pytest.mark.parametrize("n_layers,total,boundary,start,level", [
    (5, 10, 1, 0.5, 1.0), (19, 24, 8, 0.0, 1.0), (7, 100, 3, 0.1, 0.7), (4, 30, 10, 0.3, 1.0), (2, 5, 1, 0.0, 1.0),
])
def test_threshold_table_equals_composer_per_boundary(n_layers, total, boundary, start, level):
    th = _thresholds(n_layers, total, boundary, start, level)
    for k in range(total // boundary + 1):
        assert int((k >= th).sum()) == _depth(k * boundary / total, n_layers, start, level), k


# (2) the optimizer wrapper: frozen means bitwise frozen; jit == eager; no retrace; resume ------------------------

def _run(tx, params, grads_key, steps, opt=None):
    opt = tx.init(params) if opt is None else opt
    history = [params]
    step = jax.jit(lambda p, o, g: (lambda u, o2: (optax.apply_updates(p, u), o2))(*tx.update(g, o, p)))
    for s in range(steps):
        g = jax.tree.map(lambda x: jax.random.normal(jax.random.fold_in(grads_key, s), x.shape), params)
        params, opt = step(params, opt, g)
        history.append(params)
    return history, opt


def _base(lr=0.1):
    # momentum and decoupled weight decay: both would move a param even with a zero gradient
    return optax.chain(DecoupledSGDW(lr=lr, momentum=0.9, weight_decay=1e-4), optax.scale_by_schedule(lambda s: 1.0))


def test_frozen_layers_stay_bitwise_unchanged(key):
    params = _params(key)
    info = RunInfo(total_steps=8, steps_per_epoch=2, base_lr=0.1)
    tx = layer_freezing_tx(_base(), info, freeze_start=0.0, freeze_level=1.0, update_interval="1ep")
    history, opt = _run(tx, params, jax.random.fold_in(key, 1), 8)
    names = list(params)
    for s in range(8):  # step s runs after s // 2 epoch ends: depth int((2k/8) * 4)
        depth = int((2 * (s // 2) / 8) * 4)
        before, after = history[s], history[s + 1]
        for i, n in enumerate(names):
            for leaf in ("w", "b"):
                same = np.array_equal(before[n][leaf], after[n][leaf])
                assert same == (i < depth), (s, n, depth)
    assert isinstance(opt, LayerFreezingState) and int(opt.count) == 8
    # head (last layer) is never frozen, even at the end
    assert not np.array_equal(history[-2]["head"]["w"], history[-1]["head"]["w"])


def test_frozen_gradients_do_not_reach_the_inner_optimizer(key):
    # A global-norm clip inside: torch's frozen params have no grad, so they do not count in the norm.
    params = _params(key, ("a", "b", "head"))
    info = RunInfo(total_steps=2, steps_per_epoch=None, base_lr=1.0)
    inner = optax.chain(optax.clip_by_global_norm(0.5), optax.sgd(1.0))
    tx = layer_freezing_tx(inner, info, 0.0, 1.0, "1ba")
    opt = tx.init(params)
    g = jax.tree.map(lambda x: jnp.full(x.shape, 3.0), params)
    _, opt = tx.update(g, opt, params)  # step 0: nothing frozen yet
    u, _ = tx.update(g, opt, params)  # step 1: t = 1/2, depth int(0.5 * 2) = 1: 'a' frozen
    g_ref = dict(g, a=jax.tree.map(jnp.zeros_like, g["a"]))
    u_ref, _ = inner.update(g_ref, inner.init(params), params)
    assert float(jnp.abs(u["a"]["w"]).max()) == 0.0
    jax.tree.map(np.testing.assert_array_equal, u, u_ref)


def test_jit_equals_eager_and_no_retrace(key):
    params = _params(key)
    tx = layer_freezing_tx(_base(), RunInfo(total_steps=6, steps_per_epoch=None, base_lr=0.1), 0.2, 1.0, "1ba")
    traces = []

    def update(g, o, p):
        traces.append(1)
        return tx.update(g, o, p)

    jupdate = jax.jit(update)
    jo = eo = tx.init(params)
    for s in range(6):
        g = jax.tree.map(lambda x: jax.random.normal(jax.random.fold_in(key, s), x.shape), params)
        (ju, jo), (eu, eo) = jupdate(g, jo, params), update(g, eo, params)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7), ju, eu)
    assert len(traces) == 1 + 6  # one trace for jit, then the eager calls


def test_resume_across_the_freeze_boundary_is_bitwise(key):
    params = _params(key)
    info = RunInfo(total_steps=8, steps_per_epoch=2, base_lr=0.1)
    make = lambda: layer_freezing_tx(_base(), info, 0.0, 1.0, "1ep")
    straight, opt_a = _run(make(), params, key, 8)
    first, opt = _run(make(), params, key, 3)  # stop mid-epoch 2, with one layer frozen
    saved = jax.tree.map(np.asarray, (first[-1], opt))  # what a checkpoint holds: plain arrays
    restored = jax.tree.map(jnp.asarray, saved)
    # a fresh wrapper, initialized then overwritten by the checkpoint as the Trainer does, continues with the same
    # grads (keys folded with the absolute step)
    tx = make()
    template = tx.init(params)
    assert jax.tree_util.tree_structure(template) == jax.tree_util.tree_structure(restored[1])
    p, o = restored
    step = jax.jit(lambda p, o, g: (lambda u, o2: (optax.apply_updates(p, u), o2))(*tx.update(g, o, p)))
    for s in range(3, 8):
        g = jax.tree.map(lambda x: jax.random.normal(jax.random.fold_in(key, s), x.shape), params)
        p, o = step(p, o, g)
    jax.tree.map(np.testing.assert_array_equal, (p, o), (straight[-1], opt_a))


def test_method_reads_nnx_definition_order(net):
    task = ComposerClassifier(net, num_classes=3)
    m = LayerFreezing(freeze_start=0.0, update_interval="1ba")
    info = RunInfo(total_steps=2, steps_per_epoch=8, base_lr=0.1)
    with pytest.raises(ValueError, match="nnx.State sorts its keys"):
        m.tx(optax.sgd(0.1), info).init(task.params)  # the model slot has not run: order unknown
    assert m.model(task) is task
    tx = m.tx(optax.sgd(0.1), info)
    opt = tx.init(task.params)
    _, opt = tx.update(jax.tree.map(jnp.ones_like, task.params), opt, task.params)
    u, _ = tx.update(jax.tree.map(jnp.ones_like, task.params), opt, task.params)  # depth int(0.5 * 13) = 6
    flat = {"/".join(str(k.key) for k in kp if hasattr(k, "key")): v
            for kp, v in jax.tree_util.tree_flatten_with_path(u)[0]}
    for i, layer in enumerate(NET_LAYERS):
        zero = all(float(jnp.abs(v).max()) == 0.0 for n, v in flat.items() if n.rsplit("/", 1)[0] == layer)
        assert zero == (i < 6), layer
    # layer_order pins the order without reading the model (e.g. a rebuilt one)
    m2 = LayerFreezing(freeze_start=0.0, update_interval="1ba", layer_order=list(reversed(NET_LAYERS)))
    clone_task = ComposerClassifier(nnx.clone(net), num_classes=3)
    with pytest.raises(ValueError, match="rebuilt"):
        m.model(clone_task)
    assert m2.model(clone_task) is clone_task
    tx2 = m2.tx(optax.sgd(0.1), info)
    opt = tx2.init(task.params)
    _, opt = tx2.update(jax.tree.map(jnp.ones_like, task.params), opt, task.params)
    u, _ = tx2.update(jax.tree.map(jnp.ones_like, task.params), opt, task.params)
    assert float(jnp.abs(u["head"]["kernel"][...]).max()) == 0.0  # head listed first: frozen first
    assert float(jnp.abs(u["stem"]["kernel"][...]).max()) > 0.0
    with pytest.raises(ValueError, match="layer_order"):
        LayerFreezing(layer_order="stem")


# (3)+(4) in the Trainer with Composer's default epoch-end freezing -----------------------------------------------

class _Recorder(Callback):
    """Copies the params after every batch (the live train state's buffers are donated to the next step)."""

    def __init__(self):
        self.params = []

    def batch_end(self, state, logger):
        self.params.append(jax.tree.map(np.array, state.train_state.params))


def _trainer(**kw):
    task = ComposerClassifier(MLP(64, hidden=(16, 16, 16), num_classes=10, rngs=nnx.Rngs(0)), num_classes=10)
    return Trainer(model=task, train_dataloader=ArrayLoader(digits("train", n=256), 32, seed=3), max_duration="3ep",
                   optimizers=DecoupledSGDW(lr=0.1, momentum=0.9, weight_decay=1e-4),
                   algorithms=[LayerFreezing(freeze_start=0.0, freeze_level=1.0)], seed=7, progress_bar=False,
                   devices=jax.devices()[:1], **kw)


def test_trainer_freezes_at_epoch_ends_and_resumes(tmp_path):
    rec = _Recorder()
    straight = _trainer(callbacks=[rec])
    straight.fit()
    assert len(rec.params) == 24  # 8 batches per epoch; epoch ends at t = 1/3, 2/3: depth int(t * 3) = 1, 2
    frozen_from = {"hidden/0": 8, "hidden/1": 16}

    def leaf(tree, layer):
        node = tree
        for k in layer.split("/"):
            node = node[int(k) if k.isdigit() else k]
        return np.asarray(node["kernel"][...])

    for layer in ("hidden/0", "hidden/1", "hidden/2", "head"):
        for b in range(1, 24):  # rec.params[b] is after batch b + 1; compare with the batch before
            same = np.array_equal(leaf(rec.params[b - 1], layer), leaf(rec.params[b], layer))
            assert same == (b >= frozen_from.get(layer, 99)), (layer, b)

    first = _trainer()
    first.max_duration = Time(12, "ba")  # stop mid-epoch 2, with hidden/0 frozen
    first.fit()
    first.save_checkpoint(tmp_path / "ckpt")
    resumed = _trainer(load_path=tmp_path / "ckpt")
    resumed.fit()
    a, b = jax.tree_util.tree_leaves(straight.state.train_state), jax.tree_util.tree_leaves(resumed.state.train_state)
    assert len(a) == len(b)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


# (5) composition ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("other", sorted(EXAMPLE_METHODS))
def test_composes_pairwise(other, key):
    check_composes_with("LayerFreezing", other, key)
