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
from jaxcomposer.algorithms import BlurPool, LowPrecisionLayerNorm, apply_low_precision_layernorm
from jaxcomposer.errors import NoEffectWarning
from jaxcomposer.algorithms.low_precision_layernorm import LPLayerNorm
from jaxcomposer.core.method import RunInfo, StepCtx, compose
from jaxcomposer.models import GPT, ResNetCIFAR
from torch_bridge.methods.low_precision_layernorm import LPLayerNorm as TorchLPLayerNorm, to_lp_layernorm
from torch_bridge.surgery import count_module_instances
from tests.algorithms.algo_testing import Example

# no LayerNorm in the contract's ResNetCIFAR (it warns NoEffectWarning there); the composition table's GPT has five
EXAMPLE = Example(lambda: algorithms.LowPrecisionLayerNorm())

BF16 = jnp.bfloat16


def _bf16(v) -> np.ndarray:
    """Values rounded to bfloat16, as float32."""
    return np.asarray(jnp.asarray(v, jnp.float32).astype(BF16).astype(jnp.float32))


@functools.cache
def _apply(graphdef):
    return jax.jit(lambda state, x: nnx.merge(graphdef, state)(x))


def _call(layer, x, dtype=None):
    """A jitted call of ``layer`` with its variables cast to ``dtype`` (as the Trainer's AMP casts params)."""
    graphdef, state = nnx.split(layer)
    if dtype is not None:
        state = jax.tree.map(lambda v: v.astype(dtype), state)
    return _apply(graphdef)(state, x)


def _torch_layernorm(d=64, seed=0):
    torch.manual_seed(seed)
    layer = nn.LayerNorm(d)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(d))
        layer.bias.copy_(torch.randn(d))
    return layer


def _nnx_copy(tlayer, **kw) -> nnx.LayerNorm:
    layer = nnx.LayerNorm(tlayer.normalized_shape[0], epsilon=tlayer.eps, rngs=nnx.Rngs(0), **kw)
    layer.scale[...] = jnp.asarray(tlayer.weight.detach().numpy())
    layer.bias[...] = jnp.asarray(tlayer.bias.detach().numpy())
    return layer


# (1) numerics ---------------------------------------------------------------------------------------------------

def test_bf16_numerics_match_numpy_and_torch_autocast():
    tln = _torch_layernorm()
    x = (torch.randn(8, 64) * 3 + 1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y_torch = to_lp_layernorm(tln, 0)(x)
    assert y_torch.dtype == torch.bfloat16
    y = _call(LPLayerNorm.from_layer_norm(_nnx_copy(tln)), jnp.asarray(x.numpy()), BF16)
    assert y.dtype == BF16
    # reference: inputs and weights rounded to bf16, statistics in float64, the result rounded once to bf16
    xr, w, b = _bf16(x.numpy()), _bf16(tln.weight.detach().numpy()), _bf16(tln.bias.detach().numpy())
    mean, var = xr.astype(np.float64).mean(-1, keepdims=True), xr.astype(np.float64).var(-1, keepdims=True)
    ref = _bf16(((xr - mean) / np.sqrt(var + 1e-5) * w + b).astype(np.float32))
    np.testing.assert_array_equal(np.asarray(y.astype(jnp.float32)), ref)
    np.testing.assert_array_equal(y_torch.float().detach().numpy(), ref)


def test_fp32_is_bit_identical_to_the_original():
    tln = _torch_layernorm(32, seed=1)
    x = jax.random.normal(jax.random.PRNGKey(0), (4, 5, 32)) * 2
    for kw in ({}, {"dtype": jnp.float32}):
        layer = _nnx_copy(tln, **kw)
        lp = LPLayerNorm.from_layer_norm(layer)
        np.testing.assert_array_equal(np.asarray(_call(lp, x)), np.asarray(_call(layer, x)))

        def loss(layer, x):
            return (layer(x) ** 2).sum()

        g0 = jax.jit(jax.grad(loss, argnums=(0, 1)))(layer, x)
        g1 = jax.jit(jax.grad(loss, argnums=(0, 1)))(lp, x)
        for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1), strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    eager = lp(x)  # jit equals eager
    np.testing.assert_array_equal(np.asarray(eager), np.asarray(_call(lp, x)))


