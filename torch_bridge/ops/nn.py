"""Neural-network ATen ops: convolution, linear/matmul, normalization, embedding, attention, dropout, pooling, padding.

Layouts stay torch's (NCHW activations, OIHW weights), so a bridged state_dict needs no transposes. Explicit
reshapes replace implicit broadcasting because jaxcomposer runs JAX with rank promotion set to raise.

Mutating overloads (``_native_batch_norm_legit.default`` with its ``Tensor(a!)`` running stats) are deliberately not
lowered: ``run_decompositions`` functionalizes them away, and lowering them as pure functions would silently drop
the mutation (torchax's BatchNorm bug: running statistics that never update).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

import torch

from ..kernels import autotune
from .indexing import checked_rows
from .registry import lower, to_jnp_dtype

A = torch.ops.aten
_SPATIAL = {1: "H", 2: "HW", 3: "DHW"}


def _lead(v, ndim):
    """Left-pad ``v``'s shape with ones to ``ndim`` dims (explicit numpy broadcasting, rank promotion is off)."""
    return v.reshape((1,) * (ndim - v.ndim) + v.shape)


def _channel(v, ndim):
    """A per-channel ``(C,)`` vector shaped to broadcast against ``(N, C, *spatial)``."""
    return v.reshape((1, -1) + (1,) * (ndim - 2))


def _tuple(v, n):
    if isinstance(v, int):
        return (v,) * n
    v = tuple(v)
    return v * n if len(v) == 1 else v


def require_key(key, op: str):
    if key is None:
        raise ValueError(f"torch_bridge: {op} needs a PRNG key in train mode; pass key=jax.random.key(...) to apply")
    return key


def _stats_dtype(x):
    """Statistics in float32 for half inputs, as torch's CPU/CUDA kernels accumulate."""
    return jnp.float32 if x.dtype in (jnp.float16, jnp.bfloat16) else x.dtype


