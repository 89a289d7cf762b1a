"""StochasticDepth.

Method card
-----------
**What it does.** Randomly skips the residual branch of ResNet blocks during training (Huang et al. 2016). With
``stochastic_method='block'`` each block, once per step, drops its whole residual branch with probability ``p``:
the block then computes only its shortcut (``relu(shortcut(x))`` with a projection, ``x`` without one) and its
branch gets no gradient. With ``'sample'`` each example of the batch is dropped independently (the EfficientNet
flavour): the branch output is multiplied by a per-example 0/1 mask. At evaluation nothing is dropped and the
branch is multiplied by its keep probability ``1 - p`` (the expected value of the mask). ``drop_distribution``
sets ``p`` per block: ``'uniform'`` gives every block ``drop_rate``; ``'linear'`` gives the ``i``-th of ``L``
target blocks ``(i + 1) / L * drop_rate``, so the deepest block drops most.

**When it helps.** Deep ResNets trained long enough to profit from the regularization (Composer: ResNet-50/101 on
ImageNet, about 1.1x speedup to the same accuracy with ``'sample'``, ``drop_rate=0.1``). Dropping blocks also
makes ``'block'`` steps cheaper on average. Short runs and shallow networks mostly lose accuracy.

**Hyperparameters.** ``target_layer_name`` (required: ``'ResNetBottleneck'`` as in Composer, or
``'ResNetBasicBlock'``), ``stochastic_method`` (``'block'``), ``drop_rate`` (``0.2``), ``drop_distribution``
(``'linear'``), ``drop_warmup`` (``0.0``: the fraction of training, or a time string ``'0.1dur'`` / ``'100ba'``,
over which ``drop_rate`` ramps linearly from 0; ``'block'`` only).

**Exact Composer semantics.** As ``composer/algorithms/stochastic_depth`` (``stochastic_layers.py``): block mode
keeps with ``bernoulli(1 - p)``; kept: ``relu(branch + shortcut)``; dropped: ``relu(downsample(x))`` or ``x``;
eval: ``relu((1 - p) * branch + shortcut)``. Sample mode: mask ``floor((1 - p) + U[0, 1))`` per example, *no*
``1 / (1 - p)`` rescaling in training (Composer's ``_sample_drop``), ``relu(mask * branch + shortcut)``; eval:
``relu((1 - p) * branch + shortcut)``. Layer index ``i`` counts target blocks in module order (Composer's
``module_index``). The warmup scales every block's rate by ``min(elapsed / drop_warmup, 1)`` before each step.
Deliberate differences:

- Randomness comes from the step's forward key the Trainer gives the model, not from torch's global generator,
  so a resumed run replays the same drops bit for bit (Composer xfails StochasticDepth in its resumption test).
- After the warmup the full ``drop_rate`` is used. Composer stops updating the layers once warmup ends, so its
  blocks keep the last warmup value (``(W - 1) / W`` of the rate, for ``W`` warmup batches) for the rest of
  training; that is a bug, not a design.
- Target layers: Composer only handles torchvision's ``Bottleneck``. Here ``'ResNetBottleneck'`` selects the
  bottleneck of :mod:`jaxcomposer.models.resnet_imagenet` and, on torch models, torchvision-layout
  ``Bottleneck`` modules; ``'ResNetBasicBlock'`` selects :class:`jaxcomposer.models.resnet.BasicBlock` and
  torchvision-layout ``BasicBlock`` modules. torchvision is not a dependency, so torch blocks are recognized by
  class name and layout (``conv1``/``bn1``/.../``downsample``/``relu``).
- Bridged torch models (block mode): the exported graph must be static, so both outcomes are computed and
  ``torch.where`` picks one. Outputs and gradients are Composer's, but the BatchNorm running statistics of a
  dropped branch still update (Composer skips the branch). Native NNX blocks compute the branch too and select
  (an ``nnx.cond`` makes the step far slower on XLA:CPU), but a dropped branch's BatchNorm statistics are restored,
  exactly as Composer's; what Composer saves by skipping a dropped branch's compute is not saved here.

**How it plugs in.** ``model`` slot (host, once): NNX target blocks become :class:`StochasticBasicBlock` /
:class:`StochasticBottleneck`, subclasses holding the very same submodules, so parameter paths and checkpoints
are unchanged (as Composer's forward monkeypatching); the rate of each block is static (one compile). The
block's random key comes from the model: ``ResNetCIFAR`` and ``ResNetImageNet`` pass block ``i`` the key
``fold_in(fold_in(key, tag), i)`` of the forward key the Trainer gives them (``resnet.block_key``; plain blocks
ignore it). Torch models are surgered before export by ``torch_bridge.methods.stochastic_depth`` (Composer's
forward patching), and their ``torch.bernoulli`` / ``torch.rand`` draw from the same forward key in the bridge.
``drop_warmup > 0`` adds a ``drop_warmup_scale`` scalar to each target block's *model state* (an NNX
:class:`DropWarmupScale` variable; a buffer on torch) and a ``grad``-slot wrapper that sets it to
``min(step / warmup_steps, 1)`` from ``ctx.step`` before the forward, so no recompile per step and resume replays
the ramp; evaluation uses the last training step's value, as Composer's modules do.

**Reference.** Huang, Sun, Liu, Sedra, Weinberger, "Deep Networks with Stochastic Depth", ECCV 2016
(arXiv:1603.09382). Composer: ``composer/algorithms/stochastic_depth``.
"""
from __future__ import annotations

