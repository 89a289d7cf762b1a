"""Exact weight conversion between jaxcomposer's native NNX models and their torch mirrors.

One explicit, shape-checked table per architecture maps every NNX variable to one torch ``state_dict`` key:

=============================  ====================================  ==========================================
NNX (``jaxcomposer.models``)   torch (``torch_mirrors`` mirror)      transform
=============================  ====================================  ==========================================
``<linear>.kernel`` (in, out)  ``<linear>.weight`` (out, in)         transpose
``<linear>.bias``              ``<linear>.bias``                     copy
``<conv>.kernel`` HWIO         ``<conv>.weight`` OIHW                ``(3, 2, 0, 1)`` / ``(2, 3, 1, 0)``
``<bn>.scale / bias``          ``<bn>.weight / bias``                copy
``<bn>.mean / var``            ``<bn>.running_mean / running_var``   copy
(none)                         ``<bn>.num_batches_tracked``          0 on export, ignored on import
``<ln>.scale / bias``          ``<ln>.weight / bias``                copy
``<embed>.embedding``          ``<embed>.weight``                    copy
=============================  ====================================  ==========================================

Module names are the same on both sides (``blocks.3.conv1``, ``blocks.0.attn.qkv``, ``head``, ...). A GPT with
tied embeddings has no ``lm_head`` on either side; on import a redundant ``lm_head.weight`` (as nanoGPT-style
state dicts carry) is accepted only if it equals ``wte.weight``.

The check is strict: every key on both sides must be consumed and every shape must agree, else ``ValueError``
listing each offending key with its expected and got shape. Values convert exactly (transposes only), so
NNX -> torch -> NNX is bitwise lossless.

BatchNorm caveat: weights and running statistics convert exactly, but the frameworks' *training* updates differ
slightly: torch updates ``running_var`` with the unbiased batch variance (``n / (n - 1)`` times the biased one),
flax's ``nnx.BatchNorm`` with the biased one. A model trained through the bridged torch path follows torch
exactly; the same model trained natively ends up with marginally smaller running variances.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import jax.numpy as jnp
import numpy as np
import torch
from flax import nnx

from jaxcomposer.models.gpt import GPT
from jaxcomposer.models.mlp import MLP
from jaxcomposer.models.resnet import ResNetCIFAR

__all__ = ["Entry", "ConversionTable", "conversion_table", "nnx_to_torch_state_dict", "torch_state_dict_to_nnx"]

NnxPath = tuple  # e.g. ("blocks", 0, "conv1", "kernel")

# name -> (NNX -> torch, torch -> NNX); both pure layout changes.
_TRANSFORMS: dict[str, tuple[Callable[[np.ndarray], np.ndarray], Callable[[np.ndarray], np.ndarray]]] = {
    "copy": (lambda a: a, lambda a: a),
    "linear": (lambda a: a.T, lambda a: a.T),                                        # (in, out) <-> (out, in)
    "conv": (lambda a: a.transpose(3, 2, 0, 1), lambda a: a.transpose(2, 3, 1, 0)),  # HWIO <-> OIHW
}


@dataclasses.dataclass(frozen=True)
class Entry:
    """One NNX variable <-> one torch state-dict key."""

    nnx_path: NnxPath
    torch_key: str
    transform: str = "copy"

    def to_torch(self, a: np.ndarray) -> np.ndarray:
        return _TRANSFORMS[self.transform][0](a)

    def to_nnx(self, a: np.ndarray) -> np.ndarray:
        return _TRANSFORMS[self.transform][1](a)

    def torch_shape(self, nnx_shape: tuple) -> tuple:
        return tuple(self.to_torch(np.broadcast_to(np.float32(0), nnx_shape)).shape)


@dataclasses.dataclass(frozen=True)
class ConversionTable:
    """``entries`` map values; ``export_zeros`` are torch-only int64 counters (``num_batches_tracked``) written as
    0 and ignored on import; ``aliases`` are optional torch keys that must equal another key (tied weights)."""

    architecture: str
    entries: tuple[Entry, ...]
    export_zeros: tuple[str, ...] = ()
    aliases: tuple[tuple[str, str], ...] = ()  # (optional key, key it must equal)


class _Builder:
    def __init__(self):
        self.entries: list[Entry] = []
        self.zeros: list[str] = []

    def add(self, path: NnxPath, key: str, transform: str = "copy") -> None:
        self.entries.append(Entry(tuple(path), key, transform))

    def linear(self, prefix: NnxPath, bias: bool = True) -> None:
        self.add((*prefix, "kernel"), _key(prefix, "weight"), "linear")
        if bias:
            self.add((*prefix, "bias"), _key(prefix, "bias"))

    def conv(self, prefix: NnxPath) -> None:  # our convs are bias-free
        self.add((*prefix, "kernel"), _key(prefix, "weight"), "conv")

    def batchnorm(self, prefix: NnxPath) -> None:
        for ours, theirs in (("scale", "weight"), ("bias", "bias"), ("mean", "running_mean"), ("var", "running_var")):
            self.add((*prefix, ours), _key(prefix, theirs))
        self.zeros.append(_key(prefix, "num_batches_tracked"))

    def layernorm(self, prefix: NnxPath) -> None:
        self.add((*prefix, "scale"), _key(prefix, "weight"))
        self.add((*prefix, "bias"), _key(prefix, "bias"))

    def embed(self, prefix: NnxPath) -> None:
        self.add((*prefix, "embedding"), _key(prefix, "weight"))


def _key(prefix: NnxPath, leaf: str) -> str:
    return ".".join(map(str, (*prefix, leaf)))


def _mlp_table(model: MLP) -> ConversionTable:
    b = _Builder()
    for i in range(len(model.hidden)):
        b.linear(("hidden", i))
    b.linear(("head",))
    return ConversionTable("MLP", tuple(b.entries))


def _resnet_table(model: ResNetCIFAR) -> ConversionTable:
    b = _Builder()
    b.conv(("stem_conv",))
    b.batchnorm(("stem_bn",))
    for i, block in enumerate(model.blocks):
        for conv, bn in (("conv1", "bn1"), ("conv2", "bn2")):
            b.conv(("blocks", i, conv))
            b.batchnorm(("blocks", i, bn))
        if block.proj_conv is not None:
            b.conv(("blocks", i, "proj_conv"))
            b.batchnorm(("blocks", i, "proj_bn"))
    b.linear(("head",))
    return ConversionTable("ResNetCIFAR", tuple(b.entries), tuple(b.zeros))


def _gpt_table(model: GPT) -> ConversionTable:
    b = _Builder()
    b.embed(("wte",))
    b.embed(("wpe",))
    for i in range(len(model.blocks)):
        b.layernorm(("blocks", i, "ln1"))
        b.linear(("blocks", i, "attn", "qkv"))
        b.linear(("blocks", i, "attn", "proj"))
        b.layernorm(("blocks", i, "ln2"))
        b.linear(("blocks", i, "fc"))
        b.linear(("blocks", i, "fc_proj"))
    b.layernorm(("ln_f",))
    if model.lm_head is not None:
        b.linear(("lm_head",), bias=False)
        aliases = ()
    else:
        aliases = (("lm_head.weight", "wte.weight"),)
    return ConversionTable("GPT", tuple(b.entries), aliases=aliases)


_TABLES: tuple[tuple[type, Callable[[Any], ConversionTable]], ...] = (
    (MLP, _mlp_table), (ResNetCIFAR, _resnet_table), (GPT, _gpt_table))


def conversion_table(model: nnx.Module) -> ConversionTable:
    """The table for ``model``'s architecture (dispatch on type: MLP, ResNetCIFAR, GPT)."""
    for cls, build in _TABLES:
        if isinstance(model, cls):
            return build(model)
    raise TypeError(f"interop.torch_weights: no conversion table for {type(model).__name__}; "
                    f"supported: {', '.join(c.__name__ for c, _ in _TABLES)}.")


