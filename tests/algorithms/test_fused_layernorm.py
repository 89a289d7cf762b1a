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
from jaxcomposer.algorithms import FusedLayerNorm, apply_fused_layernorm
from jaxcomposer.errors import NoEffectWarning
from jaxcomposer.algorithms.fused_layernorm import FusedLayerNormModule, fused_layer_norm
from jaxcomposer.core.method import RunInfo, StepCtx
from jaxcomposer.models import GPT, ResNetCIFAR
from torch_bridge.methods.fused_layernorm import FusedLayerNorm as TorchFusedLayerNorm
from torch_bridge.surgery import count_module_instances
from tests.algorithms.algo_testing import Example

# no LayerNorm in the contract's ResNetCIFAR (it warns NoEffectWarning there); the composition table's GPT has five
EXAMPLE = Example(lambda: algorithms.FusedLayerNorm())


def _layers(d, seed=0):
    """A plain two-pass ``nnx.LayerNorm`` (the reference) with random affine parameters, and its fused twin."""
    plain = nnx.LayerNorm(d, epsilon=1e-5, use_fast_variance=False, rngs=nnx.Rngs(0))
    ks, kb = jax.random.split(jax.random.PRNGKey(seed))
    plain.scale[...] = 1 + 0.5 * jax.random.normal(ks, (d,))
    plain.bias[...] = jax.random.normal(kb, (d,))
    return plain, FusedLayerNormModule.from_layer_norm(plain)


@functools.cache
def _value_and_grads(graphdef):
    """Jitted ``(y, (dscale, dbias), dx)`` of ``sum(y * ct)``: one compile per layer type."""
    def loss(state, x, ct):
        y = nnx.merge(graphdef, state)(x)
        return (y * ct).sum(), y

    def run(state, x, ct):
        (_, y), (g_state, g_x) = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(state, x, ct)
        return y, (g_state["scale"][...], g_state["bias"][...]), g_x

    return jax.jit(run)


def _run(layer, x, ct):
    graphdef, state = nnx.split(layer)
    return _value_and_grads(graphdef)(state, x, ct)


def _numpy_layernorm(x, scale, bias, ct, eps=1e-5):
    """float64 reference: ``y`` and the analytic gradients of ``sum(y * ct)`` w.r.t. ``x``, ``scale``, ``bias``."""
    x, scale, bias, ct = (np.asarray(a, np.float64) for a in (x, scale, bias, ct))
    mean = x.mean(-1, keepdims=True)
    rstd = 1 / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + eps)
    xhat = (x - mean) * rstd
    g = ct * scale
    dx = rstd * (g - g.mean(-1, keepdims=True) - xhat * (g * xhat).mean(-1, keepdims=True))
    axes = tuple(range(x.ndim - 1))
    return xhat * scale + bias, ((ct * xhat).sum(axes), ct.sum(axes)), dx


def _inputs(shape, loc=0.0, spread=1.0, seed=1):
    kx, kc = jax.random.split(jax.random.PRNGKey(seed))
    return loc + spread * jax.random.normal(kx, shape), jax.random.normal(kc, shape)


# (1) numerics ---------------------------------------------------------------------------------------------------

def _assert_close(ours, ref, rtol=1e-5, atol=1e-5):
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(ref), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=rtol, atol=atol)


def test_forward_and_gradients_equal_nnx_layernorm():
    plain, fused = _layers(48)
    x, ct = _inputs((3, 5, 48), loc=0.5, spread=2.0)
    ours = _run(fused, x, ct)
    # both float32 with O(1) values: they differ by float32 rounding of sums over <= 48 (x) or 15 (params) terms
    _assert_close(ours, _run(plain, x, ct))
    _assert_close(ours, _numpy_layernorm(x, plain.scale[...], plain.bias[...], ct))
    assert ours[0].dtype == x.dtype and ours[2].dtype == x.dtype


@pytest.mark.parametrize("loc", [1e3, 1e4])
def test_stays_accurate_on_inputs_with_a_large_mean(loc):
    # Rows with mean `loc` and std 1. The reference is float64 on the same float32 inputs. Subtracting the row's
    # first element is exact here (Sterbenz), so the statistics are those of O(1) numbers: the same 1e-5
    # tolerance holds as for centred inputs. An unshifted one-pass variance, E[x^2] - E[x]^2 in float32, would
    # cancel ~1e8 against ~1e8 and lose every digit of a variance of 1 (`naive` below shows it).
    plain, fused = _layers(64, seed=2)
    x, ct = _inputs((4, 64), loc=loc)
    ours = _run(fused, x, ct)
    ref = _numpy_layernorm(x, plain.scale[...], plain.bias[...], ct)
    _assert_close(ours, ref)
    # at least as accurate as the two-pass float32 LayerNorm, whose mean (rounded at the magnitude of `loc`)
    # shifts every normalized value (~1e-3 at 1e4)
    two_pass_error = np.abs(np.asarray(_run(plain, x, ct)[0]) - ref[0]).max()
    assert np.abs(np.asarray(ours[0]) - ref[0]).max() <= two_pass_error
    naive_var = (x * x).mean(-1) - x.mean(-1) ** 2
    assert np.abs(np.asarray(naive_var) - np.asarray(x, np.float64).var(-1)).max() > 0.01


