"""Exact weight conversion between jaxcomposer's native NNX models and torch ``state_dict``s.

Each architecture has one explicit, shape-checked table per torch layout (:mod:`torch_bridge.weights.table`
holds the vocabulary; one module per architecture holds its tables):

==================  ============================  =============================================================
NNX model           layouts (first: the default)  torch side
==================  ============================  =============================================================
``MLP``             ``mirror``                    ``torch_bridge.mirrors.TorchMLP``
``ResNetCIFAR``     ``mirror``                    ``torch_bridge.mirrors.TorchResNetCIFAR``
``ConvNet``         ``mirror``                    ``torch_bridge.mirrors.TorchConvNet``
``ResNetImageNet``  ``torchvision``               ``torchvision.models.resnet{18,34,50,101,152}``
``GPT``             ``mirror``, ``hf``            ``torch_bridge.mirrors.TorchGPT``; HF ``GPT2LMHeadModel``
``BERT``            ``hf``                        HF ``BertForMaskedLM``, ``BertForSequenceClassification``,
                                                  ``BertModel`` (by the model's ``head``)
``ViT``             ``hf``, ``hf_legacy``         HF ``ViTForImageClassification`` (5.x names; the Hub's older
                                                  checkpoint names)
==================  ============================  =============================================================

Every variable maps to one key through a pure layout change:

=============================  ====================================  ==========================================
NNX                            torch                                 transform
=============================  ====================================  ==========================================
``<linear>.kernel`` (in, out)  ``<linear>.weight`` (out, in)         transpose (HF ``Conv1D``: copy)
``<linear>.bias``              ``<linear>.bias``                     copy
``<conv>.kernel`` HWIO         ``<conv>.weight`` OIHW                ``(3, 2, 0, 1)`` / ``(2, 3, 1, 0)``
``<bn>.scale / bias``          ``<bn>.weight / bias``                copy
``<bn>.mean / var``            ``<bn>.running_mean / running_var``   copy
(none)                         ``<bn>.num_batches_tracked``          0 on export, ignored on import
``<ln>.scale / bias``          ``<ln>.weight / bias``                copy
``<embed>.embedding``          ``<embed>.weight``                    copy
=============================  ====================================  ==========================================

The check is strict: every key on both sides must be consumed and every shape must agree, else ``ValueError``
listing each offending key with its expected and got shape. Values convert exactly (transposes only), so
NNX -> torch -> NNX is bitwise lossless.

:func:`from_torch_state_dict` is the entry point for weights you already have: a model name (``"resnet50"``,
``"gpt2"``, ``"bert-base-uncased"``, ``"vit-b16"``, ...) or a template module, and a ``state_dict`` or a file (``.safetensors``, or ``.pt``/``.pth``/
``.bin`` from ``torch.save``, including Composer checkpoints). It picks the layout whose keys the state dict has
and strips the wrappers a saved model often carries (``module.`` from DDP, ``model.`` from Composer,
``_orig_mod.`` from ``torch.compile``). :func:`to_torch_state_dict` goes back.

BatchNorm caveat: weights and running statistics convert exactly, but the frameworks' *training* updates differ
slightly: torch updates ``running_var`` with the unbiased batch variance (``n / (n - 1)`` times the biased one),
flax's ``nnx.BatchNorm`` with the biased one. A model trained through the bridged torch path follows torch
exactly; the same model trained natively ends up with marginally smaller running variances.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Mapping

import jax
import numpy as np
import torch
from flax import nnx

from torch_bridge.weights import bert, gpt2, native, resnet, vit
from torch_bridge.weights.table import ConversionTable, Entry, NnxPath, TableBuilder
from jaxcomposer import models

__all__ = ["Entry", "ConversionTable", "TableBuilder", "LAYOUTS", "NAMED_MODELS", "conversion_table",
           "to_torch_state_dict", "from_torch_state_dict", "load_torch_file", "nnx_to_torch_state_dict",
           "torch_state_dict_to_nnx"]

# model class -> {layout: table builder}; the first layout is the default for exports.
LAYOUTS: dict[type, dict[str, Callable[[Any], ConversionTable]]] = {
    models.MLP: {"mirror": native.mlp_table},
    models.ResNetCIFAR: {"mirror": native.resnet_cifar_table},
    models.ConvNet: {"mirror": native.convnet_table},
    models.ResNetImageNet: {"torchvision": resnet.torchvision_table},
    models.GPT: {"mirror": native.gpt_mirror_table, "hf": gpt2.hf_gpt2_table},
    models.ViT: {"hf": vit.hf_vit_table, "hf_legacy": vit.hf_vit_legacy_table},
    models.BERT: {"hf": bert.hf_bert_table},
}

# names from_torch_state_dict accepts -> the builder of the matching NNX model (keywords pass through)
NAMED_MODELS: dict[str, Callable[..., nnx.Module]] = {
    **{f"resnet{d}": (lambda d: lambda **kw: models.resnet(d, **kw))(d) for d in (18, 34, 50, 101, 152)},
    **{name: (lambda n: lambda **kw: models.gpt2(n, **kw))(name) for name in models.GPT2_SIZES},
    **{name: (lambda n: lambda **kw: models.vit(n, **kw))(name) for name in models.VIT_SIZES},
    **{name: (lambda n: lambda **kw: models.bert(n, **kw))(name) for name in models.BERT_SIZES},
}

# prefixes that wrappers put before a model's own keys: DDP, Composer's ComposerModel, torch.compile
WRAPPER_PREFIXES = ("module.", "model.", "_orig_mod.")


def conversion_table(model: nnx.Module, layout: str | None = None) -> ConversionTable:
    """The table for ``model``'s architecture in ``layout`` (None: the architecture's first layout)."""
    layouts = _layouts_of(model)
    if layout is None:
        layout = next(iter(layouts))
    if layout not in layouts:
        raise ValueError(f"torch_bridge.weights: {type(model).__name__} has no layout {layout!r}; "
                         f"known: {list(layouts)}.")
    return layouts[layout](model)


def _layouts_of(model: nnx.Module) -> dict[str, Callable[[Any], ConversionTable]]:
    for cls, layouts in LAYOUTS.items():
        if isinstance(model, cls):
            return layouts
    raise TypeError(f"torch_bridge.weights: no conversion table for {type(model).__name__}; "
                    f"supported: {', '.join(c.__name__ for c in LAYOUTS)}.")


def _flat_variables(model: nnx.Module, table: ConversionTable) -> dict[NnxPath, nnx.Variable]:
    """``{path: Variable}`` of every variable in ``model``, checked to be exactly the table's NNX side."""
    flat = {tuple(path): var for path, var in nnx.to_flat_state(nnx.state(model))}
    wanted = {e.nnx_path for e in table.entries}
    unmapped, absent = sorted(set(flat) - wanted, key=str), sorted(wanted - set(flat), key=str)
    if unmapped or absent:
        raise ValueError(
            f"torch_bridge.weights: the {table.architecture} table does not match this {type(model).__name__}: "
            f"variables without a table entry: {['.'.join(map(str, p)) for p in unmapped]}; "
            f"table entries without a variable: {['.'.join(map(str, p)) for p in absent]}.")
    return flat