def _flat_variables(model: nnx.Module, table: ConversionTable) -> dict[NnxPath, nnx.Variable]:
    """``{path: Variable}`` of every variable in ``model``, checked to be exactly the table's NNX side."""
    flat = {tuple(path): var for path, var in nnx.to_flat_state(nnx.state(model))}
    wanted = {e.nnx_path for e in table.entries}
    unmapped, absent = sorted(set(flat) - wanted, key=str), sorted(wanted - set(flat), key=str)
    if unmapped or absent:
        raise ValueError(
            f"interop.torch_weights: the {table.architecture} table does not match this {type(model).__name__}: "
            f"variables without a table entry: {['.'.join(map(str, p)) for p in unmapped]}; "
            f"table entries without a variable: {['.'.join(map(str, p)) for p in absent]}.")
    return flat


def nnx_to_torch_state_dict(model: nnx.Module) -> dict[str, torch.Tensor]:
    """A torch ``state_dict`` for the matching ``interop.torch_mirrors`` mirror of ``model``.

    Loads with ``load_state_dict(..., strict=True)``; tensors are fresh CPU copies (the model is untouched).
    """
    table = conversion_table(model)
    flat = _flat_variables(model, table)
    out: dict[str, torch.Tensor] = {}
    for e in table.entries:
        value = np.array(flat[e.nnx_path].get_value())  # a writable host copy
        out[e.torch_key] = torch.from_numpy(np.ascontiguousarray(e.to_torch(value)))
    for key in table.export_zeros:
        out[key] = torch.tensor(0, dtype=torch.long)
    return out


