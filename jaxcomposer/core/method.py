"""``Method``: a speedup method as a bundle of optional pure pieces, and ``compose``, its ``optax.chain``.

Composer's in-step events mutate eager tensors. Our step is one traced pure function, so each in-step event
becomes a fixed *slot* where pure functions are composed at trace time (docs/design.md, "Methods and slots").
Every slot has the same shape, ``slot(x, ctx) -> x``, and every slot receives the same :class:`StepCtx`:

========== ============================================= ==================================================
slot        ``x`` (runs)                                  examples
========== ============================================= ==================================================
model       the task (host, once, before ``tx.init``)     BlurPool (torch surgery is looked up by name)
batch       the batch dict (in jit)                       MixUp, CutOut, ProgressiveResizing
loss        ``loss_fn(outputs, batch) -> (B,)`` (trace)   LabelSmoothing, MixUp's target interpolation
grad        ``grad_fn`` (trace)                           SAM, SelectiveBackprop
tx          the optax transformation (trace, every step)  GradientClipping, LayerFreezing, SWA
schedule    ``alpha(step) -> LR multiplier`` (trace)      SWA's learning-rate annealing
post_step   ``PostStep(init, update)`` on own state       EMA
eval        own state -> (params, model_state) to eval    EMA, SWA
stage       batch shapes -> hashable (host, every step)   static shapes: one compile per stage
data        the numpy batch (host, before the device)     RandAugment, AugMix
========== ============================================= ==================================================

``grad_fn(params, model_state, batch, key) -> ((mean_loss, new_model_state), grads)``. ``post_step`` is
``PostStep(init(params, model_state, ctx) -> extra, update(extra, params, model_state, ctx) -> extra)``; ``eval``
is ``eval(extra, params, model_state, ctx) -> (params, model_state)``; ``extra`` is the method's own state, kept in
``TrainState.extras[name]``. The ``tx`` slot is built inside each step from that step's ctx (its state structure
comes from building it once with the step-0 ctx), so an optimizer wrapper reads the clock from ``ctx.step`` and
keeps no counter of its own.

Composition is ``optax.chain``-like: model, batch, data and post_step run in list order; loss, grad, tx and
schedule wrappers nest so the first-listed method is outermost, which gives Composer's first-in-last-out order
(``BEFORE_LOSS`` A, B then ``AFTER_LOSS`` B, A) for free. A method declares where it sorts (``order``) and what it
cannot share a recipe with (``exclusive``, ``conflicts_with``); the core knows no method by name. Methods share
facts only through the ctx or their own state, never through closures.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Hashable, NamedTuple, Sequence

import jax
import numpy as np
import optax

from jaxcomposer.errors import MethodConflictError


class RunInfo(NamedTuple):
    """Static facts about the run, known before the first step: its length in steps (batches), the epoch length
    (None for loaders without ``len()``), the optimizer's base learning rate (None when it has no ``lr``) and the
    Trainer's ``precision`` (``'fp32'``, ``'amp_bf16'``, ...; None outside a Trainer)."""

    total_steps: int = 1
    steps_per_epoch: int | None = None
    base_lr: float | None = None
    precision: str | None = None


class ModelView(NamedTuple):
    """What the model exposes to methods.

    ``param_order()`` gives the params' paths (tuples of strings, as :func:`jaxcomposer.core.model.param_path`
    names them) in the order the forward pass first reads them: earliest layers first, the same for NNX and
    bridged torch models (memoized; it traces the forward once, on first call). ``per_example_loss(params,
    model_state, batch, key, *, train=True) -> (losses (B,), new_model_state)`` is the step's forward (at its
    precision) and composed loss, for wrappers that must score examples without a gradient (SelectiveBackprop);
    None outside a train step. ``param_layout`` says where a weight keeps its output units: ``'flax'`` (NNX: the
    last axis, Dense ``(in, out)``, Conv ``(kh, kw, in, out)``) or ``'torch'`` (a bridged torch model's
    ``state_dict`` layout: axis 0, Linear ``(out, in)``, Conv ``(out, in, kh, kw)``).
    """

    param_order: Callable[[], tuple[tuple[str, ...], ...]] | None = None
    per_example_loss: Callable | None = None
    param_layout: str = "flax"

    @property
    def unit_axis(self) -> int:
        """The output-unit axis of a weight in this layout (``0`` torch, ``-1`` flax)."""
        return 0 if self.param_layout == "torch" else -1