def to_torch_state_dict(model: nnx.Module, layout: str | None = None) -> dict[str, torch.Tensor]:
    """A torch ``state_dict`` of ``model`` in ``layout`` (None: the default; ``LAYOUTS`` lists them), which the
    torch original loads with ``load_state_dict(..., strict=True)``. Tensors are fresh CPU copies."""
    table = conversion_table(model, layout)
    flat = _flat_variables(model, table)
    out: dict[str, torch.Tensor] = {}
    for e in table.entries:
        value = np.array(flat[e.nnx_path].get_value())  # a writable host copy
        out[e.torch_key] = torch.from_numpy(np.ascontiguousarray(e.to_torch(value)))
    for key in table.export_zeros:
        out[key] = torch.tensor(0, dtype=torch.long)
    if table.export_aliases:
        for key, target in table.aliases:
            out[key] = out[target].clone()
    return out


def nnx_to_torch_state_dict(model: nnx.Module) -> dict[str, torch.Tensor]:
    """:func:`to_torch_state_dict` in the default layout (the ``torch_bridge.mirrors`` one for the models that
    have a mirror)."""
    return to_torch_state_dict(model)


def _to_numpy(value: Any) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        if value.dtype == torch.bfloat16:  # numpy has no bfloat16; float32 holds it exactly
            value = value.float()
        return value.numpy()
    return np.asarray(value)


