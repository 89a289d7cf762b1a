"""Model-zoo parity: CNN, ResNet-18/50-style, a tied-weight SDPA GPT, HF GPT-2, BERT (with and without padding),
Llama, T5 and ViT, and an LSTM classifier,
each bridged with ``from_torch`` and compared against torch itself: eval forward, CE gradients (eval mode), BN
buffers after a train forward, and the ``to_torch`` round trip after a few jitted optax SGD steps."""
import copy
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
import torch.nn.functional as F

from torch_bridge import from_torch
from tests.torch_bridge.parity import LAYER_TOL, MODEL_TOL, assert_close_on_scale
from tests.torch_bridge.zoo import ZOO, ConvBNReLU

# its module-scoped fixtures and caches are built once per worker: keep its tests on one xdist worker
pytestmark = pytest.mark.xdist_group("test_zoo_parity")

BATCH = 4
# XLA:CPU compile time dominates these tests; LLVM at -O0 compiles several times faster and is plenty for parity.
jit = functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": 0})


@functools.cache
def bridged(name):
    """(name, pristine torch reference, BridgedModel, inputs, targets), exported once per session with
    ``dynamic_batch=True`` (what the Trainer does). The reference is never handed to the bridge, so tests that
    write back with ``to_torch`` cannot disturb the others."""
    zc = ZOO[name]
    module = zc.build()
    ref = copy.deepcopy(module)
    inputs, targets = zc.inputs(BATCH), zc.targets(BATCH)
    return name, ref, from_torch(module, inputs, dynamic_batch=True), inputs, targets


@pytest.fixture(params=list(ZOO))
def case(request):
    return bridged(request.param)


def np_inputs(inputs):
    return tuple(x.numpy() for x in inputs)


def ce_jax(logits, y):
    return optax.softmax_cross_entropy_with_integer_labels(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)).mean()


def ce_torch(logits, y):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def assert_close(ours, ref, tol=MODEL_TOL):
    """On the reference's scale (logits reach ~7,000 after the SGD steps): see ``assert_close_on_scale``."""
    assert_close_on_scale(ours, ref, tol)


@functools.cache
def eval_with_grads(name):
    """``(params, buffers) -> ((loss, (outputs, new_buffers)), grads)``: a zoo model's eval forward on its inputs,
    with the cross-entropy and its gradients; one compile shared by the eval, gradient and round-trip tests."""
    _, _, bm, x, y = bridged(name)
    xs, yj = np_inputs(x), jnp.asarray(y.numpy())

    def loss(params, buffers):
        out, new_buffers = bm.apply(params, buffers, None, *xs, train=False)
        return ce_jax(out, yj), (out, new_buffers)

    return jit(jax.value_and_grad(loss, has_aux=True))


SGD_STEPS = 3


@functools.cache
def sgd_run(name):
    """A few jitted optax SGD steps in train mode (dropout keyed, BN in batch-stats mode).

    Returns the buffers after each step and the final params: the first step's buffers are the result of one
    train forward from the initial weights, so they double as the train-mode buffer check.
    """
    _, _, bm, x, y = bridged(name)
    opt = optax.sgd(0.05, momentum=0.9)
    xs, yj = np_inputs(x), jnp.asarray(y.numpy())

    @jit
    def step(params, buffers, opt_state, key):
        def loss(p):
            out, new_b = bm.apply(p, buffers, key, *xs, train=True)
            return ce_jax(out, yj), new_b
        (_, buffers), grads = jax.value_and_grad(loss, has_aux=True)(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), buffers, opt_state

    # the init jitted: eager, it compiles a zeros program per parameter shape
    params, buffers, opt_state, history = bm.params, bm.buffers, jit(opt.init)(bm.params), []
    for i in range(SGD_STEPS):
        params, buffers, opt_state = step(params, buffers, opt_state, jax.random.key(i))
        history.append(buffers)
    return params, history


def test_eval_forward_parity(case):
    name, ref, bm, x, _ = case
    m = copy.deepcopy(ref).eval()
    with torch.no_grad():
        expected = m(*x)
    (_, (out, new_buffers)), _ = eval_with_grads(name)(bm.params, bm.buffers)
    assert out.shape == tuple(expected.shape)
    assert_close(out, expected)
    for k, v in new_buffers.items():  # eval leaves buffers alone
        np.testing.assert_array_equal(np.asarray(v), np.asarray(bm.buffers[k]))


def test_grad_parity_eval_mode(case):
    name, ref, bm, x, y = case
    m = copy.deepcopy(ref).eval()
    ce_torch(m(*x), y).backward()
    (loss, _), grads = eval_with_grads(name)(bm.params, bm.buffers)
    with torch.no_grad():
        assert_close(loss, ce_torch(m(*x), y))
    torch_params = dict(m.named_parameters())  # torch de-duplicates tied parameters too
    assert set(grads) == set(torch_params)
    for k, g in grads.items():
        if torch_params[k].grad is None:  # unused by this forward: zero here
            np.testing.assert_array_equal(np.asarray(g), 0)
        else:
            assert_close(g, torch_params[k].grad)


