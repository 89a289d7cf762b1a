"""FusedLayerNorm.

Method card
-----------
**What it does.** Replaces every LayerNorm with a fused one: mean and variance from one reduction pass, and a
hand-written backward with fewer passes over memory. The reduction sums the row and its squares together (the row
shifted by its first element, for accuracy); a second pass normalizes, scales and shifts. The backward
(``jax.custom_vjp``) recomputes the normalized input from the saved per-row mean and 1/std and needs one
reduction per axis plus one elementwise pass, where autodiff of the plain LayerNorm materializes several
full-size intermediates (XLA:CPU's optimized HLO of forward plus backward: 13-14 fusions for flax's
``nnx.LayerNorm``, 8-11 for this one).

**When it helps.** Transformers, whose LayerNorms are memory bound. On CPU the gain is small and reliable only on
small activations (``benchmarks/fused_layernorm.py``; figures in ``benchmarks/README.md``): XLA:CPU already fuses
the plain forward into one to four fusions; what the fused version saves is backward passes (the plain vjp
materializes a broadcast scale and several full-size intermediates). The gain Composer reports is on GPUs, where
this has not been timed: such a run should add bfloat16 and larger shapes to the script, count the fusions of both
backwards in the optimized HLO (the target: one row-reduction, one column-reduction and one elementwise fusion),
and compare with a Pallas/Triton LayerNorm kernel, which would go in :func:`fused_layer_norm`.

**Hyperparameters.** None (Composer's ``FusedLayerNorm()``; its ``apply_events`` is accepted only as ``None``:
the surgery runs once in the ``model`` slot, Composer's ``Event.INIT``).

**Exact Composer semantics.** As ``composer/algorithms/fused_layernorm``: every ``torch.nn.LayerNorm`` is replaced
(Composer: by apex's ``FusedLayerNorm``, built from ``normalized_shape`` and ``eps``, ``weight`` and ``bias``
copied under ``torch.no_grad``); no LayerNorm warns ``NoEffectWarning`` ("No instances of `torch.nn.LayerNorm`
were found..."); ``apply_fused_layernorm(model, optimizers)``. Differences, with the reason:

- no apex: Composer raises ``ImportError`` without it. Here the fused LayerNorm is our own JAX function (the same
  for native NNX and bridged torch models), so nothing is missing and nothing raises.
- ``optimizers`` is accepted and ignored (our optimizer is built after the ``model`` slot, from the edited
  model; parameter paths do not change anyway) and defaults to ``None``.
- Composer's ``from_LayerNorm`` builds apex's layer with ``elementwise_affine=True`` and copies ``weight``/``bias``
  unconditionally (it fails on a LayerNorm without them); here the torch replacement keeps the original's
  ``elementwise_affine`` and ``bias`` settings.
- numerics: the variance is ``E[(x-k)^2] - E[x-k]^2`` with ``k`` the row's first element, in float32 (float64 for
  float64 inputs), and the mean is kept relative to ``k``. The shift keeps the cancellation to the row's own
  spread. On rows with mean 1e4 and std 1 the largest error of the normalized output against float64 is 4e-7
  here, 9e-4 for flax's two-pass float32 LayerNorm (its mean is rounded at 1e4's precision) and 3e3 for flax's
  default one-pass ``use_fast_variance=True`` (the variance cancels to 0). On ordinary inputs outputs and
  gradients equal the plain LayerNorm's to float32 rounding (1e-5), not bitwise.
- composed with LowPrecisionLayerNorm (sorted last), the fused layers become LPLayerNorms: the later surgery
  wins, here and for bridged torch models (our torch FusedLayerNorm is an ``nn.LayerNorm``; apex's is not).
- the NNX replacement supports the layers a transformer has: normalization over the last axis
  (``reduction_axes=feature_axes=-1``), no ``axis_name``, no ``mask``; any other LayerNorm raises a
  ``ValueError`` naming it before anything compiles.
- the functional form returns the model (Composer's returns None).

**How it plugs in.** ``model`` slot (host, once, before the optimizer is built). NNX ``nnx.LayerNorm``
submodules become :class:`FusedLayerNormModule` (a subclass sharing the original's ``scale``/``bias`` variables,
so parameter paths and checkpoints do not change); torch ``nn.LayerNorm`` modules become
``torch_bridge.methods.fused_layernorm.FusedLayerNorm`` (registered as ``"FusedLayerNorm"``), a subclass with the
same ``weight``/``bias`` whose eager forward is ``F.layer_norm`` and whose exported graph is one
``jaxcomposer::fused_layer_norm`` op that the bridge lowers to :func:`fused_layer_norm` below.

**Reference.** Composer: ``composer/algorithms/fused_layernorm``; apex ``FusedLayerNorm``. The shifted one-pass
variance: Chan, Golub and LeVeque, "Algorithms for computing the sample variance" (1983).
"""
from __future__ import annotations

