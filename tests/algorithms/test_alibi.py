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

from torch_bridge.mirrors import TorchGPT
from torch_bridge.weights import torch_state_dict_to_nnx
from jaxcomposer import algorithms
from jaxcomposer.algorithms import Alibi, apply_alibi
from jaxcomposer.algorithms.alibi import AlibiBias, FrozenPositionEmbedding, alibi_head_slopes, scale_sequence_length
from jaxcomposer.errors import NoEffectWarning
from jaxcomposer.core.method import RunInfo, StepCtx
from jaxcomposer.models import GPT, ResNetCIFAR
from jaxcomposer.models.tasks import ComposerCausalLM
from tests.algorithms.algo_testing import Example
from torch_bridge.methods.alibi import alibi_causal_bias

# On the contract's ResNet there is no attention (the surgery warns) and its image batches have no sequence keys
# (the reshape leaves them alone): the run must still go
EXAMPLE = Example(lambda: algorithms.Alibi(max_sequence_length=64))

D, HEADS = 32, 4


def _gpt(seed=0, seq_len=16):
    return GPT(vocab_size=64, seq_len=seq_len, d_model=D, n_layers=2, n_heads=HEADS, rngs=nnx.Rngs(seed))


def _tokens(b, t, seed=0):
    return jnp.asarray(np.random.default_rng(seed).integers(0, 64, (b, t)), jnp.int32)


@functools.cache
def _jit_forward():
    return nnx.jit(lambda m, t: m(t, train=False))


def _np_softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


# (1) slopes and the bias -------------------------------------------------------------------------------------------

def test_head_slopes_match_composer():
    assert alibi_head_slopes(8) == [2.0 ** -i for i in range(1, 9)]  # the paper's 1/2, 1/4, ..., 1/256
    assert alibi_head_slopes(4) == [2.0 ** -(2 * i) for i in range(1, 5)]
    # not a power of two: the 4-head slopes, then every other one of the 8-head slopes
    assert alibi_head_slopes(6) == [2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8, 2 ** -1, 2 ** -3]
    np.testing.assert_allclose(alibi_head_slopes(12), alibi_head_slopes(8) + [2.0 ** -(i / 2) for i in (1, 3, 5, 7)])
    assert alibi_head_slopes(1) == [2.0 ** -8]
    with pytest.raises(ValueError, match="n_heads"):
        alibi_head_slopes(0)


def test_bias_values_and_composers_row_form_give_the_same_attention():
    slopes = alibi_head_slopes(HEADS)
    bias = np.asarray(AlibiBias(tuple(slopes))(5))
    assert bias.shape == (1, HEADS, 5, 5)
    i, j = np.meshgrid(np.arange(5), np.arange(5), indexing="ij")
    for h, m in enumerate(slopes):
        np.testing.assert_allclose(bias[0, h], -m * (i - j), rtol=1e-7)
    # Composer adds slope * j (all rows alike); after the causal mask, softmax sees the same distribution
    logits = np.random.default_rng(0).standard_normal((HEADS, 5, 5)).astype(np.float32)
    causal = j <= i
    ours = _np_softmax(np.where(causal, logits + bias[0], -np.inf))
    composer = _np_softmax(np.where(causal, logits + np.asarray(slopes)[:, None, None] * j, -np.inf))
    np.testing.assert_allclose(ours, composer, rtol=1e-6, atol=1e-7)
    assert AlibiBias((0.5,)) == AlibiBias((0.5,)) and hash(AlibiBias((0.5,))) == hash(AlibiBias((0.5,)))


