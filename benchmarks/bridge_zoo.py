"""Real-model parity table of torch_bridge: HF transformers models and a few torch-only nets, tiny and random.

Every model is built from a config with tiny sizes (``transformers`` config classes, nothing downloaded) or from code
in this file, with ``torch.manual_seed(0)``; BatchNorm running stats are seeded to non-trivial values so eval graphs
really use them. HF models are wrapped in a small ``nn.Module`` whose forward takes positional tensors and returns
one tensor (``.logits``, or ``.logits_per_image`` for CLIP), as ``tests/torch_bridge/zoo.py`` does. Per model:

- ``converted``: ``torch_bridge.from_torch(module, inputs, dynamic_batch=True)`` (batch 4) succeeds; on failure the
  exception type and its first line are recorded and the table moves on. ``convert_s``: its wall time (export of
  the train and eval graphs, lowering check, weight binding).
- ``fwd_err``: eval-mode forward, ``max |bridged - torch| / max(max |torch|, 1)`` (the scale-relative error of
  ``tests/torch_bridge/parity.assert_close_on_scale``; the tests hold whole models to 1e-4).
- ``grad_err``: the same relative error of every parameter's gradient (worst parameter reported) of the mean
  cross-entropy of the output against fixed random integer targets over its last axis, eval mode (dropout off);
  JAX ``jax.value_and_grad`` under ``jax.jit`` against torch autograd. A parameter torch leaves without a gradient
  is compared with zero. ``loss_err`` is the loss's.
- ``buf_err``: where the model carries floating-point buffers (BatchNorm running stats), their relative error after
  one train-mode forward from the initial weights (bridged under jit, torch eager); null for models without them.
- Step speed, batch 8, train mode (dropout on, BN in batch-stats mode): a jitted JAX step (forward, CE, grad, plain
  SGD update, new buffers, dropout key) against a torch eager step of the same (``zero_grad``, forward, CE,
  backward, ``torch.optim.SGD.step``; ``torch.set_num_threads(2)``). After warm-up steps (the JAX side's first one
  compiles, reported as ``jax_compile_s``) each side times single steps (JAX ones end with ``block_until_ready``)
  until ``--time-budget`` seconds or ``--max-steps`` steps; ``jax_step_ms`` / ``torch_step_ms`` are medians and
  ``speed_ratio = torch_ms / jax_ms`` (> 1: the bridge is faster). The torch step is timed again with one thread
  (``torch_1t_step_ms``, ``speed_ratio_1t``): on a loaded machine torch's OpenMP threads collapse
  (benchmarks/README.md), so the 1-thread column is the fairer eager baseline whenever the load average exceeds the
  core count.

Deliberate config choices: ``use_cache=False`` for decoders; Wav2Vec2 with ``mask_time_prob=0`` (its SpecAugment
draws masks with numpy on the host, outside any graph), once with its default ``layerdrop=0.1`` (``hf_wav2vec2``: the
train graph's ``if dropout_probability < layerdrop`` on a ``torch.rand`` draw is value-dependent Python control flow,
which torch.export refuses) and once with ``layerdrop=0`` (``hf_wav2vec2_nold``); HF attention is the library
default (SDPA). The machine is
shared, so speed ratios are indicative: the JSON records ``os.getloadavg()`` before and after every model.
The JSON is rewritten after every model, so an interrupted run keeps what it measured.

Run:  .venv/bin/python benchmarks/bridge_zoo.py                       (every model, several minutes)
      .venv/bin/python benchmarks/bridge_zoo.py --models hf_gpt2 lstm  (a subset)
      .venv/bin/python benchmarks/bridge_zoo.py --smoke                (three small models, 1-2 timed steps, < 60 s)
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import statistics
import sys
import time
import traceback
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_bridge
from common import machine_facts, results_path, write_json  # benchmarks/common.py

NAME = "bridge_zoo"
PARITY_BATCH, STEP_BATCH = 4, 8
MODEL_TOL = 1e-4  # tests/torch_bridge/parity.py: a whole model's outputs, gradients, loss
LAYER_TOL = 1e-5  # ... and BatchNorm running statistics
LR = 0.01
VOCAB, SEQ, DEC_SEQ, IMG = 256, 16, 8, 32


# ------------------------------------------------------------------------------------------------- HF wrappers
class HFLogits(nn.Module):
    """An HF model called with keyword tensors (named by ``keys``) taken positionally; returns ``.<field>``."""

    def __init__(self, model: nn.Module, keys: tuple[str, ...], field: str = "logits", **call_kwargs):
        super().__init__()
        self.model, self.keys, self.field, self.call_kwargs = model, keys, field, call_kwargs

    def forward(self, *tensors):
        return getattr(self.model(**dict(zip(self.keys, tensors)), **self.call_kwargs), self.field)


def _hf(model_cls: str, config_cls: str, config: dict, keys=("input_ids",), field="logits", **call_kwargs):
    def build():
        import transformers
        cfg = getattr(transformers, config_cls)(**config)
        return HFLogits(getattr(transformers, model_cls)(cfg), keys, field, **call_kwargs)
    return build


_TEXT = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
             max_position_embeddings=64)
_DECODER = dict(_TEXT, num_key_value_heads=2)
_VISION = dict(image_size=IMG, patch_size=8, num_channels=3, hidden_size=64, num_hidden_layers=2,
               num_attention_heads=4, intermediate_size=128)


# ------------------------------------------------------------------------------------------------- torch-only nets
class InvertedResidual(nn.Module):
    """MobileNetV2 block: 1x1 expand, 3x3 depthwise, 1x1 project (BN after each, ReLU6), residual when shapes match."""

    def __init__(self, cin: int, cout: int, stride: int, expand: int = 4):
        super().__init__()
        hidden = cin * expand
        self.use_res = stride == 1 and cin == cout
        self.block = nn.Sequential(
            nn.Conv2d(cin, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6(inplace=True),
            nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False), nn.BatchNorm2d(hidden),
            nn.ReLU6(inplace=True),
            nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        return x + self.block(x) if self.use_res else self.block(x)


class MobileNetTiny(nn.Module):
    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU6(inplace=True))
        self.blocks = nn.Sequential(InvertedResidual(16, 16, 1), InvertedResidual(16, 24, 2),
                                    InvertedResidual(24, 24, 1), InvertedResidual(24, 32, 2))
        self.head = nn.Sequential(nn.Conv2d(32, 64, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU6(inplace=True))
        self.drop, self.fc = nn.Dropout(0.2), nn.Linear(64, num_classes)

    def forward(self, x):
        x = self.head(self.blocks(self.stem(x)))
        return self.fc(self.drop(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)))


class ResNeXtBlock(nn.Module):
    """ResNeXt/RegNet bottleneck: 1x1, grouped 3x3, 1x1, BN after each, projection shortcut when shapes change."""

    def __init__(self, cin: int, cout: int, stride: int, groups: int = 4):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
            nn.Conv2d(cout, cout, 3, stride, 1, groups=groups, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
            nn.Conv2d(cout, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.short = nn.Identity() if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        return F.relu(self.body(x) + self.short(x))


class ResNeXtTiny(nn.Module):
    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(inplace=True))
        self.stages = nn.Sequential(ResNeXtBlock(16, 32, 2), ResNeXtBlock(32, 32, 1), ResNeXtBlock(32, 64, 2))
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x):
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.stages(self.stem(x)), 1), 1))


class LSTMClassifier(nn.Module):
    """Embedding, 2-layer ``nn.LSTM`` (batch_first, dropout between layers), Linear on the last step's output."""

    def __init__(self, vocab: int = VOCAB, d: int = 32, hidden: int = 64, num_classes: int = 5):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.lstm = nn.LSTM(d, hidden, num_layers=2, batch_first=True, dropout=0.1)
        self.fc = nn.Linear(hidden, num_classes)

    def forward(self, ids):
        out, _ = self.lstm(self.emb(ids))
        return self.fc(out[:, -1])