import re
import warnings
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxcomposer.errors import NoEffectWarning
from jaxcomposer.algorithms.nnx_surgery import apply_surgery, find_modules, replace_found
from jaxcomposer.core.method import Method, MethodEntry
from jaxcomposer.core.model import param_path
from jaxcomposer.core.state import tree_select
from jaxcomposer.models.resnet import BasicBlock
from jaxcomposer.models.resnet_imagenet import Bottleneck

__all__ = ["StochasticDepth", "apply_stochastic_depth", "StochasticBasicBlock", "StochasticBottleneck",
           "DropWarmupScale", "TARGET_LAYERS", "layer_drop_rates"]

TARGET_LAYERS = ("ResNetBottleneck", "ResNetBasicBlock")
STOCHASTIC_METHODS = ("block", "sample")
DROP_DISTRIBUTIONS = ("uniform", "linear")
WARMUP_STATE = "drop_warmup_scale"  # the model-state leaf the warmup wrapper sets (NNX variable / torch buffer)
_CONFIG_ATTRS = ("drop_rate", "stochastic_method", WARMUP_STATE)


class DropWarmupScale(nnx.Variable):
    """A stochastic block's warmup factor on its drop rate: model state (not a param), set before each step."""


def layer_drop_rates(count: int, drop_rate: float, drop_distribution: str) -> list[float]:
    """Each target block's rate, in module order: ``drop_rate`` (uniform) or ``(i + 1) / count * drop_rate``."""
    if drop_distribution == "linear":
        return [(i + 1) / count * drop_rate for i in range(count)]
    return [drop_rate] * count


class _StochasticResidual:
    """The stochastic forward shared by both block kinds; the block supplies ``residual`` and ``shortcut``."""

    def __init__(self, block: nnx.Module, drop_rate: float, stochastic_method: str, warmup: bool = False):
        for name, value in vars(block).items():  # the block's own submodules, shared: paths do not change
            if not name.startswith("_") and name not in _CONFIG_ATTRS:
                setattr(self, name, value)
        self.drop_rate = float(drop_rate)
        self.stochastic_method = stochastic_method
        self.drop_warmup_scale = DropWarmupScale(jnp.ones((), jnp.float32)) if warmup else None

    def current_drop_rate(self):
        """A Python float, or a traced scalar when the rate warms up."""
        if self.drop_warmup_scale is None:
            return self.drop_rate
        return self.drop_rate * self.drop_warmup_scale[...]

    def _projects(self) -> bool:
        return self.proj_conv is not None

    def __call__(self, x: jax.Array, *, train: bool, key: jax.Array | None = None) -> jax.Array:
        p = self.current_drop_rate()
        if not train:  # the expectation of the mask scales the branch
            keep = jnp.asarray(1.0 - p, x.dtype)
            return jax.nn.relu(self.residual(x, train=False) * keep + self.shortcut(x, train=False))
        if isinstance(p, float) and p == 0.0:  # never drops: the plain block (Composer's draws always keep)
            return jax.nn.relu(self.residual(x, train=True) + self.shortcut(x, train=True))
        if key is None:
            raise ValueError(f"StochasticDepth: {type(self).__name__} needs a PRNG key in training; the model must "
                             f"pass each block key=... (ResNetCIFAR and ResNetImageNet do when called with key=).")
        if self.stochastic_method == "sample":
            u = jax.random.uniform(key, (x.shape[0],) + (1,) * (x.ndim - 1), x.dtype)
            mask = jnp.floor(jnp.asarray(1.0 - p, x.dtype) + u)  # Composer's _sample_drop: no 1/(1-p) rescaling
            return jax.nn.relu(self.residual(x, train=True) * mask + self.shortcut(x, train=True))
        kept = jax.random.bernoulli(key, 1.0 - p)
        # Both outcomes computed, one selected: a select, not nnx.cond, whose nested computations make the whole
        # step far slower on XLA:CPU (benchmarks/README.md, "Measurements behind code choices"). As in Composer, a dropped branch leaves its BatchNorm statistics alone: the
        # shortcut runs first, then the statistics are kept from before the branch ran unless the branch is kept.
        shortcut = self.shortcut(x, train=True)
        before = jax.tree.map(lambda a: a, nnx.state(self, nnx.BatchStat))  # a snapshot, not live variables
        branch = self.residual(x, train=True)
        nnx.update(self, tree_select(kept, nnx.state(self, nnx.BatchStat), before))
        dropped = jax.nn.relu(shortcut) if self._projects() else x
        return jnp.where(kept, jax.nn.relu(branch + shortcut), dropped)


