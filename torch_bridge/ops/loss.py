"""Loss ATen ops: cross entropy / NLL, the regression losses, binary cross entropy, KL divergence, margin losses.

``torch.export`` followed by ``run_decompositions({})`` keeps ``torch.nn.functional``'s losses as single ATen ops
(``F.cross_entropy`` -> ``cross_entropy_loss``, ``F.nll_loss`` -> ``nll_loss_nd``, ``F.mse_loss`` ->
``broadcast_tensors`` + ``mse_loss``, ...), so a module whose forward returns its loss (Composer's
``ComposerModel.loss``, a Hugging Face model given ``labels``) needs these lowerings.

Each one follows the formula of torch's kernel (``aten/src/ATen/native/Loss*.cpp``), not a textbook one:

- ``reduction`` is ATen's enum: 0 none, 1 mean, 2 sum.
- NLL-style losses skip targets equal to ``ignore_index`` in both the numerator and the denominator of the mean,
  and with a class ``weight`` the mean is weighted: ``sum(-w[t] * logp[t]) / sum(w[t])`` over the kept targets
  (0 / 0 = NaN when every target is ignored, as in torch, whose gradient is then zero, as here).
- ``label_smoothing`` is torch's: ``(1 - eps) * nll + eps / C * smooth``, ``smooth`` the (weighted) negative sum of
  the log-probabilities over classes, zero at ignored targets, its mean normalized like the NLL's. With
  probability targets (input and target of one shape) the target becomes ``t * (1 - eps) + eps / C`` and the mean
  divides by the number of samples, never by the weights.
- Result dtypes are torch's, including its in-place quirks: most losses promote their inputs, while ``huber_loss``,
  ``soft_margin_loss``, ``binary_cross_entropy`` and ``hinge_embedding_loss`` keep the input's dtype and
  ``binary_cross_entropy_with_logits`` the target's. Half-precision inputs are computed in float32 and rounded once.
- Gradients equal torch's: ignored targets and masked branches go through ``jnp.where`` with finite values on both
  sides (no NaN from an unused branch), ``clamp_min(0)`` passes the gradient at exactly 0 as torch's does, and
  ``binary_cross_entropy`` carries torch's backward formula ``(x - t) / max(x (1 - x), 1e-12)`` (finite at 0 and 1).

Broadcasting is explicit (``same_rank``) because jaxcomposer runs JAX with rank promotion set to raise. Invalid
input that torch rejects at run time (a class index out of range, a probability outside [0, 1]) cannot raise
under ``jax.jit`` and is not checked here.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import torch

from .elementwise import opmath, result_dtype, same_rank
from .reduction import linalg_vector_norm
from .registry import lower

A = torch.ops.aten

_NONE, _MEAN, _SUM = 0, 1, 2


def _reduce(loss, reduction: int):
    """torch's ``apply_loss_reduction``: none / mean over every element / sum."""
    if reduction == _NONE:
        return loss
    if reduction == _MEAN:
        return jnp.mean(loss)
    if reduction == _SUM:
        return jnp.sum(loss)
    raise ValueError(f"torch_bridge: unknown loss reduction {reduction!r} (0 none, 1 mean, 2 sum)")


def _operands(*xs, dtype=None):
    """The tensors at one rank, cast to the compute type (float32 for half) of ``dtype`` or of their promotion;
    returns ``(cast tensors..., result dtype)``. ``None`` entries stay ``None``."""
    dtype = result_dtype(*xs) if dtype is None else jnp.dtype(dtype)
    compute = opmath(dtype)
    return (*(None if x is None else x.astype(compute) for x in same_rank(*xs)), dtype)


def _clamp_min0(v):
    """``v.clamp_min(0)`` with torch's gradient: 1 where ``v >= 0`` (jnp.maximum would give 0.5 at the tie)."""
    return jnp.where(v >= 0, v, jnp.zeros((), v.dtype))