# ------------------------------------------------------------------------------------------------- the zoo
@dataclasses.dataclass(frozen=True)
class Case:
    build: Callable[[], nn.Module]
    inputs: Callable[[int], tuple]  # batch -> positional input tensors
    source: str  # "transformers" or "torch"
    note: str = ""


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _ids(t=SEQ, low=0, high=VOCAB, seed=3):
    return lambda b: (torch.randint(low, high, (b, t), generator=_gen(seed)),)


def _seq2seq(b):
    return (torch.randint(0, VOCAB, (b, SEQ), generator=_gen(3)),
            torch.randint(0, VOCAB, (b, DEC_SEQ), generator=_gen(4)))


def _images(b, hw=IMG):
    return (torch.randn(b, 3, hw, hw, generator=_gen(1)),)


def _clip(b):
    return _ids()(b) + _images(b)


def _whisper(b):
    return (torch.randn(b, 16, 64, generator=_gen(1)), torch.randint(0, VOCAB, (b, DEC_SEQ), generator=_gen(4)))


def _audio(b):
    return (torch.randn(b, 1600, generator=_gen(1)),)


ZOO: dict[str, Case] = {
    "hf_gpt2": Case(_hf("GPT2LMHeadModel", "GPT2Config", dict(vocab_size=VOCAB, n_positions=64, n_embd=64, n_layer=2,
                                                               n_head=4), use_cache=False), _ids(), "transformers"),
    "hf_bert": Case(_hf("BertForSequenceClassification", "BertConfig", dict(_TEXT, num_labels=3)), _ids(),
                    "transformers"),
    "hf_distilbert": Case(_hf("DistilBertForSequenceClassification", "DistilBertConfig", dict(
        vocab_size=VOCAB, dim=64, n_layers=2, n_heads=4, hidden_dim=128, max_position_embeddings=64, num_labels=3)),
        _ids(), "transformers"),
    # token ids from 2: RoBERTa derives position ids from the non-padding tokens (pad_token_id=1)
    "hf_roberta": Case(_hf("RobertaForSequenceClassification", "RobertaConfig", dict(
        _TEXT, max_position_embeddings=66, pad_token_id=1, num_labels=3)), _ids(low=2), "transformers"),
    "hf_t5": Case(_hf("T5ForConditionalGeneration", "T5Config", dict(
        vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2, num_heads=4,
        decoder_start_token_id=0), keys=("input_ids", "decoder_input_ids"), use_cache=False), _seq2seq,
        "transformers"),
    "hf_llama": Case(_hf("LlamaForCausalLM", "LlamaConfig", _DECODER, use_cache=False), _ids(), "transformers"),
    "hf_mistral": Case(_hf("MistralForCausalLM", "MistralConfig", _DECODER, use_cache=False), _ids(), "transformers"),
    "hf_qwen2": Case(_hf("Qwen2ForCausalLM", "Qwen2Config", _DECODER, use_cache=False), _ids(), "transformers"),
    "hf_vit": Case(_hf("ViTForImageClassification", "ViTConfig", dict(_VISION, num_labels=10), keys=("pixel_values",)),
                   _images, "transformers"),
    "hf_convnext": Case(_hf("ConvNextForImageClassification", "ConvNextConfig", dict(
        num_channels=3, patch_size=4, hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1], image_size=IMG,
        num_labels=10), keys=("pixel_values",)), _images, "transformers"),
    "hf_resnet": Case(_hf("ResNetForImageClassification", "ResNetConfig", dict(
        num_channels=3, embedding_size=16, hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1], layer_type="basic",
        num_labels=10), keys=("pixel_values",)), _images, "transformers"),
    "hf_clip": Case(_hf("CLIPModel", "CLIPConfig", dict(
        text_config=dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, max_position_embeddings=32),
        vision_config=dict(image_size=IMG, patch_size=8, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4), projection_dim=32),
        keys=("input_ids", "pixel_values"), field="logits_per_image"), _clip, "transformers",
        "output: logits_per_image (B, B); CE targets over the batch's texts"),
    "hf_whisper": Case(_hf("WhisperForConditionalGeneration", "WhisperConfig", dict(
        vocab_size=VOCAB, num_mel_bins=16, encoder_layers=2, decoder_layers=2, d_model=64, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, max_source_positions=32,
        max_target_positions=32, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1),
        keys=("input_features", "decoder_input_ids"), use_cache=False), _whisper, "transformers",
        "input_features (B, 16 mel bins, 64 frames)"),
    "hf_wav2vec2": Case(_hf("Wav2Vec2ForCTC", "Wav2Vec2Config", dict(
        vocab_size=32, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        conv_dim=(32, 32, 32), conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3), num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=4, mask_time_prob=0.0), keys=("input_values",)), _audio, "transformers",
        "mask_time_prob=0 (SpecAugment draws its masks with numpy on the host); CE over the CTC logits"),
    "hf_wav2vec2_nold": Case(_hf("Wav2Vec2ForCTC", "Wav2Vec2Config", dict(
        vocab_size=32, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        conv_dim=(32, 32, 32), conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3), num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=4, mask_time_prob=0.0, layerdrop=0.0), keys=("input_values",)), _audio,
        "transformers", "hf_wav2vec2 with layerdrop=0 (no value-dependent layer skipping in the train graph)"),
    "mobilenet_tiny": Case(MobileNetTiny, _images, "torch", "inverted residual blocks, depthwise 3x3, ReLU6, BN"),
    "resnext_tiny": Case(ResNeXtTiny, _images, "torch", "grouped 3x3 convs (groups=4), BN"),
    "lstm_classifier": Case(LSTMClassifier, _ids(), "torch", "2-layer nn.LSTM, batch_first, dropout 0.1"),
}
SMOKE_MODELS = ("hf_bert", "mobilenet_tiny", "lstm_classifier")