import functools
import math
import warnings
from typing import Any, Sequence

import jax
import jax.numpy as jnp
from jax import lax
from flax import nnx

from jaxcomposer.errors import NoEffectWarning
from jaxcomposer.algorithms.functional_io import optimizers_follow
from jaxcomposer.algorithms.low_precision_norm import layer_norm_as, replace_norms
from jaxcomposer.algorithms.nnx_surgery import apply_surgery
from jaxcomposer.core.method import Method, MethodEntry

__all__ = ["FusedLayerNorm", "FusedLayerNormModule", "apply_fused_layernorm", "fused_layer_norm"]


def _stats_dtype(dtype) -> Any:
    """Statistics in float32 at least (float64 stays float64), as torch's and flax's LayerNorms accumulate."""
    return jnp.promote_types(dtype, jnp.float32)


def _centred(x2d: jax.Array) -> jax.Array:
    """Each row minus its first element, in float32 (float64 for float64 rows). Exact when the row's mean is large
    beside its spread (Sterbenz), so nothing below works on numbers of the mean's magnitude."""
    xf = x2d.astype(_stats_dtype(x2d.dtype))
    return xf - xf[:, :1]


def _row_stats(centred: jax.Array, epsilon: float) -> tuple[jax.Array, jax.Array]:
    """``(mean, 1/std)`` of each row of ``centred``, shapes ``(R, 1)``, from one pass (its sum and sum of squares
    together). The mean stays relative to the row's first element: adding it back would round it to the
    precision of the mean's magnitude (1e-3 at 1e4 in float32) and spoil every normalized value."""
    n = centred.shape[-1]
    mean = centred.sum(-1, keepdims=True) / n
    var = jnp.maximum((centred * centred).sum(-1, keepdims=True) / n - mean * mean, 0.0)
    return mean, lax.rsqrt(var + epsilon)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _fused_2d(x2d, scale, bias, epsilon):
    return _fused_2d_fwd(x2d, scale, bias, epsilon)[0]


def _fused_2d_fwd(x2d, scale, bias, epsilon):
    centred = _centred(x2d)
    mean, rstd = _row_stats(centred, epsilon)
    y = (centred - mean) * rstd * scale[None].astype(centred.dtype) + bias[None].astype(centred.dtype)
    return y, (x2d, mean, rstd, scale, bias)


def _fused_2d_bwd(epsilon, residuals, ct):
    """The LayerNorm's gradients from the saved row statistics: ``g = ct * scale``,
    ``dx = rstd * (g - mean(g) - xhat * mean(g * xhat))``, ``dscale = sum_rows(ct * xhat)``, ``dbias =
    sum_rows(ct)``; ``xhat`` is recomputed from ``x`` rather than saved (one activation-sized residual, not two)."""
    x2d, mean, rstd, scale, bias = residuals
    n = x2d.shape[-1]
    xhat = (_centred(x2d) - mean) * rstd
    ct = ct.astype(mean.dtype)
    g = ct * scale[None].astype(mean.dtype)
    mean_g = g.sum(-1, keepdims=True) / n
    mean_gx = (g * xhat).sum(-1, keepdims=True) / n
    dx = rstd * (g - mean_g - xhat * mean_gx)
    return (dx.astype(x2d.dtype), (ct * xhat).sum(0).astype(scale.dtype), ct.sum(0).astype(bias.dtype))


_fused_2d.defvjp(_fused_2d_fwd, _fused_2d_bwd)


def fused_layer_norm(x: jax.Array, scale: jax.Array | None, bias: jax.Array | None, epsilon: float = 1e-5,
                     n_axes: int = 1, dtype: Any = None) -> jax.Array:
    """LayerNorm of ``x`` over its last ``n_axes`` axes (torch's ``normalized_shape``), one-pass statistics and a
    hand-written backward; ``scale``/``bias`` (shape ``x.shape[-n_axes:]`` or flattened) may be None. The result is
    in ``dtype``, by default the promoted dtype of ``x``, ``scale`` and ``bias`` (as flax's LayerNorm)."""
    if not 1 <= n_axes <= x.ndim:
        raise ValueError(f"fused_layer_norm: n_axes={n_axes} must be between 1 and x.ndim={x.ndim}")
    out_dtype = dtype or jnp.result_type(*(a for a in (x, scale, bias) if a is not None))
    features = math.prod(x.shape[x.ndim - n_axes:])
    # the statistics run over rows of `features` elements: a reshape, free in XLA
    x2d = x.reshape((-1, features))
    stats = _stats_dtype(x.dtype)
    # a missing scale/bias is a constant: its cotangent is computed and dropped (cheap beside the activations)
    scale = jnp.ones((features,), stats) if scale is None else scale.reshape((features,))
    bias = jnp.zeros((features,), stats) if bias is None else bias.reshape((features,))
    return _fused_2d(x2d, scale, bias, float(epsilon)).reshape(x.shape).astype(out_dtype)