# --------------------------------------------------------------------------------------------- broadcast_tensors
@lower(A.broadcast_tensors.default)
def broadcast_tensors(tensors):
    """Every tensor at the common shape, dtypes unchanged; the graph unpacks the list with ``getitem``.

    ``F.mse_loss``/``l1_loss``/``smooth_l1_loss``/``huber_loss`` emit it before the loss op.
    """
    return list(jnp.broadcast_arrays(*same_rank(*tensors)))


# --------------------------------------------------------------------------------------------- NLL / cross entropy
def _class_dim(x) -> int:
    return 0 if x.ndim == 1 else 1


def _along_classes(v, ndim):
    """A per-class ``(C,)`` vector shaped to broadcast against ``(N, C, *d)`` (or ``(C,)`` unbatched)."""
    return v if ndim == 1 else v.reshape((1, -1) + (1,) * (ndim - 2))


def _log_softmax(x, dim):
    """torch's ``log_softmax(x, dim, x.dtype)``: a half input computes in float32 and its output rounds to half."""
    return jax.nn.log_softmax(x.astype(opmath(x.dtype)), axis=dim).astype(x.dtype)


def _target_weights(target, weight, ignore_index, compute):
    """(kept mask, class indices safe to gather with, per-target weight: ``weight[t]``, 1 without, 0 if ignored)."""
    target = target.astype(jnp.int32)  # uint8 targets too; compare with a negative ignore_index safely
    kept = target != ignore_index
    safe = jnp.where(kept, target, 0)
    w = jnp.ones(target.shape, compute) if weight is None else jnp.take(weight.astype(compute), safe, axis=0)
    return kept, safe, jnp.where(kept, w, jnp.zeros((), compute))


def _nll(logp, target, weight, reduction, ignore_index):
    """torch's ``nll_loss_forward`` for any rank, in the compute dtype: ``(output, total_weight)``.

    ``logp`` is ``(C,)`` with a 0-dim target or ``(N, C, *d)`` with an ``(N, *d)`` target. ``total_weight`` is the
    sum of the kept targets' weights; with ``reduction=none`` torch reports it as 0 for batched input.
    """
    compute = opmath(logp.dtype)
    kept, safe, w = _target_weights(target, weight, ignore_index, compute)
    if logp.ndim == 1:
        picked = jnp.take(logp, safe, axis=0)
    else:
        picked = jnp.take_along_axis(logp, safe[:, None], axis=1)[:, 0]
    # where, not a product with the zero weight: an ignored row's picked value may be -inf (its gradient NaN)
    losses = jnp.where(kept, -picked.astype(compute) * w, jnp.zeros((), compute))
    total = jnp.sum(w)
    if reduction == _NONE:
        return losses, total if logp.ndim == 1 else jnp.zeros((), compute)
    if reduction == _SUM:
        return jnp.sum(losses), total
    if reduction == _MEAN:
        return jnp.sum(losses) / total, total
    raise ValueError(f"torch_bridge: unknown loss reduction {reduction!r} (0 none, 1 mean, 2 sum)")


@lower(A.nll_loss_nd.default, A.nll_loss.default, A.nll_loss2d.default)
def nll_loss_nd(self, target, weight=None, reduction=_MEAN, ignore_index=-100):
    """``F.nll_loss`` on ``(C,)``, ``(N, C)`` or ``(N, C, d1, ...)`` log-probabilities."""
    return _nll(self, target, weight, reduction, ignore_index)[0].astype(self.dtype)


@lower(A.nll_loss_forward.default, A.nll_loss2d_forward.default)
def nll_loss_forward(self, target, weight=None, reduction=_MEAN, ignore_index=-100):
    """``(output, total_weight)``, both of the input's dtype."""
    out, total = _nll(self, target, weight, reduction, ignore_index)
    return out.astype(self.dtype), total.astype(self.dtype)