def build(case: Case) -> nn.Module:
    torch.manual_seed(0)
    module = case.build()
    g = _gen(123)
    with torch.no_grad():  # non-trivial running stats, so eval graphs really use them
        for m in module.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.running_mean.copy_(torch.rand(m.running_mean.shape, generator=g) - 0.5)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)
    return module.train()


def targets_for(shape: tuple, seed: int = 2) -> torch.Tensor:
    """Integer CE targets for logits of ``shape``: over its last axis, one per leading position."""
    return torch.randint(0, shape[-1], shape[:-1], generator=_gen(seed))


def ce_torch(logits, y):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def ce_jax(logits, y):
    return optax.softmax_cross_entropy_with_integer_labels(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)).mean()


def rel_err(got, want) -> float:
    """``max |got - want| / max(max |want|, 1)`` in float64; inf on a shape mismatch or a non-finite difference."""
    g = np.asarray(got, dtype=np.float64)
    w = (want.detach().cpu().numpy() if isinstance(want, torch.Tensor) else np.asarray(want)).astype(np.float64)
    if g.shape != w.shape:
        return float("inf")
    if not w.size:
        return 0.0
    finite = np.isfinite(w)
    if not np.array_equal(g[~finite], w[~finite]):
        return float("inf")
    err = np.abs(g[finite] - w[finite])
    if np.isnan(err).any():
        return float("inf")
    return float(err.max(initial=0.0)) / max(float(np.abs(w[finite]).max(initial=0.0)), 1.0)


