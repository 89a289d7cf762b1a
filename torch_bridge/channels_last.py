"""Run a bridged graph's 2-D convolution nets channels-last, transposing only where the graph leaves them.

torch's graphs are NCHW. Convolving NCHW means a transpose into the kernel's channels-last layout and one back
around every convolution (oneDNN's fast layouts and the GPU's are NHWC), and XLA cannot move those transposes
through the BatchNorm, ReLU and residual adds between convolutions, so the transposes take a sizeable share of a
small CNN's CPU step (benchmarks/channels_last.py). Here the interpreter instead carries a 4-D activation as
:class:`ChannelsLast` (the same NCHW tensor, held as NHWC) from the convolution that makes it, through the ops that
do not care about the layout, to the first op that does; only there is it transposed back (:func:`to_nchw`).

Ops that take and give channels-last tensors: 2-D convolutions (not transposed), BatchNorm in training and eval,
pointwise ops (``torch.Tag.pointwise``, and ``type_as`` / ``_to_copy`` / ``clone``; any operand that broadcasts
against the channels-last one), max and average pooling, ``mean`` with ``keepdim`` (a channels-first LayerNorm's;
``adaptive_avg_pool2d`` to 1x1 is one), while the global average pool without it (``mean`` over H and W) gives a
plain (N, C); ``permute`` reads the data in place (ConvNeXt's ``permute(0, 2, 3, 1)`` to run its LayerNorm and MLP
channels-last is no transpose at all, and the ``permute(0, 3, 1, 2)`` back makes a channels-last tensor again), and
``cat`` of 4-D tensors joins their data. Every other op gets NCHW arrays, as before. Values are the same as the NCHW
graph's up to float rounding (a BatchNorm's sums run in another order).
"""
from __future__ import annotations

import dataclasses
import operator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import torch

from .kernels import autotune
from .ops import nn as nn_ops
from .ops import nn_pool
from .ops.reduction import mean_dim
from .ops.registry import lookup

A = torch.ops.aten
_TO_NHWC, _TO_NCHW = (0, 2, 3, 1), (0, 3, 1, 2)
DECLINED = object()  # a handler's answer for "not this call": the op runs on NCHW arrays


@dataclasses.dataclass(frozen=True)
class ChannelsLast:
    """An NCHW tensor held as NHWC (``data``); ``shape`` is the logical (NCHW) one, as torch's graph sees it."""
    data: jax.Array

    @property
    def shape(self) -> tuple:
        n, h, w, c = self.data.shape
        return (n, c, h, w)

    @property
    def dtype(self):
        return self.data.dtype

    ndim = 4


def to_nchw(value: Any) -> Any:
    """``value`` with every :class:`ChannelsLast` inside it (tuples, lists) transposed back to NCHW."""
    if isinstance(value, ChannelsLast):
        return value.data.transpose(_TO_NCHW)
    if isinstance(value, (list, tuple)):
        return type(value)(to_nchw(v) for v in value)
    if isinstance(value, dict):
        return {k: to_nchw(v) for k, v in value.items()}
    return value


def _physical(x) -> jax.Array:
    """An operand as NHWC: a ChannelsLast's data, or a plain array broadcasting against NCHW: one of fewer dims
    (a per-channel ``(C, 1, 1)``) aligns with the trailing ones, so it is padded to 4-D first, as numpy would."""
    if isinstance(x, ChannelsLast):
        return x.data
    return x.reshape((1,) * (4 - x.ndim) + tuple(x.shape)).transpose(_TO_NHWC)


def _has_channels_last(args) -> bool:
    return any(isinstance(a, ChannelsLast) or (isinstance(a, (list, tuple)) and _has_channels_last(a))
               for a in args)