def test_a_float32_layernorm_runs_in_bf16_under_amp():
    # a LayerNorm pinned to float32 returns float32 in a bf16 network; the replacement returns bf16
    tln = _torch_layernorm(16, seed=2)
    layer = _nnx_copy(tln, dtype=jnp.float32)
    x = jax.random.normal(jax.random.PRNGKey(1), (3, 16)).astype(BF16)
    assert _call(layer, x, BF16).dtype == jnp.float32
    y = _call(LPLayerNorm.from_layer_norm(layer), x, BF16)
    assert y.dtype == BF16
    # the same as the bf16 reference (an upcast float32 input is cast down first)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(_call(LPLayerNorm.from_layer_norm(layer),
                                                                  x.astype(jnp.float32), BF16)))
    assert not np.array_equal(np.asarray(y.astype(jnp.float32)), np.asarray(_call(layer, x, BF16)))


# (2) surgery ----------------------------------------------------------------------------------------------------

def _gpt():
    return GPT(vocab_size=32, seq_len=8, d_model=16, n_layers=2, n_heads=2, rngs=nnx.Rngs(0))


@nnx.jit
def _logits(model, tokens):
    return model(tokens, train=False)


def _paths(model):
    return sorted(jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(nnx.state(model))[0])


def test_nnx_surgery_counts_paths_and_original_untouched():
    model = _gpt()
    new = apply_low_precision_layernorm(model, "amp_bf16")
    lps = [m for _, m in nnx.iter_graph(new) if isinstance(m, LPLayerNorm)]
    assert len(lps) == 5  # ln1 and ln2 of two blocks, ln_f
    assert not any(isinstance(m, LPLayerNorm) for _, m in nnx.iter_graph(model))
    assert _paths(new) == _paths(model)  # same parameter paths: checkpoints load either way
    tokens = jnp.arange(16, dtype=jnp.int32).reshape(2, 8) % 32
    np.testing.assert_array_equal(np.asarray(_logits(new, tokens)), np.asarray(_logits(model, tokens)))
    with warnings.catch_warnings():  # converting again finds the converted layers: no warning, no change
        warnings.simplefilter("error")
        again = apply_low_precision_layernorm(new, "amp_bf16", inplace=True)
    assert again is new and sum(isinstance(m, LPLayerNorm) for _, m in nnx.iter_graph(new)) == 5


def test_torch_surgery_in_place_copies_weights():
    from torch_bridge.mirrors import TorchGPT
    torch.manual_seed(0)
    model = TorchGPT(vocab_size=32, seq_len=8, d_model=16, n_layers=2, n_heads=2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    tokens = torch.randint(0, 32, (2, 8))
    with torch.no_grad():
        y0 = model(tokens)
    same = apply_low_precision_layernorm(model, "amp_bf16")
    assert same is model and count_module_instances(model, TorchLPLayerNorm) == 5
    assert model.state_dict().keys() == before.keys()
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), y0, rtol=0, atol=0)  # fp32: the same computation


def test_precision_and_no_layernorm_warn_and_apply_at_is_checked():
    model = _gpt()
    for precision in (None, "fp32"):
        with pytest.warns(NoEffectWarning, match="only applies to AMP_FP16 and AMP_BF16"):
            assert apply_low_precision_layernorm(model, precision) is model
    assert not any(isinstance(m, LPLayerNorm) for _, m in nnx.iter_graph(model))
    with pytest.warns(NoEffectWarning, match="No instances of LayerNorm"):
        apply_low_precision_layernorm(ResNetCIFAR(depth=8, width=4, rngs=nnx.Rngs(0)), "amp_bf16")
    with pytest.warns(NoEffectWarning, match="No instances of LayerNorm"):
        apply_low_precision_layernorm(nn.Sequential(nn.Linear(2, 2)), "amp_bf16")
    with pytest.raises(TypeError, match="flax.nnx.Module or a torch.nn.Module"):
        apply_low_precision_layernorm(object(), "amp_bf16")
    for ok in ("init", "before_load", "after_load", "INIT"):
        LowPrecisionLayerNorm(apply_at=ok)
    with pytest.raises(ValueError, match="only supports application on Event.INIT"):
        LowPrecisionLayerNorm(apply_at="fit_start")