def _to_numpy(value: Any) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        if value.dtype == torch.bfloat16:  # numpy has no bfloat16; float32 holds it exactly
            value = value.float()
        return value.numpy()
    return np.asarray(value)


def _shape(s: tuple) -> str:
    return str(tuple(int(d) for d in s))


def torch_state_dict_to_nnx(state_dict: Mapping[str, Any], model: nnx.Module) -> nnx.Module:
    """A NEW module like ``model`` holding the values of ``state_dict`` (torch tensors or ``np.ndarray``).

    ``model`` supplies the architecture and the target dtypes and is left untouched. Raises ``ValueError`` listing
    every missing key, unexpected key and shape mismatch (each with the expected and the got shape).
    """
    table = conversion_table(model)
    flat = _flat_variables(model, table)
    sd = {str(k): _to_numpy(v) for k, v in state_dict.items()}

    expected = {e.torch_key: e.torch_shape(tuple(flat[e.nnx_path].get_value().shape)) for e in table.entries}
    ignored = set(table.export_zeros)
    alias_of = dict(table.aliases)
    problems = []
    for key, shape in expected.items():
        if key not in sd:
            problems.append(f"missing key {key!r}: expected shape {_shape(shape)}, got nothing")
        elif tuple(sd[key].shape) != shape:
            problems.append(f"key {key!r}: expected shape {_shape(shape)}, got shape {_shape(sd[key].shape)}")
    for key in sd:
        if key in expected or key in ignored:
            continue
        if key in alias_of:
            target = alias_of[key]
            same_shape = target in sd and sd[key].shape == sd[target].shape
            if target in sd and not (same_shape and np.array_equal(sd[key], sd[target])):
                problems.append(f"key {key!r}: the tied {table.architecture} needs it equal to {target!r} "
                                f"(expected shape {_shape(sd[target].shape)} and equal values, got shape "
                                f"{_shape(sd[key].shape)}{' with different values' if same_shape else ''})")
            continue
        problems.append(f"unexpected key {key!r}: expected no such key, got shape {_shape(sd[key].shape)}")
    if problems:
        raise ValueError(f"interop.torch_weights: state dict does not match {table.architecture}:\n  "
                         + "\n  ".join(problems))

    new = nnx.clone(model)
    new_flat = _flat_variables(new, table)
    for e in table.entries:
        var = new_flat[e.nnx_path]
        # np.array copies: a torch tensor's .numpy() shares its memory, and jnp.asarray may alias host buffers.
        host = np.array(e.to_nnx(sd[e.torch_key]), dtype=var.get_value().dtype, order="C")
        var.set_value(jnp.asarray(host))
    return new
