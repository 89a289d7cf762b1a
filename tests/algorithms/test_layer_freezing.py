import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxcomposer import Trainer
from jaxcomposer.algorithms import BlurPool, LayerFreezing, apply_blurpool, freeze_layers
from jaxcomposer.algorithms.layer_freezing import (LayerFreezingState, _depth, _thresholds, get_layers,
                                                   layer_freezing_tx)
from jaxcomposer.core.events import Callback
from jaxcomposer.core.method import ModelView
from jaxcomposer.core.model import param_path, param_use_order
from jaxcomposer.data import ArrayLoader
from jaxcomposer.models import MLP
from jaxcomposer.models.tasks import ComposerClassifier
from jaxcomposer.optim import DecoupledSGDW
from tests.algorithms.algo_testing import make_ctx
from tests.trainer.helpers import digits, stop_at, resnet_task
from jaxcomposer import algorithms
from tests.algorithms.algo_testing import Example

# one representative configuration: the composition table and the Trainer contract run it
# per-batch recomputation from the start: in the contract ResNet, 9 of 19 layers freeze for the 2nd step
EXAMPLE = Example(lambda: algorithms.LayerFreezing(freeze_start=0.0, freeze_level=1.0, update_interval="1ba"))


class _Net(nnx.Module):
    """Attributes deliberately not alphabetical, 11 list items ('10' sorts before '2'), a strided conv for BlurPool."""

    def __init__(self, rngs):
        self.stem = nnx.Conv(1, 4, (3, 3), strides=2, rngs=rngs)
        self.norm = nnx.BatchNorm(4, rngs=rngs)
        self.blocks = nnx.List([nnx.Linear(4, 4, rngs=rngs) for _ in range(11)])
        self.head = nnx.Linear(4, 3, rngs=rngs)

    def __call__(self, x, *, train, key=None):
        x = jax.nn.relu(self.norm(self.stem(x), use_running_average=not train))
        for block in self.blocks:
            x = jax.nn.relu(block(x))
        return self.head(x.mean((1, 2)))


class _DefinedBackwards(nnx.Module):
    """Defines the head before the layer its forward calls first: Composer's definition order would freeze the head
    first; the forward's order freezes 'body' (the one deliberate difference, see the card)."""

    def __init__(self, rngs):
        self.head = nnx.Linear(4, 3, rngs=rngs)
        self.body = nnx.Linear(2, 4, rngs=rngs)

    def __call__(self, x, *, train, key=None):
        return self.head(jax.nn.relu(self.body(x)))


NET_LAYERS = ["stem", "norm"] + [f"blocks/{i}" for i in range(11)] + ["head"]


def _forward_order(module, input_shape=(2, 8, 8, 1)):
    """What ``ctx.model.param_order()`` gives in the Trainer: param paths in the order the forward reads them."""
    task = ComposerClassifier.for_module(module, num_classes=3)
    return param_use_order(task.forward, task.params, task.state, {"input": jnp.zeros(input_shape)})


def _param_tree(module):
    return nnx.split(module, nnx.Param, ...)[1]


def _params(key, names=("stem", "block1", "block2", "block3", "head")):
    """A plain dict in definition (insertion) order, deliberately not alphabetical."""
    keys = jax.random.split(key, len(names))
    return {n: {"w": jax.random.normal(k, (3, 2)), "b": jax.random.normal(k, (2,))} for n, k in zip(names, keys)}


# (1) functional numerics ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def net():
    return _Net(nnx.Rngs(0))


def test_layers_follow_the_forward_order(net):
    params = _param_tree(net)
    assert get_layers(params, _forward_order(net)) == NET_LAYERS  # nnx.State alone would sort 'blocks', then 'head'
    with pytest.raises(ValueError, match="nnx.State sorts its keys"):
        get_layers(params)
    # a rebuilt module has sorted attributes, but the forward still reads the stem first: the same order
    clone = nnx.clone(net)
    assert get_layers(_param_tree(clone), _forward_order(clone)) == NET_LAYERS
    # after surgery: BlurPool's new 'conv' level sits where the forward reads it, whether the order comes from the
    # surgered model's forward or from module paths read before surgery (a layer takes its ancestor's place)
    blurred = apply_blurpool(net, min_channels=1)
    assert get_layers(_param_tree(blurred), _forward_order(blurred)) == ["stem/conv"] + NET_LAYERS[1:]
    assert get_layers(_param_tree(blurred), NET_LAYERS) == ["stem/conv"] + NET_LAYERS[1:]
    mlp = MLP(64, hidden=(8,), rngs=nnx.Rngs(0))  # the contract tests' model family: hidden layers, then head
    assert get_layers(_param_tree(mlp), _forward_order(mlp, (2, 64))) == ["hidden/0", "head"]
    # the one deliberate difference from Composer: forward order, not definition order; layer_order restores any
    backwards = _DefinedBackwards(nnx.Rngs(0))
    assert get_layers(_param_tree(backwards), _forward_order(backwards, (2, 2))) == ["body", "head"]
    assert get_layers(_param_tree(backwards), ["head", "body"]) == ["head", "body"]
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
    frozen, d, p = freeze_layers(params, None, t, freeze_start=start, freeze_level=level)
    assert d == depth and p == pytest.approx(pct)
    names = list(params)
    for i, n in enumerate(names):
        assert bool(frozen[n]["w"]) == bool(frozen[n]["b"]) == (i < depth), (n, frozen)
    # traced duration (float32 in jit) gives the same answer away from exact boundaries
    tf, td, tp = jax.jit(lambda x: freeze_layers(params, None, x, start, level))(jnp.float32(t))
    assert int(td) == depth and float(tp) == pytest.approx(pct, abs=1e-6)
    assert jax.tree.map(bool, tf) == jax.tree.map(bool, frozen)


