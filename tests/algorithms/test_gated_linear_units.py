import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx
from torch import nn

from jaxcomposer import algorithms
from jaxcomposer.algorithms import GatedLinearUnits, apply_gated_linear_units
from jaxcomposer.errors import NoEffectWarning
from jaxcomposer.algorithms.gated_linear_units import GatedFFOutput, Identity, identity
from jaxcomposer.core.method import RunInfo, StepCtx
from jaxcomposer.models import GPT, ResNetCIFAR
from jaxcomposer.models.gpt import gelu_tanh
from jaxcomposer.models.tasks import ComposerCausalLM
from tests.algorithms.algo_testing import Example
from torch_bridge.methods.gated_linear_units import BERTGatedFFOutput, GatedGPT2MLP

# On the contract's ResNet there is no transformer MLP: the surgery warns and changes nothing (the run must still go)
EXAMPLE = Example(lambda: algorithms.GatedLinearUnits())

D, FF = 32, 128  # the tiny GPT's width and MLP width (mlp_ratio 4)


def _gpt(seed=0, **kw):
    return GPT(vocab_size=64, seq_len=16, d_model=D, n_layers=2, n_heads=2, rngs=nnx.Rngs(seed), **kw)


def _np_gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def _paths(m) -> set[str]:
    return {"/".join(map(str, p)) for p, _ in nnx.to_flat_state(nnx.state(m, nnx.Param))}


def _n_params(m) -> int:
    return sum(v.size for v in jax.tree_util.tree_leaves(nnx.state(m, nnx.Param)))


@functools.cache
def _jit_forward():
    return nnx.jit(lambda m, t: m(t, train=False))


# (1) the gated layer's numerics ------------------------------------------------------------------------------------

def test_gated_ff_output_matches_numpy_and_jit_equals_eager():
    layer = GatedFFOutput(D, FF, gelu_tanh, gated_layer_bias=True, rngs=nnx.Rngs(1))
    x = np.random.default_rng(0).standard_normal((3, 5, D)).astype(np.float32)
    g, n, wo = layer.gated_layer, layer.non_gated_layer, layer.wo
    assert n.bias is None and g.bias is not None and wo.bias is not None  # non_gated_layer_bias=False; wo always
    ref = (_np_gelu_tanh(x @ np.asarray(g.kernel[...]) + np.asarray(g.bias[...])) * (x @ np.asarray(n.kernel[...]))
           ) @ np.asarray(wo.kernel[...]) + np.asarray(wo.bias[...])
    eager = np.asarray(layer(jnp.asarray(x)))
    np.testing.assert_allclose(eager, ref, rtol=1e-5, atol=1e-5)
    jitted = np.asarray(nnx.jit(lambda m, v: m(v))(layer, jnp.asarray(x)))
    np.testing.assert_allclose(jitted, eager, rtol=1e-6, atol=1e-6)
    # Composer's init (torch's nn.Linear default): U(-1/sqrt(fan_in), 1/sqrt(fan_in)), weights and biases
    for lin, fan_in in ((g, D), (n, D), (wo, FF)):
        k = np.asarray(lin.kernel[...])
        assert np.abs(k).max() <= 1 / np.sqrt(fan_in) and k.std() == pytest.approx(1 / np.sqrt(3 * fan_in), rel=0.1)
    assert np.abs(np.asarray(wo.bias[...])).max() <= 1 / np.sqrt(FF) and np.asarray(wo.bias[...]).std() > 0


def test_nnx_gated_layer_matches_torch_gpt2_gated_mlp():
    torch.manual_seed(0)
    theirs = GatedGPT2MLP(D, FF, 0.0, transformers.activations.NewGELUActivation(), gated_layer_bias=True,
                          non_gated_layer_bias=True).eval()
    ours = GatedFFOutput(D, FF, gelu_tanh, True, True, rngs=nnx.Rngs(0))
    for name in ("gated_layer", "non_gated_layer", "wo"):  # torch Linear (out, in) -> NNX kernel (in, out)
        tl, jl = getattr(theirs, name), getattr(ours, name)
        jl.kernel[...] = jnp.asarray(tl.weight.detach().numpy().T)
        jl.bias[...] = jnp.asarray(tl.bias.detach().numpy())
    x = torch.randn(2, 7, D)
    with torch.no_grad():
        ref = theirs(x).numpy()
    np.testing.assert_allclose(np.asarray(ours(jnp.asarray(x.numpy()))), ref, rtol=1e-5, atol=1e-5)