@lower(A.cross_entropy_loss.default)
def cross_entropy_loss(self, target, weight=None, reduction=_MEAN, ignore_index=-100, label_smoothing=0.0):
    """``F.cross_entropy``: class indices (``(N, *d)`` target) or class probabilities (target shaped as the input).

    Follows torch's ``cross_entropy_loss_symint``: probability targets when the shapes are equal, else
    ``nll_loss_nd(log_softmax(x))`` plus the label-smoothing term when ``label_smoothing > 0``.
    """
    dim = _class_dim(self)
    n_classes = self.shape[dim]
    logp = _log_softmax(self, dim)
    if tuple(self.shape) == tuple(target.shape):
        return _cross_entropy_probs(logp, target, weight, reduction, label_smoothing, dim)
    nll, _ = _nll(logp, target, weight, reduction, ignore_index)
    if label_smoothing <= 0:
        return nll.astype(self.dtype)
    compute = opmath(self.dtype)
    kept, _, w = _target_weights(target, weight, ignore_index, compute)
    lp = logp.astype(compute)
    if weight is not None:
        lp = lp * _along_classes(weight.astype(compute), lp.ndim)
    smooth = jnp.where(kept, -jnp.sum(lp, axis=dim), jnp.zeros((), compute))
    if reduction == _MEAN:  # normalized like the NLL: by the kept targets' weights, or their count
        smooth = jnp.sum(smooth) / (jnp.sum(w) if weight is not None else jnp.sum(kept))
    else:
        smooth = _reduce(smooth, reduction)
    return ((1 - label_smoothing) * nll + smooth * (label_smoothing / n_classes)).astype(self.dtype)


def _cross_entropy_probs(logp, target, weight, reduction, label_smoothing, dim):
    """torch's ``cross_entropy_loss_prob_target``: ``-sum(logp * t * w)``; its mean divides by N * d1 * ...."""
    if not jnp.issubdtype(target.dtype, jnp.floating):
        raise TypeError("torch_bridge: cross_entropy with a target shaped like the input needs class probabilities "
                        f"(a floating target), got {target.dtype} (as in torch)")
    n_classes = logp.shape[dim]
    dtype = result_dtype(logp, target, weight)
    compute = opmath(dtype)
    t = target.astype(compute)
    if label_smoothing > 0:
        t = t * (1 - label_smoothing) + label_smoothing / n_classes
    prod = logp.astype(compute) * t
    if weight is not None:
        prod = prod * _along_classes(weight.astype(compute), prod.ndim)
    if reduction == _NONE:
        out = -jnp.sum(prod, axis=dim)
    elif reduction == _SUM:
        out = -jnp.sum(prod)
    elif reduction == _MEAN:
        samples = prod.size // n_classes if n_classes else 0
        out = -jnp.sum(prod) / samples if samples else jnp.full((), jnp.nan, compute)
    else:
        raise ValueError(f"torch_bridge: unknown loss reduction {reduction!r} (0 none, 1 mean, 2 sum)")
    return out.astype(dtype)


# --------------------------------------------------------------------------------------------- regression losses
@lower(A.mse_loss.default)
def mse_loss(self, target, reduction=_MEAN):
    x, t, dtype = _operands(self, target)
    d = x - t
    return _reduce(d * d, reduction).astype(dtype)


@lower(A.l1_loss.default)
def l1_loss(self, target, reduction=_MEAN):
    """``|x - t|``, written ``sign(d) d`` so that the gradient at ``x == t`` is 0 as torch's (``sgn``), where
    ``jnp.abs``'s is 1."""
    x, t, dtype = _operands(self, target)
    d = x - t
    return _reduce(jnp.sign(d) * d, reduction).astype(dtype)


@lower(A.smooth_l1_loss.default)
def smooth_l1_loss(self, target, reduction=_MEAN, beta=1.0):
    """``0.5 d^2 / beta`` where ``|d| < beta``, else ``|d| - beta / 2``; ``beta == 0`` is ``l1_loss`` (torch)."""
    if beta == 0:
        return l1_loss(self, target, reduction)
    x, t, dtype = _operands(self, target)
    d = x - t
    z = jnp.abs(d)
    return _reduce(jnp.where(z < beta, 0.5 * d * d / beta, z - 0.5 * beta), reduction).astype(dtype)