# --------------------------------------------------------------------------------------------- conv / linear
@lower(A.convolution.default, conv_layout=True)
def convolution(x, w, b, stride, padding, dilation, transposed, output_padding, groups, *, conv_layout="NCHW"):
    nd = w.ndim - 2
    unbatched = x.ndim == nd + 1
    x = x[None] if unbatched else x
    sp = _SPATIAL[nd]
    dn = ("NC" + sp, "OI" + sp, "NC" + sp)
    stride, dilation = _tuple(stride, nd), _tuple(dilation, nd)
    k = w.shape[2:]
    if transposed:  # gradient-of-conv form: dilate the input, flip the kernel, swap I/O inside each group
        padding, output_padding = _tuple(padding, nd), _tuple(output_padding, nd)
        pads = [(d * (ki - 1) - p, d * (ki - 1) - p + op)
                for ki, p, d, op in zip(k, padding, dilation, output_padding)]
        cin, cout_g = w.shape[:2]
        w = w.reshape((groups, cin // groups, cout_g) + k).swapaxes(1, 2).reshape((groups * cout_g, cin // groups) + k)
        w = jnp.flip(w, axis=tuple(range(2, 2 + nd)))
        y = _xla_conv(x, w, (1,) * nd, pads, lhs_dilation=stride, rhs_dilation=dilation, groups=groups,
                      conv_layout=conv_layout)
    else:
        pads = conv_pads(padding, k, dilation)
        chosen = autotune.choice(x, w, stride, pads, rhs_dilation=dilation, dimension_numbers=dn,
                                 feature_group_count=groups) if nd == 2 and x.dtype == w.dtype == jnp.float32 else None
        if chosen is not None and chosen.uses_onednn:
            # oneDNN on CPU where it measured faster for this shape (torch's own kernels; channels-last inside)
            y = autotune.convolve(chosen, x, w, stride, pads, rhs_dilation=dilation, dimension_numbers=dn,
                                  feature_group_count=groups)
        elif _depthwise_by_taps_applies(x, w, groups, pads, stride, dilation):
            y = _depthwise_by_taps(x, w, stride, pads, dilation)
        else:
            y = _xla_conv(x, w, stride, pads, rhs_dilation=dilation, groups=groups, conv_layout=conv_layout)
    if b is not None:
        y = y + _channel(b, y.ndim)
    return y[0] if unbatched else y


def conv_pads(padding, kernel: tuple, dilation: tuple) -> list[tuple[int, int]]:
    """torch's ``padding`` (``'valid'``, ``'same'``, an int or one per spatial dim) as lax's (low, high) pairs."""
    if padding == "valid":
        return [(0, 0)] * len(kernel)
    if padding == "same":  # torch puts the odd extra pixel on the right
        return [(d * (k - 1) // 2, d * (k - 1) - d * (k - 1) // 2) for k, d in zip(kernel, dilation)]
    return [(p, p) for p in _tuple(padding, len(kernel))]


def _xla_conv(x, w, stride, pads, *, lhs_dilation=None, rhs_dilation, groups, conv_layout):
    """``lax.conv_general_dilated`` of channels-first ``x`` (N, C, *spatial) and ``w`` (O, I, *spatial).

    ``conv_layout="NHWC"`` (the ChannelsLast method) convolves channels-last instead, as Flax does: the input
    becomes (N, *spatial, C) and the kernel (*spatial, I, O) before the call and the result goes back to
    channels-first after it. The values are the same; XLA folds the transposes into the neighbouring ops, and the
    convolution it sees asks for the channels-last layout GPU and TPU kernels prefer.
    """
    nd = w.ndim - 2
    sp = _SPATIAL[nd]
    if conv_layout == "NHWC":
        spatial = tuple(range(2, nd + 2))
        y = lax.conv_general_dilated(x.transpose((0,) + spatial + (1,)), w.transpose(spatial + (1, 0)), stride, pads,
                                     lhs_dilation=lhs_dilation, rhs_dilation=rhs_dilation,
                                     dimension_numbers=("N" + sp + "C", sp + "IO", "N" + sp + "C"),
                                     feature_group_count=groups)
        return y.transpose((0, nd + 1) + tuple(range(1, nd + 1)))
    return lax.conv_general_dilated(x, w, stride, pads, lhs_dilation=lhs_dilation, rhs_dilation=rhs_dilation,
                                    dimension_numbers=("NC" + sp, "OI" + sp, "NC" + sp), feature_group_count=groups)


def _out_size(size, pad, k, stride, dilation):
    return (size + pad[0] + pad[1] - dilation * (k - 1) - 1) // stride + 1


def _depthwise_by_taps_applies(x, w, groups, pads, stride, dilation) -> bool:
    """A batched 2-D depthwise convolution (one input channel per group, any channel multiplier) in float32/64 with
    at most 7x7 taps. bfloat16/float16 keep XLA's convolution, which accumulates in float32 as torch does."""
    if w.ndim != 4 or x.ndim != 4 or groups == 1 or groups != x.shape[1] or w.shape[1] != 1:
        return False
    if x.dtype not in (jnp.float32, jnp.float64) or w.shape[2] * w.shape[3] > 49:
        return False
    return all(_out_size(x.shape[2 + d], pads[d], w.shape[2 + d], stride[d], dilation[d]) > 0 for d in range(2))


def _depthwise_by_taps(x, w, stride, pads, dilation):
    """Depthwise 2-D convolution as a sum of ``kh * kw`` shifted, strided slices of the padded input, each times its
    tap's per-channel weight. XLA:CPU runs a convolution with one channel per group through a generic loop, which
    this outruns on MobileNet/EfficientNet shapes, forward and backward (benchmarks/bridge_depthwise.py)."""
    n, c, h, wd = x.shape
    multiplier = w.shape[0] // c
    if multiplier > 1:  # output channel o reads input channel o // multiplier
        x = jnp.repeat(x, multiplier, axis=1)
    kh, kw = w.shape[2:]
    ho, wo = (_out_size(size, pads[d], (kh, kw)[d], stride[d], dilation[d]) for d, size in enumerate((h, wd)))
    xp = jnp.pad(x, ((0, 0), (0, 0), tuple(pads[0]), tuple(pads[1])))
    y = None
    for i in range(kh):
        for j in range(kw):
            r, q = i * dilation[0], j * dilation[1]
            tap = lax.slice(xp, (0, 0, r, q), (xp.shape[0], xp.shape[1], r + (ho - 1) * stride[0] + 1,
                                              q + (wo - 1) * stride[1] + 1), (1, 1, stride[0], stride[1]))
            term = tap * w[:, 0, i, j][None, :, None, None]
            y = term if y is None else y + term
    return y


@lower(A.conv1d.default, A.conv1d.padding, A.conv2d.default, A.conv2d.padding, A.conv3d.default, A.conv3d.padding,
       conv_layout=True)
def conv(x, w, b=None, stride=1, padding=0, dilation=1, groups=1, *, conv_layout="NCHW"):
    return convolution(x, w, b, stride, padding, dilation, False, 0, groups, conv_layout=conv_layout)


@lower(A.conv_transpose1d.default, A.conv_transpose2d.input, A.conv_transpose3d.input, conv_layout=True)
def conv_transpose(x, w, b=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1, *, conv_layout="NCHW"):
    return convolution(x, w, b, stride, padding, dilation, True, output_padding, groups, conv_layout=conv_layout)


@lower(A.linear.default)
def linear(x, w, b=None):
    y = jnp.matmul(x, w.T)
    return y if b is None else y + _lead(b, y.ndim)


@lower(A.addmm.default)
def addmm(bias, m1, m2, *, beta=1, alpha=1):
    y = jnp.matmul(m1, m2)
    y = y if alpha == 1 else alpha * y
    return y + (beta * _lead(bias, 2) if beta != 1 else _lead(bias, 2))


@lower(A.mm.default, A.bmm.default, A.matmul.default)
def matmul(a, b):
    return jnp.matmul(a, b)


# --------------------------------------------------------------------------------------------- normalization
def _along(v, ndim, axis):
    """A per-channel ``(C,)`` vector shaped to broadcast along ``axis`` of an ``ndim``-d tensor."""
    return v.reshape(tuple(-1 if i == axis else 1 for i in range(ndim)))


def _batch_norm(x, weight, bias, mean, var, eps, channel_axis=1):
    xf = x.astype(_stats_dtype(x))
    # the weight folded into the per-channel factor: one multiply per element, not two, forward and backward
    # (a large share of a bridged CNN step's elementwise kernels, benchmarks/step_profile.py)
    factor = lax.rsqrt(var + eps) if weight is None else lax.rsqrt(var + eps) * weight
    out = (xf - _along(mean, x.ndim, channel_axis)) * _along(factor, x.ndim, channel_axis)
    if bias is not None:
        out = out + _along(bias, x.ndim, channel_axis)
    return out.astype(x.dtype)


def _batch_stats(x, channel_axis=1):
    axes = tuple(i for i in range(x.ndim) if i != channel_axis)
    xf = x.astype(_stats_dtype(x))
    # E[x^2] - E[x]^2 (as flax does): both moments in one fused pass over x, where jnp.var makes two passes
    mean, mean_sq = xf.mean(axes), lax.square(xf).mean(axes)
    return mean, jnp.maximum(mean_sq - lax.square(mean), 0.0), x.size // x.shape[channel_axis]


@lower(A._native_batch_norm_legit_functional.default)
def batch_norm_functional(x, weight, bias, running_mean, running_var, training, momentum, eps, *, channel_axis=1):
    """Returns (out, save_mean, save_rstd, new_running_mean, new_running_var) like torch.

    Normalization uses the biased batch variance; the running variance is updated with the unbiased one, as torch
    does. Running stats are stop-gradient: they are state, not part of the loss. ``channel_axis`` 3: ``x`` held
    channels-last (``torch_bridge.channels_last``).
    """
    if not training:
        out = _batch_norm(x, weight, bias, running_mean, running_var, eps, channel_axis)
        return out, running_mean, lax.rsqrt(running_var + eps), running_mean, running_var
    mean, var, n = _batch_stats(x, channel_axis)
    out = _batch_norm(x, weight, bias, mean, var, eps, channel_axis)
    m_stat, v_stat = lax.stop_gradient(mean), lax.stop_gradient(var * (n / max(n - 1, 1)))
    new_rm = ((1 - momentum) * running_mean + momentum * m_stat).astype(running_mean.dtype)
    new_rv = ((1 - momentum) * running_var + momentum * v_stat).astype(running_var.dtype)
    return out, mean, lax.rsqrt(var + eps), new_rm, new_rv


@lower(A._native_batch_norm_legit_no_training.default)
def batch_norm_no_training(x, weight, bias, running_mean, running_var, momentum, eps, *, channel_axis=1):
    out = _batch_norm(x, weight, bias, running_mean, running_var, eps, channel_axis)
    empty = jnp.zeros((0,), out.dtype)  # torch returns empty save_mean / save_rstd in eval
    return out, empty, empty


@lower(A._native_batch_norm_legit.no_stats)
def batch_norm_no_stats(x, weight, bias, training, momentum, eps):
    """BatchNorm with ``track_running_stats=False``: always batch statistics, no state."""
    mean, var, _ = _batch_stats(x)
    return _batch_norm(x, weight, bias, mean, var, eps), mean, lax.rsqrt(var + eps)


@lower(A.native_layer_norm.default)
def native_layer_norm(x, normalized_shape, weight, bias, eps):
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    xf = x.astype(_stats_dtype(x))
    mean = xf.mean(axes, keepdims=True)
    rstd = lax.rsqrt(xf.var(axes, keepdims=True) + eps)
    out = (xf - mean) * rstd
    if weight is not None:
        out = out * _lead(weight, x.ndim)
    if bias is not None:
        out = out + _lead(bias, x.ndim)
    return out.astype(x.dtype), mean, rstd


@lower(A.layer_norm.default)
def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5, cudnn_enable=True):
    return native_layer_norm(x, normalized_shape, weight, bias, eps)[0]


@lower(A.native_group_norm.default)
def native_group_norm(x, weight, bias, N, C, HxW, group, eps):
    xf = x.astype(_stats_dtype(x)).reshape((N, group, -1))
    mean = xf.mean(-1, keepdims=True)
    rstd = lax.rsqrt(xf.var(-1, keepdims=True) + eps)
    out = ((xf - mean) * rstd).reshape(x.shape)
    if weight is not None:
        out = out * _channel(weight, x.ndim)
    if bias is not None:
        out = out + _channel(bias, x.ndim)
    return out.astype(x.dtype), mean[..., 0], rstd[..., 0]


@lower(A.group_norm.default)
def group_norm(x, num_groups, weight=None, bias=None, eps=1e-5, cudnn_enabled=True):
    n, c = x.shape[:2]
    return native_group_norm(x, weight, bias, n, c, math.prod(x.shape[2:]), num_groups, eps)[0]


@lower(A.embedding.default)
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    if scale_grad_by_freq:
        raise NotImplementedError("torch_bridge: embedding(scale_grad_by_freq=True) is not lowered")
    out = jnp.take(weight, checked_rows(indices, weight.shape[0], "embedding"), axis=0)  # NaN rows if out of range
    if padding_idx is not None and padding_idx >= 0:  # torch gives the padding row no gradient
        pad = (indices == padding_idx)[..., None]
        out = jnp.where(pad, lax.stop_gradient(out), out)
    return out


# --------------------------------------------------------------------------------------------- dropout
def _dropout(x, p, key, op):
    if p == 0:
        return x, jnp.ones(x.shape, jnp.bool_)
    if p >= 1:
        return jnp.zeros_like(x), jnp.zeros(x.shape, jnp.bool_)
    keep = jax.random.bernoulli(require_key(key, op), 1.0 - p, x.shape)
    return jnp.where(keep, x / (1.0 - p), 0).astype(x.dtype), keep


@lower(A.native_dropout.default, random=True)
def native_dropout(x, p, train=None, *, key=None):
    """(out, keep_mask): mask ~ Bernoulli(1-p), kept values scaled by 1/(1-p); ``train=None`` means training."""
    if train is False:
        return x, jnp.ones(x.shape, jnp.bool_)
    return _dropout(x, p, key, "native_dropout")


@lower(A.dropout.default, random=True)
def dropout(x, p, train, *, key=None):
    return _dropout(x, p, key, "dropout")[0] if train else x


# --------------------------------------------------------------------------------------------- attention
@lower(A.scaled_dot_product_attention.default, random=True)
def scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None,
                                 enable_gqa=False, key=None):
    """torch (B, H, T, D) -> ``jax.nn.dot_product_attention`` (B, T, H, D); a 3-D input is one head.

    ``key`` is the PRNG key (the registry's convention); torch's ``key`` tensor arrives positionally as ``k``.
    jax.nn.dot_product_attention has no dropout, so ``dropout_p > 0`` takes an explicit softmax path.
    Grouped K/V heads (``enable_gqa``) map query head n to kv head n // (Hq/Hkv) in both libraries.
    """
    three_d = q.ndim == 3
    if three_d:
        q, k, v = q[:, None], k[:, None], v[:, None]
    b, hq, t, d = q.shape
    s = k.shape[2]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    mask = bias = valid = None
    if attn_mask is not None:
        m = jnp.broadcast_to(_lead(attn_mask, 4), (b, hq, t, s))
        mask, bias = (m, None) if m.dtype == jnp.bool_ else (None, m.astype(q.dtype))
        # torch returns zeros for a query row whose keys are all masked (left padding in HF models); JAX would
        # average the values uniformly there (its masked logits are finite), so such rows are zeroed explicitly.
        valid = (m if mask is not None else m > -jnp.inf).any(-1, keepdims=True)
    if dropout_p > 0:
        out = _attention_with_dropout(q, k, v, mask, bias, is_causal, scale, dropout_p, key)
    else:
        out = jax.nn.dot_product_attention(q.swapaxes(1, 2), k.swapaxes(1, 2), v.swapaxes(1, 2), bias=bias,
                                           mask=mask, scale=scale, is_causal=is_causal).swapaxes(1, 2)
    if valid is not None:
        out = jnp.where(valid, out, jnp.zeros((), out.dtype))
    return out[:, 0] if three_d else out


def _attention_with_dropout(q, k, v, mask, bias, is_causal, scale, p, key):
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k, v = jnp.repeat(k, group, axis=1), jnp.repeat(v, group, axis=1)
    logits = jnp.einsum("bhtd,bhsd->bhts", q, k).astype(jnp.float32) * scale
    if bias is not None:
        logits = logits + bias.astype(jnp.float32)
    if mask is not None:
        logits = jnp.where(mask, logits, -jnp.inf)
    if is_causal:
        logits = jnp.where(jnp.tril(jnp.ones(logits.shape[-2:], jnp.bool_))[None, None], logits, -jnp.inf)
    # a fully masked row would softmax to NaN (and NaN gradients); its output is zeroed by the caller
    logits = jnp.where(jnp.isneginf(logits).all(-1, keepdims=True), jnp.zeros((), logits.dtype), logits)
    probs = _dropout(jax.nn.softmax(logits, axis=-1).astype(q.dtype), p, key, "scaled_dot_product_attention")[0]
    return jnp.einsum("bhts,bhsd->bhtd", probs, v)


# --------------------------------------------------------------------------------------------- activations
lower(A.relu.default)(jax.nn.relu)
lower(A.silu.default)(jax.nn.silu)
lower(A.sigmoid.default)(jax.nn.sigmoid)
lower(A.tanh.default)(jnp.tanh)
lower(A.mish.default)(jax.nn.mish)


@lower(A.gelu.default)
def gelu(x, *, approximate="none"):
    return jax.nn.gelu(x, approximate=approximate == "tanh")


@lower(A.hardtanh.default)
def hardtanh(x, min_val=-1.0, max_val=1.0):
    return jnp.clip(x, min_val, max_val)


@lower(A.leaky_relu.default)
def leaky_relu(x, negative_slope=0.01):
    return jnp.where(x > 0, x, x * negative_slope)


@lower(A.elu.default)
def elu(x, alpha=1.0, scale=1.0, input_scale=1.0):
    return jnp.where(x > 0, scale * x, (scale * alpha) * jnp.expm1(x * input_scale))


@lower(A.hardswish.default)
def hardswish(x):
    return x * jnp.clip(x + 3.0, 0.0, 6.0) / 6.0


@lower(A.hardsigmoid.default)
def hardsigmoid(x):
    return jnp.clip(x + 3.0, 0.0, 6.0) / 6.0


@lower(A.softplus.default)
def softplus(x, beta=1.0, threshold=20.0):
    return jnp.where(x * beta > threshold, x, jnp.log1p(jnp.exp(x * beta)) / beta)


@lower(A._softmax.default)
def _softmax(x, dim, half_to_float):
    return jax.nn.softmax(x.astype(jnp.float32) if half_to_float else x, axis=dim)


@lower(A._log_softmax.default)
def _log_softmax(x, dim, half_to_float):
    return jax.nn.log_softmax(x.astype(jnp.float32) if half_to_float else x, axis=dim)


@lower(A.softmax.int)
def softmax(x, dim, dtype=None):
    return jax.nn.softmax(x if dtype is None else x.astype(to_jnp_dtype(dtype)), axis=dim)


@lower(A.log_softmax.int)
def log_softmax(x, dim, dtype=None):
    return jax.nn.log_softmax(x if dtype is None else x.astype(to_jnp_dtype(dtype)), axis=dim)