def test_nnx_attention_matches_numpy_reference_and_jit_equals_eager():
    attn = apply_alibi(_gpt(), 64).blocks[0].attn
    x = np.random.default_rng(1).standard_normal((2, 6, D)).astype(np.float32)
    qkv = x @ np.asarray(attn.qkv.kernel[...]) + np.asarray(attn.qkv.bias[...])
    q, k, v = (z.reshape(2, 6, HEADS, D // HEADS).transpose(0, 2, 1, 3) for z in np.split(qkv, 3, -1))
    pos = np.arange(6)
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(D // HEADS)
    scores = scores + np.asarray(alibi_head_slopes(HEADS))[None, :, None, None] * pos  # Composer's row form
    scores = np.where(pos[None, :] <= pos[:, None], scores, -np.inf)
    y = (_np_softmax(scores) @ v).transpose(0, 2, 1, 3).reshape(2, 6, D)
    ref = y @ np.asarray(attn.proj.kernel[...]) + np.asarray(attn.proj.bias[...])
    eager = np.asarray(attn(jnp.asarray(x)))
    np.testing.assert_allclose(eager, ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(nnx.jit(lambda m, v: m(v))(attn, jnp.asarray(x))), eager, rtol=1e-6,
                               atol=1e-6)


# (2) NNX surgery on our GPT ------------------------------------------------------------------------------------------

def test_nnx_surgery_counts_freezes_positions_and_extrapolates():
    model = _gpt()
    tokens = _tokens(2, 16)
    y0 = np.asarray(_jit_forward()(model, tokens))
    params_before = {p for p, _ in nnx.to_flat_state(nnx.state(model, nnx.Param))}
    new = apply_alibi(model, 48)
    # the original is untouched
    assert all(b.attn.attention_bias is None for b in model.blocks) and model.seq_len == 16
    np.testing.assert_array_equal(np.asarray(_jit_forward()(model, tokens)), y0)
    assert all(b.attn.attention_bias == AlibiBias(tuple(alibi_head_slopes(HEADS))) for b in new.blocks)
    # the position table: zeros of (max_sequence_length, d), model state rather than a trained Param
    table = new.wpe.embedding
    assert isinstance(table, FrozenPositionEmbedding) and not isinstance(table, nnx.Param)
    np.testing.assert_array_equal(np.asarray(table[...]), np.zeros((48, D), np.float32))
    params_after = {p for p, _ in nnx.to_flat_state(nnx.state(new, nnx.Param))}
    assert params_after == params_before - {("wpe", "embedding")}
    y1 = np.asarray(_jit_forward()(new, tokens))
    assert not np.allclose(y1, y0)
    # extrapolation: the unmodified GPT refuses 40 tokens; with ALiBi the first 16 positions are unchanged (causal)
    with pytest.raises(ValueError, match="exceeds seq_len=16"):
        model(_tokens(2, 40), train=False)
    long = np.concatenate([np.asarray(tokens), np.asarray(_tokens(2, 24, seed=1))], axis=1)
    y_long = np.asarray(_jit_forward()(new, jnp.asarray(long)))
    assert y_long.shape == (2, 40, 64) and np.isfinite(y_long).all()
    np.testing.assert_allclose(y_long[:, :16], y1, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="exceeds seq_len=48"):
        new(_tokens(1, 49), train=False)


def test_nnx_gpt_with_alibi_matches_torch_twin_with_alibi():
    torch.manual_seed(0)
    twin = TorchGPT(vocab_size=64, seq_len=16, d_model=D, n_layers=2, n_heads=HEADS).eval()
    ours = torch_state_dict_to_nnx(twin.state_dict(), _gpt())
    same = apply_alibi(twin, 48)
    assert same is twin and twin.seq_len == 48
    ours = apply_alibi(ours, 48)
    assert "wpe.weight" in twin.state_dict() and "wpe.weight" not in dict(twin.named_parameters())
    assert torch.equal(twin.wpe.weight, torch.zeros(48, D))
    tokens = _tokens(2, 40)
    with torch.no_grad():
        ref = twin(torch.from_numpy(np.array(tokens)).long()).numpy()
    out = np.asarray(_jit_forward()(ours, tokens))
    scale = np.abs(ref).max()
    np.testing.assert_allclose(out / scale, ref / scale, atol=1e-4)  # whole model: 1e-4 of the output's scale


def test_nnx_attention_matches_hf_gpt2_attention_with_alibi():
    hf = _gpt2()
    apply_alibi(hf, 64)
    tattn = hf.transformer.h[0].attn.eval()
    attn = apply_alibi(_gpt(), 64).blocks[0].attn
    # GPT-2's Conv1D stores (in, out), as an NNX kernel does
    attn.qkv.kernel[...] = jnp.asarray(tattn.c_attn.weight.detach().numpy())
    attn.qkv.bias[...] = jnp.asarray(tattn.c_attn.bias.detach().numpy())
    attn.proj.kernel[...] = jnp.asarray(tattn.c_proj.weight.detach().numpy())
    attn.proj.bias[...] = jnp.asarray(tattn.c_proj.bias.detach().numpy())
    x = torch.randn(2, 9, D)
    with torch.no_grad():
        ref, _ = tattn(x)
    np.testing.assert_allclose(np.asarray(attn(jnp.asarray(x.numpy()))), ref.numpy(), rtol=1e-5, atol=1e-5)


# (3) torch surgery ---------------------------------------------------------------------------------------------------

def _gpt2():
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=64, n_positions=16, n_embd=D, n_layer=2, n_head=HEADS, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0))


def test_torch_gpt2_surgery_in_place():
    model = _gpt2().eval()
    ids = torch.randint(0, 64, (2, 10))
    with torch.no_grad():
        y0 = model(input_ids=ids).logits
    n_params = sum(p.numel() for p in model.parameters())
    same = apply_alibi(model, 64)
    assert same is model
    wpe = model.transformer.wpe
    assert "weight" in wpe._buffers and torch.equal(wpe.weight, torch.zeros(64, D))
    assert sum(p.numel() for p in model.parameters()) == n_params - 16 * D  # the table is no longer trained
    assert "transformer.wpe.weight" in model.state_dict()
    assert not any("alibi" in k for k in model.state_dict())  # slopes are a non-persistent constant
    torch.testing.assert_close(model.transformer.h[1].attn.alibi_slopes, torch.tensor(alibi_head_slopes(HEADS)))
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[1, 6:] = 0
    with torch.no_grad():
        y1 = model(input_ids=ids, use_cache=False).logits
        y_masked = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        y_long = model(input_ids=torch.randint(0, 64, (2, 40)), use_cache=False).logits  # past n_positions=16
        first = model(input_ids=ids[:, :6], use_cache=True)
        step = model(input_ids=ids[:, 6:7], cache=first.past_key_values).logits
    assert not torch.allclose(y1, y0) and y_long.shape == (2, 40, 64) and torch.isfinite(y_long).all()
    torch.testing.assert_close(y_masked[1, :6], y1[1, :6], rtol=1e-5, atol=1e-5)  # causal: padding after is unseen
    torch.testing.assert_close(step[:, 0], y1[:, 6], rtol=1e-5, atol=1e-5)  # a cached step sees the same biases
    with pytest.warns(NoEffectWarning, match="applied already"):
        apply_alibi(model, 64)


def test_torch_bias_is_the_causal_mask_too():
    slopes = torch.tensor([0.5, 0.25])
    bias = alibi_causal_bias(slopes, 3, 5)  # the last 3 of 5 positions query all 5 keys
    assert bias.shape == (1, 2, 3, 5)
    assert bias[0, 0, 0, 2] == 0 and bias[0, 0, 0, 0] == -1.0 and bias[0, 1, 2, 0] == -1.0
    assert bias[0, 0, 0, 3] == torch.finfo(torch.float32).min


# (4) the training reshape --------------------------------------------------------------------------------------------

def test_reshape_as_composer_for_equal_length_keys():
    ids = jnp.arange(2 * 8).reshape(2, 8)
    batch = {"input_ids": ids, "labels": ids + 100, "attention_mask": jnp.ones((2, 8)), "other": jnp.ones((2, 3))}
    out = scale_sequence_length(batch, 0.25)
    np.testing.assert_array_equal(out["input_ids"], np.arange(16).reshape(8, 2))  # (B, S) -> (B / s, S * s)
    np.testing.assert_array_equal(out["labels"], np.arange(16).reshape(8, 2) + 100)
    assert out["attention_mask"].shape == (8, 2) and out["other"].shape == (2, 3)  # not a sequence key: kept
    assert scale_sequence_length(batch, 1)["input_ids"].shape == (2, 8)
    assert scale_sequence_length(batch, 0.5)["input_ids"].shape == (4, 4)


def test_reshape_of_next_token_inputs_uses_overlapping_windows():
    ids = np.arange(2 * 9).reshape(2, 9)  # ComposerCausalLM: T + 1 = 9 tokens for T = 8 targets
    out = scale_sequence_length({"input_ids": jnp.asarray(ids), "labels": jnp.asarray(ids[:, 1:])}, 0.25)
    windows = np.asarray(out["input_ids"])
    assert windows.shape == (8, 3)
    np.testing.assert_array_equal(windows[:4], [[0, 1, 2], [2, 3, 4], [4, 5, 6], [6, 7, 8]])
    np.testing.assert_array_equal(windows[4], [9, 10, 11])
    # every target is kept once, aligned with its window: labels (B, T) reshape plainly to windows[:, 1:]
    np.testing.assert_array_equal(np.asarray(out["labels"]), windows[:, 1:])
    jitted = jax.jit(lambda b: scale_sequence_length(b, 0.25))({"input_ids": jnp.asarray(ids)})
    np.testing.assert_array_equal(np.asarray(jitted["input_ids"]), windows)


def test_reshape_errors_name_the_shape():
    with pytest.raises(ValueError, match=r"batch\['input_ids'\] has sequence length 10"):
        scale_sequence_length({"input_ids": jnp.zeros((2, 10), jnp.int32)}, 0.25)
    with pytest.raises(ValueError, match="batch size divided by it"):
        scale_sequence_length({"input_ids": jnp.zeros((3, 8), jnp.int32)}, 0.4)


# (5) the method ------------------------------------------------------------------------------------------------------

def test_factory_validation_slots_and_method_equals_functional():
    for bad in (0, -4, 2.5, True):
        with pytest.raises(ValueError, match="max_sequence_length"):
            Alibi(max_sequence_length=bad)
    for bad in (0, -0.5, "0.25"):
        with pytest.raises(ValueError, match="train_sequence_length_scaling"):
            Alibi(64, train_sequence_length_scaling=bad)
    with pytest.raises(ValueError, match="sequence_keys"):
        Alibi(64, sequence_keys="input_ids")
    with pytest.raises(ValueError, match="max_sequence_length"):
        apply_alibi(_gpt(), 0)
    method = Alibi(64)
    assert method.name == "Alibi" and method.model is not None and method.batch is not None
    assert Alibi(64, train_sequence_length_scaling=1).batch is None  # Composer: scaling 1 leaves batches alone
    model = _gpt()
    functional = apply_alibi(model, 64)
    task = method.model(ComposerCausalLM(model), StepCtx(step=0, run=RunInfo(total_steps=2)))
    assert task.source is model and model.seq_len == 64  # in place, as Composer
    tokens = _tokens(2, 20)
    np.testing.assert_array_equal(np.asarray(_jit_forward()(model, tokens)),
                                  np.asarray(_jit_forward()(functional, tokens)))
    batch = {"input_ids": _tokens(4, 17)}
    assert method.batch(batch, StepCtx())["input_ids"].shape == (16, 5)


def test_nothing_to_convert_warns():
    with pytest.warns(NoEffectWarning, match="Alibi did not change ResNetCIFAR"):
        apply_alibi(ResNetCIFAR(depth=8, width=4, num_classes=10, in_channels=1, rngs=nnx.Rngs(0)), 64)
    with pytest.warns(NoEffectWarning, match="applied already"):
        apply_alibi(apply_alibi(_gpt(), 64), 64)
    with pytest.warns(NoEffectWarning, match="Sequential"):
        apply_alibi(nn.Sequential(nn.Linear(4, 4)), 64)
    with pytest.raises(TypeError, match="flax.nnx.Module or a torch.nn.Module"):
        apply_alibi(object(), 64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        apply_alibi(_gpt(), 64)


# (6) inside the Trainer ----------------------------------------------------------------------------------------------

def _fit(model, data, algorithms, **kw):
    from jaxcomposer import Trainer
    from jaxcomposer.loggers import InMemoryLogger
    from jaxcomposer.optim import DecoupledAdamW

    logger = InMemoryLogger()
    trainer = Trainer(model=model, train_dataloader=data, max_duration="2ba", optimizers=DecoupledAdamW(lr=3e-3),
                      algorithms=algorithms, seed=0, progress_bar=False, devices=jax.devices()[:1], loggers=[logger],
                      **kw)
    trainer.fit()
    return trainer, [v for _, v in logger.data["loss/train/total"]]


def test_trains_native_gpt_short_and_evaluates_long():
    from jaxcomposer.data import ArrayLoader
    model = _gpt(seq_len=16)
    tokens = np.random.default_rng(0).integers(0, 64, (16, 17)).astype(np.int32)  # T = 16 targets per row
    trainer, losses = _fit(ComposerCausalLM(model), ArrayLoader({"input_ids": tokens}, 8, seed=0),
                           [Alibi(max_sequence_length=32)])
    assert len(losses) == 2 and np.all(np.isfinite(losses)) and losses[0] != losses[1]
    assert trainer.state.model is model and model.seq_len == 32
    state = trainer.state.train_state
    assert "wpe" not in state.params and np.all(np.asarray(state.model_state["wpe"]["embedding"][...]) == 0)
    # trained on rows of 4 tokens (+1), it evaluates on sequences of 32, past the GPT's original seq_len
    long = np.random.default_rng(1).integers(0, 64, (4, 33)).astype(np.int32)
    (logits,) = trainer.predict([{"input_ids": long}])
    assert np.asarray(logits).shape == (4, 32, 64) and np.isfinite(np.asarray(logits)).all()


def test_trains_bridged_hf_gpt2_in_trainer():
    from torch.utils.data import DataLoader
    from torch_bridge import HuggingFaceModel

    ids = np.random.default_rng(0).integers(1, 64, (16, 16))
    rows = [{"input_ids": torch.from_numpy(ids[i]), "labels": torch.from_numpy(ids[i])} for i in range(16)]
    hf = _gpt2()
    model = HuggingFaceModel(hf)
    # the bridge exports for the loader's sequence length: the reshape is refused before anything is built
    with pytest.raises(ValueError, match="train_sequence_length_scaling=1"):
        _fit(model, DataLoader(rows, batch_size=8), [Alibi(max_sequence_length=32)])
    assert isinstance(hf.transformer.wpe.weight, nn.Parameter)  # and the module was left alone
    trainer, losses = _fit(model, DataLoader(rows, batch_size=8),
                           [Alibi(max_sequence_length=32, train_sequence_length_scaling=1)])
    assert len(losses) == 2 and np.all(np.isfinite(losses))
    assert trainer.state.model is model and hf.transformer.h[0].attn.alibi_slopes is not None
    names = set(trainer.task.pure.params)
    assert not any("wpe" in n for n in names)  # the zeroed table is a buffer, never trained
    assert torch.equal(hf.transformer.wpe.weight, torch.zeros(32, D))