@lower(A.huber_loss.default)
def huber_loss(self, target, reduction=_MEAN, delta=1.0):
    """``0.5 d^2`` where ``|d| < delta``, else ``delta (|d| - delta / 2)``; the input's dtype, as torch's kernel."""
    x, t, _ = _operands(self, target)
    d = x - t
    z = jnp.abs(d)
    return _reduce(jnp.where(z < delta, 0.5 * d * d, delta * (z - 0.5 * delta)), reduction).astype(self.dtype)


# --------------------------------------------------------------------------------------------- binary cross entropy
@jax.custom_jvp
def _bce(x, t):
    """Torch's elementwise BCE, each log clamped at -100."""
    return (t - 1) * jnp.maximum(jnp.log1p(-x), -100.0) - t * jnp.maximum(jnp.log(x), -100.0)


@_bce.defjvp
def _bce_jvp(primals, tangents):
    """Torch's backward: ``(x - t) / max((1 - x) x, 1e-12)`` for the input (finite at 0 and 1 where the clamped
    logs' autodiff is NaN), ``-logit(x)`` for the target."""
    x, t = primals
    dx, dt = tangents
    gx = (x - t) / jnp.maximum((1 - x) * x, 1e-12)
    gt = -jnp.log(x / (1 - x))
    return _bce(x, t), gx * dx + gt * dt


@lower(A.binary_cross_entropy.default)
def binary_cross_entropy(self, target, weight=None, reduction=_MEAN):
    """``F.binary_cross_entropy`` on probabilities; the result has the input's dtype (torch's kernel writes into an
    ``empty_like(input)``)."""
    x, t, w, _ = _operands(self, target, weight, dtype=result_dtype(self, target))
    loss = _bce(*jnp.broadcast_arrays(x, t))
    if w is not None:
        loss = loss * w
    return _reduce(loss, reduction).astype(self.dtype)


@lower(A.binary_cross_entropy_with_logits.default)
def binary_cross_entropy_with_logits(self, target, weight=None, pos_weight=None, reduction=_MEAN):
    """``(1 - t) x - (1 + (pos_weight - 1) t) log_sigmoid(x)``, times ``weight``, as torch computes it.

    Torch builds the loss in place on ``1 - target``, so the result has the target's dtype.
    """
    x, t, w, pw, _ = _operands(self, target, weight, pos_weight)
    log_sig = jax.nn.log_sigmoid(x)
    if pw is not None:
        log_sig = log_sig * ((pw - 1) * t + 1)
    loss = (1 - t) * x - log_sig
    if w is not None:
        loss = loss * w
    return _reduce(loss, reduction).astype(target.dtype)


@lower(A.log_sigmoid.default)
def log_sigmoid(self):
    """``min(x, 0) - log1p(exp(-|x|))`` (``F.logsigmoid``; ``F.multilabel_soft_margin_loss`` decomposes to it)."""
    return jax.nn.log_sigmoid(self.astype(opmath(self.dtype))).astype(self.dtype)


# --------------------------------------------------------------------------------------------- divergences, margins
@lower(A.kl_div.default)
def kl_div(self, target, reduction=_MEAN, *, log_target=False):
    """``xlogy(t, t) - t x``, or ``exp(t) (t - x)`` with ``log_target``; ``reduction='batchmean'`` is ``F.kl_div``'s
    own ``sum / batch`` around a ``sum`` reduction, so it arrives here as 2."""
    x, t, dtype = _operands(self, target)
    if log_target:
        out = jnp.exp(t) * (t - x)
    else:
        out = jax.scipy.special.xlogy(t, t) - t * x
    return _reduce(out, reduction).astype(dtype)


@lower(A.soft_margin_loss.default)
def soft_margin_loss(self, target, reduction=_MEAN):
    """``log1p(exp(-t x))``, computed as torch's kernel does (inf where ``exp`` overflows, as torch); the input's
    dtype."""
    x, t, _ = _operands(self, target)
    return _reduce(jnp.log1p(jnp.exp(-t * x)), reduction).astype(self.dtype)