def _shape(s: tuple) -> str:
    return str(tuple(int(d) for d in s))


def _problems(sd: Mapping[str, np.ndarray], table: ConversionTable, flat: dict) -> list[str]:
    """Every missing key, unexpected key and shape mismatch between ``sd`` and ``table`` (empty: it fits)."""
    expected = {e.torch_key: e.torch_shape(tuple(flat[e.nnx_path].get_value().shape)) for e in table.entries}
    ignored = set(table.export_zeros) | set(table.ignored)
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
    return problems


def _rekeyings(sd: dict[str, np.ndarray], table: ConversionTable) -> list[tuple[str, dict[str, np.ndarray]]]:
    """``sd`` as given, then with wrapper prefixes stripped, then (for a headless base model such as HF's
    ``GPT2Model``) with the table's common first key component added: ``(description, re-keyed dict)``."""
    out, seen = [("as given", sd)], [sd]
    stripped = sd
    for _ in range(3):  # wrappers nest: DDP around Composer's model, ...
        prefix = next((p for p in WRAPPER_PREFIXES if stripped and all(k.startswith(p) for k in stripped)), None)
        if prefix is None:
            break
        stripped = {k[len(prefix):]: v for k, v in stripped.items()}
        out.append((f"without the prefix {prefix!r}", stripped))
        seen.append(stripped)
    heads = {e.torch_key.split(".", 1)[0] for e in table.entries}
    if len(heads) == 1:
        base = f"{heads.pop()}."
        for label, variant in list(out):
            out.append((f"{label}, with {base!r} added", {base + k: v for k, v in variant.items()}))
    return out


def torch_state_dict_to_nnx(state_dict: Mapping[str, Any], model: nnx.Module,
                            layout: str | None = None) -> nnx.Module:
    """A NEW module like ``model`` holding the values of ``state_dict`` (torch tensors or ``np.ndarray``) given in
    ``layout`` (None: the first of ``model``'s layouts whose keys it has, trying the wrapper prefixes too).

    ``model`` supplies the architecture and the target dtypes and is left untouched (it may be abstract, from
    ``nnx.eval_shape``). Raises ``ValueError`` listing every missing key, unexpected key and shape mismatch (each
    with the expected and the got shape) against the closest layout.
    """
    sd = {str(k): _to_numpy(v) for k, v in state_dict.items()}
    layouts = [layout] if layout is not None else list(_layouts_of(model))
    best = None  # (number of problems, layout, description, problems)
    for name in layouts:
        try:
            table = conversion_table(model, name)
        except ValueError:
            if layout is not None:
                raise
            continue  # this layout cannot hold this configuration (an untied GPT in HF's layout)
        flat = _flat_variables(model, table)
        for label, variant in _rekeyings(sd, table):
            problems = _problems(variant, table, flat)
            if not problems:
                return _filled(model, table, variant)
            if best is None or len(problems) < best[0]:
                best = (len(problems), name, label, problems)
    _, name, label, problems = best
    shown = problems[:40] + ([f"... and {len(problems) - 40} more"] if len(problems) > 40 else [])
    raise ValueError(f"torch_bridge.weights: state dict does not match {type(model).__name__} in the {name!r} "
                     f"layout (closest reading: keys {label}; layouts tried: {layouts}):\n  " + "\n  ".join(shown))