def test_method_sorts_last_edits_in_place_and_equals_functional():
    from jaxcomposer.models.tasks import ComposerCausalLM
    assert compose([LowPrecisionLayerNorm(), BlurPool(), algorithms.LabelSmoothing(0.1)]).names[-1] == \
        "LowPrecisionLayerNorm"
    model = _gpt()
    functional = apply_low_precision_layernorm(model, "amp_bf16")
    task = LowPrecisionLayerNorm().model(ComposerCausalLM(model), StepCtx(step=0, run=RunInfo(2)))
    assert task.source is model and isinstance(model.ln_f, LPLayerNorm) and isinstance(model.blocks[1].ln2,
                                                                                        LPLayerNorm)
    tokens = jnp.arange(16, dtype=jnp.int32).reshape(2, 8) % 32
    np.testing.assert_array_equal(np.asarray(_logits(model, tokens)), np.asarray(_logits(functional, tokens)))


# (3) inside the Trainer, under amp_bf16 -------------------------------------------------------------------------

def _fit(task, data):
    from jaxcomposer import Trainer
    from jaxcomposer.loggers import InMemoryLogger
    from jaxcomposer.optim import DecoupledAdamW

    logger = InMemoryLogger()
    trainer = Trainer(model=task, train_dataloader=data, max_duration="2ba", optimizers=DecoupledAdamW(lr=3e-3),
                      algorithms=[LowPrecisionLayerNorm()], seed=0, progress_bar=False, precision="amp_bf16",
                      devices=jax.devices()[:1], loggers=[logger])
    trainer.fit()
    losses = [v for _, v in logger.data["loss/train/total"]]
    assert len(losses) == 2 and np.all(np.isfinite(losses)) and losses[0] != losses[1]
    return trainer


def test_trains_native_gpt_in_amp_bf16():
    from jaxcomposer.data import ArrayLoader
    from jaxcomposer.models.tasks import ComposerCausalLM
    model = _gpt()
    tokens = np.random.default_rng(0).integers(0, 32, (16, 9)).astype(np.int32)
    trainer = _fit(ComposerCausalLM(model), ArrayLoader({"input_ids": tokens}, 8, seed=0))
    assert trainer.state.model is model and isinstance(model.blocks[0].ln1, LPLayerNorm)
    assert trainer.state.train_state.params["ln_f"]["scale"][...].dtype == jnp.float32  # master weights


def test_trains_bridged_torch_model_in_amp_bf16_and_its_layernorm_runs_in_bf16():
    from jaxcomposer.data import ArrayLoader
    from jaxcomposer.models.tasks import ComposerClassifier
    from jaxcomposer.trainer.step import make_forward

    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(64, 32), nn.LayerNorm(32), nn.ReLU(), nn.Linear(32, 10))
    with torch.no_grad():
        module[1].weight.uniform_(0.5, 1.5)
        module[1].bias.uniform_(-0.5, 0.5)
    x = np.random.default_rng(0).standard_normal((32, 64)).astype(np.float32)
    y = np.random.default_rng(1).integers(0, 10, 32).astype(np.int32)
    trainer = _fit(ComposerClassifier(module, num_classes=10), ArrayLoader({"input": x, "target": y}, 16, seed=0))
    assert trainer.state.model.module is module and isinstance(module[1], TorchLPLayerNorm)

    # the exported LayerNorm alone, under the Trainer's amp_bf16 forward, is torch's LPLayerNorm under autocast
    norm = ComposerClassifier.for_module(nn.Sequential(module[1]), num_classes=10)
    norm.bind({"input": x[:, :32]})
    out, _ = make_forward(norm, "amp_bf16")(norm.params, norm.state, {"input": x[:, :32]}, train=False, key=None)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        ref = module[1](torch.from_numpy(x[:, :32]))
    assert ref.dtype == torch.bfloat16
    out = np.asarray(out)
    np.testing.assert_array_equal(out, _bf16(out))  # computed to bf16 values (amp then casts outputs to float32)
    # the same bf16 values as torch's, up to one bf16 rounding step where float32 op orders differ before rounding
    np.testing.assert_allclose(out, ref.float().numpy(), rtol=2.0 ** -7, atol=0)
    assert (out != ref.float().numpy()).mean() < 0.01
    assert not np.array_equal(np.asarray(out), module[1](torch.from_numpy(x[:, :32])).detach().numpy())