def error_of(e: BaseException) -> dict:
    lines = [ln for ln in str(e).splitlines() if ln.strip()]
    return {"type": type(e).__name__, "line": lines[0] if lines else "", "message": str(e)[:1500],
            "notes": list(getattr(e, "__notes__", []))}


def np_inputs(inputs):
    return tuple(x.numpy() for x in inputs)


def _rounded(x, digits=3):
    return None if x is None else float(f"{x:.{digits}g}") if isinstance(x, float) else x


# ------------------------------------------------------------------------------------------------- measuring
def parity(bm, ref: nn.Module, inputs: tuple, row: dict) -> None:
    """Eval forward, loss and gradients (one jit), and the train-forward buffers where there are float buffers."""
    m = copy.deepcopy(ref).eval()
    out_t = m(*inputs)
    y = targets_for(tuple(out_t.shape))
    loss_t = ce_torch(out_t, y)
    loss_t.backward()
    xs, yj = np_inputs(inputs), jnp.asarray(y.numpy())

    def loss(params, buffers):
        out, _ = bm.apply(params, buffers, None, *xs, train=False)
        return ce_jax(out, yj), out

    t0 = time.perf_counter()
    (loss_j, out_j), grads = jax.block_until_ready(
        jax.jit(jax.value_and_grad(loss, has_aux=True))(bm.params, bm.buffers))
    row["parity_compile_run_s"] = round(time.perf_counter() - t0, 2)
    row["output_shape"] = list(out_t.shape)
    row["fwd_err"] = rel_err(out_j, out_t)
    row["loss_err"] = rel_err(loss_j, loss_t)
    torch_params = dict(m.named_parameters())  # de-duplicated like bm.params (tied weights once)
    if set(grads) != set(torch_params):
        row["grad_key_mismatch"] = sorted(set(grads) ^ set(torch_params))[:10]
    worst, worst_name = 0.0, None
    for k, g in grads.items():
        p = torch_params.get(k)
        want = torch.zeros(p.shape) if p is not None and p.grad is None else (p.grad if p is not None else None)
        e = float("inf") if want is None else rel_err(g, want)
        if worst_name is None or e > worst:
            worst, worst_name = e, k
    row["grad_err"], row["grad_worst_param"] = worst, worst_name

    float_buffers = {k: v for k, v in bm.buffers.items() if jnp.issubdtype(v.dtype, jnp.floating)}
    if not float_buffers:
        row["buf_err"] = None
        return
    tm = copy.deepcopy(ref).train()
    with torch.no_grad():
        tm(*inputs)
    sd = tm.state_dict()
    _, new = jax.jit(lambda p, b, k: bm.apply(p, b, k, *xs, train=True))(bm.params, bm.buffers, jax.random.key(0))
    row["buf_err"] = max(rel_err(new[k], sd[k]) for k in float_buffers)
    counters = [k for k in new if k.endswith("num_batches_tracked")]
    row["num_batches_tracked_ok"] = all(int(new[k]) == int(sd[k]) for k in counters) if counters else None


