"""Factorize.

Method card
-----------
**What it does.** Replaces wide 2-D convolutions and linear layers by low-rank pairs with no nonlinearity between
them: a ``k x k`` convolution becomes a ``k x k`` convolution to ``latent`` channels (no bias, the original's
stride, padding and dilation) followed by a ``1 x 1`` convolution to the output channels (with bias), and a linear
layer ``in -> out`` becomes ``in -> latent`` (no bias) then ``latent -> out`` (bias if the original had one). Only
layers where this lowers the number of multiply-adds are replaced. The new layers are freshly initialized, as
Composer does (``reset_parameters``): the original weights are discarded.

**When it helps.** Large CNNs and MLP/transformer blocks whose wide layers dominate the compute (Composer: ResNets
on ImageNet, with ``min_channels=256``), trading some accuracy for fewer FLOPs. It does nothing on narrow layers,
where the two smaller matmuls cost more than they save.

**Hyperparameters.** ``factorize_convs`` / ``factorize_linears`` (default ``True``); ``min_channels`` /
``min_features``: a layer is considered only if ``min(in, out) >= min_*`` (functional default 512, method default
256); ``latent_channels`` / ``latent_features``: the latent width, a fraction ``< 1`` of ``min(in, out)``
(``max(1, int(fraction * min(in, out)))``) or an absolute count (functional defaults 0.25; method defaults 0.25
channels and 128 features, as Composer's).

**Exact Composer semantics.** As ``composer/algorithms/factorize``: a layer is replaced when ``min(in, out) >=
min_*`` and ``factorizing_could_speedup``: ``latent <= ceil(fan_in * out / (fan_in + out) - 1)`` with ``fan_in =
in * kh * kw`` for convs (``in`` for linears); grouped convolutions are never factorized; only 2-D convolutions
(``Conv2d``) are. Convs are replaced first, then linears. Composer's ``FactorizedConv2d.from_conv2d`` /
``FactorizedLinear.from_linear`` call ``reset_parameters`` (fresh initialization, no SVD of the original weights:
``factorize_conv2d`` / ``factorize_matrix`` exist in Composer but only serve ``set_rank``, which the algorithm never
calls), so the model's function changes. The NNX layers are initialized with torch's default distributions
(kernel and bias ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``, fan_in of each new layer) so both frameworks start from
the same distribution; the values come from a JAX key (``key=``, default ``PRNGKey(0)``; the method uses the
step-0 ctx key when the Trainer provides one), not torch's global RNG. The new conv pair keeps the original's
``padding``, ``strides``, ``kernel_dilation``, dtypes and ``conv_general_dilated``; the second conv always has a
bias (Composer's ``bias=True``), the first never. Deviation: the functional also warns with ``NoEffectWarning``
when nothing was replaced (Composer logs only).

**How it plugs in.** ``model`` slot, ``model(task, ctx) -> task`` (host, once, before the optimizer is built, which
then sees the new parameters). NNX: ``nnx.Conv`` (2-D kernels) -> :class:`FactorizedConv`, ``nnx.Linear`` ->
:class:`FactorizedLinear`, each holding ``module0`` and ``module1`` (paths ``.../module0/kernel``, as Composer's
``module0.weight``); in place in the Trainer, cloned by the functional unless ``inplace=True``. Torch: the surgery
torch_bridge registers under ``"Factorize"`` (:mod:`torch_bridge.methods.factorize`) replaces ``nn.Conv2d`` /
``nn.Linear`` before export. Checkpoints of a factorized model need Factorize in the recipe (``required_on_load``).

**Reference.** Zhang et al., "Accelerating Very Deep Convolutional Networks for Classification and Detection",
TPAMI 2016; Composer: ``composer/algorithms/factorize``.
"""
from __future__ import annotations

import math
import warnings
from typing import Any

import jax
from flax import nnx

from jaxcomposer.errors import NoEffectWarning
from jaxcomposer.algorithms.nnx_surgery import apply_surgery, replace_modules
from jaxcomposer.core.method import Method, MethodEntry

__all__ = ["Factorize", "FactorizedConv", "FactorizedLinear", "apply_factorization", "clean_latent_size",
           "max_rank_with_possible_speedup", "latent_could_speedup", "factorizing_could_speedup"]

# torch's default init (kaiming_uniform(a=sqrt(5)) for weights, U(+-1/sqrt(fan_in)) for biases), as
# ``reset_parameters`` leaves a fresh Conv2d / Linear: both are U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
_torch_default_kernel = jax.nn.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform")


def _torch_default_bias(fan_in: int):
    bound = 1.0 / math.sqrt(fan_in)
    return lambda key, shape, dtype=jax.numpy.float32: jax.random.uniform(key, shape, dtype, -bound, bound)


def clean_latent_size(latent_size: float, in_size: int, out_size: int) -> int:
    """Composer's ``_clean_latent_size``: a fraction ``< 1`` of ``min(in, out)`` (at least 1), else ``int``."""
    if latent_size < 1:
        return max(1, int(latent_size * min(in_size, out_size)))
    return int(latent_size)