class StepCtx(NamedTuple):
    """The one context every slot receives.

    ``step`` is the clock: batches trained before this one (a traced int32 in jit, a Python int on the host); a
    step skipped for a non-finite loss still advances it, as it advances the timestamp (docs/design.md, "The
    clock"). ``key`` is this method's own key for this step (``fold_in(fold_in(run key, step), name)``; in the
    host ``data`` slot, a ``numpy.random.Generator`` seeded from (seed, epoch, batch, name)). ``stage`` is the value
    this method's ``stage`` slot returned for this step (static). ``run`` holds the static :class:`RunInfo`;
    ``model`` the :class:`ModelView`. ``host`` is this method's values computed on the host for this step and passed
    into it as arguments (traced; the users' algorithms' captured arrays), None for most methods. ``emit(name,
    value)`` (in the train step, outside the differentiated function) adds a value the step returns in
    ``metrics['logs']``, which the Trainer logs after the step.
    """

    step: Any = 0
    key: Any = None
    stage: Hashable = None
    run: RunInfo = RunInfo()
    model: ModelView = ModelView()
    host: Any = None
    emit: Callable[[str, Any], None] | None = None

    @property
    def progress(self):
        """Elapsed fraction of the run: ``step / total_steps`` (a traced float32 in jit)."""
        return self.step / max(self.run.total_steps, 1)


def require_stage(ctx: StepCtx, who: str, why: str) -> Hashable:
    """``ctx.stage``, which an in-step slot of the method ``who`` cannot do without: a ValueError saying ``why``
    when the step was given none (a loop of the user's own that did not pass the method's stage)."""
    if ctx.stage is None:
        raise ValueError(f"{who}: ctx.stage is None, but {why}")
    return ctx.stage


class PostStep(NamedTuple):
    """A method's own state kept beside the params (EMA weights, ...): ``init(params, model_state, ctx) -> extra``
    on the host; ``update(extra, params, model_state, ctx) -> extra`` in jit after the optimizer update."""

    init: Callable[[Any, Any, StepCtx], Any]
    update: Callable[[Any, Any, Any, StepCtx], Any]


@dataclasses.dataclass(frozen=True)
class Method:
    """A speedup method: a name, any subset of the slots in this module's table, and its declared relations.

    ``order``: methods sort by it, stably (lower is earlier in list order and outermost among wrappers).
    ``exclusive``: capabilities at most one method of a recipe may hold (``"interpolates_targets"``: MixUp,
    CutMix). ``conflicts_with``: names of methods this one refuses to share a recipe with.
    """

    name: str
    model: Callable[[Any, StepCtx], Any] | None = None
    batch: Callable[[dict, StepCtx], dict] | None = None
    loss: Callable[[Callable, StepCtx], Callable] | None = None
    grad: Callable[[Callable, StepCtx], Callable] | None = None
    tx: Callable[[optax.GradientTransformation, StepCtx], optax.GradientTransformation] | None = None
    schedule: Callable[[Callable, StepCtx], Callable] | None = None
    post_step: PostStep | None = None
    eval: Callable[[Any, Any, Any, StepCtx], tuple[Any, Any]] | None = None
    stage: Callable[[dict | None, StepCtx], Hashable] | None = None
    data: Callable[[dict, StepCtx], dict] | None = None
    order: int = 0
    exclusive: frozenset[str] = frozenset()
    conflicts_with: frozenset[str] = frozenset()
    description: str = ""

    def __post_init__(self):
        for field in ("exclusive", "conflicts_with"):  # accept any iterable of names; a bare string is one name
            value = getattr(self, field)
            object.__setattr__(self, field, frozenset([value] if isinstance(value, str) else value))


class MethodEntry(NamedTuple):
    """How a method file registers itself (its module-level ``ENTRY``): Composer's registry spelling (the YAML
    ``algorithms:`` key, e.g. ``"mixup"``), the factory (Composer's class name, returning a :class:`Method`) and
    the functional forms exported by ``jaxcomposer.functional``. ``jaxcomposer.algorithms`` collects every file's
    ``ENTRY``, so adding a method edits no other file."""

    registry_name: str
    factory: Callable[..., Method]
    functional: tuple[Callable, ...] = ()


# slots whose functions wrap the one before: folded in reverse, so the first-listed method is outermost
WRAPPER_SLOTS = frozenset({"loss", "grad", "tx", "schedule"})


def name_hash(name: str) -> int:
    """A stable (not Python's salted ``hash``) 31-bit number per name."""
    h = 0
    for ch in name.encode():
        h = (h * 131 + ch) % (2**31 - 1)
    return h


def method_key(base_key: jax.Array, step: jax.Array, name: str) -> jax.Array:
    """The key a method gets at a step: a pure function of (seed, step, name), so a resumed run draws the same."""
    return jax.random.fold_in(jax.random.fold_in(base_key, step), name_hash(name))


