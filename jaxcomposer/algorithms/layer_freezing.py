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

**Schedule, exactly as Composer.** At an update boundary with elapsed duration ``t`` (completed batches over
total batches), ``pct = 0`` if ``t <= freeze_start`` else ``freeze_level * ((t - freeze_start) / (1 -
freeze_start))``, and the first ``int(pct * (n - 1))`` layers are frozen, ``n`` being the number of layers: the
last layer (the head) is never frozen. The depth in force at optimizer step ``s`` is the one computed at the last
boundary ``<= s`` completed batches. It is computed in float64 on the host, once per possible depth, so no
float32 rounding can move a boundary; in jit the step only counts boundaries past thresholds.

**What a layer is.** Composer's ``_get_layers``: the leaf modules that own params, in depth-first definition
order. From the param tree: a param's layer is its path without the last key; layers whose path is a prefix of
another layer's path are not leaves, and their direct params are never frozen (as in Composer, which recurses
into such modules' children only). The order is definition order:

- Flax NNX: ``nnx.State`` sorts its keys, so the order is read from the module itself: the ``model`` slot walks
  the task's module (attributes in assignment order, ``nnx.List`` items by index) once, before the optimizer is
  built. Params added by later surgery (e.g. BlurPool's ``conv1/conv``) take the place of their nearest
  ancestor in that walk. A module rebuilt by ``nnx.clone``/``merge``/``eval_shape`` has sorted attributes, so
  the order is gone: the slot raises and asks for LayerFreezing to be listed before surgery methods (which
  clone), or for ``layer_order=[...]`` (keyword-only, ours: module paths, earliest first).
- torch modules (bridged): ``named_modules()`` order; bridged params' dotted names are split on ``.``.
- Plain dicts (no module): insertion order, e.g. ``{'stem': ..., 'block1': ..., 'head': ...}``, as the optimizer's
  ``init`` sees them on the host (inside jit, dicts come back with sorted keys; pass ``model=`` a list of paths to
  :func:`freeze_layers` there).

:func:`get_layers` lists the layers in freezing order.

**How it plugs in.** ``tx`` slot: an optax wrapper whose state holds its own step count (so the frozen depth is in
every checkpoint and a resumed run freezes exactly the same layers; Composer's LayerFreezing cannot resume, issue
#1002). Frozen leaves get zero gradients going into the wrapped optimizer (so a global-norm clip inside sees
what torch sees: no gradient) and a zero update coming out (so decoupled weight decay and momentum do not move
them either, as when Composer removes them from the optimizer). Their moment buffers inside the optimizer keep
evolving but are never used again: freezing only grows. The ``model`` slot records the definition order and
returns the task unchanged. List LayerFreezing before other ``tx`` methods to have it outermost. Because the
count is the optimizer's, a step skipped for a non-finite loss does not advance the schedule (as for the LR).

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

from jaxcomposer.core.method import Method, RunInfo
from jaxcomposer.core.model import is_torch_module
from jaxcomposer.core.time import Time, TimeUnit

__all__ = ["freeze_layers", "get_layers", "layer_freezing_tx", "LayerFreezing", "LayerFreezingState"]

_NEVER = 2**31 - 1  # a boundary count no run reaches


# ---- layers and their order ------------------------------------------------------------------------------------

def _split(key: Any) -> tuple[str, ...]:
    # Bridged torch params are one flat dict keyed 'layer1.0.conv1.weight': split so modules become path levels.
    return tuple(str(key).split("."))


def _norm_keypath(keypath) -> tuple[str, ...]:
    out: list[str] = []
    for k in keypath:
        if isinstance(k, jax.tree_util.DictKey):
            out.extend(_split(k.key))
        elif isinstance(k, jax.tree_util.SequenceKey):
            out.append(str(k.idx))
        elif isinstance(k, jax.tree_util.FlattenedIndexKey):
            out.append(str(k.key))
        # GetAttrKey: the `.value` inside an nnx.Variable, not a level of the model
    return tuple(out)


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


def _definition_order(model: Any) -> list[tuple[str, ...]]:
    """Module and param paths of ``model`` in depth-first definition order (Composer's ``model.children()``)."""
    if is_torch_module(model):
        return [_split(name) if name else () for name, _ in model.named_modules()]
    if isinstance(model, (list, tuple)) and all(isinstance(p, str) for p in model):
        return [tuple(q for q in p.replace("/", ".").split(".") if q) for p in model]
    from flax import nnx

    if not isinstance(model, nnx.Module):
        raise ValueError(f"LayerFreezing: model must be a flax.nnx.Module, a torch.nn.Module or a sequence of "
                         f"param/module paths in definition order, got {type(model).__name__}.")
    keys = list(vars(model))
    if "_pytree__state" in keys and "_pytree__nodes" in keys and \
            keys.index("_pytree__nodes") < keys.index("_pytree__state"):
        # A constructor sets _pytree__state first; nnx.clone/merge/eval_shape rebuild modules with sorted attributes,
        # which puts 'head' before 'stem': freezing in that order would be silently wrong.
        raise ValueError(f"LayerFreezing: the {type(model).__name__} module was rebuilt (nnx.clone, nnx.merge or "
                         "nnx.eval_shape; surgery methods such as BlurPool clone the model), so its attributes are "
                         "sorted and the definition order is lost. List LayerFreezing before surgery methods, or "
                         "pass layer_order=[module paths, earliest first].")
    out: list[tuple[str, ...]] = []
    seen: set[int] = set()

    def walk(node: Any, path: tuple[str, ...]) -> None:
        if id(node) in seen:  # a shared submodule belongs where it first appears
            return
        seen.add(id(node))
        out.append(path)
        if isinstance(node, nnx.Variable):
            return
        if isinstance(node, nnx.Module) and isinstance(node, Sequence):  # nnx.List: by index, not by '10' < '2'
            items = list(enumerate(node))
        elif isinstance(node, nnx.Module):
            items = [(k, v) for k, v in vars(node).items() if not k.startswith("_pytree__")]
        elif isinstance(node, Mapping):
            items = list(node.items())
        else:
            items = list(enumerate(node))
        for k, v in items:
            if isinstance(v, (nnx.Module, nnx.Variable, list, tuple, Mapping)):
                walk(v, path + (str(k),))

    walk(model, ())
    return out


def _layers(params: Any, order: list[tuple[str, ...]] | None):
    """(layer paths in freezing order, pytree like ``params`` of each leaf's layer position or -1)."""
    if order is None:
        from flax import nnx

        if isinstance(params, nnx.State):
            raise ValueError("LayerFreezing: nnx.State sorts its keys, so the params alone do not give the layers' "
                             "definition order; pass model=<the nnx.Module> (the LayerFreezing method reads it "
                             "from the Trainer's model by itself).")
    container = {p: i for i, p in enumerate(_container_order(params))}
    leaf_paths = [_norm_keypath(kp) for kp, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
    parents = {p[:-1] for p in leaf_paths}
    leaf_layers = {L for L in parents if not any(len(o) > len(L) and o[:len(L)] == L for o in parents)}
    first = {}
    for p in leaf_paths:
        if p[:-1] in leaf_layers:
            first[p[:-1]] = min(first.get(p[:-1], math.inf), container.get(p, math.inf))
    if order is None:
        ranked = sorted(leaf_layers, key=lambda L: (first[L], L))
    else:
        rank = {}
        for i, q in enumerate(order):
            rank.setdefault(q, i)

        def key(L):
            # the nearest ancestor the module walk knows (a layer added by later surgery sits where its parent was)
            for k in range(len(L), -1, -1):
                if L[:k] in rank:
                    return (rank[L[:k]], first[L], L)
            raise ValueError(f"LayerFreezing: layer {'/'.join(L)!r} is not covered by the layer order "
                             f"{['/'.join(q) for q in order]}; list it (or a module containing it).")

        ranked = sorted(leaf_layers, key=key)
    position = {L: i for i, L in enumerate(ranked)}
    index = jax.tree_util.tree_map_with_path(lambda kp, _: position.get(_norm_keypath(kp)[:-1], -1), params)
    return ranked, index


def get_layers(params: Any, model: Any = None) -> list[str]:
    """The layers of ``params`` in the order LayerFreezing freezes them, as ``'/'``-joined paths (the last one is
    never frozen). ``model`` (nnx or torch module, or paths in definition order) gives the order; see the card."""
    ranked, _ = _layers(params, None if model is None else _definition_order(model))
    return ["/".join(L) for L in ranked]


# ---- the schedule ------------------------------------------------------------------------------------------------

def _check(freeze_start: float, freeze_level: float) -> None:
    if not 0.0 <= freeze_start < 1.0:
        raise ValueError(f"LayerFreezing: freeze_start must be in [0, 1), got {freeze_start!r}.")
    if not 0.0 <= freeze_level <= 1.0:
        raise ValueError(f"LayerFreezing: freeze_level must be in [0, 1], got {freeze_level!r}.")


def _freeze_schedule(current_duration: float, freeze_start: float, freeze_level: float) -> float:
    # Composer's _freeze_schedule, operation for operation (float64), so depths match at exact boundaries.
    if current_duration <= freeze_start:
        return 0.0
    return freeze_level * ((current_duration - freeze_start) / (1.0 - freeze_start))


def _depth(current_duration: float, n_layers: int, freeze_start: float, freeze_level: float) -> int:
    return min(int(_freeze_schedule(current_duration, freeze_start, freeze_level) * max(n_layers - 1, 0)),
               max(n_layers - 1, 0))


def freeze_layers(params: Any, current_duration, freeze_start: float = 0.5, freeze_level: float = 1.0, *,
                  model: Any = None):
    """Composer's ``freeze_layers``, pure: returns ``(frozen, freeze_depth, freeze_percentage)``.

    ``frozen`` is a pytree like ``params`` with a bool per leaf (True: frozen), to mask gradients and updates with
    (``jnp.where(frozen, 0, u)``); Composer instead edits ``requires_grad`` and the optimizer's param groups.
    ``current_duration`` is the elapsed fraction of training: a Python number gives Python/numpy results, a traced
    value gives traced ones (computed in float32; the LayerFreezing method avoids that rounding, see the card).
    ``model`` supplies the layer order (required for ``nnx.State`` params, whose keys are sorted).
    """
    _check(freeze_start, freeze_level)
    ranked, index = _layers(params, None if model is None else _definition_order(model))
    n = len(ranked)
    if isinstance(current_duration, (int, float)):
        pct = _freeze_schedule(float(current_duration), freeze_start, freeze_level)
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
    count: jax.Array  # optimizer steps applied: the schedule's clock, checkpointed with the optimizer
    inner_state: Any


def layer_freezing_tx(inner: optax.GradientTransformation, info: RunInfo, freeze_start: float = 0.5,
                      freeze_level: float = 1.0, update_interval: str | Time = "1ep", *,
                      model_order: Sequence | None = None) -> optax.GradientTransformation:
    """``inner`` with Composer's freezing schedule applied to its inputs and outputs (see the module docstring).

    ``model_order`` is ``_definition_order(model)``-style paths (or None for the params' container order).
    """
    _check(freeze_start, freeze_level)
    interval = _interval(update_interval)
    if interval.unit == TimeUnit.EPOCH:
        if not info.steps_per_epoch:
            raise ValueError("LayerFreezing: update_interval in 'ep' (Composer's epoch-end freezing) needs the "
                             "epoch length; this run has no steps_per_epoch (a loader without len()). Use "
                             "update_interval='Nba'.")
        boundary = int(info.steps_per_epoch) * int(interval.value)
    else:
        boundary = int(interval.value)
    total = max(int(info.total_steps), 1)
    # jit rebuilds dicts with sorted keys, so a dict's insertion order exists only on the host: without a module
    # order, pin the layer order of the params `init` sees (the Trainer calls it on the host, before any jit).
    pinned = {"order": None if model_order is None else list(model_order)}

    def init(params):
        ranked, _ = _layers(params, pinned["order"])  # a missing order fails here, before the first step
        if pinned["order"] is None:
            pinned["order"] = ranked
        return LayerFreezingState(jnp.zeros((), jnp.int32), inner.init(params))

    def update(updates, state, params=None):
        ranked, index = _layers(updates, pinned["order"])
        th = _thresholds(len(ranked), total, boundary, freeze_start, freeze_level)
        k = state.count // boundary  # boundaries passed before this step
        depth = (k >= jnp.asarray(th)).sum(dtype=jnp.int32) if th.size else jnp.zeros((), jnp.int32)

        def mask(u, i):
            if i < 0:  # direct params of a non-leaf module: never frozen, as in Composer
                return u
            return jnp.where(i < depth, jnp.zeros_like(u), u)

        grads = jax.tree.map(mask, updates, index)
        out, inner_state = inner.update(grads, state.inner_state, params)
        return jax.tree.map(mask, out, index), LayerFreezingState(state.count + 1, inner_state)

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
    """Composer's ``LayerFreezing(freeze_start, freeze_level)`` as a :class:`Method` (``model`` + ``tx`` slots).

    ``layer_order`` (keyword-only, ours): module paths earliest first (``'blocks/0/conv1'`` or
    ``'blocks.0.conv1'``), for models whose definition order cannot be read (see the card).
    """
    _check(freeze_start, freeze_level)
    _interval(update_interval)
    if layer_order is not None and (isinstance(layer_order, str) or not all(isinstance(p, str) for p in layer_order)):
        raise ValueError(f"LayerFreezing: layer_order must be a list of module paths such as ['stem', "
                         f"'blocks/0/conv1'], got {layer_order!r}.")
    # The model slot runs on the host before the optimizer is built (Trainer: apply_model, then wrap_tx); it is
    # the only place the module (and so the definition order nnx.State loses) is visible.
    seen: dict[str, Any] = {"order": None if layer_order is None else _definition_order(list(layer_order))}

    def model_fn(task):
        if layer_order is not None:
            return task
        source = getattr(task, "source", None)
        from flax import nnx

        if is_torch_module(source) or isinstance(source, nnx.Module):
            seen["order"] = _definition_order(source)
        else:  # a PureModel: its params' own (dict insertion) order
            seen["order"] = None
        return task

    def tx_fn(inner, info):
        return layer_freezing_tx(inner, info, freeze_start, freeze_level, update_interval,
                                 model_order=seen["order"])

    return Method(name="LayerFreezing", model=model_fn, tx=tx_fn,
                  description=f"LayerFreezing(freeze_start={freeze_start}, freeze_level={freeze_level}, "
                              f"update_interval={update_interval!r})")
