"""Logical sharding annotations for the native models, ready for meshes.

Each model class names the logical axes of its parameters in a ``PARTITION_RULES`` class attribute: pairs of a
regular expression, matched in full against the parameter's path joined by ``/`` (``blocks/3/attn/qkv/kernel``),
and one logical axis name (or None) per dimension. The first matching rule wins. The names say what a dimension
*is*, not where it goes:

============  ====================================================================
``vocab``     the token vocabulary (embedding rows, LM-head columns)
``embed``     the model width (d_model, the residual stream)
``mlp``       the feed-forward hidden width
``heads``     attention heads times head size (q, k, v outputs; the output projection's input)
``conv_in``   a convolution's input channels
``conv_out``  a convolution's output channels (and the BatchNorm that follows it)
``classes``   a classifier head's outputs
``positions`` position-embedding rows
============  ====================================================================

A mesh layout then maps names to mesh axes (``rules``: e.g. ``{"embed": "fsdp", "mlp": "tensor", "heads":
"tensor"}``); unnamed dimensions, and names the rules leave out, are replicated. Rules are read from the model, so
surgery that adds parameters must also be covered by a rule or is replicated (``partition_specs`` reports
unmatched paths).
"""
from __future__ import annotations

import re
from typing import Any, Mapping

import jax
from flax import nnx
from jax.sharding import PartitionSpec

LOGICAL_AXES = ("vocab", "embed", "mlp", "heads", "conv_in", "conv_out", "classes", "positions")


def _rules_of(model: nnx.Module) -> tuple[tuple[str, tuple[str | None, ...]], ...]:
    rules = getattr(type(model), "PARTITION_RULES", None)
    if rules is None:
        raise TypeError(f"{type(model).__name__} has no PARTITION_RULES: its parameters carry no logical axes. "
                        "Add the class attribute (see jaxcomposer.models.sharding).")
    return rules


def logical_axes(model: nnx.Module, *, strict: bool = True) -> dict[str, tuple[str | None, ...]]:
    """``{'blocks/0/attn/qkv/kernel': ('embed', 'heads'), ...}`` for every parameter and batch statistic.

    ``strict``: raise ``ValueError`` naming the paths no rule matches, or whose rule has the wrong rank, instead
    of replicating them silently.
    """
    rules = [(re.compile(pattern), axes) for pattern, axes in _rules_of(model)]
    out, unmatched, wrong_rank = {}, [], []
    for path, var in nnx.to_flat_state(nnx.state(model)):
        name = "/".join(map(str, path))
        ndim = len(var.get_value().shape)
        axes = next((a for r, a in rules if r.fullmatch(name)), None)
        if axes is None:
            unmatched.append(name)
            axes = (None,) * ndim
        elif len(axes) != ndim:
            wrong_rank.append(f"{name}: {ndim} dims, rule gives {axes}")
        bad = [a for a in axes if a is not None and a not in LOGICAL_AXES]
        if bad:
            raise ValueError(f"{type(model).__name__}.PARTITION_RULES: unknown logical axes {bad} for {name}; "
                             f"known: {LOGICAL_AXES}.")
        out[name] = tuple(axes)
    if strict and (unmatched or wrong_rank):
        raise ValueError(f"{type(model).__name__}.PARTITION_RULES: unmatched parameters {unmatched}; "
                         f"rank mismatches {wrong_rank}.")
    return out


def partition_specs(model: nnx.Module, rules: Mapping[str, str | tuple[str, ...] | None], *,
                    strict: bool = True) -> Any:
    """The ``nnx.State`` of ``model`` with a ``PartitionSpec`` in place of each value: logical axes mapped to mesh
    axes by ``rules`` (``{"embed": "fsdp", "mlp": "tensor"}``); a mesh axis is used at most once per parameter
    (a later dimension asking for an axis already taken is replicated)."""
    axes = logical_axes(model, strict=strict)
    state = nnx.state(model)

    def spec(path, _):
        used, dims = set(), []
        for logical in axes["/".join(map(str, path))]:
            mesh_axis = rules.get(logical) if logical is not None else None
            flat = (mesh_axis,) if isinstance(mesh_axis, str) else tuple(mesh_axis or ())
            if mesh_axis is None or used & set(flat):
                dims.append(None)
            else:
                used |= set(flat)
                dims.append(mesh_axis)
        return PartitionSpec(*dims)

    return nnx.map_state(spec, state)


def named_shardings(model: nnx.Module, mesh: jax.sharding.Mesh, rules: Mapping[str, Any], **kw) -> Any:
    """:func:`partition_specs` as ``NamedSharding``s on ``mesh``, for ``jax.device_put`` or jit's shardings."""
    return jax.tree.map(lambda p: jax.sharding.NamedSharding(mesh, p), partition_specs(model, rules, **kw),
                        is_leaf=lambda x: isinstance(x, PartitionSpec))