@dataclasses.dataclass(frozen=True)
class Composed:
    """The methods of a recipe folded into the slots the train step uses.

    Every ``apply_*``/``wrap_*`` takes the step's ctx with ``key`` = the step key ``fold_in(run key, step)`` and
    ``stage`` = every method's stage (what :meth:`stage` returned); each method sees its own key and stage.
    """

    methods: tuple[Method, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.methods)

    def _each(self, slot: str, reverse: bool = False):
        ms = reversed(self.methods) if reverse else self.methods
        return [(m, getattr(m, slot)) for m in ms if getattr(m, slot) is not None]

    @staticmethod
    def own(m: Method, ctx: StepCtx) -> StepCtx:
        """``ctx`` as method ``m`` sees it: its own key and its own stage."""
        stage = dict(ctx.stage).get(m.name) if isinstance(ctx.stage, tuple) else None
        key = None if ctx.key is None else jax.random.fold_in(ctx.key, name_hash(m.name))
        host = ctx.host.get(m.name) if isinstance(ctx.host, dict) else None
        return ctx._replace(key=key, stage=stage, host=host)

    def fold(self, slot: str, x: Any, ctx: StepCtx, *,
             own: Callable[[Method, StepCtx], StepCtx] | None = None) -> Any:
        """``x`` passed through every method's ``slot`` function, ``x = f(x, own(m, ctx))`` (``own`` defaults to
        :meth:`own`): in list order, or, for the wrapper slots (loss, grad, tx, schedule), in reverse, so that the
        first-listed method's wrapper is outermost."""
        own = self.own if own is None else own
        for m, f in self._each(slot, reverse=slot in WRAPPER_SLOTS):
            x = f(x, own(m, ctx))
        return x

    # partialmethods, not wrapper functions: no frame of their own, so a slot's warnings keep their stacklevel
    apply_model = functools.partialmethod(fold, "model")
    apply_batch = functools.partialmethod(fold, "batch")

    def apply_data(self, batch: dict, ctx: StepCtx, seed_parts: tuple[int, ...]) -> dict:
        """Host-side data methods, in list order; each draws from its own numpy generator seeded by ``seed_parts``
        (run seed, epoch, batch in epoch) and its name, so a resumed run augments identically."""
        def own_with_generator(m: Method, ctx: StepCtx) -> StepCtx:
            seq = np.random.SeedSequence([*(int(p) for p in seed_parts), name_hash(m.name)])
            return self.own(m, ctx)._replace(key=np.random.default_rng(seq))

        return self.fold("data", batch, ctx, own=own_with_generator)

    @property
    def has_data(self) -> bool:
        return bool(self._each("data"))

    wrap_loss = functools.partialmethod(fold, "loss")
    wrap_grad = functools.partialmethod(fold, "grad")
    wrap_tx = functools.partialmethod(fold, "tx")
    wrap_schedule = functools.partialmethod(fold, "schedule")

    def init_extras(self, params, model_state, ctx: StepCtx) -> dict:
        return {m.name: p.init(params, model_state, self.own(m, ctx)) for m, p in self._each("post_step")}

    def update_extras(self, extras: dict, params, model_state, ctx: StepCtx) -> dict:
        new = dict(extras)
        for m, p in self._each("post_step"):
            new[m.name] = p.update(extras[m.name], params, model_state, self.own(m, ctx))
        return new

    def eval_weights(self, extras: dict, params, model_state, ctx: StepCtx):
        """The weights evaluation uses: each ``eval`` slot in list order may replace them (EMA, SWA)."""
        for m, f in self._each("eval"):
            params, model_state = f(extras.get(m.name), params, model_state, self.own(m, ctx))
        return params, model_state

    def stage(self, batch_shapes: dict | None, ctx: StepCtx) -> Hashable:
        """Every method's stage for ``ctx.step`` (host): ``batch_shapes`` (key -> shape of the loader's batch)
        lets a stage size itself to the data (ProgressiveResizing pins sizes to the image width)."""
        parts = tuple((m.name, f(batch_shapes, self.own(m, ctx))) for m, f in self._each("stage"))
        return parts or None


def compose(methods: Sequence[Method] | None) -> Composed:
    """Fold a recipe into slots, like ``optax.chain``; raise on declared conflicts before anything is compiled."""
    methods = tuple(methods or ())
    for m in methods:
        if not isinstance(m, Method):
            raise TypeError(f"algorithms: expected jaxcomposer Method objects, got {type(m).__name__} ({m!r}). "
                            "Build them with jaxcomposer.algorithms, e.g. algorithms.MixUp(alpha=0.2).")
    names = [m.name for m in methods]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise MethodConflictError(f"algorithms: {dupes} listed more than once; each method may appear once.")
    for m in methods:
        clash = sorted(m.conflicts_with & set(names))
        if clash:
            raise MethodConflictError(f"algorithms: {m.name} cannot be combined with {clash}; keep one of them.")
    for capability in sorted({c for m in methods for c in m.exclusive}):
        holders = [m.name for m in methods if capability in m.exclusive]
        if len(holders) > 1:
            raise MethodConflictError(
                f"algorithms: {holders} all claim {capability!r}, which one method of a recipe may hold "
                f"(e.g. two methods that interpolate targets would compound their mixing). Keep one of them.")
    return Composed(tuple(sorted(methods, key=lambda m: m.order)))