def _filled(model: nnx.Module, table: ConversionTable, sd: Mapping[str, np.ndarray]) -> nnx.Module:
    new = nnx.clone(model)
    new_flat = _flat_variables(new, table)
    for e in table.entries:
        var = new_flat[e.nnx_path]
        # np.array copies: a torch tensor's .numpy() shares its memory, and device_put aliases an aligned host buffer
        # on CPU. device_put, not jnp.asarray: that compiles an identity program per new shape and dtype
        host = np.array(e.to_nnx(sd[e.torch_key]), dtype=var.get_value().dtype, order="C")
        var.set_value(jax.device_put(host))
    return new


def load_torch_file(path: str | os.PathLike) -> dict[str, Any]:
    """The state dict in a file: ``.safetensors``, or a ``torch.save`` file (``.pt``, ``.pth``, ``.bin``) holding
    a state dict, a Composer checkpoint (``state.model``) or a ``{"state_dict": ...}`` / ``{"model": ...}``
    wrapper. Loaded with ``weights_only=True``: no code in the file runs."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"torch_bridge.weights: no weights file at {str(path)!r}; give the path of a "
                                ".safetensors, .pt, .pth or .bin file saved from the torch model.")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file
        return dict(load_file(str(path)))
    obj = torch.load(path, map_location="cpu", weights_only=True)
    for wrapper in (("state", "model"), ("state_dict",), ("model",)):
        inner = obj
        for key in wrapper:
            inner = inner.get(key) if isinstance(inner, Mapping) else None
        if isinstance(inner, Mapping) and inner and all(isinstance(v, torch.Tensor) for v in inner.values()):
            return dict(inner)
    if isinstance(obj, Mapping) and all(isinstance(v, torch.Tensor) for v in obj.values()):
        return dict(obj)
    raise ValueError(f"torch_bridge.weights: {str(path)!r} holds no state dict (a mapping of names to tensors, "
                     "directly or under 'state_dict', 'model' or Composer's 'state' -> 'model').")


def from_torch_state_dict(model: str | nnx.Module, source: Mapping[str, Any] | str | os.PathLike,
                          layout: str | None = None, **model_kwargs) -> nnx.Module:
    """The NNX model holding torch weights you already have.

    ``model``: a name from ``NAMED_MODELS`` (``"resnet50"``, ``"gpt2"``, ``"gpt2-medium"``, ...; ``model_kwargs``
    go to its builder, e.g. ``num_classes=10``) or a module to copy the architecture from (left untouched).
    ``source``: a state dict, or a file path (see :func:`load_torch_file`). ``layout``: None picks the layout
    whose keys the state dict has. Example::

        model = from_torch_state_dict("resnet50", "resnet50-11ad3fa6.pth")   # a torchvision checkpoint
        model = from_torch_state_dict("gpt2", "gpt2/model.safetensors")      # Hugging Face's files
    """
    if isinstance(model, str):
        if model not in NAMED_MODELS:
            raise ValueError(f"from_torch_state_dict: unknown model name {model!r}; known: {sorted(NAMED_MODELS)}, "
                             "or pass an NNX module of the architecture.")
        build = NAMED_MODELS[model]
        model = nnx.eval_shape(lambda: build(**model_kwargs))  # shapes only: the weights come from the file
    elif model_kwargs:
        raise TypeError(f"from_torch_state_dict: keywords {sorted(model_kwargs)} only apply to a model name.")
    state_dict = load_torch_file(source) if isinstance(source, (str, os.PathLike)) else source
    return torch_state_dict_to_nnx(state_dict, model, layout)