# ------------------------------------------------------------------------------------------------ handlers
def _conv(x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
    if getattr(w, "ndim", 0) != 4 or len(x.shape) != 4 or isinstance(w, ChannelsLast) or isinstance(b, ChannelsLast):
        return DECLINED
    xp = _physical(x)
    stride, dilation = nn_ops._tuple(stride, 2), nn_ops._tuple(dilation, 2)
    pads = nn_ops.conv_pads(padding, w.shape[2:], dilation)
    whwio = w.transpose(2, 3, 1, 0)
    dn = ("NHWC", "HWIO", "NHWC")
    chosen = autotune.choice(xp, whwio, stride, pads, rhs_dilation=dilation, dimension_numbers=dn,
                             feature_group_count=groups) if xp.dtype == jnp.float32 else None
    if chosen is not None and chosen.uses_onednn:
        y = autotune.convolve(chosen, xp, whwio, stride, pads, rhs_dilation=dilation, dimension_numbers=dn,
                              feature_group_count=groups)
    elif nn_ops._depthwise_by_taps_applies(x, w, groups, pads, stride, dilation):
        return DECLINED  # the NCHW lowering's shifted-slices depthwise beats XLA:CPU's grouped convolution
    else:
        y = lax.conv_general_dilated(xp, whwio, stride, pads, rhs_dilation=dilation, dimension_numbers=dn,
                                     feature_group_count=groups)
    if b is not None:
        y = y + b.reshape(1, 1, 1, -1)
    return ChannelsLast(y)


def _convolution(x, w, b, stride, padding, dilation, transposed, output_padding, groups):
    if transposed:
        return DECLINED
    return _conv(x, w, b, stride, padding, dilation, groups)


def _batch_norm_functional(x, weight, bias, running_mean, running_var, training, momentum, eps):
    if not isinstance(x, ChannelsLast) or _has_channels_last((weight, bias, running_mean, running_var)):
        return DECLINED
    out, *rest = nn_ops.batch_norm_functional(x.data, weight, bias, running_mean, running_var, training, momentum,
                                              eps, channel_axis=3)
    return (ChannelsLast(out), *rest)


def _batch_norm_no_training(x, weight, bias, running_mean, running_var, momentum, eps):
    if not isinstance(x, ChannelsLast) or _has_channels_last((weight, bias, running_mean, running_var)):
        return DECLINED
    out, *rest = nn_ops.batch_norm_no_training(x.data, weight, bias, running_mean, running_var, momentum, eps,
                                               channel_axis=3)
    return (ChannelsLast(out), *rest)


def _nhwc(t: tuple) -> tuple:
    """A per-axis tuple in NCHW order (window, strides, pads) in the NHWC data's order."""
    return tuple(t[i] for i in _TO_NHWC)


def _window(x, kernel_size, stride, padding, dilation, ceil_mode):
    """The pooling window of ``x``, worked out on its NCHW shape as the NCHW lowering does (NCHW order)."""
    return nn_pool._window(jax.ShapeDtypeStruct(x.shape, x.dtype), 2, kernel_size, stride, padding, dilation,
                           ceil_mode)


def _max_pool2d(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    if not isinstance(x, ChannelsLast):
        return DECLINED
    win, strides, pads, dil = map(_nhwc, _window(x, kernel_size, stride, padding, dilation, ceil_mode))
    return ChannelsLast(lax.reduce_window(x.data, nn_pool._lowest(x.dtype), lax.max, win, strides, pads,
                                          window_dilation=dil))


def _avg_pool2d(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
                divisor_override=None):
    if not isinstance(x, ChannelsLast):
        return DECLINED
    win, strides, pads, _ = _window(x, kernel_size, stride, padding, 1, ceil_mode)
    total = lax.reduce_window(x.data, np.array(0, x.dtype), lax.add, _nhwc(win), _nhwc(strides), _nhwc(pads))
    if divisor_override:
        return ChannelsLast(total / divisor_override)
    count = nn_pool.avg_pool_divisor(x.shape[2:], x.dtype, win[2:], strides[2:], pads[2:], count_include_pad)
    return ChannelsLast(total / count.reshape((1,) + count.shape + (1,)))


def _mean_dim(x, dim, keepdim=False, dtype=None):
    """With ``keepdim`` the mean stays channels-last (over any dims: a channels-first LayerNorm's mean over C too);
    without it, only the global average pool (H and W) is taken here, giving a plain (N, C)."""
    if not isinstance(x, ChannelsLast) or dim is None:
        return DECLINED
    axes = sorted({d % 4 for d in dim})
    if keepdim:
        return ChannelsLast(mean_dim(x.data, [_PHYSICAL_AXIS[d] for d in axes], keepdim=True, dtype=dtype))
    if axes != [2, 3]:
        return DECLINED
    return mean_dim(x.data, [1, 2], keepdim=False, dtype=dtype)  # (N, C): the same tensor in either layout


def _adaptive_avg_pool2d(x, output_size):
    if not isinstance(x, ChannelsLast) or tuple(nn_ops._tuple(output_size, 2)) != (1, 1):
        return DECLINED
    return _mean_dim(x, [2, 3], keepdim=True)


_PHYSICAL_AXIS = (0, 3, 1, 2)  # where each NCHW axis lies in the NHWC data


def _permute(x, dims):
    """ConvNeXt's ``x.permute(0, 2, 3, 1)`` of a channels-last tensor is its data as it is, and the
    ``permute(0, 3, 1, 2)`` back of a plain NHWC tensor is that tensor held channels-last: no data moves."""
    dims = tuple(d % 4 for d in dims) if len(x.shape) == 4 else None
    if isinstance(x, ChannelsLast):
        return x.data.transpose(tuple(_PHYSICAL_AXIS[d] for d in dims))
    if dims == _TO_NCHW:
        return ChannelsLast(x)
    return DECLINED


def _cat(tensors, dim=0):
    """Concatenation of 4-D tensors (DenseNet's and Inception's along channels, a U-Net's skips) stays
    channels-last, along the dim's place in the NHWC data."""
    if not any(isinstance(t, ChannelsLast) for t in tensors) or any(len(t.shape) != 4 for t in tensors):
        return DECLINED
    dtype = jnp.result_type(*(t.dtype for t in tensors))
    return ChannelsLast(jnp.concatenate([_physical(t).astype(dtype) for t in tensors], axis=_PHYSICAL_AXIS[dim % 4]))


_LAYOUT_FREE = {A.type_as.default, A._to_copy.default, A.clone.default}


def _pointwise(target, args, kwargs):
    """A pointwise op on channels-last operands: the same op on their NHWC data."""
    if any(isinstance(v, ChannelsLast) for v in kwargs.values()):
        return DECLINED
    if any(getattr(a, "ndim", 0) > 4 for a in args):
        return DECLINED
    lowering = lookup(target)
    if lowering is None or lowering.random:  # a random op would need its key: the interpreter's path gives it
        return DECLINED
    physical = [_physical(a) if getattr(a, "ndim", 0) else a for a in args]
    out = lowering.fn(*physical, **kwargs)
    if getattr(out, "ndim", 0) != 4:
        return DECLINED
    return ChannelsLast(out)


HANDLERS = {
    A.conv2d.default: _conv, A.conv2d.padding: _conv, A.convolution.default: _convolution,
    A._native_batch_norm_legit_functional.default: _batch_norm_functional,
    A._native_batch_norm_legit_no_training.default: _batch_norm_no_training,
    A.max_pool2d.default: _max_pool2d, A.avg_pool2d.default: _avg_pool2d, A.mean.dim: _mean_dim,
    A.adaptive_avg_pool2d.default: _adaptive_avg_pool2d, A._adaptive_avg_pool2d.default: _adaptive_avg_pool2d,
    A.permute.default: _permute, A.cat.default: _cat,
}
_ON_PLAIN_INPUTS = (A.conv2d.default, A.conv2d.padding, A.convolution.default, A.permute.default)


def run(target, args, kwargs) -> Any:
    """The op's result, with channels-last values, where this module handles the op; else ``DECLINED``."""
    if target is operator.getitem and isinstance(args[0], (tuple, list)):  # one result of a multi-output op
        return operator.getitem(*args)
    handler = HANDLERS.get(target)
    if handler is not None:
        if target in _ON_PLAIN_INPUTS or _has_channels_last(args):
            return handler(*args, **kwargs)
        return DECLINED
    if not _has_channels_last(args):
        return DECLINED
    if target in _LAYOUT_FREE or torch.Tag.pointwise in getattr(target, "tags", ()):
        return _pointwise(target, args, kwargs)
    return DECLINED

