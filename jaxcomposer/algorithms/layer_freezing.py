"""Layer freezing.

Method card
-----------
**What it does.** Progressively freezes the network's layers, earliest first, over the end of training. After
``freeze_start`` of training the fraction of layers frozen grows linearly, reaching ``freeze_level`` at the end;
a frozen layer's params never change again (no gradient step, no momentum, no weight decay).

**When it helps.** Long fine-tuning or training runs of deep CNNs and transformers whose early layers converge
first (FreezeOut, Freeze Training). In Composer the speedup comes from skipping the backward pass through frozen
layers; here the gradient is still computed (the frozen set is a traced value, so XLA cannot prune it) and the
method gives Composer's training dynamics, not its wall-clock savings.

**Hyperparameters** (Composer's names and defaults):

- ``freeze_start=0.5``: fraction of training before freezing begins, in ``[0, 1)``.
- ``freeze_level=1.0``: fraction of (freezable) layers frozen at the end of training, in ``[0, 1]``.
- ``update_interval='1ep'`` (keyword-only, our extension): when the frozen depth is recomputed. Composer does it
  at every epoch end, which is the default; ``'Nba'`` recomputes every N batches (single-epoch runs, tests).
- ``layer_order=None`` (keyword-only, ours): module paths, earliest first (``'blocks/0/conv1'`` or
  ``'blocks.0.conv1'``), used instead of the forward's order (below) when given.

**Schedule, exactly as Composer.** At an update boundary with elapsed duration ``t`` (completed batches over
total batches), ``pct = 0`` if ``t <= freeze_start`` else ``freeze_level * ((t - freeze_start) / (1 -
freeze_start))``, and the first ``int(pct * (n - 1))`` layers are frozen, ``n`` being the number of layers: the
last layer (the head) is never frozen. The depth in force at clock ``s`` (``ctx.step``, the batches trained before
this one) is the one computed at the last boundary ``<= s`` completed batches. It is computed in float64 on the
host, once per possible depth, so no float32 rounding can move a boundary; in jit the step only counts boundaries
past thresholds.

**What a layer is.** Composer's ``_get_layers``: the leaf modules that own params. From the param tree: a param's
layer is its path without the last key; layers whose path is a prefix of another layer's path are not leaves, and
their direct params are never frozen (as in Composer, which recurses into such modules' children only).

**Which layers come first: one deliberate difference from Composer.** Composer freezes in module definition order
(``model.children()``, depth first). We freeze in the order the forward pass first uses the layers:
``ctx.model.param_order()`` lists the param paths in the order the forward first reads them (read off its jaxpr
by the core, the same for Flax NNX and bridged torch models), and a layer's place is where its first param
appears. The two agree for sequential models (every Composer benchmark model: ResNets, MLPs, GPT); they differ
only for a model that defines a layer before one it calls earlier. The forward's order needs no definition order,
which ``nnx.State`` (sorted keys) and ``nnx.clone`` (sorted attributes) lose, so it is right after surgery too
(BlurPool's ``stem/conv`` sits where the forward reads it). ``layer_order=[module paths]`` restores any order:
a layer takes the place of the first listed path that is it or contains it (a module path covers the layers under
it), and every layer must be covered.

:func:`get_layers` lists the layers in freezing order; :func:`freeze_layers` is the functional form (its
``param_order=`` takes param paths in forward order or module paths; without it, plain dicts use their insertion
order, which exists only on the host: inside jit dicts come back with sorted keys). It takes Composer's positional
arguments ``(model, optimizers, current_duration, freeze_start, freeze_level)``. On a torch module it is Composer's
own, in place and in definition order (``requires_grad`` off, params removed from the optimizers; returns
``(freeze_depth, freeze_percentage)``); on a pytree ``optimizers`` must be None and the frozen set comes back as a
mask, ``(frozen, freeze_depth, freeze_percentage)``.

**How it plugs in.** ``tx`` slot, ``tx(optax_tx, ctx) -> optax_tx``, built inside every step from that step's ctx
(docs/design.md, "Methods and slots"): an optax wrapper whose state is only the wrapped optimizer's state
(:class:`LayerFreezingState`). The schedule's clock is ``ctx.step`` (docs/design.md, "The clock"), so the frozen
depth follows the checkpointed ``TrainState.step`` and a resumed run freezes exactly the same layers (Composer's
LayerFreezing cannot resume, issue #1002); a step skipped for a non-finite loss still advances it, as it advances
the timestamp. Frozen leaves get zero gradients going into the wrapped optimizer (so a global-norm clip inside sees
what torch sees: no gradient) and a zero update coming out (so decoupled weight decay and momentum do not move
them either, as when Composer removes them from the optimizer). Their moment buffers inside the optimizer keep
evolving but are never used again: freezing only grows. List LayerFreezing before other ``tx`` methods to have it
outermost.

**Reference.** Brock et al., "FreezeOut: Accelerate Training by Progressively Freezing Layers", 2017
(arXiv:1706.04983); Raghu et al., "SVCCA", NeurIPS 2017 (arXiv:1706.05806). Composer:
``composer/algorithms/layer_freezing``.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxcomposer.algorithms.functional_io import functional_form
from jaxcomposer.core.method import Method, MethodEntry, StepCtx
from jaxcomposer.core.model import param_path
from jaxcomposer.core.time import Time, TimeUnit

__all__ = ["freeze_layers", "get_layers", "layer_freezing_tx", "LayerFreezing", "LayerFreezingState"]

_NEVER = 2**31 - 1  # a boundary count no run reaches


# ---- layers and their order ------------------------------------------------------------------------------------

def _split(key: Any) -> tuple[str, ...]:
    # Bridged torch params are one flat dict keyed 'layer1.0.conv1.weight': split so modules become path levels
    # (as param_path does).
    return tuple(str(key).split("."))


def _container_order(tree: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Param paths in the container's own iteration order (dict insertion order), not jax's sorted flatten order."""
    if isinstance(tree, Mapping):
        out = []
        for k, v in tree.items():
            out += _container_order(v, prefix + _split(k))
        return out
    if isinstance(tree, (list, tuple)) and not hasattr(tree, "_fields"):
        out = []
        for i, v in enumerate(tree):
            out += _container_order(v, prefix + (str(i),))
        return out
    return [prefix]