def time_steps(step, warmup: int, budget_s: float, max_steps: int, min_steps: int) -> tuple[float, list[float]]:
    """``(first_warmup_s, timed_ms)``: ``step()`` (synchronous) ``warmup`` times, then timed until the budget."""
    t0 = time.perf_counter()
    step()
    first = time.perf_counter() - t0
    for _ in range(warmup - 1):
        step()
    times, start = [], time.perf_counter()
    while len(times) < max_steps and (len(times) < min_steps or time.perf_counter() - start < budget_s):
        t0 = time.perf_counter()
        step()
        times.append(1e3 * (time.perf_counter() - t0))
    return first, times


def speed(bm, ref: nn.Module, case: Case, args, row: dict) -> None:
    inputs = case.inputs(STEP_BATCH)
    tm = copy.deepcopy(ref).train()
    with torch.no_grad():
        y = targets_for(tuple(tm(*inputs).shape), seed=5)
    opt = torch.optim.SGD(tm.parameters(), lr=LR)

    def torch_step():
        opt.zero_grad(set_to_none=True)
        ce_torch(tm(*inputs), y).backward()
        opt.step()

    xs, yj = np_inputs(inputs), jnp.asarray(y.numpy())

    @jax.jit
    def jax_step(params, buffers, key):
        key, sub = jax.random.split(key)

        def loss(p):
            out, new_b = bm.apply(p, buffers, sub, *xs, train=True)
            return ce_jax(out, yj), new_b

        (_, new_buffers), grads = jax.value_and_grad(loss, has_aux=True)(params)
        return jax.tree.map(lambda p, g: p - LR * g, params, grads), new_buffers, key

    state = [bm.params, bm.buffers, jax.random.key(0)]

    def run_jax():
        state[:] = jax_step(*state)
        jax.block_until_ready(state)

    kw = dict(warmup=args.warmup, budget_s=args.time_budget, max_steps=args.max_steps, min_steps=args.min_steps)
    compile_s, jax_ms = time_steps(run_jax, **kw)
    _, torch_ms = time_steps(torch_step, **kw)
    torch.set_num_threads(1)
    try:
        _, torch_1t_ms = time_steps(torch_step, **kw)
    finally:
        torch.set_num_threads(args.torch_threads)
    row["jax_compile_s"] = round(compile_s, 2)
    row["jax_step_ms"], row["torch_step_ms"] = statistics.median(jax_ms), statistics.median(torch_ms)
    row["torch_1t_step_ms"] = statistics.median(torch_1t_ms)
    row["timed_steps"] = {"jax": len(jax_ms), "torch": len(torch_ms), "torch_1t": len(torch_1t_ms)}
    row["speed_ratio"] = row["torch_step_ms"] / row["jax_step_ms"]
    row["speed_ratio_1t"] = row["torch_1t_step_ms"] / row["jax_step_ms"]


