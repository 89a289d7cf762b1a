"""GatedLinearUnits.

Method card
-----------
**What it does.** Turns each transformer feed-forward block ``proj(act(W x))`` into a gated one (Shazeer's GLU
variants): ``wo(act(W_g x) * (W_n x))``. The gated and non-gated matrices both map the model width ``d`` to the
block's existing intermediate width ``d_ff`` (kept, as Composer keeps ``intermediate_size``), so the MLP gains a third
``d x d_ff`` matrix: its weights grow by half (our GPT with ``mlp_ratio=4``: ``8 d^2 + 5d`` -> ``12 d^2 + d`` with
the default bias-free gate layers; a BERT layer's intermediate bias is dropped the same way).

**When it helps.** Transformer language models (Composer's target is BERT pretraining: better quality per step
at a small throughput cost). No effect on models without transformer MLPs: then it warns.

**Hyperparameters** (Composer's names and defaults). ``act_fn=None`` (the model's own MLP activation: our GPT's
``Block.mlp_act``, GELU-tanh; our BERT's ``BertIntermediate.act``, exact GELU; HF BERT's
``BertIntermediate.intermediate_act_fn``; GPT-2's ``GPT2MLP.act``);
``gated_layer_bias=False``; ``non_gated_layer_bias=False``. Addition: ``seed=0``, keyword-only, seeds the new layers'
initialization on NNX models (Composer draws from torch's global generator; our ``model`` slot has no key).

**Exact Composer semantics.** As ``composer/algorithms/gated_linear_units``: on HF BERT, ``BertIntermediate`` ->
``Identity`` and ``BertOutput`` -> ``BERTGatedFFOutput(d_embed, d_ff, dropout_rate, act_fn, layernorm_eps)``:
``LayerNorm(wo(dropout(act(gated(x)) * non_gated(x))) + residual)``, all its layers fresh with torch's default
``nn.Linear``/``nn.LayerNorm`` init (weights and biases ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``; ``wo`` always has a
bias). The default ``act_fn`` is the one activation the model uses; several different ones raise ``ValueError``.
Differences, each for a reason:

- Composer raises ``TypeError`` for anything but a ``BertPreTrainedModel``; we also convert our native GPT (its
  ``Block``) and HF GPT-2's ``GPT2MLP`` (torch), and a model with none of them warns with ``NoEffectWarning``
  (Composer returns silently when a BERT has no ``BertIntermediate`` left).
- Native GPT: ``fc`` -> ``Identity``, ``mlp_act`` -> identity, ``fc_proj`` -> :class:`GatedFFOutput` (``gated_layer``,
  ``non_gated_layer``, ``wo``), mirroring Composer's split. Our GPT is pre-LN and its ``Block`` adds the residual
  and applies its residual dropout after the MLP, so :class:`GatedFFOutput` has no LayerNorm, residual or inner
  dropout (BERT's post-LN and residual live in ``BertOutput``, which is why Composer's layer carries them). New
  layers use Composer's (torch's default) init, not the GPT's normal(0.02).
- Native BERT (:class:`jaxcomposer.models.BERT`): exactly Composer's surgery on HF BERT: ``intermediate`` ->
  ``Identity`` and ``output`` -> :class:`BERTGatedFFOutput` (``gated_layer``, ``non_gated_layer``, ``wo``,
  ``layernorm``; the output's dropout rate and LayerNorm eps kept), which takes the residual as BERT's output does.
  Weight conversion to HF (``torch_bridge.weights``) has no table for the surgered layers.
- GPT-2 (torch): ``GPT2MLP`` -> :class:`torch_bridge.methods.gated_linear_units.GatedGPT2MLP`
  (``wo(act(gated(x)) * non_gated(x))`` then GPT-2's residual dropout), fresh layers with torch's default init.
  Our torch twin ``torch_bridge.mirrors.TorchGPT`` is converted as the native GPT is (same parameter names).
- ``optimizers`` is accepted and ignored: our optimizer is built from the params after the ``model`` slot. The
  functional form returns the model (Composer's returns None), so one call serves NNX and torch. An ``act_fn`` for
  a torch model must be a torch callable (it runs inside the torch module).

**How it plugs in.** ``model`` slot (host, once, before the optimizer is built). A torch-sourced task is surgered
in place on its ``nn.Module`` before export by the function torch_bridge registers as ``"GatedLinearUnits"``
(:mod:`torch_bridge.methods.gated_linear_units`). An NNX model is cloned (``inplace=False``, the functional default)
or edited in place (the method). Parameter paths change (``blocks/0/fc_proj/gated_layer/kernel``; torch:
``bert.encoder.layer.0.output.gated_layer.weight``), so checkpoints of the surgered model need the method in the
recipe (Composer's ``required_on_load``).

**Reference.** Shazeer, "GLU Variants Improve Transformer", 2020 (arXiv:2002.05202). Composer:
``composer/algorithms/gated_linear_units``.
"""
from __future__ import annotations