class StochasticBasicBlock(_StochasticResidual, BasicBlock):
    """:class:`~jaxcomposer.models.resnet.BasicBlock` with stochastic depth (same submodules, same paths)."""


class StochasticBottleneck(_StochasticResidual, Bottleneck):
    """:class:`~jaxcomposer.models.resnet_imagenet.Bottleneck` with stochastic depth (same submodules, paths)."""


_NNX_TARGETS = {"ResNetBottleneck": (Bottleneck, StochasticBottleneck),
                "ResNetBasicBlock": (BasicBlock, StochasticBasicBlock)}


def _apply_nnx(model: nnx.Module, target_layer_name: str, stochastic_method: str, drop_rate: float,
               drop_distribution: str, warmup: bool, inplace: bool) -> tuple[nnx.Module, int]:
    new = model if inplace else nnx.clone(model)
    target, stochastic = _NNX_TARGETS[target_layer_name]
    # every (parent, key) of each target block, in module order (depth first, children in order, as
    # torch's modules()): the order Composer's module_index counts in
    blocks = find_modules(new, lambda m: isinstance(m, target), enter_matches=True)
    rates = layer_drop_rates(len(blocks), drop_rate, drop_distribution)
    n = replace_found(blocks, lambda block, i: stochastic(block, rates[i], stochastic_method, warmup))
    return new, n


def _validate(target_layer_name, stochastic_method, drop_rate, drop_distribution) -> None:
    if stochastic_method not in STOCHASTIC_METHODS:
        raise ValueError(f"StochasticDepth: stochastic_method must be one of {STOCHASTIC_METHODS}, "
                         f"got {stochastic_method!r}.")
    if target_layer_name not in TARGET_LAYERS:
        raise ValueError(f"StochasticDepth: target_layer_name {target_layer_name!r} is not supported; must be one of "
                         f"{list(TARGET_LAYERS)} (torchvision-style Bottleneck / BasicBlock, and jaxcomposer's "
                         f"resnet_imagenet.Bottleneck / resnet.BasicBlock).")
    if isinstance(drop_rate, bool) or not isinstance(drop_rate, (int, float)) or not 0.0 <= drop_rate <= 1.0:
        raise ValueError(f"StochasticDepth: drop_rate must be a number in [0, 1], got {drop_rate!r}.")
    if drop_distribution not in DROP_DISTRIBUTIONS:
        raise ValueError(f"StochasticDepth: drop_distribution must be one of {DROP_DISTRIBUTIONS}, "
                         f"got {drop_distribution!r}.")


def _apply(model, target_layer_name, stochastic_method, drop_rate, drop_distribution, warmup, nnx_inplace):
    return apply_surgery(
        "StochasticDepth", model,
        lambda m: _apply_nnx(m, target_layer_name, stochastic_method, float(drop_rate), drop_distribution, warmup,
                             nnx_inplace),
        who="apply_stochastic_depth", target_layer_name=target_layer_name, stochastic_method=stochastic_method,
        drop_rate=float(drop_rate), drop_distribution=drop_distribution, warmup=warmup)


def _warn_if_none(count: int, model: Any, target_layer_name: str) -> None:
    if count == 0:
        warnings.warn(NoEffectWarning(
            f"StochasticDepth did not change any layers of {type(model).__name__}: no {target_layer_name} found "
            f"in the model; the method is a no-op."), stacklevel=3)


def apply_stochastic_depth(model: Any, target_layer_name: str, stochastic_method: str = "block",
                           drop_rate: float = 0.2, drop_distribution: str = "linear", *,
                           inplace: bool | None = None):
    """Composer's ``apply_stochastic_depth(model, target_layer_name, stochastic_method='block', drop_rate=0.2,
    drop_distribution='linear')``.

    A torch module is edited in place and returned, as Composer does. A Flax NNX module is cloned and the new
    model returned unless ``inplace=True``. Warns with :class:`NoEffectWarning` when no target block was found.
    """
    _validate(target_layer_name, stochastic_method, drop_rate, drop_distribution)
    new, count = _apply(model, target_layer_name, stochastic_method, drop_rate, drop_distribution, False,
                        bool(inplace))
    _warn_if_none(count, model, target_layer_name)
    return new