@pytest.mark.parametrize("name", [n for n in ZOO if ZOO[n].has_bn])
def test_train_mode_buffers(name):
    _, ref, bm, x, _ = bridged(name)
    m = copy.deepcopy(ref).train()
    with torch.no_grad():
        m(*x)
    new = sgd_run(name)[1][0]  # after one train forward from the initial weights
    sd = m.state_dict()
    assert set(new) == set(bm.buffers) and new
    for k, v in new.items():
        assert v.dtype == bm.buffers[k].dtype
        if k.endswith("num_batches_tracked"):
            assert int(v) == int(sd[k]) == 1
        else:
            assert_close(v, sd[k], LAYER_TOL)


def test_no_bn_models_carry_no_buffers():
    for name in (n for n in ZOO if not ZOO[n].has_bn):
        assert not any(k.endswith(("running_mean", "num_batches_tracked")) for k in bridged(name)[2].buffers)


@pytest.mark.parametrize("name", [n for n in ZOO if n != "hf_bert"])  # hf_bert_mask: same model, more inputs
def test_round_trip_after_sgd(name):
    name, ref, bm, x, _ = bridged(name)
    params, history = sgd_run(name)
    buffers = history[-1]
    moved = max(np.abs(np.asarray(params[k]) - np.asarray(bm.params[k])).max() for k in params)
    assert moved > 1e-3  # the steps did something
    restored = bm.to_torch(params, buffers).eval()
    assert restored is bm.module  # loaded into the module that was converted, not a copy
    (_, (ours, _)), _ = eval_with_grads(name)(params, buffers)
    with torch.no_grad():
        assert_close(ours, restored(*x))
    for k, v in restored.state_dict().items():  # dtypes preserved (int64 num_batches_tracked, ...)
        assert v.dtype == ref.state_dict()[k].dtype
    if ZOO[name].has_bn:
        assert all(int(v) == SGD_STEPS for k, v in restored.state_dict().items() if k.endswith("num_batches_tracked"))
    if name == "gpt":
        assert restored.lm_head.weight is restored.wte.weight  # still tied after the load


# ------------------------------------------------------------------------------------------------ per layer
def test_per_layer_first_conv_bn_block():
    """The first Conv-BN-ReLU block of the CNN, exported alone, at 1e-5 in eval and train (stats included)."""
    zc = ZOO["cnn"]
    model = zc.build()
    block = ConvBNReLU(copy.deepcopy(model.conv1), copy.deepcopy(model.bn1))
    (x,) = zc.inputs(BATCH)
    bm = from_torch(block, (x,))
    with torch.no_grad():
        expected = copy.deepcopy(block).eval()(x)
        # the same block inside the full model: its activation as the model computes it
        full = copy.deepcopy(model).eval()
        inside = F.relu(full.bn1(full.conv1(x)))
    out, _ = bm.apply(bm.params, bm.buffers, None, x.numpy(), train=False)
    assert_close(out, expected, LAYER_TOL)
    assert_close(out, inside, LAYER_TOL)
    train_ref = copy.deepcopy(block).train()
    with torch.no_grad():
        expected_train = train_ref(x)
    out, new = bm.apply(bm.params, bm.buffers, jax.random.key(0), x.numpy(), train=True)
    assert_close(out, expected_train, LAYER_TOL)
    for k in ("bn.running_mean", "bn.running_var"):
        assert_close(new[k], train_ref.state_dict()[k], LAYER_TOL)


def test_per_layer_resnet_stage():
    """ResNet-18's layer1 (two BasicBlocks) exported alone, fed the stem's activation, at 1e-5."""
    model = ZOO["resnet18"].build().eval()
    (x,) = ZOO["resnet18"].inputs(BATCH)
    with torch.no_grad():
        stem = model.maxpool(F.relu(model.bn1(model.conv1(x))))
        expected = model.layer1(stem)
    bm = from_torch(copy.deepcopy(model.layer1), (stem,))
    out, _ = bm.apply(bm.params, bm.buffers, None, stem.numpy(), train=False)
    assert_close(out, expected, LAYER_TOL)


def test_bert_padding_mask_matters():
    """The mask input is really used: changing padded tokens changes nothing, dropping the mask changes logits."""
    _, ref, bm, (ids, mask), _ = bridged("hf_bert_mask")
    model = copy.deepcopy(ref).eval()
    noisy = torch.where(mask.bool(), ids, torch.full_like(ids, 7))
    fwd = jit(lambda i, m: bm.apply(bm.params, bm.buffers, None, i, m, train=False)[0])
    run = lambda i, m: np.asarray(fwd(i.numpy(), m.numpy()))
    assert_close(run(ids, mask), run(noisy, mask), LAYER_TOL)
    assert not np.allclose(run(noisy, mask), run(noisy, torch.ones_like(mask)), atol=1e-4)
    with torch.no_grad():
        assert_close(run(ids[:3], mask[:3]), model(ids[:3], mask[:3]))  # dynamic batch with a mask input