import math
import warnings
from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import nnx

from jaxcomposer.errors import NoEffectWarning
from jaxcomposer.algorithms.nnx_surgery import apply_surgery
from jaxcomposer.core.method import Method, MethodEntry

__all__ = ["GatedLinearUnits", "GatedFFOutput", "BERTGatedFFOutput", "Identity", "apply_gated_linear_units",
           "identity"]


def identity(x: jax.Array) -> jax.Array:
    """The MLP activation after surgery: the gate applies the activation itself."""
    return x


class Identity(nnx.Module):
    """``nn.Identity``: what Composer puts in place of ``BertIntermediate`` (here: of ``Block.fc``)."""

    def __call__(self, x: jax.Array) -> jax.Array:
        return x


def _torch_default_init(fan_in: int):
    """torch's ``nn.Linear`` init for weights and biases: ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``."""
    bound = 1.0 / math.sqrt(fan_in)

    def init(key, shape, dtype=jnp.float32):
        return jax.random.uniform(key, shape, dtype, -bound, bound)

    return init


def _linear(d_in: int, d_out: int, bias: bool, rngs: nnx.Rngs) -> nnx.Linear:
    init = _torch_default_init(d_in)
    return nnx.Linear(d_in, d_out, use_bias=bias, kernel_init=init, bias_init=init, rngs=rngs)


class GatedFFOutput(nnx.Module):
    """``wo(act(gated_layer(x)) * non_gated_layer(x))``: Composer's ``BERTGatedFFOutput`` without the post-LN,
    residual and dropout, which our pre-LN GPT ``Block`` applies itself. Fresh layers, torch's default init."""

    def __init__(self, d_embed: int, d_ff: int, act_fn: Callable[[jax.Array], jax.Array],
                 gated_layer_bias: bool = False, non_gated_layer_bias: bool = False, *, rngs: nnx.Rngs):
        self.gated_layer = _linear(d_embed, d_ff, gated_layer_bias, rngs)
        self.non_gated_layer = _linear(d_embed, d_ff, non_gated_layer_bias, rngs)
        self.wo = _linear(d_ff, d_embed, True, rngs)
        self.act = act_fn

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.wo(self.act(self.gated_layer(x)) * self.non_gated_layer(x))


class BERTGatedFFOutput(nnx.Module):
    """Composer's ``BERTGatedFFOutput`` for our BERT's ``BertLayer.output``:
    ``layernorm(wo(dropout(act(gated_layer(x)) * non_gated_layer(x))) + residual)``. Fresh layers, torch's default
    init (LayerNorm: ones and zeros)."""

    def __init__(self, d_embed: int, d_ff: int, dropout_rate: float, act_fn: Callable[[jax.Array], jax.Array],
                 layernorm_eps: float, gated_layer_bias: bool = False, non_gated_layer_bias: bool = False, *,
                 rngs: nnx.Rngs):
        self.gated_layer = _linear(d_embed, d_ff, gated_layer_bias, rngs)
        self.non_gated_layer = _linear(d_embed, d_ff, non_gated_layer_bias, rngs)
        self.wo = _linear(d_ff, d_embed, True, rngs)
        self.dropout = nnx.Dropout(dropout_rate)
        self.layernorm = nnx.LayerNorm(d_embed, epsilon=layernorm_eps, rngs=rngs)
        self.act = act_fn

    def __call__(self, h: jax.Array, residual: jax.Array, *, train: bool, key) -> jax.Array:
        h = self.dropout(self.act(self.gated_layer(h)) * self.non_gated_layer(h), deterministic=not train, rngs=key)
        return self.layernorm(self.wo(h) + residual)


def _bert_layers(model: nnx.Module) -> list:
    """Our BERT's layers still holding a plain ``BertIntermediate`` and ``BertOutput``, in graph order."""
    from jaxcomposer.models.bert import BertIntermediate, BertLayer, BertOutput
    return [m for _, m in nnx.iter_graph(model) if isinstance(m, BertLayer)
            and isinstance(m.intermediate, BertIntermediate) and isinstance(m.output, BertOutput)]


def _gpt_blocks(model: nnx.Module) -> list:
    """Our GPT's blocks still holding a plain MLP (``fc`` a Linear and ``fc_proj`` a Linear), in graph order."""
    from jaxcomposer.models.gpt import Block  # the one native transformer MLP we know
    return [m for _, m in nnx.iter_graph(model)
            if isinstance(m, Block) and isinstance(m.fc, nnx.Linear) and isinstance(m.fc_proj, nnx.Linear)]


def _default_act_fn(blocks: list, layers: list = ()) -> Callable:
    acts = {b.mlp_act for b in blocks} | {layer.intermediate.act for layer in layers}
    if len(acts) > 1:
        raise ValueError(f"GatedLinearUnits: the model's MLPs use {len(acts)} different activations "
                         f"({sorted(getattr(a, '__name__', repr(a)) for a in acts)}); pass act_fn explicitly.")
    return next(iter(acts))