def _warmup_steps(drop_warmup: float | str, total_steps: int | None) -> float:
    """Batches over which the rate ramps: ``'Nba'`` directly, a fraction (or ``'Xdur'``) of the run's steps."""
    if isinstance(drop_warmup, str) and drop_warmup.endswith("ba"):
        return float(drop_warmup[:-2])
    fraction = float(drop_warmup[:-3]) if isinstance(drop_warmup, str) else float(drop_warmup)
    if total_steps is None:
        raise ValueError("StochasticDepth: drop_warmup as a fraction of training needs the run's length in batches "
                         "(max_duration in batches, or epochs of a sized dataloader); give drop_warmup as 'Nba'.")
    return fraction * total_steps


def _parse_warmup(drop_warmup) -> float | str:
    if isinstance(drop_warmup, str):
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e-?[0-9]+)?)\s*(dur|ba)\s*", drop_warmup)
        if m is None:
            raise ValueError(f"StochasticDepth: drop_warmup must be a fraction in [0, 1] or a time string like "
                             f"'0.1dur' or '100ba', got {drop_warmup!r}.")
        value, unit = float(m.group(1)), m.group(2)
        if unit == "dur" and value > 1:
            raise ValueError(f"StochasticDepth: drop_warmup must be at most 1dur, got {drop_warmup!r}.")
        return f"{value}{unit}" if value > 0 else 0.0
    if isinstance(drop_warmup, bool) or not isinstance(drop_warmup, (int, float)) or not 0 <= drop_warmup <= 1:
        raise ValueError(f"StochasticDepth: drop_warmup must be a fraction in [0, 1] or a time string like "
                         f"'0.1dur' or '100ba', got {drop_warmup!r}.")
    return float(drop_warmup)


def _set_warmup_scale(model_state, scale: jax.Array):
    """``model_state`` with every ``drop_warmup_scale`` leaf (NNX variable or torch buffer) set to ``scale``."""
    def set_leaf(path, leaf):
        if param_path(path)[-1:] == (WARMUP_STATE,):
            return jnp.asarray(scale, jnp.asarray(leaf).dtype).reshape(jnp.shape(leaf))
        return leaf
    return jax.tree_util.tree_map_with_path(set_leaf, model_state)


def StochasticDepth(target_layer_name: str, stochastic_method: str = "block", drop_rate: float = 0.2,
                    drop_distribution: str = "linear", drop_warmup: float | str = 0.0) -> Method:
    """Composer's ``StochasticDepth(target_layer_name, stochastic_method='block', drop_rate=0.2,
    drop_distribution='linear', drop_warmup=0.0)`` as a :class:`Method` (``model`` slot; with ``drop_warmup``
    also a ``grad`` slot that sets the warmup factor in the model state from the step)."""
    _validate(target_layer_name, stochastic_method, drop_rate, drop_distribution)
    warmup = _parse_warmup(drop_warmup)
    if stochastic_method == "sample" and warmup:
        raise ValueError("StochasticDepth: drop_warmup can not be used with the 'sample' stochastic_method "
                         "(as in Composer).")
    if drop_rate == 0:
        warnings.warn(NoEffectWarning("StochasticDepth will have no effect when drop_rate is 0."), stacklevel=2)
    use_warmup = bool(warmup)

    def model_fn(task, ctx):  # in place, as Composer: the module the user passed becomes the trained one
        new, count = _apply(task.source, target_layer_name, stochastic_method, drop_rate, drop_distribution,
                            use_warmup, True)
        _warn_if_none(count, task.source, target_layer_name)
        return task.with_model(new)

    def grad_fn_wrapper(grad_fn, ctx):
        steps = _warmup_steps(warmup, ctx.run.total_steps)
        scale = jnp.minimum(jnp.asarray(ctx.step, jnp.float32) / steps, 1.0) if steps > 0 else jnp.float32(1.0)

        def with_warmed_up_rate(params, model_state, batch, key):
            return grad_fn(params, _set_warmup_scale(model_state, scale), batch, key)
        return with_warmed_up_rate

    return Method(name="StochasticDepth", model=model_fn, grad=grad_fn_wrapper if use_warmup else None,
                  description=f"StochasticDepth(target_layer_name={target_layer_name!r}, stochastic_method="
                              f"{stochastic_method!r}, drop_rate={drop_rate}, drop_distribution="
                              f"{drop_distribution!r}, drop_warmup={drop_warmup!r})")


ENTRY = MethodEntry(registry_name="stochastic_depth", factory=StochasticDepth, functional=(apply_stochastic_depth,))