def test_torch_normalized_shape_without_affine_and_bf16():
    x, _ = _inputs((2, 3, 4, 5), loc=3.0)
    tx = torch.from_numpy(np.array(x))
    np.testing.assert_allclose(np.asarray(fused_layer_norm(x, None, None, 1e-5, n_axes=2)),
                               nn.functional.layer_norm(tx, (4, 5)).numpy(), rtol=1e-5, atol=1e-5)
    # bf16 activations and parameters: float32 statistics, the result in bf16 (as flax's and torch's LayerNorms)
    y = fused_layer_norm(x.astype(jnp.bfloat16), jnp.ones(5, jnp.bfloat16), jnp.zeros(5, jnp.bfloat16))
    assert y.dtype == jnp.bfloat16
    with pytest.raises(ValueError, match="n_axes=5"):
        fused_layer_norm(x, None, None, n_axes=5)


def test_jit_equals_eager():
    _, fused = _layers(16, seed=3)
    x, _ = _inputs((2, 3, 16))
    eager = fused(x)
    jitted = nnx.jit(lambda m, x: m(x))(fused, x)
    np.testing.assert_allclose(np.asarray(eager), np.asarray(jitted), rtol=1e-6, atol=1e-6)


# (2) surgery ----------------------------------------------------------------------------------------------------

def _gpt():
    return GPT(vocab_size=32, seq_len=8, d_model=16, n_layers=2, n_heads=2, rngs=nnx.Rngs(0))


@nnx.jit
def _logits(model, tokens):
    return model(tokens, train=False)


def _paths(model):
    return sorted(jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(nnx.state(model))[0])


TOKENS = jnp.arange(16, dtype=jnp.int32).reshape(2, 8) % 32


def test_nnx_surgery_counts_paths_and_original_untouched():
    model = _gpt()
    new = apply_fused_layernorm(model)
    assert sum(isinstance(m, FusedLayerNormModule) for _, m in nnx.iter_graph(new)) == 5  # ln1, ln2 x 2, ln_f
    assert not any(isinstance(m, FusedLayerNormModule) for _, m in nnx.iter_graph(model))
    assert _paths(new) == _paths(model)  # same parameter paths: checkpoints load either way
    np.testing.assert_allclose(np.asarray(_logits(new, TOKENS)), np.asarray(_logits(model, TOKENS)),
                               rtol=1e-5, atol=1e-5)
    with warnings.catch_warnings():  # fusing again finds the fused layers: no warning, no change
        warnings.simplefilter("error")
        again = apply_fused_layernorm(new, inplace=True)
    assert again is new and sum(isinstance(m, FusedLayerNormModule) for _, m in nnx.iter_graph(new)) == 5


def test_unfusable_layernorm_raises_before_any_change():
    model = nnx.Sequential(nnx.LayerNorm(4, rngs=nnx.Rngs(0)),
                           nnx.LayerNorm(4, reduction_axes=(-2, -1), rngs=nnx.Rngs(0)))
    with pytest.raises(ValueError, match=r"LayerNorm at layers\.1 with reduction_axes=\(-2, -1\)"):
        apply_fused_layernorm(model, inplace=True)
    assert not any(isinstance(m, FusedLayerNormModule) for _, m in nnx.iter_graph(model))
    with pytest.raises(ValueError, match="mask"):
        _layers(4)[1](jnp.ones((2, 4)), mask=jnp.ones((2, 4), bool))


def test_torch_surgery_in_place_copies_weights():
    from torch_bridge.mirrors import TorchGPT
    torch.manual_seed(0)
    model = TorchGPT(vocab_size=32, seq_len=8, d_model=16, n_layers=2, n_heads=2)
    with torch.no_grad():  # non-trivial LayerNorm weights, so copying them is visible
        for m in model.modules():
            if isinstance(m, nn.LayerNorm):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    tokens = torch.randint(0, 32, (2, 8))
    with torch.no_grad():
        y0 = model(tokens)
    same = apply_fused_layernorm(model, optimizers=None)
    assert same is model and count_module_instances(model, TorchFusedLayerNorm) == 5
    assert model.state_dict().keys() == before.keys()
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), y0, rtol=0, atol=0)  # eager: torch's own layer_norm


