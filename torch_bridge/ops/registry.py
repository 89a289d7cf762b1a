"""The ATen -> jax.numpy op table.

A lowering is a plain function that receives a node's arguments the way the exported fx graph holds them: jax arrays
where the graph has tensors, Python values (ints, floats, lists, ``torch.dtype``, ``None``) elsewhere, and keyword
arguments by their ATen schema names. It returns a jax array, or a tuple/list of them for multi-output ops.
Random ops are registered with ``random=True`` and receive a fresh key as the keyword ``key`` (a pure function of
the caller's key and the node), so a bridged model owns no RNG state. Convolutions are registered with
``conv_layout=True`` and receive the model's convolution layout as the keyword ``conv_layout`` (``"NCHW"``, or
``"NHWC"`` for a module marked channels-last: ``torch_bridge.module.from_torch``).

Registration happens at import time, once, through ``@lower(...)``; a second registration of the same overload is
an error (two files claiming one op is a bug to surface, not to resolve by import order). Lookups try the exact
overload (``aten.add.Tensor``), then the overload packet (``aten.add``).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax.numpy as jnp
import numpy as np
import torch


@dataclasses.dataclass(frozen=True)
class Lowering:
    fn: Callable[..., Any]
    random: bool = False
    conv_layout: bool = False  # receives the model's convolution layout as the keyword ``conv_layout``


_TABLE: dict[Any, Lowering] = {}


def lower(*ops, random: bool = False, conv_layout: bool = False):
    """Register ``fn`` for each given ``torch.ops.aten`` overload or overload packet."""

    def register(fn):
        for op in ops:
            if op in _TABLE:
                raise RuntimeError(f"torch_bridge: {op} is lowered twice ({_TABLE[op].fn.__module__}."
                                   f"{_TABLE[op].fn.__name__} and {fn.__module__}.{fn.__name__})")
            _TABLE[op] = Lowering(fn, random, conv_layout)
        return fn

    return register


def lookup(target) -> Lowering | None:
    found = _TABLE.get(target)
    if found is None and isinstance(target, torch._ops.OpOverload):
        found = _TABLE.get(target.overloadpacket)
    return found


def supported(target) -> bool:
    return lookup(target) is not None


def registered_ops() -> list:
    return list(_TABLE)


_DTYPES = {
    torch.float32: jnp.float32, torch.float64: jnp.float32,  # x64 is off in JAX: float64 computes as float32
    torch.float16: jnp.float16, torch.bfloat16: jnp.bfloat16,
    torch.int64: jnp.int32, torch.int32: jnp.int32, torch.int16: jnp.int16, torch.int8: jnp.int8,
    torch.uint8: jnp.uint8, torch.bool: jnp.bool_,
    torch.complex64: jnp.complex64, torch.complex128: jnp.complex64,  # spectral ops' intermediates
}


def to_jnp_dtype(dtype: torch.dtype | None):
    """torch dtype -> jnp dtype; 64-bit types map to 32-bit ones since JAX runs with x64 off."""
    if dtype is None:
        return None
    if dtype not in _DTYPES:
        raise NotImplementedError(f"torch_bridge: dtype {dtype} has no JAX equivalent here")
    return _DTYPES[dtype]


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A torch tensor as numpy in the dtype JAX will hold it (64-bit narrowed, bfloat16 through float32)."""
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.float().numpy().astype(jnp.bfloat16)
    a = t.numpy()
    if a.dtype == np.float64:
        return a.astype(np.float32)
    if a.dtype == np.complex128:
        return a.astype(np.complex64)
    if a.dtype == np.int64:
        return a.astype(np.int32)
    return a


def core_aten_overloads() -> list:
    """Every ATen overload torch tags ``core`` (the "core ATen" opset: 190 in torch 2.13)."""
    found = []
    for name in dir(torch.ops.aten):
        packet = getattr(torch.ops.aten, name, None)
        if not isinstance(packet, torch._ops.OpOverloadPacket):
            continue
        for overload in packet.overloads():
            op = getattr(packet, overload)
            if torch.Tag.core in op.tags:
                found.append(op)
    return found
