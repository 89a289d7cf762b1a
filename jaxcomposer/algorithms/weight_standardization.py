"""WeightStandardization.

Method card
-----------
**What it does.** Reparametrizes convolution weights: each forward uses ``(W - mean) / sqrt(var + 1e-10)`` per
output channel instead of ``W`` (mean and *biased* variance over every other axis), computed from the stored raw
weights. The stored parameter stays raw; gradients flow through the standardization into it. No parameter is
added.

**When it helps.** CNNs trained with small per-device batches or with GroupNorm / without BatchNorm, where it
smooths the loss landscape (Qiao et al. 2019). Composer pairs it with GroupNorm; with BatchNorm models it is
mostly neutral. It costs a tiny per-step reduction over each conv kernel.

**Hyperparameters.** ``n_last_layers_ignore`` (default ``0``): how many of the model's last convolutions are left
unstandardized (e.g. a convolutional head).

**Exact Composer semantics.** As ``composer/algorithms/weight_standardization``: ``torch.var_mean(W, dim=1..,
unbiased=False)``, ``(W - mean) / sqrt(var + 1e-10)``; Conv1d/2d/3d are parametrized with
``torch.nn.utils.parametrize.register_parametrization`` (the torch surgery in
:mod:`torch_bridge.methods.weight_standardization`), the first ``count - n_last_layers_ignore`` convolutions in
``torch.fx.symbolic_trace`` module order (falling back to ``.modules()`` order, with Composer's warning, when the
model cannot be traced). On NNX models the standardized axis is the kernel's last one (HWIO: output channels). The
order of NNX convolutions is their definition order: a depth-first walk of each module's attributes in the order
they were assigned (``vars``), which is the order the forward calls them for every model that defines its layers
in call order (all of jaxcomposer's; checked against the forward's param-use order in the tests). Composer's
fallback when fx cannot trace is this same order. Deviation: a forward that calls its convolutions in another order
than it defines them gets the definition order (NNX surgery has no example input to trace a forward with); and
``nnx.clone`` sorts attributes by name, so pass the module as built, not a clone, when ``n_last_layers_ignore > 0``.
Composed with Factorize afterwards, the factorized layers are not standardized (a :class:`StandardizedConv` whose
conv was replaced calls the replacement as is), as in torch, where the replacement of a parametrized conv carries
no parametrization. Return value: Composer's functional returns the number of standardized layers and edits in
place; that is what a torch module and an NNX module with ``inplace=True`` get; an NNX module without ``inplace``
is cloned and ``(new_module, count)`` is returned.

**How it plugs in.** ``model`` slot, ``model(task, ctx) -> task`` (host, once, before the optimizer is built). NNX:
each selected ``nnx.Conv`` is wrapped in :class:`StandardizedConv` (in place in the Trainer), so the parameter paths
gain a ``conv`` segment (``stem_conv/conv/kernel``). Torch: the parametrization is registered before export, so the
exported graph computes the standardization and the raw weight is the bridged parameter
(``conv.parametrizations.weight.original``, as in torch). The parameter values are unchanged by the surgery.

**Reference.** Qiao et al., "Micro-Batch Training with Batch-Channel Normalization and Weight Standardization",
arXiv:1903.10520. Composer: ``composer/algorithms/weight_standardization``.
"""
from __future__ import annotations

import warnings
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxcomposer.errors import NoEffectWarning
from jaxcomposer.algorithms.nnx_surgery import apply_surgery, set_child as _set_child
from jaxcomposer.core.method import Method, MethodEntry

__all__ = ["WeightStandardization", "StandardizedConv", "apply_weight_standardization", "standardize_weights"]

EPSILON = 1e-10  # Composer's, added to the variance


def standardize_weights(kernel: jax.Array, out_axis: int = -1) -> jax.Array:
    """``(W - mean) / sqrt(var + 1e-10)`` per output channel (``out_axis``), biased variance over the other axes."""
    axes = tuple(a for a in range(kernel.ndim) if a != out_axis % kernel.ndim)
    mean = jnp.mean(kernel, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(kernel - mean), axis=axes, keepdims=True)  # two-pass, as torch.var_mean
    return (kernel - mean) / jnp.sqrt(var + EPSILON)


class StandardizedConv(nnx.Module):
    """An ``nnx.Conv`` whose forward uses its standardized kernel (per output channel, the HWIO kernel's last axis);
    the stored ``conv.kernel`` stays raw. The counterpart of a torch conv parametrized with Composer's
    ``WeightStandardizer``."""

    def __init__(self, conv: nnx.Conv):
        self.conv = conv

    def __call__(self, x: jax.Array, *args, **kwargs) -> jax.Array:
        if not isinstance(self.conv, nnx.Conv):
            # a later surgery replaced the conv (Factorize): as in torch, where the replacement of a parametrized
            # conv is not parametrized, the new layers are not standardized
            return self.conv(x, *args, **kwargs)
        graphdef, state = nnx.split(self.conv)
        state["kernel"] = state["kernel"].replace(standardize_weights(state["kernel"][...]))
        return nnx.merge(graphdef, state)(x, *args, **kwargs)  # a view with the standardized kernel


