"""``Method``: a speedup method as a bundle of optional pure pieces, and ``compose``, its ``optax.chain``.

Composer's in-step events mutate eager tensors. Our step is one traced pure function, so each in-step event
becomes a fixed *slot* where pure functions are composed at trace time (DESIGN §2):

======== ============================================== ====================================================
slot      signature                                      examples
======== ============================================== ====================================================
model     task -> task (host, once, before ``tx.init``)  BlurPool, SqueezeExcite
batch     (batch, ctx) -> batch (in jit)                 MixUp, CutOut
loss      loss_fn -> loss_fn (trace time)                LabelSmoothing, MixUp target interpolation
grad      (grad_fn, ctx) -> grad_fn (trace time)         SAM, SelectiveBackprop
tx        (optax tx, info) -> optax tx (trace time)      GradientClipping, LayerFreezing
schedule  (alpha, info) -> alpha (trace time)            SWA's learning-rate annealing
post_step ``PostStep(init, update)`` on extra state      EMA, SWA
eval      (extra, params, state) -> (params, state)      EMA: evaluate with the averaged weights
stage     (step, total, batch_shapes) -> hashable (host) static shapes: one compile per stage
host      (event, run_state) -> None (host)              anything that must touch Python between steps
data      (batch, rng) -> batch (host, numpy)            RandAugment, AugMix: per-example ops before the device
======== ============================================== ====================================================

``loss_fn(outputs, batch) -> (B,)`` per-example losses. ``grad_fn(params, model_state, batch, key) ->
((mean_loss, new_model_state), grads)``; grad wrappers see the whole (accumulated) batch and the step's ``StepCtx``
(built inside the jitted step, so a wrapper may branch on the static ``ctx.stage``). ``alpha(step) -> multiplier``
is the learning-rate schedule; ``info`` (:class:`RunInfo`) tells ``tx`` and ``schedule`` wrappers the run's
length. Wrappers nest so the first-listed method is outermost, which gives Composer's first-in-last-out order
(``BEFORE_LOSS`` A,B then ``AFTER_LOSS`` B,A) for free. Every in-jit slot sees its own method's ``ctx.key`` and
``ctx.stage`` (the value its ``stage`` slot returned for this step), never another method's.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Hashable, NamedTuple, Sequence

import jax
import numpy as np
import optax

from jaxcomposer.errors import JaxComposerError


class StepCtx(NamedTuple):
    """What in-jit slots know about the current step.

    ``step`` and ``progress`` are traced scalars (number of optimizer steps taken before this one, and that number
    over ``total_steps``); ``key`` is this method's own key for this step; ``stage``, ``total_steps`` and
    ``steps_per_epoch`` are static Python values. ``per_example_loss(params, model_state, batch, key, *,
    train=True) -> (losses (B,), new_model_state)`` is the run's forward (at its precision) followed by the
    composed loss, for wrappers that must score examples without a gradient (SelectiveBackprop); ``grad_fn``
    alone cannot give per-example values. None outside a train step.
    """

    step: jax.Array
    progress: jax.Array
    key: jax.Array
    stage: Hashable = None
    total_steps: int = 1
    steps_per_epoch: int | None = None
    per_example_loss: Callable | None = None


class RunInfo(NamedTuple):
    """Static facts about the run, for ``tx`` and ``schedule`` wrappers (known before the first step)."""

    total_steps: int = 1
    steps_per_epoch: int | None = None
    base_lr: float | None = None


class PostStep(NamedTuple):
    """Extra state kept beside the params (EMA weights, SWA averages, ...).

    ``init(params, model_state) -> extra``; ``update(extra, params, model_state, ctx) -> extra`` runs in jit after
    the optimizer update, with the new params.
    """

    init: Callable[[Any, Any], Any]
    update: Callable[[Any, Any, Any, StepCtx], Any]


@dataclasses.dataclass(frozen=True)
class Method:
    """A speedup method: a name and any subset of the slots described in this module's docstring.

    ``interpolates_targets`` marks methods that rewrite targets by mixing examples (MixUp, CutMix); two such
    methods in one recipe are a conflict.
    """

    name: str
    model: Callable[[Any], Any] | None = None
    batch: Callable[[dict, StepCtx], dict] | None = None
    loss: Callable[[Callable], Callable] | None = None
    grad: Callable[[Callable, StepCtx], Callable] | None = None
    tx: Callable[[optax.GradientTransformation, RunInfo], optax.GradientTransformation] | None = None
    schedule: Callable[[Callable, RunInfo], Callable] | None = None
    post_step: PostStep | None = None
    eval: Callable[[Any, Any, Any], tuple[Any, Any]] | None = None
    stage: Callable[[int, int, dict | None], Hashable] | None = None
    host: Callable[[Any, Any], None] | None = None
    data: Callable[[dict, Any], dict] | None = None
    interpolates_targets: bool = False
    description: str = ""


class MethodConflictError(JaxComposerError, ValueError):
    pass


def method_key(base_key: jax.Array, step: jax.Array, name: str) -> jax.Array:
    """The key a method gets at a step: a pure function of (seed, step, name), so a resumed run draws the same."""
    return jax.random.fold_in(jax.random.fold_in(base_key, step), _name_hash(name))


def _name_hash(name: str) -> int:
    # A stable (not Python's salted hash) 31-bit number per name.
    h = 0
    for ch in name.encode():
        h = (h * 131 + ch) % (2**31 - 1)
    return h


@dataclasses.dataclass(frozen=True)
class Composed:
    """The methods of a recipe folded into the slots the train step uses."""

    methods: tuple[Method, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.methods)

    def apply_model(self, task):
        for m in self.methods:
            if m.model is not None:
                task = m.model(task)
        return task

    @staticmethod
    def _ctx_for(m: Method, ctx: StepCtx, base_key: jax.Array) -> StepCtx:
        """``ctx`` as method ``m`` sees it: its own key and its own stage (``ctx.stage`` holds all of them)."""
        stage = dict(ctx.stage).get(m.name) if isinstance(ctx.stage, tuple) else None
        return ctx._replace(key=method_key(base_key, ctx.step, m.name), stage=stage)

    def apply_batch(self, batch: dict, ctx: StepCtx, base_key: jax.Array) -> dict:
        for m in self.methods:
            if m.batch is not None:
                batch = m.batch(batch, self._ctx_for(m, ctx, base_key))
        return batch

    def apply_data(self, batch: dict, seed_parts: tuple[int, ...]) -> dict:
        """Host-side data-pipeline methods, in list order; each draws from its own generator seeded by
        ``seed_parts`` (run seed, epoch, batch in epoch) and its name, so a resumed run augments identically."""
        for m in self.methods:
            if m.data is not None:
                seq = np.random.SeedSequence([*(int(p) for p in seed_parts), _name_hash(m.name)])
                batch = m.data(batch, np.random.default_rng(seq))
        return batch

    @property
    def has_data(self) -> bool:
        return any(m.data is not None for m in self.methods)

    def wrap_loss(self, loss_fn: Callable) -> Callable:
        for m in reversed(self.methods):
            if m.loss is not None:
                loss_fn = m.loss(loss_fn)
        return loss_fn

    def wrap_grad(self, grad_fn: Callable, ctx: StepCtx, base_key: jax.Array) -> Callable:
        for m in reversed(self.methods):
            if m.grad is not None:
                grad_fn = m.grad(grad_fn, self._ctx_for(m, ctx, base_key))
        return grad_fn

    def wrap_tx(self, tx: optax.GradientTransformation, info: RunInfo = RunInfo()) -> optax.GradientTransformation:
        for m in reversed(self.methods):
            if m.tx is not None:
                tx = m.tx(tx, info)
        return tx

    def wrap_schedule(self, alpha: Callable, info: RunInfo = RunInfo()) -> Callable:
        for m in reversed(self.methods):
            if m.schedule is not None:
                alpha = m.schedule(alpha, info)
        return alpha

    def init_extras(self, params, model_state) -> dict:
        return {m.name: m.post_step.init(params, model_state) for m in self.methods if m.post_step is not None}

    def update_extras(self, extras: dict, params, model_state, ctx: StepCtx, base_key: jax.Array) -> dict:
        new = dict(extras)
        for m in self.methods:
            if m.post_step is not None:
                new[m.name] = m.post_step.update(extras[m.name], params, model_state, self._ctx_for(m, ctx, base_key))
        return new

    def eval_weights(self, extras: dict, params, model_state):
        """Weights evaluation should use: the last method with an ``eval`` slot wins (EMA, SWA)."""
        for m in self.methods:
            if m.eval is not None:
                params, model_state = m.eval(extras[m.name], params, model_state)
        return params, model_state

    def stage(self, step: int, total_steps: int, batch_shapes: dict | None = None) -> Hashable:
        """Every method's stage for this step; ``batch_shapes`` (key -> shape of the loader's batch) lets a stage
        size itself to the data (ProgressiveResizing pins sizes to the image width)."""
        parts = tuple((m.name, m.stage(step, total_steps, batch_shapes)) for m in self.methods if m.stage is not None)
        return parts or None

    def run_host(self, event, run_state) -> None:
        for m in self.methods:
            if m.host is not None:
                m.host(event, run_state)


def compose(methods: Sequence[Method] | None) -> Composed:
    """Fold a recipe into slots, like ``optax.chain``; raise on known conflicts before anything is compiled."""
    methods = tuple(methods or ())
    for m in methods:
        if not isinstance(m, Method):
            raise TypeError(f"algorithms: expected jaxcomposer Method objects, got {type(m).__name__} ({m!r}). "
                            "Build them with jaxcomposer.algorithms, e.g. algorithms.MixUp(alpha=0.2).")
    names = [m.name for m in methods]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise MethodConflictError(f"algorithms: {dupes} listed more than once; each method may appear once.")
    # Composer's sort_selective_backprop_first: selection must see the whole batch once, outside every other grad
    # wrapper (SAM inside it then differentiates twice on the kept examples, instead of selecting twice)
    methods = tuple(sorted(methods, key=lambda m: m.name != "SelectiveBackprop"))
    mixers = [m.name for m in methods if m.interpolates_targets]
    if len(mixers) > 1:
        raise MethodConflictError(
            f"algorithms: {mixers} both interpolate targets between examples; their target mixing would compound. "
            "Keep one of them (Composer warns about the same conflict).")
    return Composed(methods)