def test_freeze_layers_takes_a_param_order(net):
    # nnx.State params with the forward's order (the functional form of what the method reads from ctx.model)
    params = _param_tree(net)
    frozen, depth, pct = freeze_layers(params, None, 0.75, freeze_start=0.5, param_order=_forward_order(net))
    assert depth == int(0.5 * 13) == 6 and pct == pytest.approx(0.5)
    flat = {"/".join(param_path(kp)[:-1]): bool(v) for kp, v in jax.tree_util.tree_flatten_with_path(frozen)[0]}
    assert flat == {layer: i < 6 for i, layer in enumerate(NET_LAYERS)}
    # module paths work as well, dotted or slashed
    frozen2, _, _ = freeze_layers(params, None, 0.75, freeze_start=0.5,
                                  param_order=[p.replace("/", ".") for p in NET_LAYERS])
    assert jax.tree.map(bool, frozen2) == jax.tree.map(bool, frozen)


def test_freeze_layers_validates():
    with pytest.raises(ValueError, match="freeze_start"):
        freeze_layers({"a": {"w": 1.0}}, None, 0.5, freeze_start=1.0)
    with pytest.raises(ValueError, match="freeze_level"):
        LayerFreezing(freeze_level=1.5)
    with pytest.raises(ValueError, match="update_interval"):
        LayerFreezing(update_interval="0.5dur")
    with pytest.raises(ValueError, match="steps_per_epoch"):
        layer_freezing_tx(optax.sgd(0.1), make_ctx(0, total_steps=10), 0.0, 1.0, "1ep", layer_order=["a"])
    with pytest.raises(ValueError, match="no layer order"):  # neither the model's param order nor layer_order
        layer_freezing_tx(optax.sgd(0.1), make_ctx(0, total_steps=10), 0.0, 1.0, "1ba")