def max_rank_with_possible_speedup(in_size: int, out_size: int, kernel_size: tuple[int, ...] | None = None) -> int:
    """Composer's ``_max_rank_with_possible_speedup``: the largest latent size with fewer multiply-adds."""
    fan_in = in_size * (math.prod(kernel_size) if kernel_size is not None else 1)
    breakeven = (fan_in * out_size) / (fan_in + out_size)
    return int(math.ceil(breakeven - 1))  # round down, or one lower if it divides evenly


def latent_could_speedup(latent_size: float, in_size: int, out_size: int,
                         kernel_size: tuple[int, ...] | None = None) -> bool:
    """Whether factorizing an ``in_size -> out_size`` layer (a conv with ``kernel_size``) at ``latent_size``
    (:func:`clean_latent_size`) saves multiply-adds: the test both frameworks' ``factorizing_could_speedup`` run."""
    return clean_latent_size(latent_size, in_size, out_size) <= max_rank_with_possible_speedup(in_size, out_size,
                                                                                              kernel_size)


def factorizing_could_speedup(module: Any, latent_size: float) -> bool:
    """Composer's ``factorizing_could_speedup`` for ``nnx.Conv`` / ``nnx.Linear`` (False for anything else)."""
    if isinstance(module, (FactorizedConv, FactorizedLinear)):  # already factorized: any reduction helps
        return clean_latent_size(latent_size, module.in_size, module.out_size) <= module.latent_size - 1
    if isinstance(module, nnx.Conv):
        if module.feature_group_count > 1:
            return False  # grouped convolutions cannot be factorized
        return latent_could_speedup(latent_size, module.in_features, module.out_features, tuple(module.kernel_size))
    if isinstance(module, nnx.Linear):
        return latent_could_speedup(latent_size, module.in_features, module.out_features)
    return False


class FactorizedConv(nnx.Module):
    """``module1(module0(x))``: a ``k x k`` conv to ``latent_size`` channels (no bias) and a ``1 x 1`` conv to the
    output channels (with bias); the NNX counterpart of Composer's ``FactorizedConv2d``. Freshly initialized."""

    def __init__(self, conv: nnx.Conv, latent_channels: float, *, rngs: nnx.Rngs):
        self.in_size, self.out_size = conv.in_features, conv.out_features
        self.latent_size = clean_latent_size(latent_channels, self.in_size, self.out_size)
        common = dict(dtype=conv.dtype, param_dtype=conv.param_dtype, precision=conv.precision,
                      conv_general_dilated=conv.conv_general_dilated)
        self.module0 = nnx.Conv(self.in_size, self.latent_size, tuple(conv.kernel_size), strides=conv.strides,
                                padding=conv.padding, input_dilation=conv.input_dilation,
                                kernel_dilation=conv.kernel_dilation, use_bias=False,
                                kernel_init=_torch_default_kernel, rngs=rngs, **common)
        self.module1 = nnx.Conv(self.latent_size, self.out_size, (1, 1), use_bias=True,
                                kernel_init=_torch_default_kernel, bias_init=_torch_default_bias(self.latent_size),
                                rngs=rngs, **common)

    def __call__(self, x: jax.Array, *args, **kwargs) -> jax.Array:
        return self.module1(self.module0(x, *args, **kwargs))


class FactorizedLinear(nnx.Module):
    """``module1(module0(x))``: ``in -> latent`` without bias, then ``latent -> out`` (bias as the original); the
    NNX counterpart of Composer's ``FactorizedLinear``. Freshly initialized."""

    def __init__(self, linear: nnx.Linear, latent_features: float, *, rngs: nnx.Rngs):
        self.in_size, self.out_size = linear.in_features, linear.out_features
        self.latent_size = clean_latent_size(latent_features, self.in_size, self.out_size)
        common = dict(dtype=linear.dtype, param_dtype=linear.param_dtype, precision=linear.precision)
        self.module0 = nnx.Linear(self.in_size, self.latent_size, use_bias=False,
                                  kernel_init=_torch_default_kernel, rngs=rngs, **common)
        self.module1 = nnx.Linear(self.latent_size, self.out_size, use_bias=linear.use_bias,
                                  kernel_init=_torch_default_kernel,
                                  bias_init=_torch_default_bias(self.latent_size), rngs=rngs, **common)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.module1(self.module0(x))


_FACTORIZED = (FactorizedConv, FactorizedLinear)  # their parts are never factorized again