def _convs_in_definition_order(model: nnx.Module) -> list[tuple[Any, Any, nnx.Conv]]:
    """``(parent, key, conv)`` for each reference to an ``nnx.Conv`` in ``model``, depth-first in the order the
    attributes were assigned (not into :class:`StandardizedConv`: those are standardized already)."""
    out, seen = [], set()

    def children(node):
        if isinstance(node, nnx.Module) and not isinstance(node, nnx.List):
            return [(k, v) for k, v in vars(node).items() if not k.startswith("_")]
        return list(nnx.iter_children(node))

    def walk(node):
        if id(node) in seen:
            return
        seen.add(id(node))
        for key, child in children(node):
            if isinstance(child, nnx.Conv) and child.kernel[...].ndim in (3, 4, 5):  # Conv1d/2d/3d
                out.append((node, key, child))
            elif isinstance(child, (nnx.Module, nnx.List, list, tuple, dict)) and not isinstance(
                    child, StandardizedConv):
                walk(child)

    walk(model)
    return out


def _standardize_nnx(model: nnx.Module, n_last_layers_ignore: int) -> int:
    refs = _convs_in_definition_order(model)
    convs: dict[int, nnx.Conv] = {}  # distinct convs, first reference first (Composer counts modules once)
    for _, _, conv in refs:
        convs.setdefault(id(conv), conv)
    target = max(len(convs) - n_last_layers_ignore, 0)
    chosen = {id(c): StandardizedConv(c) for c in list(convs.values())[:target]}
    for parent, key, conv in refs:
        if id(conv) in chosen:
            _set_child(parent, key, chosen[id(conv)])
    return len(chosen)


def _check_n(n_last_layers_ignore: Any, where: str) -> int:
    if isinstance(n_last_layers_ignore, bool) or int(n_last_layers_ignore) != n_last_layers_ignore \
            or n_last_layers_ignore < 0:
        raise ValueError(f"{where}: n_last_layers_ignore must be a non-negative integer, got "
                         f"{n_last_layers_ignore!r}.")
    return int(n_last_layers_ignore)


def _apply_nnx(module: nnx.Module, n_last_layers_ignore: int, inplace: bool) -> tuple[nnx.Module, int]:
    if inplace:
        return module, _standardize_nnx(module, n_last_layers_ignore)
    new = nnx.clone(module)  # the order is read off the original: a clone's attributes are sorted by name
    return new, _standardize_nnx_like(module, new, n_last_layers_ignore)


def _standardize_nnx_like(original: nnx.Module, new: nnx.Module, n_last_layers_ignore: int) -> int:
    """Standardize, in ``new`` (a clone of ``original``), the convs that ``original``'s definition order selects
    (matched by their graph path, which a clone keeps)."""
    original_path = {id(m): p for p, m in nnx.iter_graph(original)}
    distinct: dict[int, nnx.Conv] = {}
    for _, _, conv in _convs_in_definition_order(original):
        distinct.setdefault(id(conv), conv)
    target = max(len(distinct) - n_last_layers_ignore, 0)
    chosen = {original_path[i] for i in list(distinct)[:target]}
    wrappers = {id(node): StandardizedConv(node) for path, node in nnx.iter_graph(new) if path in chosen}
    for parent, key, conv in _convs_in_definition_order(new):
        if id(conv) in wrappers:
            _set_child(parent, key, wrappers[id(conv)])
    return len(wrappers)


def apply_weight_standardization(module: Any, n_last_layers_ignore: int = 0, *, inplace: bool | None = None):
    """Composer's ``apply_weight_standardization(module, n_last_layers_ignore=0) -> int``.

    A torch module is parametrized in place and the number of standardized convolutions returned, as Composer. An
    NNX module is cloned and ``(new_module, count)`` returned, or, with ``inplace=True``, edited in place and the
    count returned. Warns with :class:`NoEffectWarning` when no convolution was standardized.
    """
    n = _check_n(n_last_layers_ignore, "apply_weight_standardization")
    new, count = apply_surgery("WeightStandardization", module, lambda m: _apply_nnx(m, n, bool(inplace)),
                               who="apply_weight_standardization", n_last_layers_ignore=n)
    if count == 0:
        warnings.warn(NoEffectWarning(
            f"WeightStandardization did not change any layers of {type(module).__name__}: no convolution to "
            f"standardize (n_last_layers_ignore={n})."), stacklevel=2)
    if isinstance(module, nnx.Module) and not inplace:
        return new, count
    return count


def WeightStandardization(n_last_layers_ignore: int = 0) -> Method:
    """Composer's ``WeightStandardization(n_last_layers_ignore=0)`` as a :class:`Method` (``model`` slot)."""
    n = _check_n(n_last_layers_ignore, "WeightStandardization")

    def model_fn(task, ctx):  # in place, as Composer: the module the user passed is the trained one
        apply_weight_standardization(task.source, n, inplace=True)
        return task.with_model(task.source)

    return Method(name="WeightStandardization", model=model_fn,
                  description=f"WeightStandardization(n_last_layers_ignore={n})")


ENTRY = MethodEntry(registry_name="weight_standardization", factory=WeightStandardization,
                    functional=(apply_weight_standardization,))