@pytest.mark.parametrize("n_layers,total,boundary,start,level", [
    (5, 10, 1, 0.5, 1.0), (19, 24, 8, 0.0, 1.0), (7, 100, 3, 0.1, 0.7), (4, 30, 10, 0.3, 1.0), (2, 5, 1, 0.0, 1.0),
])
def test_threshold_table_equals_composer_per_boundary(n_layers, total, boundary, start, level):
    th = _thresholds(n_layers, total, boundary, start, level)
    for k in range(total // boundary + 1):
        assert int((k >= th).sum()) == _depth(k * boundary / total, n_layers, start, level), k


# (2) the optimizer wrapper: frozen means bitwise frozen; jit == eager; no retrace; resume ------------------------

def _ctx(step, params, total_steps, steps_per_epoch=None, base_lr=0.1):
    """The step's ctx, with the param order the Trainer would give: a plain dict's layers are read in its order."""
    order = tuple((n, leaf) for n in params for leaf in params[n])
    return make_ctx(step, total_steps=total_steps, steps_per_epoch=steps_per_epoch, base_lr=base_lr,
                    model=ModelView(param_order=lambda: order))


def _run(tx_at, params, grads_key, steps, opt=None, start=0):
    """``tx_at(step)`` builds the step's wrapper (as the Trainer does, from the clock); jitted once."""
    opt = tx_at(0).init(params) if opt is None else opt
    history = [params]
    step = jax.jit(lambda p, o, g, s: (lambda u, o2: (optax.apply_updates(p, u), o2))(*tx_at(s).update(g, o, p)))
    for s in range(start, start + steps):
        g = jax.tree.map(lambda x: jax.random.normal(jax.random.fold_in(grads_key, s), x.shape), params)
        params, opt = step(params, opt, g, s)
        history.append(params)
    return history, opt


def _base(lr=0.1):
    # momentum and decoupled weight decay: both would move a param even with a zero gradient
    return optax.chain(DecoupledSGDW(lr=lr, momentum=0.9, weight_decay=1e-4), optax.scale_by_schedule(lambda s: 1.0))


def test_frozen_layers_stay_bitwise_unchanged(key):
    params = _params(key)
    tx_at = lambda s: layer_freezing_tx(_base(), _ctx(s, params, 8, 2), freeze_start=0.0, freeze_level=1.0,
                                        update_interval="1ep")
    history, opt = _run(tx_at, params, jax.random.fold_in(key, 1), 8)
    names = list(params)
    for s in range(8):  # step s runs after s // 2 epoch ends: depth int((2k/8) * 4)
        depth = int((2 * (s // 2) / 8) * 4)
        before, after = history[s], history[s + 1]
        for i, n in enumerate(names):
            for leaf in ("w", "b"):
                same = np.array_equal(before[n][leaf], after[n][leaf])
                assert same == (i < depth), (s, n, depth)
    # the schedule's clock is the step (ctx.step): the wrapper's state is the inner optimizer's, no counter
    assert isinstance(opt, LayerFreezingState) and LayerFreezingState._fields == ("inner_state",)
    # head (last layer) is never frozen, even at the end
    assert not np.array_equal(history[-2]["head"]["w"], history[-1]["head"]["w"])


def test_frozen_gradients_do_not_reach_the_inner_optimizer(key):
    # A global-norm clip inside: torch's frozen params have no grad, so they do not count in the norm.
    params = _params(key, ("a", "b", "head"))
    inner = optax.chain(optax.clip_by_global_norm(0.5), optax.sgd(1.0))
    tx_at = lambda s: layer_freezing_tx(inner, _ctx(s, params, 2, None, 1.0), 0.0, 1.0, "1ba")
    opt = tx_at(0).init(params)
    g = jax.tree.map(lambda x: jnp.full(x.shape, 3.0), params)
    _, opt = tx_at(0).update(g, opt, params)  # step 0: nothing frozen yet
    u, _ = tx_at(1).update(g, opt, params)  # step 1: t = 1/2, depth int(0.5 * 2) = 1: 'a' frozen
    g_ref = dict(g, a=jax.tree.map(jnp.zeros_like, g["a"]))
    u_ref, _ = inner.update(g_ref, inner.init(params), params)
    assert float(jnp.abs(u["a"]["w"]).max()) == 0.0
    jax.tree.map(np.testing.assert_array_equal, u, u_ref)


def test_jit_equals_eager_and_no_retrace(key):
    params = _params(key)
    tx_at = lambda s: layer_freezing_tx(_base(), _ctx(s, params, 6), 0.2, 1.0, "1ba")
    traces = []

    def update(g, o, p, s):
        traces.append(1)
        return tx_at(s).update(g, o, p)

    jupdate = jax.jit(update)
    jo = eo = tx_at(0).init(params)
    for s in range(6):
        g = jax.tree.map(lambda x: jax.random.normal(jax.random.fold_in(key, s), x.shape), params)
        (ju, jo), (eu, eo) = jupdate(g, jo, params, s), update(g, eo, params, s)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7), ju, eu)
    assert len(traces) == 1 + 6  # one trace for jit, then the eager calls


def test_resume_across_the_freeze_boundary_is_bitwise(key):
    params = _params(key)
    tx_at = lambda s: layer_freezing_tx(_base(), _ctx(s, params, 8, 2), 0.0, 1.0, "1ep")
    straight, opt_a = _run(tx_at, params, key, 8)
    first, opt = _run(tx_at, params, key, 3)  # stop mid-epoch 2, with one layer frozen
    saved = jax.tree.map(np.asarray, (first[-1], opt))  # what a checkpoint holds: plain arrays (the clock is the
    restored = jax.tree.map(jnp.asarray, saved)  # train state's step, saved beside them)
    # a fresh wrapper, initialized then overwritten by the checkpoint as the Trainer does, continues from clock 3
    # with the same grads (keys folded with the absolute step)
    template = tx_at(0).init(params)
    assert jax.tree_util.tree_structure(template) == jax.tree_util.tree_structure(restored[1])
    resumed, o = _run(tx_at, restored[0], key, 5, opt=restored[1], start=3)
    jax.tree.map(np.testing.assert_array_equal, (resumed[-1], o), (straight[-1], opt_a))


def test_method_reads_the_forward_order(net):
    task = ComposerClassifier.for_module(net, num_classes=3)
    m = LayerFreezing(freeze_start=0.0, update_interval="1ba")
    assert m.model is None and m.tx is not None  # no model slot: the order comes from ctx.model
    with pytest.raises(ValueError, match="no layer order"):
        m.tx(optax.sgd(0.1), make_ctx(0, total_steps=2, steps_per_epoch=8))  # no param_order in this ctx

    def frozen_after_two_steps(method, task):
        view = ModelView(param_order=lambda: _forward_order(task.source))
        ctx = lambda s: make_ctx(s, total_steps=2, steps_per_epoch=8, base_lr=0.1, model=view)
        ones = jax.tree.map(jnp.ones_like, task.params)
        opt = method.tx(optax.sgd(0.1), ctx(0)).init(task.params)
        _, opt = method.tx(optax.sgd(0.1), ctx(0)).update(ones, opt, task.params)
        u, _ = method.tx(optax.sgd(0.1), ctx(1)).update(ones, opt, task.params)  # depth int(0.5 * 13) = 6
        flat = {"/".join(param_path(kp)): v for kp, v in jax.tree_util.tree_flatten_with_path(u)[0]}
        return {layer: all(float(jnp.abs(v).max()) == 0.0 for n, v in flat.items() if n.rsplit("/", 1)[0] == layer)
                for layer in NET_LAYERS}

    assert frozen_after_two_steps(m, task) == {layer: i < 6 for i, layer in enumerate(NET_LAYERS)}
    # a rebuilt module (nnx.clone sorts attributes) freezes the same layers: the forward's order does not change
    clone_task = ComposerClassifier(nnx.clone(net), num_classes=3)
    assert frozen_after_two_steps(m, clone_task) == frozen_after_two_steps(m, task)
    # layer_order pins the order instead of the forward's
    m2 = LayerFreezing(freeze_start=0.0, update_interval="1ba", layer_order=list(reversed(NET_LAYERS)))
    frozen = frozen_after_two_steps(m2, clone_task)
    assert frozen["head"] and not frozen["stem"]  # head listed first: frozen first
    assert frozen == {layer: i < 6 for i, layer in enumerate(reversed(NET_LAYERS))}
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

    # stop mid-epoch 2, with hidden/0 frozen; the plan (total steps) unchanged
    first = _trainer(callbacks=[stop_at(12)])
    first.fit()
    assert first.state.timestamp.batch == 12
    first.save_checkpoint(tmp_path / "ckpt")
    resumed = _trainer(load_path=tmp_path / "ckpt")
    resumed.fit()
    a, b = jax.tree_util.tree_leaves(straight.state.train_state), jax.tree_util.tree_leaves(resumed.state.train_state)
    assert len(a) == len(b)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_trainer_freezes_in_forward_order_after_blurpool():
    """BlurPool listed first rebuilds the NNX ResNet (sorted attributes, new 'conv' levels); LayerFreezing still
    freezes earliest layers first, because its order is the forward's (ctx.model.param_order())."""
    rec = _Recorder()
    trainer = Trainer(model=resnet_task(), train_dataloader=ArrayLoader(digits("train", n=128), 32, seed=3),
                      max_duration="4ba", optimizers=DecoupledSGDW(lr=0.1, momentum=0.9, weight_decay=1e-4),
                      algorithms=[BlurPool(min_channels=1),
                                  LayerFreezing(freeze_start=0.0, freeze_level=1.0, update_interval="1ba")],
                      callbacks=[rec], seed=7, progress_bar=False, devices=jax.devices()[:1])
    block = lambda i, strided: [f"blocks/{i}/conv1" + ("/conv" if strided else ""), f"blocks/{i}/bn1",
                                f"blocks/{i}/conv2", f"blocks/{i}/bn2"] + \
        ([f"blocks/{i}/proj_conv/conv", f"blocks/{i}/proj_bn"] if strided else [])
    layers = ["stem_conv", "stem_bn"] + block(0, False) + block(1, True) + block(2, True) + ["head"]
    assert get_layers(trainer.state.train_state.params, trainer.param_order()) == layers  # 19 layers
    trainer.fit()

    def by_layer(params):
        out = {}
        for kp, v in jax.tree_util.tree_flatten_with_path(params)[0]:
            out.setdefault("/".join(param_path(kp)[:-1]), []).append(np.asarray(v))
        return out

    for b in range(1, 4):  # the step at clock b freezes the first int((b / 4) * 18) layers: 4, 9, 13
        depth = int(b / 4 * 18)
        before, after = by_layer(rec.params[b - 1]), by_layer(rec.params[b])
        for i, layer in enumerate(layers):
            same = all(np.array_equal(x, y) for x, y in zip(before[layer], after[layer]))
            assert same == (i < depth), (b, layer, depth)