def test_bert_gated_output_matches_composer_formula():
    torch.manual_seed(0)
    layer = BERTGatedFFOutput(D, FF, 0.0, torch.nn.functional.gelu, 1e-12).eval()
    x, res = torch.randn(2, 5, D), torch.randn(2, 5, D)
    assert layer.gated_layer.bias is None and layer.non_gated_layer.bias is None and layer.wo.bias is not None
    with torch.no_grad():
        out = layer(x, res).numpy()
        h = torch.nn.functional.gelu(x @ layer.gated_layer.weight.T) * (x @ layer.non_gated_layer.weight.T)
        y = h @ layer.wo.weight.T + layer.wo.bias + res
        ref = ((y - y.mean(-1, keepdim=True)) / torch.sqrt(y.var(-1, unbiased=False, keepdim=True) + 1e-12)).numpy()
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)  # fresh LayerNorm: weight 1, bias 0


# (2) NNX surgery on our GPT ------------------------------------------------------------------------------------------

def test_nnx_surgery_on_gpt_counts_paths_and_keeps_the_original():
    model = _gpt()
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 64, (2, 16)), jnp.int32)
    y0 = np.asarray(_jit_forward()(model, tokens))
    before = _paths(model)
    new = apply_gated_linear_units(model)
    assert new is not model and _paths(model) == before  # original untouched
    np.testing.assert_array_equal(np.asarray(_jit_forward()(model, tokens)), y0)
    for block in new.blocks:
        assert isinstance(block.fc, Identity) and isinstance(block.fc_proj, GatedFFOutput)
        assert block.mlp_act is identity and block.fc_proj.act is gelu_tanh  # default act_fn = the model's own
    after = _paths(new)
    assert "blocks/0/fc_proj/gated_layer/kernel" in after and "blocks/1/fc_proj/wo/bias" in after
    assert "blocks/0/fc/kernel" not in after and "blocks/0/fc_proj/non_gated_layer/bias" not in after
    # the MLP keeps its width and gains a third matrix: per block +D*FF weights, -FF (fc's bias) biases
    assert _n_params(new) - _n_params(model) == 2 * (D * FF - FF)
    # the surgered block computes x + wo(act(g(ln2 x)) * n(ln2 x)) after its attention branch
    block = new.blocks[0]
    x = jax.random.normal(jax.random.key(0), (2, 5, D))
    h, u = nnx.jit(lambda b, v: (v + b.attn(b.ln1(v)), b.ln2(v + b.attn(b.ln1(v)))))(block, x)
    h, u = np.asarray(h), np.asarray(u)
    g, n, wo = block.fc_proj.gated_layer, block.fc_proj.non_gated_layer, block.fc_proj.wo
    ref = np.asarray(h) + (_np_gelu_tanh(u @ np.asarray(g.kernel[...])) * (u @ np.asarray(n.kernel[...]))
                           ) @ np.asarray(wo.kernel[...]) + np.asarray(wo.bias[...])
    out = nnx.jit(lambda b, v: b(v, train=False, keys=[None, None]))(block, x)
    np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-5, atol=1e-5)
    y1 = np.asarray(_jit_forward()(new, tokens))
    assert y1.shape == y0.shape and np.isfinite(y1).all() and not np.allclose(y1, y0)


def test_act_fn_bias_and_seed_options():
    model = _gpt()
    new = apply_gated_linear_units(model, None, jax.nn.silu, True, True, seed=3)
    fc = new.blocks[1].fc_proj
    assert fc.act is jax.nn.silu and fc.gated_layer.bias is not None and fc.non_gated_layer.bias is not None
    again = apply_gated_linear_units(model, None, jax.nn.silu, True, True, seed=3)
    other = apply_gated_linear_units(model, None, jax.nn.silu, True, True, seed=4)
    k = lambda m: np.asarray(m.blocks[1].fc_proj.gated_layer.kernel[...])  # noqa: E731
    np.testing.assert_array_equal(k(again), k(new))
    assert not np.array_equal(k(other), k(new))
    # two different activations in one model: as Composer, pass act_fn explicitly
    model.blocks[1].mlp_act = jax.nn.relu
    with pytest.raises(ValueError, match="different activations"):
        apply_gated_linear_units(model)
    assert apply_gated_linear_units(model, act_fn=jax.nn.gelu).blocks[1].fc_proj.act is jax.nn.gelu


def test_nothing_to_convert_warns_and_twice_is_a_no_op():
    with pytest.warns(NoEffectWarning, match="GatedLinearUnits did not change ResNetCIFAR"):
        apply_gated_linear_units(ResNetCIFAR(depth=8, width=4, num_classes=10, in_channels=1, rngs=nnx.Rngs(0)))
    once = apply_gated_linear_units(_gpt())
    with pytest.warns(NoEffectWarning, match="converted already"):
        twice = apply_gated_linear_units(once)
    assert _paths(twice) == _paths(once)
    with pytest.warns(NoEffectWarning, match="Sequential"):
        apply_gated_linear_units(nn.Sequential(nn.Linear(4, 4)))
    with pytest.raises(TypeError, match="flax.nnx.Module or a torch.nn.Module"):
        apply_gated_linear_units(object())