def measure(name: str, case: Case, args) -> dict:
    row = {"model": name, "source": case.source, "note": case.note, "converted": False, "convert_s": None,
           "fwd_err": None, "loss_err": None, "grad_err": None, "buf_err": None, "jax_step_ms": None,
           "torch_step_ms": None, "speed_ratio": None, "torch_1t_step_ms": None, "speed_ratio_1t": None,
           "errors": {}, "loadavg_before": [round(x, 2) for x in os.getloadavg()]}
    try:
        ref = build(case)
    except Exception as e:  # a class or config this transformers lacks
        row["skipped"] = error_of(e)
        return row
    row["torch_params"] = sum(p.numel() for p in ref.parameters())
    module = copy.deepcopy(ref)  # the bridge binds this one; torch measures on deep copies of ref
    inputs = case.inputs(PARITY_BATCH)
    t0 = time.perf_counter()
    try:
        bm = torch_bridge.from_torch(module, inputs, dynamic_batch=True)
    except Exception as e:
        row["convert_s"] = round(time.perf_counter() - t0, 2)
        row["errors"]["convert"] = error_of(e)
        return row
    row["convert_s"], row["converted"] = round(time.perf_counter() - t0, 2), True
    row["bridged"] = {"params": len(bm.params), "buffers": len(bm.buffers), "aliases": len(bm.aliases)}
    stages = [("parity", lambda: parity(bm, ref, inputs, row))]
    if not args.no_speed:
        stages.append(("speed", lambda: speed(bm, ref, case, args, row)))
    for stage, fn in stages:
        try:
            fn()
        except Exception as e:
            row["errors"][stage] = error_of(e)
            if args.verbose:
                traceback.print_exc()
    tols = [row[k] is not None and row[k] <= MODEL_TOL for k in ("fwd_err", "grad_err", "loss_err")]
    row["parity_ok"] = all(tols) and (row["buf_err"] is None or row["buf_err"] <= LAYER_TOL)
    return row


# ------------------------------------------------------------------------------------------------- table
def _fmt(x, spec):
    return "-" if x is None else format(x, spec)


def status_of(row: dict) -> str:
    if "skipped" in row:
        return "skipped"
    if not row["converted"]:
        return "FAILED"
    return "yes" if not row["errors"] else "yes*"


def print_table(rows: list[dict]) -> None:
    print(f"\n{'model':<17} {'converted':>9} {'convert_s':>9} {'fwd err':>8} {'grad err':>8} {'buf err':>8} "
          f"{'jax ms':>7} {'torch ms':>8} {'ratio':>6} {'torch1t ms':>10} {'ratio1t':>7}")
    for r in rows:
        print(f"{r['model']:<17} {status_of(r):>9} {_fmt(r['convert_s'], '.1f'):>9} {_fmt(r['fwd_err'], '.1e'):>8} "
              f"{_fmt(r['grad_err'], '.1e'):>8} {_fmt(r['buf_err'], '.1e'):>8} {_fmt(r['jax_step_ms'], '.1f'):>7} "
              f"{_fmt(r['torch_step_ms'], '.1f'):>8} {_fmt(r['speed_ratio'], '.2f'):>6} "
              f"{_fmt(r.get('torch_1t_step_ms'), '.1f'):>10} {_fmt(r.get('speed_ratio_1t'), '.2f'):>7}")
    failures = [(r["model"], stage, err) for r in rows
                for stage, err in ([("skipped", r["skipped"])] if "skipped" in r else []) + list(r["errors"].items())]
    if failures:
        print("failures (yes*: converted, a later stage failed):")
        for model, stage, err in failures:
            print(f"  {model} [{stage}] {err['type']}: {err['line'][:200]}")