def _factorize_nnx(model: nnx.Module, factorize_convs: bool, factorize_linears: bool, min_channels: int,
                   latent_channels: float, min_features: int, latent_features: float, key,
                   inplace: bool) -> tuple[nnx.Module, int]:
    model = model if inplace else nnx.clone(model)
    rngs = nnx.Rngs(params=key)
    if factorize_convs:
        def wanted_conv(m):
            return (isinstance(m, nnx.Conv) and len(tuple(m.kernel_size)) == 2
                    and min(m.in_features, m.out_features) >= min_channels
                    and factorizing_could_speedup(m, latent_channels))
        replace_modules(model, wanted_conv, lambda m, i: FactorizedConv(m, latent_channels, rngs=rngs), skip=_FACTORIZED)
    if factorize_linears:
        def wanted_linear(m):
            return (isinstance(m, nnx.Linear) and min(m.in_features, m.out_features) >= min_features
                    and factorizing_could_speedup(m, latent_features))
        replace_modules(model, wanted_linear, lambda m, i: FactorizedLinear(m, latent_features, rngs=rngs),
                        skip=_FACTORIZED)
    return model, sum(isinstance(m, _FACTORIZED) for _, m in nnx.iter_graph(model))


def _check_latent(value: Any, name: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0 or (
            value >= 1 and int(value) != value):
        raise ValueError(f"{where}: {name} must be a fraction in (0, 1) or a positive integer count, got {value!r}.")
    return value


def _check_min(value: Any, name: str, where: str) -> int:
    if isinstance(value, bool) or int(value) != value or value < 0:
        raise ValueError(f"{where}: {name} must be a non-negative integer, got {value!r}.")
    return int(value)


def apply_factorization(model: Any, factorize_convs: bool = True, factorize_linears: bool = True,
                        min_channels: int = 512, latent_channels: float = 0.25, min_features: int = 512,
                        latent_features: float = 0.25, optimizers: Any = None, *, key: jax.Array | None = None,
                        inplace: bool | None = None):
    """Composer's ``apply_factorization(model, factorize_convs, factorize_linears, min_channels, latent_channels,
    min_features, latent_features, optimizers)``; a torch optimizer given as ``optimizers`` holds the new layers'
    parameters afterwards, as in Composer.

    A torch module is edited in place and returned, as Composer. A Flax NNX module is cloned and the new model
    returned unless ``inplace=True``; ``key`` draws the new layers' initial values (default ``PRNGKey(0)``). Warns
    with :class:`NoEffectWarning` when the result has no factorized layer.
    """
    where = "apply_factorization"
    min_channels, min_features = (_check_min(min_channels, "min_channels", where),
                                  _check_min(min_features, "min_features", where))
    latent_channels = _check_latent(latent_channels, "latent_channels", where)
    latent_features = _check_latent(latent_features, "latent_features", where)
    new, count = apply_surgery(
        "Factorize", model,
        lambda m: _factorize_nnx(m, factorize_convs, factorize_linears, min_channels, latent_channels, min_features,
                                 latent_features, jax.random.PRNGKey(0) if key is None else key, bool(inplace)),
        who=where, optimizers=optimizers, factorize_convs=factorize_convs, factorize_linears=factorize_linears,
        min_channels=min_channels, latent_channels=latent_channels, min_features=min_features,
        latent_features=latent_features)
    if count == 0:
        warnings.warn(NoEffectWarning(
            f"Factorize did not change any layers of {type(model).__name__}: no Conv2d with min(in, out) >= "
            f"{min_channels} or Linear with min(in, out) >= {min_features} would have fewer multiply-adds "
            f"factorized (latent_channels={latent_channels}, latent_features={latent_features})."), stacklevel=2)
    return new


def Factorize(factorize_convs: bool = True, factorize_linears: bool = True, min_channels: int = 256,
              latent_channels: float = 0.25, min_features: int = 256, latent_features: float = 128) -> Method:
    """Composer's ``Factorize(factorize_convs=True, factorize_linears=True, min_channels=256,
    latent_channels=0.25, min_features=256, latent_features=128)`` as a :class:`Method` (``model`` slot)."""
    where = "Factorize"
    min_channels, min_features = (_check_min(min_channels, "min_channels", where),
                                  _check_min(min_features, "min_features", where))
    latent_channels = _check_latent(latent_channels, "latent_channels", where)
    latent_features = _check_latent(latent_features, "latent_features", where)
    if not factorize_convs and not factorize_linears:
        warnings.warn(NoEffectWarning("Factorize: factorize_convs and factorize_linears are both False; Factorize "
                                      "will not modify the model."), stacklevel=2)

    def model_fn(task, ctx):  # in place, as Composer: the module the user passed is the trained one
        new = apply_factorization(task.source, factorize_convs, factorize_linears, min_channels, latent_channels,
                                  min_features, latent_features, key=getattr(ctx, "key", None), inplace=True)
        return task.with_model(new)

    return Method(name="Factorize", model=model_fn,
                  description=f"Factorize(factorize_convs={factorize_convs}, factorize_linears={factorize_linears}, "
                              f"min_channels={min_channels}, latent_channels={latent_channels}, "
                              f"min_features={min_features}, latent_features={latent_features})")


ENTRY = MethodEntry(registry_name="factorize", factory=Factorize, functional=(apply_factorization,))