def test_factory_validation_and_method_equals_functional():
    with pytest.raises(ValueError, match="act_fn"):
        GatedLinearUnits(act_fn="gelu")
    with pytest.raises(ValueError, match="gated_layer_bias"):
        GatedLinearUnits(gated_layer_bias=1)
    with pytest.raises(ValueError, match="seed"):
        GatedLinearUnits(seed=1.5)
    model = _gpt()
    functional = apply_gated_linear_units(model, seed=0)
    method = GatedLinearUnits()
    assert method.name == "GatedLinearUnits" and method.model is not None and method.batch is None
    task = ComposerCausalLM(model)
    new_task = method.model(task, StepCtx(step=0, run=RunInfo(total_steps=2)))
    assert new_task.source is model and isinstance(model.blocks[0].fc_proj, GatedFFOutput)  # in place
    ours, theirs = nnx.to_flat_state(nnx.state(model, nnx.Param)), nnx.to_flat_state(nnx.state(functional, nnx.Param))
    assert [p for p, _ in ours] == [p for p, _ in theirs]
    for (_, a), (_, b) in zip(ours, theirs):
        np.testing.assert_array_equal(np.asarray(a[...]), np.asarray(b[...]))


# (3) torch surgery ---------------------------------------------------------------------------------------------------

def _bert(layers=2):
    torch.manual_seed(0)
    return transformers.BertForMaskedLM(transformers.BertConfig(
        vocab_size=64, hidden_size=D, num_hidden_layers=layers, num_attention_heads=2, intermediate_size=FF,
        max_position_embeddings=16, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))


def _gpt2():
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=64, n_positions=16, n_embd=D, n_layer=2, n_head=2, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0))


def test_torch_bert_surgery_in_place_as_composer():
    from transformers.models.bert.modeling_bert import BertIntermediate, BertOutput
    model = _bert().eval()
    ids = torch.randint(0, 64, (2, 10))
    with torch.no_grad():
        y0 = model(input_ids=ids).logits
    act = model.bert.encoder.layer[0].intermediate.intermediate_act_fn
    old_attention = model.bert.encoder.layer[0].attention
    same = apply_gated_linear_units(model)
    assert same is model
    assert not any(isinstance(m, (BertIntermediate, BertOutput)) for m in model.modules())
    for layer in model.bert.encoder.layer:
        assert isinstance(layer.intermediate, nn.Identity) and isinstance(layer.output, BERTGatedFFOutput)
        assert layer.output.act is act and layer.output.layernorm.eps == 1e-12  # BERT's own activation and eps
    assert model.bert.encoder.layer[0].attention is old_attention  # the rest is untouched
    keys = set(model.state_dict())
    assert "bert.encoder.layer.0.output.gated_layer.weight" in keys and "bert.encoder.layer.1.output.wo.bias" in keys
    assert "bert.encoder.layer.0.intermediate.dense.weight" not in keys
    with torch.no_grad():
        y1 = model(input_ids=ids).logits
    assert y1.shape == y0.shape and torch.isfinite(y1).all() and not torch.allclose(y1, y0)
    with pytest.warns(NoEffectWarning):
        apply_gated_linear_units(model)


def test_nnx_gpt_matches_torch_twin_after_surgery():
    from torch_bridge.mirrors import TorchGPT
    from torch_bridge.weights import torch_state_dict_to_nnx
    from torch_bridge.methods.gated_linear_units import GatedFFOutput as TorchGatedFFOutput

    torch.manual_seed(0)
    twin = TorchGPT(vocab_size=64, seq_len=16, d_model=D, n_layers=2, n_heads=2).eval()
    ours = apply_gated_linear_units(torch_state_dict_to_nnx(twin.state_dict(), _gpt()), None, None, True)
    assert apply_gated_linear_units(twin, None, None, True) is twin
    assert all(isinstance(b.fc, nn.Identity) and isinstance(b.fc_proj, TorchGatedFFOutput) for b in twin.blocks)
    for tb, jb in zip(twin.blocks, ours.blocks):  # the fresh layers differ: copy the twin's (out, in) -> (in, out)
        for name in ("gated_layer", "non_gated_layer", "wo"):
            tl, jl = getattr(tb.fc_proj, name), getattr(jb.fc_proj, name)
            jl.kernel[...] = jnp.asarray(tl.weight.detach().numpy().T)
            if tl.bias is not None:
                jl.bias[...] = jnp.asarray(tl.bias.detach().numpy())
    # the MLPs' parameters have the same names on both sides (NNX path <-> state_dict key)
    nnx_mlp = {k.replace("/", ".").replace("kernel", "weight") for k in _paths(ours) if "fc" in k}
    assert nnx_mlp == {k for k in twin.state_dict() if "fc" in k}
    tokens = np.random.default_rng(0).integers(0, 64, (2, 16))
    with torch.no_grad():
        ref = twin(torch.from_numpy(tokens)).numpy()
    out = np.asarray(_jit_forward()(ours, jnp.asarray(tokens, jnp.int32)))
    scale = np.abs(ref).max()
    np.testing.assert_allclose(out / scale, ref / scale, atol=1e-4)  # whole model: 1e-4 of the output's scale
    with pytest.warns(NoEffectWarning):
        apply_gated_linear_units(twin)