def _apply_nnx(model: nnx.Module, act_fn, gated_layer_bias: bool, non_gated_layer_bias: bool, inplace: bool,
               seed: int):
    new = model if inplace else nnx.clone(model)
    blocks, layers = _gpt_blocks(new), _bert_layers(new)
    if not blocks and not layers:
        return new, 0
    act = _default_act_fn(blocks, layers) if act_fn is None else act_fn
    rngs = nnx.Rngs(seed)
    for layer in layers:
        d_embed, d_ff = layer.intermediate.dense.in_features, layer.intermediate.dense.out_features
        layer.output = BERTGatedFFOutput(d_embed, d_ff, layer.output.drop.rate, act, layer.output.ln.epsilon,
                                         gated_layer_bias, non_gated_layer_bias, rngs=rngs)
        layer.intermediate = Identity()
    for block in blocks:
        d_embed, d_ff = block.fc.in_features, block.fc.out_features
        block.fc_proj = GatedFFOutput(d_embed, d_ff, act, gated_layer_bias, non_gated_layer_bias, rngs=rngs)
        block.fc = Identity()
        block.mlp_act = identity
    return new, len(blocks) + len(layers)


def apply_gated_linear_units(model: Any, optimizers: Any = None, act_fn: Callable | None = None,
                             gated_layer_bias: bool = False, non_gated_layer_bias: bool = False, *,
                             inplace: bool | None = None, seed: int = 0):
    """Composer's ``apply_gated_linear_units(model, optimizers, act_fn=None, gated_layer_bias=False,
    non_gated_layer_bias=False)``.

    A torch module is edited in place and returned (Composer returns None; returning the module lets one call
    serve both frameworks). A Flax NNX module is cloned and the new model returned unless ``inplace=True``.
    A torch optimizer given as ``optimizers`` holds the new layers' parameters afterwards, as in Composer (an NNX
    model's optimizer is built from the surgered params: pass None). Warns with :class:`NoEffectWarning` when no
    MLP was converted.
    """
    if act_fn is not None and not callable(act_fn):
        raise TypeError(f"apply_gated_linear_units: act_fn must be callable or None, got {type(act_fn).__name__}.")
    new, count = apply_surgery(
        "GatedLinearUnits", model,
        lambda m: _apply_nnx(m, act_fn, bool(gated_layer_bias), bool(non_gated_layer_bias), bool(inplace), int(seed)),
        who="apply_gated_linear_units", optimizers=optimizers, act_fn=act_fn, gated_layer_bias=bool(gated_layer_bias),
        non_gated_layer_bias=bool(non_gated_layer_bias))
    if count == 0:
        what = ("no GPT Block with a plain fc/fc_proj MLP or BERT layer with a plain intermediate/output"
                if isinstance(model, nnx.Module) else "no BertIntermediate/BertOutput pair, GPT2MLP or TorchBlock MLP")
        warnings.warn(NoEffectWarning(f"GatedLinearUnits did not change {type(model).__name__}: {what} was found "
                                      "(or the model was converted already)."), stacklevel=2)
    return new


def GatedLinearUnits(act_fn: Callable | None = None, gated_layer_bias: bool = False,
                     non_gated_layer_bias: bool = False, *, seed: int = 0) -> Method:
    """Composer's ``GatedLinearUnits(act_fn=None, gated_layer_bias=False, non_gated_layer_bias=False)`` as a
    :class:`Method` (``model`` slot; edits the user's module in place, as Composer)."""
    if act_fn is not None and not callable(act_fn):
        raise ValueError(f"GatedLinearUnits: act_fn must be a callable (e.g. jax.nn.silu) or None for the model's "
                         f"own activation, got {act_fn!r}.")
    for name, value in (("gated_layer_bias", gated_layer_bias), ("non_gated_layer_bias", non_gated_layer_bias)):
        if not isinstance(value, bool):
            raise ValueError(f"GatedLinearUnits: {name} must be True or False, got {value!r}.")
    if isinstance(seed, bool) or int(seed) != seed:
        raise ValueError(f"GatedLinearUnits: seed must be an integer, got {seed!r}.")

    def model_fn(task, ctx):
        new = apply_gated_linear_units(task.source, act_fn=act_fn, gated_layer_bias=gated_layer_bias,
                                       non_gated_layer_bias=non_gated_layer_bias, inplace=True, seed=int(seed))
        return task.with_model(new)

    act_name = None if act_fn is None else getattr(act_fn, "__name__", "act_fn")
    return Method(name="GatedLinearUnits", model=model_fn,
                  description=f"GatedLinearUnits(act_fn={act_name}, gated_layer_bias={gated_layer_bias}, "
                              f"non_gated_layer_bias={non_gated_layer_bias})")


# Registration: jaxcomposer.algorithms, jaxcomposer.functional and `jaxcomposer methods` find the method here.
ENTRY = MethodEntry(registry_name="gated_linear_units", factory=GatedLinearUnits,
                    functional=(apply_gated_linear_units,))