@lower(A.poisson_nll_loss.default)
def poisson_nll_loss(input, target, log_input, full, eps, reduction):  # noqa: A002 - the ATen argument name
    """``exp(x) - t x`` (``log_input``) or ``x - t log(x + eps)``, plus Stirling's term where ``t > 1`` (``full``)."""
    x, t, dtype = _operands(input, target)
    loss = jnp.exp(x) - t * x if log_input else x - t * jnp.log(x + eps)
    if full:
        big = t > 1
        ts = jnp.where(big, t, jnp.full((), 2.0, t.dtype))  # where-safe: log(0) of a masked target gives no NaN
        stirling = ts * jnp.log(ts) - ts + 0.5 * jnp.log(2 * math.pi * ts)
        loss = loss + jnp.where(big, stirling, jnp.zeros((), t.dtype))
    return _reduce(loss, reduction).astype(dtype)


@lower(A.margin_ranking_loss.default)
def margin_ranking_loss(input1, input2, target, margin=0.0, reduction=_MEAN):
    """``clamp_min(-t (x1 - x2) + margin, 0)``."""
    x1, x2, t, dtype = _operands(input1, input2, target)
    return _reduce(_clamp_min0(-t * (x1 - x2) + margin), reduction).astype(dtype)


@lower(A.hinge_embedding_loss.default)
def hinge_embedding_loss(self, target, margin=1.0, reduction=_MEAN):
    """``clamp_min(margin - x, 0)`` where ``t != 1`` plus ``x`` where ``t != -1``; the input's dtype."""
    x, t, _ = _operands(self, target)
    zero = jnp.zeros((), x.dtype)
    out = jnp.where(t != 1, _clamp_min0(margin - x), zero) + jnp.where(t != -1, x, zero)
    return _reduce(out, reduction).astype(self.dtype)


@lower(A.cosine_embedding_loss.default)
def cosine_embedding_loss(input1, input2, target, margin=0.0, reduction=_MEAN):
    """``1 - cos`` where ``t == 1``, ``clamp_min(cos - margin, 0)`` where ``t == -1``; torch's ``cos`` adds 1e-12 to
    each squared norm."""
    dtype = result_dtype(input1, input2, target)
    x1, x2, _ = _operands(input1, input2, dtype=dtype)
    t = target.astype(opmath(dtype))  # (N,) for (N, D) inputs, 0-dim for (D,): not broadcast against them
    dim = target.ndim
    prod = jnp.sum(x1 * x2, axis=dim)
    mag1, mag2 = jnp.sum(x1 * x1, axis=dim) + 1e-12, jnp.sum(x2 * x2, axis=dim) + 1e-12
    cos = prod / jnp.sqrt(mag1 * mag2)
    zero = jnp.zeros((), cos.dtype)
    out = jnp.where(t == 1, 1 - cos, zero) + jnp.where(t == -1, _clamp_min0(cos - margin), zero)
    return _reduce(out, reduction).astype(dtype)


def _pairwise_distance(x1, x2, p, eps):
    """``at::pairwise_distance``: the p-norm of ``x1 - x2 + eps`` over the last dim (torch's zero-norm gradient)."""
    return linalg_vector_norm(x1 - x2 + eps, p, [-1], False, None)


@lower(A.triplet_margin_loss.default)
def triplet_margin_loss(anchor, positive, negative, margin=1.0, p=2.0, eps=1e-6, swap=False, reduction=_MEAN):
    """``clamp_min(margin + d(a, p) - d(a, n), 0)``; ``swap`` uses ``min(d(a, n), d(p, n))`` (ties split, as
    torch's ``min``)."""
    a, pos, neg, dtype = _operands(anchor, positive, negative)
    d_pos = _pairwise_distance(a, pos, p, eps)
    d_neg = _pairwise_distance(a, neg, p, eps)
    if swap:
        d_neg = jnp.minimum(d_neg, _pairwise_distance(pos, neg, p, eps))
    return _reduce(_clamp_min0(margin + d_pos - d_neg), reduction).astype(dtype)