def test_torch_gpt2_surgery():
    from transformers.models.gpt2.modeling_gpt2 import GPT2MLP
    model = _gpt2()
    n_before = sum(p.numel() for p in model.parameters())
    act = model.transformer.h[0].mlp.act
    apply_gated_linear_units(model, None, torch.nn.functional.silu)
    assert not any(isinstance(m, GPT2MLP) for m in model.modules())
    mlp = model.transformer.h[1].mlp
    assert isinstance(mlp, GatedGPT2MLP) and mlp.act is torch.nn.functional.silu and act is not None
    assert sum(p.numel() for p in model.parameters()) - n_before == 2 * (D * FF - FF)
    default = apply_gated_linear_units(_gpt2())
    assert isinstance(default.transformer.h[0].mlp.act, transformers.activations.NewGELUActivation)


# (4) inside the Trainer ----------------------------------------------------------------------------------------------

def _fit(model, data, algorithms):
    from jaxcomposer import Trainer
    from jaxcomposer.loggers import InMemoryLogger
    from jaxcomposer.optim import DecoupledAdamW

    logger = InMemoryLogger()
    trainer = Trainer(model=model, train_dataloader=data, max_duration="2ba", optimizers=DecoupledAdamW(lr=3e-3),
                      algorithms=algorithms, seed=0, progress_bar=False, devices=jax.devices()[:1], loggers=[logger])
    trainer.fit()
    return trainer, [v for _, v in logger.data["loss/train/total"]]


def test_trains_native_gpt_in_trainer():
    from jaxcomposer.data import ArrayLoader
    model = _gpt()
    tokens = np.random.default_rng(0).integers(0, 64, (16, 17)).astype(np.int32)
    trainer, losses = _fit(ComposerCausalLM(model), ArrayLoader({"input_ids": tokens}, 8, seed=0),
                           [GatedLinearUnits()])
    assert len(losses) == 2 and np.all(np.isfinite(losses)) and losses[1] != losses[0]
    assert trainer.state.model is model and isinstance(model.blocks[0].fc_proj, GatedFFOutput)
    np.testing.assert_array_equal(  # the user's module holds the trained weights
        model.blocks[0].fc_proj.gated_layer.kernel[...],
        trainer.state.train_state.params["blocks"][0]["fc_proj"]["gated_layer"]["kernel"][...])


def test_trains_bridged_hf_bert_in_trainer():
    from torch.utils.data import DataLoader
    from torch_bridge import HuggingFaceModel

    g = np.random.default_rng(0)
    ids = g.integers(1, 64, (16, 12))
    labels = np.full((16, 12), -100)
    labels[:, 2::3] = ids[:, 2::3]
    rows = [{"input_ids": torch.from_numpy(ids[i]), "labels": torch.from_numpy(labels[i])} for i in range(16)]
    hf = _bert(layers=1)  # one layer: the export is most of this test's time
    model = HuggingFaceModel(hf)
    trainer, losses = _fit(model, DataLoader(rows, batch_size=8), [GatedLinearUnits()])
    assert len(losses) == 2 and np.all(np.isfinite(losses))
    assert trainer.state.model is model and isinstance(hf.bert.encoder.layer[0].output, BERTGatedFFOutput)
    names = set(trainer.task.pure.params)
    assert "model.model.bert.encoder.layer.0.output.gated_layer.weight" in names
    assert "model.model.bert.encoder.layer.0.intermediate.dense.weight" not in names
    np.testing.assert_array_equal(hf.bert.encoder.layer[0].output.wo.weight.detach().numpy(),
                                  trainer.state.train_state.params["model.model.bert.encoder.layer.0.output.wo.weight"])


def test_no_warning_when_something_is_converted():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        apply_gated_linear_units(_gpt())
        apply_gated_linear_units(_gpt2())