def _as_paths(order: Sequence) -> list[tuple[str, ...]]:
    """Paths as tuples of strings: tuples (``param_order()``'s form) as they are, strings split on ``/`` and ``.``."""
    if isinstance(order, str):
        raise ValueError(f"LayerFreezing: an order must be a list of paths, got the string {order!r}.")
    out = []
    for p in order:
        if isinstance(p, str):
            out.append(tuple(q for q in p.replace("/", ".").split(".") if q))
        elif isinstance(p, (tuple, list)) and all(isinstance(q, str) for q in p):
            out.append(tuple(p))
        else:
            raise ValueError(f"LayerFreezing: an order holds paths, 'blocks/0/conv1' or ('blocks', '0', 'conv1'), "
                             f"got {p!r}.")
    return out


def _layers(params: Any, order: list[tuple[str, ...]] | None):
    """(layer paths in freezing order, pytree like ``params`` of each leaf's layer position or -1).

    ``order``: param paths in forward order and/or module paths, earliest first; a param takes the rank of the first
    listed path that is it or one of its ancestors, a layer the best rank of its params. None: the params' own
    container (insertion) order, for plain dicts on the host."""
    leaf_paths = [param_path(kp) for kp, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
    parents = {p[:-1] for p in leaf_paths}
    leaf_layers = {L for L in parents if not any(len(o) > len(L) and o[:len(L)] == L for o in parents)}
    if order is None:
        from flax import nnx

        if isinstance(params, nnx.State):
            raise ValueError("LayerFreezing: nnx.State sorts its keys, so the params alone do not give the layers' "
                             "order; pass param_order= (e.g. the Trainer's param_order(), or "
                             "jaxcomposer.core.model.param_use_order(task.forward, params, state, batch)) or module "
                             "paths earliest first.")
        container = {p: i for i, p in enumerate(_container_order(params))}
        first: dict = {}
        for p in leaf_paths:
            if p[:-1] in leaf_layers:
                first[p[:-1]] = min(first.get(p[:-1], math.inf), container.get(p, math.inf))
        ranked = sorted(leaf_layers, key=lambda L: (first[L], L))
    else:
        rank: dict = {}
        for i, q in enumerate(order):
            rank.setdefault(q, i)
        best: dict = {}
        for i, p in enumerate(leaf_paths):  # i: jax's flatten order, the same on the host and in jit (tie-break)
            if p[:-1] not in leaf_layers:
                continue
            r = next((rank[p[:k]] for k in range(len(p), -1, -1) if p[:k] in rank), None)
            if r is not None:
                best[p[:-1]] = min(best.get(p[:-1], (math.inf, math.inf)), (r, i))
        missing = sorted(leaf_layers - set(best))
        if missing:
            raise ValueError(f"LayerFreezing: layers {['/'.join(L) for L in missing]} are not covered by the layer "
                             f"order {['/'.join(q) for q in order]}; list them (or a module containing them).")
        ranked = sorted(leaf_layers, key=lambda L: (best[L], L))
    position = {L: i for i, L in enumerate(ranked)}
    index = jax.tree_util.tree_map_with_path(lambda kp, _: position.get(param_path(kp)[:-1], -1), params)
    return ranked, index


def get_layers(params: Any, param_order: Sequence | None = None) -> list[str]:
    """The layers of ``params`` in the order LayerFreezing freezes them, as ``'/'``-joined paths (the last one is
    never frozen). ``param_order``: param paths in the order the forward first reads them (``ctx.model.
    param_order()``), or module paths earliest first; None for a plain dict's insertion order (see the card)."""
    ranked, _ = _layers(params, None if param_order is None else _as_paths(param_order))
    return ["/".join(L) for L in ranked]


# ---- the schedule ------------------------------------------------------------------------------------------------

def check_freezing_args(freeze_start: float, freeze_level: float) -> None:
    if not 0.0 <= freeze_start < 1.0:
        raise ValueError(f"LayerFreezing: freeze_start must be in [0, 1), got {freeze_start!r}.")
    if not 0.0 <= freeze_level <= 1.0:
        raise ValueError(f"LayerFreezing: freeze_level must be in [0, 1], got {freeze_level!r}.")


def freeze_schedule(current_duration: float, freeze_start: float, freeze_level: float) -> float:
    # Composer's freeze_schedule, operation for operation (float64), so depths match at exact boundaries.
    if current_duration <= freeze_start:
        return 0.0
    return freeze_level * ((current_duration - freeze_start) / (1.0 - freeze_start))


def _depth(current_duration: float, n_layers: int, freeze_start: float, freeze_level: float) -> int:
    return min(int(freeze_schedule(current_duration, freeze_start, freeze_level) * max(n_layers - 1, 0)),
               max(n_layers - 1, 0))


@functional_form(arrays=("params",), models=("params",))
def freeze_layers(params: Any, optimizers: Any = None, current_duration=None, freeze_start: float = 0.5,
                  freeze_level: float = 1.0, *, param_order: Sequence | None = None):
    """Composer's ``freeze_layers(model, optimizers, current_duration, freeze_start=0.5, freeze_level=1.0)``.

    On a pytree of params it is pure and returns ``(frozen, freeze_depth, freeze_percentage)``: ``frozen`` is a
    pytree like ``params`` with a bool per leaf (True: frozen), to mask gradients and updates with
    (``jnp.where(frozen, 0, u)``); Composer instead edits ``requires_grad`` and the optimizer's param groups, so
    ``optimizers`` must be None here (an optax optimizer is pure: there is nothing to remove a param from).
    ``current_duration`` is the elapsed fraction of training: a Python number gives Python/numpy results, a traced
    value gives traced ones (computed in float32; the LayerFreezing method avoids that rounding, see the card).
    ``param_order`` gives the layer order: param paths in the order the forward first reads them (what
    ``ctx.model.param_order()`` returns) or module paths, earliest first. Required for ``nnx.State`` params, whose
    keys are sorted; without it a plain dict's insertion order is used (on the host: jit sorts dict keys).

    On a torch module it is Composer's, in place (``torch_bridge.functional.freeze_layers``): ``requires_grad``
    turned off and the params removed from ``optimizers``; returns ``(freeze_depth, freeze_percentage)``.
    """
    if current_duration is None:
        hint = (f" ({optimizers!r} was given as optimizers: the second argument, as in Composer; pass "
                f"current_duration={optimizers!r})") if isinstance(optimizers, (int, float, jax.Array)) else ""
        raise TypeError(f"freeze_layers: current_duration (the elapsed fraction of training) is required{hint}.")
    if optimizers is not None:
        raise ValueError(f"freeze_layers: optimizers must be None for a pytree of params, got {optimizers!r}: an "
                         "optax optimizer is pure, so nothing can be removed from it; mask gradients and updates "
                         "with the returned `frozen` tree instead (the LayerFreezing method does both).")
    check_freezing_args(freeze_start, freeze_level)
    ranked, index = _layers(params, None if param_order is None else _as_paths(param_order))
    n = len(ranked)
    if isinstance(current_duration, (int, float)):
        pct = freeze_schedule(float(current_duration), freeze_start, freeze_level)
        depth = _depth(float(current_duration), n, freeze_start, freeze_level)
        return jax.tree.map(lambda i: np.bool_(0 <= i < depth), index), depth, pct
    t = jnp.asarray(current_duration, jnp.float32)
    pct = jnp.where(t <= freeze_start, 0.0, freeze_level * ((t - freeze_start) / (1.0 - freeze_start)))
    depth = jnp.minimum(jnp.floor(pct * max(n - 1, 0)).astype(jnp.int32), max(n - 1, 0))
    return jax.tree.map(lambda i: (i >= 0) & (i < depth), index), depth, pct


def _thresholds(n_layers: int, total_steps: int, boundary: int, freeze_start: float, freeze_level: float) -> np.ndarray:
    """``th[d - 1]`` = the first boundary count ``k`` (boundaries every ``boundary`` batches) at which at least ``d``
    layers are frozen, so the depth after ``k`` boundaries is ``sum(k >= th)``: exact host float64, tiny table."""
    last = total_steps // boundary
    depth_at = lambda k: _depth(k * boundary / total_steps, n_layers, freeze_start, freeze_level)
    th = []
    for d in range(1, n_layers):
        lo, hi = 0, last + 1  # depth is nondecreasing in k: binary search for the first k reaching d
        while lo < hi:
            mid = (lo + hi) // 2
            if depth_at(mid) >= d:
                hi = mid
            else:
                lo = mid + 1
        th.append(lo if lo <= last else _NEVER)
    return np.asarray(th, np.int32)


# ---- the optax wrapper and the method ----------------------------------------------------------------------------

class LayerFreezingState(NamedTuple):
    """The wrapper's state: only the wrapped optimizer's (the schedule's clock is ``ctx.step``, not a counter)."""

    inner_state: Any


def layer_freezing_tx(inner: optax.GradientTransformation, ctx: StepCtx, freeze_start: float = 0.5,
                      freeze_level: float = 1.0, update_interval: str | Time = "1ep", *,
                      layer_order: Sequence | None = None) -> optax.GradientTransformation:
    """``inner`` with Composer's freezing schedule at clock ``ctx.step`` applied to its inputs and outputs (see the
    module docstring). Build it from each step's ctx, as the ``tx`` slot is.

    The layer order is ``layer_order`` (module or param paths, earliest first) when given, else
    ``ctx.model.param_order()`` (param paths in forward order); one of them is required.
    """
    check_freezing_args(freeze_start, freeze_level)
    interval = _interval(update_interval)
    if interval.unit == TimeUnit.EPOCH:
        if not ctx.run.steps_per_epoch:
            raise ValueError("LayerFreezing: update_interval in 'ep' (Composer's epoch-end freezing) needs the "
                             "epoch length; this run has no steps_per_epoch (a loader without len()). Use "
                             "update_interval='Nba'.")
        boundary = int(ctx.run.steps_per_epoch) * int(interval.value)
    else:
        boundary = int(interval.value)
    total = max(int(ctx.run.total_steps), 1)
    if layer_order is not None:
        order = _as_paths(layer_order)
    elif ctx.model.param_order is not None:
        order = _as_paths(ctx.model.param_order())
    else:
        raise ValueError("LayerFreezing: no layer order: ctx.model.param_order is None (the Trainer's step provides "
                         "the forward's param order) and no layer_order=[module paths] was given.")
    step = ctx.step

    def init(params):
        _layers(params, order)  # an order that misses a layer fails here, before the first step
        return LayerFreezingState(inner.init(params))

    def update(updates, state, params=None):
        ranked, index = _layers(updates, order)
        th = _thresholds(len(ranked), total, boundary, freeze_start, freeze_level)
        k = jnp.asarray(step, jnp.int32) // boundary  # boundaries passed before this step
        depth = (k >= jnp.asarray(th)).sum(dtype=jnp.int32) if th.size else jnp.zeros((), jnp.int32)

        def mask(u, i):
            if i < 0:  # direct params of a non-leaf module: never frozen, as in Composer
                return u
            return jnp.where(i < depth, jnp.zeros_like(u), u)

        grads = jax.tree.map(mask, updates, index)
        out, inner_state = inner.update(grads, state.inner_state, params)
        return jax.tree.map(mask, out, index), LayerFreezingState(inner_state)

    return optax.GradientTransformation(init, update)


def _interval(update_interval: str | Time) -> Time:
    if isinstance(update_interval, str):
        update_interval = Time.from_timestring(update_interval)
    if not isinstance(update_interval, Time):
        raise ValueError(f"LayerFreezing: update_interval must be a time string such as '1ep' or '10ba', got "
                         f"{update_interval!r}.")
    if update_interval.unit not in (TimeUnit.EPOCH, TimeUnit.BATCH) or update_interval.value <= 0:
        raise ValueError(f"LayerFreezing: update_interval must be a positive number of 'ep' or 'ba', got "
                         f"{update_interval.to_timestring()!r}.")
    return update_interval


def LayerFreezing(freeze_start: float = 0.5, freeze_level: float = 1.0, *, update_interval: str = "1ep",
                  layer_order: Sequence[str] | None = None) -> Method:
    """Composer's ``LayerFreezing(freeze_start, freeze_level)`` as a :class:`Method` (``tx`` slot).

    ``layer_order`` (keyword-only, ours): module paths earliest first (``'blocks/0/conv1'`` or
    ``'blocks.0.conv1'``), used instead of the forward's param order (see the card).
    """
    check_freezing_args(freeze_start, freeze_level)
    _interval(update_interval)
    if layer_order is not None and (isinstance(layer_order, str) or not all(isinstance(p, str) for p in layer_order)):
        raise ValueError(f"LayerFreezing: layer_order must be a list of module paths such as ['stem', "
                         f"'blocks/0/conv1'], got {layer_order!r}.")
    order = None if layer_order is None else tuple(layer_order)

    def tx_fn(inner, ctx):
        return layer_freezing_tx(inner, ctx, freeze_start, freeze_level, update_interval, layer_order=order)

    return Method(name="LayerFreezing", tx=tx_fn,
                  description=f"LayerFreezing(freeze_start={freeze_start}, freeze_level={freeze_level}, "
                              f"update_interval={update_interval!r})")


# Registration: jaxcomposer.algorithms, jaxcomposer.functional and `jaxcomposer methods` find the method here.
ENTRY = MethodEntry(registry_name="layer_freezing", factory=LayerFreezing, functional=(freeze_layers,))