# ------------------------------------------------------------------------------------------------- main
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", default=None, help=f"subset of: {' '.join(ZOO)}")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps per side (JAX's first one compiles)")
    ap.add_argument("--time-budget", type=float, default=1.5, help="seconds of timed steps per side and model")
    ap.add_argument("--max-steps", type=int, default=15)
    ap.add_argument("--min-steps", type=int, default=3)
    ap.add_argument("--torch-threads", type=int, default=2)
    ap.add_argument("--no-speed", action="store_true", help="parity only")
    ap.add_argument("--verbose", action="store_true", help="print the traceback of every failing stage")
    ap.add_argument("--smoke", action="store_true", help=f"only {', '.join(SMOKE_MODELS)}, 1-2 timed steps")
    ap.add_argument("--out", default=None, help=f"default: benchmarks/results/{NAME}[.smoke].json")
    args = ap.parse_args(argv)
    args.out = results_path(NAME, args.smoke, args.out)
    names = args.models or (list(SMOKE_MODELS) if args.smoke else list(ZOO))
    unknown = [n for n in names if n not in ZOO]
    if unknown:
        ap.error(f"unknown models {unknown}; choose from {list(ZOO)}")
    if args.smoke:
        args.warmup, args.time_budget, args.max_steps, args.min_steps = 1, 0.0, 2, 1
    torch.set_num_threads(args.torch_threads)

    import transformers
    setup = {"parity_batch": PARITY_BATCH, "step_batch": STEP_BATCH, "dynamic_batch": True, "lr": LR,
             "loss": "mean cross-entropy of the output against fixed random integer targets over its last axis",
             "error": "max |bridged - torch| / max(max |torch|, 1); grad_err: worst parameter",
             "tolerances": {"model": MODEL_TOL, "buffers": LAYER_TOL},
             "timing": {"warmup": args.warmup, "time_budget_s": args.time_budget, "max_steps": args.max_steps,
                        "min_steps": args.min_steps, "statistic": "median ms per step"},
             "torch_threads": args.torch_threads, "transformers": transformers.__version__,
             "sizes": {"vocab": VOCAB, "seq": SEQ, "decoder_seq": DEC_SEQ, "image": IMG, "hidden": 64, "layers": 2}}
    out = {"benchmark": NAME, "smoke": args.smoke, "machine": machine_facts(torch_threads=args.torch_threads),
           "setup": setup, "models": []}
    t_start = time.perf_counter()
    for name in names:
        print(f"[{time.perf_counter() - t_start:6.0f} s] {name} ...", flush=True)
        row = measure(name, ZOO[name], args)
        row["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
        row["wall_s"] = round(time.perf_counter() - t_start, 1)
        out["models"].append({k: _rounded(v) if k.endswith(("_err", "_ms", "ratio", "ratio_1t")) else v
                              for k, v in row.items()})
        out["total_s"] = round(time.perf_counter() - t_start, 1)
        write_json(args.out, out)  # after every model: an interrupted run keeps what it measured

    rows = out["models"]
    out["summary"] = {"models": len(rows), "skipped": sum("skipped" in r for r in rows),
                      "converted": sum(r["converted"] for r in rows),
                      "parity_ok": sum(bool(r.get("parity_ok")) for r in rows),
                      **{f"median_{k}": _rounded(statistics.median([r[k] for r in rows if r.get(k)]))
                         if any(r.get(k) for r in rows) else None for k in ("speed_ratio", "speed_ratio_1t")}}
    write_json(args.out, out)
    print(f"\n{NAME}: {len(rows)} models, parity batch {PARITY_BATCH}, step batch {STEP_BATCH}, torch threads "
          f"{args.torch_threads}, load {os.getloadavg()[0]:.1f}{'  [SMOKE]' if args.smoke else ''}")
    print_table(rows)
    s = out["summary"]
    print(f"converted {s['converted']}/{s['models']}, parity within {MODEL_TOL:g} (buffers {LAYER_TOL:g}): "
          f"{s['parity_ok']}, median speed ratio torch/jax {s['median_speed_ratio']} "
          f"(torch 1 thread: {s['median_speed_ratio_1t']})")
    print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