def test_warnings_and_validation():
    with pytest.warns(NoEffectWarning, match="no instances of LayerNorm"):
        apply_fused_layernorm(ResNetCIFAR(depth=8, width=4, rngs=nnx.Rngs(0)))
    with pytest.warns(NoEffectWarning, match="no instances of LayerNorm"):
        apply_fused_layernorm(nn.Sequential(nn.Linear(2, 2)))
    with pytest.raises(TypeError, match="flax.nnx.Module or a torch.nn.Module"):
        apply_fused_layernorm(object())
    with pytest.raises(ValueError, match="apply_events"):
        FusedLayerNorm(apply_events=["fit_start"])


def test_method_edits_in_place_and_equals_functional():
    from jaxcomposer.models.tasks import ComposerCausalLM
    model = _gpt()
    functional = apply_fused_layernorm(model)
    task = FusedLayerNorm().model(ComposerCausalLM(model), StepCtx(step=0, run=RunInfo(2)))
    assert task.source is model and isinstance(model.ln_f, FusedLayerNormModule)
    assert isinstance(model.blocks[1].ln2, FusedLayerNormModule)
    np.testing.assert_array_equal(np.asarray(_logits(model, TOKENS)), np.asarray(_logits(functional, TOKENS)))


# (3) the bridge and the Trainer ---------------------------------------------------------------------------------

def test_bridged_torch_layer_matches_torch_forward_and_gradients():
    from torch_bridge import from_torch
    torch.manual_seed(0)
    module = nn.Sequential(nn.LayerNorm(24), nn.Linear(24, 6), nn.LayerNorm((6,), elementwise_affine=False))
    with torch.no_grad():
        module[0].weight.uniform_(0.5, 1.5)
        module[0].bias.uniform_(-0.5, 0.5)
    apply_fused_layernorm(module)
    x = torch.randn(5, 24) * 3 + 7
    bridged = from_torch(module, (x,), modes=(True,))
    nodes = [str(n.target) for n in bridged._programs[True].graph.nodes]
    assert sum("fused_layer_norm" in n for n in nodes) == 2 and not any("native_layer_norm" in n for n in nodes)

    xt = x.clone().requires_grad_(True)
    ref = module(xt)
    ref.pow(2).sum().backward()

    def loss(params, x):
        out, _ = bridged.apply(params, bridged.buffers, None, x)
        return (out ** 2).sum(), out

    (_, out), (g_params, g_x) = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))(
        bridged.params, x.numpy())
    np.testing.assert_allclose(np.asarray(out), ref.detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(g_x), xt.grad.numpy(), rtol=1e-5, atol=1e-5)
    for name, p in module.named_parameters():
        np.testing.assert_allclose(np.asarray(g_params[name]), p.grad.numpy(), rtol=1e-5, atol=1e-5)


def _fit(task, data):
    from jaxcomposer import Trainer
    from jaxcomposer.loggers import InMemoryLogger
    from jaxcomposer.optim import DecoupledAdamW

    logger = InMemoryLogger()
    trainer = Trainer(model=task, train_dataloader=data, max_duration="2ba", optimizers=DecoupledAdamW(lr=3e-3),
                      algorithms=[FusedLayerNorm()], seed=0, progress_bar=False, devices=jax.devices()[:1],
                      loggers=[logger])
    trainer.fit()
    losses = [v for _, v in logger.data["loss/train/total"]]
    assert len(losses) == 2 and np.all(np.isfinite(losses)) and losses[0] != losses[1]
    return trainer


def test_trains_native_gpt():
    from jaxcomposer.data import ArrayLoader
    from jaxcomposer.models.tasks import ComposerCausalLM
    model = _gpt()
    tokens = np.random.default_rng(0).integers(0, 32, (16, 9)).astype(np.int32)
    trainer = _fit(ComposerCausalLM(model), ArrayLoader({"input_ids": tokens}, 8, seed=0))
    assert trainer.state.model is model and isinstance(model.blocks[0].ln1, FusedLayerNormModule)


def test_trains_bridged_torch_model_and_matches_torch_forward():
    from jaxcomposer.data import ArrayLoader
    from jaxcomposer.models.tasks import ComposerClassifier

    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(64, 32), nn.LayerNorm(32), nn.ReLU(), nn.Linear(32, 10))
    x = np.random.default_rng(0).standard_normal((32, 64)).astype(np.float32)
    y = np.random.default_rng(1).integers(0, 10, 32).astype(np.int32)
    trainer = _fit(ComposerClassifier(module, num_classes=10), ArrayLoader({"input": x, "target": y}, 16, seed=0))
    assert trainer.state.model.module is module and isinstance(module[1], TorchFusedLayerNorm)
    np.testing.assert_array_equal(module[1].weight.detach().numpy(), trainer.state.train_state.params["1.weight"])
    (ours,) = trainer.predict([{"input": x[:8], "target": y[:8]}])
    with torch.no_grad():
        theirs = module.eval()(torch.from_numpy(x[:8])).numpy()
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)