def _normalized_axes(axes: int | Sequence[int]) -> tuple:
    return tuple(axes) if isinstance(axes, (tuple, list)) else (axes,)


def check_fusable(layer: nnx.LayerNorm, where: str = "") -> None:
    """Raises ``ValueError`` unless ``layer`` normalizes over its last axis only, without ``axis_name`` (the
    LayerNorms of a transformer), the ones :class:`FusedLayerNormModule` computes."""
    problems = []
    if _normalized_axes(layer.reduction_axes) != (-1,):
        problems.append(f"reduction_axes={layer.reduction_axes!r} (expected -1)")
    if _normalized_axes(layer.feature_axes) != (-1,):
        problems.append(f"feature_axes={layer.feature_axes!r} (expected -1)")
    if layer.axis_name is not None:
        problems.append(f"axis_name={layer.axis_name!r} (expected None)")
    if problems:
        raise ValueError(f"FusedLayerNorm: cannot fuse the nnx.LayerNorm{where} with {', '.join(problems)}: "
                         f"the fused LayerNorm normalizes the last axis of each example only.")


class FusedLayerNormModule(nnx.LayerNorm):
    """``nnx.LayerNorm`` over the last axis, computed by :func:`fused_layer_norm` (same settings, same
    ``scale``/``bias`` variables, so the same parameter paths)."""

    @classmethod
    def from_layer_norm(cls, layer: nnx.LayerNorm) -> "FusedLayerNormModule":
        """The same settings, sharing ``layer``'s ``scale``/``bias`` variables."""
        check_fusable(layer)
        return layer_norm_as(cls, layer)

    def __call__(self, x, *, mask=None):
        if mask is not None:
            raise ValueError("FusedLayerNorm: a mask is not supported by the fused LayerNorm")
        scale = self.scale[...] if self.scale is not None else None
        bias = self.bias[...] if self.bias is not None else None
        return fused_layer_norm(x, scale, bias, self.epsilon, 1, self.dtype)


def _replace_nnx(model: nnx.Module, inplace: bool):
    # structural check first, over the whole model, so a model with one unfusable LayerNorm is left untouched
    for path, m in nnx.iter_graph(model):
        if isinstance(m, nnx.LayerNorm) and not isinstance(m, FusedLayerNormModule):
            check_fusable(m, f" at {'.'.join(map(str, path)) or '<root>'}")
    return replace_norms(model, nnx.LayerNorm, FusedLayerNormModule, FusedLayerNormModule.from_layer_norm, inplace)


def _apply(model: Any, inplace: bool, stacklevel: int):
    new, n = apply_surgery("FusedLayerNorm", model, lambda m: _replace_nnx(m, inplace), who="apply_fused_layernorm")
    if n == 0:
        warnings.warn(NoEffectWarning(f"FusedLayerNorm: no instances of LayerNorm (nnx.LayerNorm / "
                                      f"torch.nn.LayerNorm) were found in {type(model).__name__}, and therefore "
                                      f"there were no modules to replace."), stacklevel=stacklevel)
    return new


def apply_fused_layernorm(model: Any, optimizers: Any = None, *, inplace: bool | None = None):
    """Composer's ``apply_fused_layernorm(model, optimizers)``: every LayerNorm becomes a fused one. A torch module
    is edited in place and returned; an NNX module is cloned and the new model returned unless ``inplace=True``.
    A torch optimizer given as ``optimizers`` holds the new layers' parameters afterwards, as in Composer."""
    with optimizers_follow(model, optimizers, "apply_fused_layernorm"):
        return _apply(model, bool(inplace), stacklevel=3)


def FusedLayerNorm(apply_events: Any = None) -> Method:
    """Composer's ``FusedLayerNorm()`` as a :class:`Method` (``model`` slot, in place)."""
    if apply_events is not None:
        raise ValueError(f"FusedLayerNorm: apply_events={apply_events!r} is not supported; the surgery runs once "
                         f"in the model slot (Composer's Event.INIT). Leave it None.")

    def model_fn(task, ctx):  # in place, as Composer
        return task.with_model(_apply(task.source, inplace=True, stacklevel=4))

    return Method(name="FusedLayerNorm", model=model_fn, description="FusedLayerNorm()")


ENTRY = MethodEntry(registry_name="fused_layernorm", factory=FusedLayerNorm, functional=(apply_fused_layernorm,))
