"""Composer's learning-rate schedulers, as stateless objects that compile to jit-safe functions of the step.

Each scheduler keeps Composer's name, arguments and defaults. ``scheduler.schedule(max_batches=...,
steps_per_epoch=...)`` converts every Time argument to batches once, on the host, and returns
``alpha(step) -> jnp.float32``: the LR multiplier at the clock ``step``, the batches trained before this one
(Composer evaluates its schedulers at ``timestamp.batch``, the same count; docs/design.md, "The clock"). The
Trainer applies ``optax.scale(alpha(ctx.step))`` as the last link of the step's ``optax.chain``; any optax loop can
use it with ``optax.scale_by_schedule(alpha)``.

Scale schedule ratio (SSR), as Composer's ``_convert_time``: the trainer passes ``max_batches`` already scaled by
``ssr``; a ``dur`` argument is a fraction of that scaled length and is not scaled again, while every other argument
is converted to batches and multiplied by ``ssr``. Warmups are scaled only when ``scale_warmup=True``.

Fail fast, as Composer: ``schedule()`` runs Composer's argument checks before anything is traced or compiled, and
its errors name the scheduler and the argument. The warmup schedulers with a ``t_max`` refuse t_warmup and t_max
in different units (after Composer's conversion, which gives 'dur' the unit of ``max_duration``) and a t_max
shorter than ``max_duration`` (so ``t_max='0.75dur'`` is refused); see ``_Warmup``. Pass ``max_duration`` (as
written, already scaled) to ``schedule()`` for the exact rules of a run measured in 'sp' or 'tok'; without it the
run is taken to be ``max_batches`` batches.

Where Composer's code and its intent disagree we follow the intent, and say so (ConstantWithWarmupScheduler is
the exception: it follows Composer's code and holds ``alpha`` after t_max, where Composer's docstring says 1.0):
- fractions of ``t_max`` are clipped to [0, 1] in every scheduler (Composer clips only some of them; unclipped,
  cosine would rise again and a fractional polynomial power would give NaN after ``t_max``);
- with ``scale_warmup=True`` the scaled warmup length is used everywhere (Composer compares the step with the
  unscaled length, which leaves a flat stretch or a jump at the end of warmup).
"""
from __future__ import annotations

import dataclasses
import inspect
import warnings
from typing import Callable, Sequence, Union

import jax.numpy as jnp

from jaxcomposer.core.time import Time, TimeUnit, time_arg, to_batches
from jaxcomposer.errors import ConfigurationError

__all__ = [
    "ComposerScheduler",
    "StepScheduler",
    "MultiStepScheduler",
    "ConstantScheduler",
    "LinearScheduler",
    "ExponentialScheduler",
    "CosineAnnealingScheduler",
    "CosineAnnealingWarmRestartsScheduler",
    "PolynomialScheduler",
    "MultiStepWithWarmupScheduler",
    "ConstantWithWarmupScheduler",
    "LinearWithWarmupScheduler",
    "CosineAnnealingWithWarmupScheduler",
    "PolynomialWithWarmupScheduler",
    "compose_schedules",
    "call_function_scheduler",
]

TimeLike = Union[Time, str]
Schedule = Callable[[object], jnp.ndarray]


@dataclasses.dataclass(frozen=True)
class _Context:
    """What converting a Time to batches needs; built once per ``schedule`` call."""

    max_batches: int
    steps_per_epoch: int | None
    ssr: float
    batch_size: int | None
    tokens_per_batch: int | None
    max_duration: Time  # as the run wrote it (already scaled by ssr); Time(max_batches, 'ba') when not given

    def batches(self, t: Time, *, scale: bool = True) -> int:
        """Composer's ``_convert_time``: ``dur`` is relative to the already-scaled max duration, others get ssr."""
        if t.unit == TimeUnit.DURATION:
            return int(t.value * self.max_batches)
        n = to_batches(
            t, steps_per_epoch=self.steps_per_epoch, max_batches=self.max_batches,
            batch_size=self.batch_size, tokens_per_batch=self.tokens_per_batch,
        )
        return int(n * self.ssr) if scale else n

    def composer_time(self, t: Time, name: str, *, scale: bool = True) -> Time:
        """``t`` as Composer's ``_convert_time`` leaves it, in the unit Composer compares it in: 'dur' becomes the
        unit of max_duration ('ba' when that is 'ep'), 'ep' becomes 'ba', other units stay; then all but 'dur'
        are scaled by ssr when ``scale``. This decides the warmup schedulers' unit checks."""
        if t.unit == TimeUnit.SECOND:
            raise ValueError(f"{name}={t.to_timestring()!r}: wall clock time ('sec') is not an allowed time unit "
                             f"for a scheduler; use 'ba', 'ep', 'sp', 'tok' or 'dur'.")
        md = self.max_duration
        if t.unit == TimeUnit.DURATION:
            if md.unit == TimeUnit.EPOCH:
                return Time(int(t.value * self._steps_per_epoch(t, name) * md.value), TimeUnit.BATCH)
            return Time(int(t.value * md.value), md.unit)
        if t.unit == TimeUnit.EPOCH:
            t = Time(t.value * self._steps_per_epoch(t, name), TimeUnit.BATCH)
        return Time(int(t.value * self.ssr), t.unit) if scale else t

    def _steps_per_epoch(self, t: Time, name: str) -> int:
        if self.steps_per_epoch is None:
            raise ValueError(f"Cannot convert {name}={t.to_timestring()!r} to batches: steps_per_epoch is None; "
                             f"pass steps_per_epoch.")
        return self.steps_per_epoch


_EXAMPLES = "'1dur', '8ep' or '100ba'"  # time strings a scheduler's error shows


def _float(step) -> jnp.ndarray:
    return jnp.asarray(step).astype(jnp.float32)


def _frac(t: jnp.ndarray, start: int, length: int, empty: float = 1.0) -> jnp.ndarray:
    """(t - start) / length clipped to [0, 1]; a zero-length phase gives ``empty`` instead of dividing by 0."""
    if length <= 0:
        return jnp.full_like(t, empty)
    return jnp.clip((t - start) / length, 0.0, 1.0)


def _cosine(x: jnp.ndarray, alpha_f: float) -> jnp.ndarray:
    return alpha_f + (1.0 - alpha_f) * 0.5 * (1.0 + jnp.cos(jnp.pi * x))


def _linear(x: jnp.ndarray, alpha_i: float, alpha_f: float) -> jnp.ndarray:
    return alpha_i + (alpha_f - alpha_i) * x


def _polynomial(x: jnp.ndarray, power: float, alpha_f: float) -> jnp.ndarray:
    return alpha_f + (1.0 - alpha_f) * (1.0 - x) ** power


def _past_warmup(step, t_w: int, t_max: int) -> jnp.ndarray:
    """The fraction of the post-warmup phase (t_w to t_max) done at ``step``: tau of the warmup schedulers."""
    return _frac(_float(step), t_w, t_max - t_w, empty=0.0)


def _check_positive(n: int, name: str, t: Time) -> int:
    if n <= 0:
        raise ValueError(f"{name}={t.to_timestring()!r} is {n} batches after conversion; expected at least 1 batch.")
    return n


class ComposerScheduler:
    """Base class: subclasses are frozen dataclasses and implement ``_build(ctx) -> alpha(step)``."""

    _TIME_FIELDS = ("t_max", "t_warmup", "t_0", "step_size", "decay_period")

    def __post_init__(self):
        # Time arguments arrive as strings or Times; parse them once, naming the argument in any error.
        for name in self._TIME_FIELDS:
            if hasattr(self, name):
                object.__setattr__(self, name, time_arg(getattr(self, name), name, _EXAMPLES, TypeError))

    def schedule(
        self,
        *,
        max_batches: int,
        steps_per_epoch: int | None,
        ssr: float = 1.0,
        batch_size: int | None = None,
        tokens_per_batch: int | None = None,
        max_duration: Time | str | None = None,
    ) -> Schedule:
        """Compile to ``alpha(step)``. ``max_batches`` is the run length in batches, already multiplied by ssr.

        ``max_duration`` is the run's length as written (also already scaled by ssr, as Composer's
        ``state.max_duration``): its unit is the one 'dur' arguments take in Composer's checks, so a warmup
        scheduler is checked exactly as Composer checks it. ``None`` means ``Time(max_batches, 'ba')``, which
        gives the same checks as a run measured in 'ba' or 'ep'. The checks run here, before anything is traced
        or compiled, and name the scheduler and the argument."""
        if isinstance(max_batches, bool) or not isinstance(max_batches, int) or max_batches <= 0:
            raise ValueError(f"max_batches must be a positive int (the run length in batches), got {max_batches!r}.")
        if not ssr > 0:
            raise ValueError(f"ssr (scale_schedule_ratio) must be > 0, got {ssr!r}.")
        md = _max_duration(max_duration, max_batches, steps_per_epoch)
        ctx = _Context(max_batches, steps_per_epoch, float(ssr), batch_size, tokens_per_batch, md)
        self._check(ctx)
        fn = self._build(ctx)

        def alpha(step) -> jnp.ndarray:
            return jnp.asarray(fn(step), jnp.float32)

        return alpha

    def _check(self, ctx: _Context) -> None:
        """Composer's fail-fast checks of the arguments against the run; none for most schedulers."""

    def _build(self, ctx: _Context) -> Schedule:  # pragma: no cover - abstract
        raise NotImplementedError


def _max_duration(max_duration: Time | str | None, max_batches: int, steps_per_epoch: int | None) -> Time:
    if max_duration is None:
        return Time(max_batches, TimeUnit.BATCH)
    md = time_arg(max_duration, "max_duration", "'10ep' or '1000ba'", TypeError)
    if md.unit not in (TimeUnit.EPOCH, TimeUnit.BATCH, TimeUnit.SAMPLE, TimeUnit.TOKEN) or md.value <= 0:
        raise ValueError(f"max_duration={md.to_timestring()!r}: expected a positive time in 'ep', 'ba', 'sp' or "
                         f"'tok', such as '10ep' or '1000ba'.")
    in_batches = md.value if md.unit == TimeUnit.BATCH else (
        md.value * steps_per_epoch if md.unit == TimeUnit.EPOCH and steps_per_epoch is not None else None)
    if in_batches is not None and in_batches != max_batches:
        raise ValueError(f"max_duration={md.to_timestring()!r} is {in_batches} batches but max_batches={max_batches}; "
                         f"pass the same run length in both (both already scaled by ssr).")
    return md


def compose_schedules(schedulers: Sequence[ComposerScheduler], **schedule_kwargs) -> Schedule:
    """Composer stacks schedulers multiplicatively; no scheduler means a constant multiplier of 1."""
    fns = [s.schedule(**schedule_kwargs) for s in schedulers]

    def alpha(step) -> jnp.ndarray:
        out = jnp.ones((), jnp.float32)
        for fn in fns:
            out = out * fn(step)
        return out

    return alpha


# ----- plain schedulers ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class StepScheduler(ComposerScheduler):
    """alpha = gamma ** floor(t / step_size)."""

    step_size: TimeLike
    gamma: float = 0.1

    def _build(self, ctx):
        size = _check_positive(ctx.batches(self.step_size), "step_size", self.step_size)
        gamma = self.gamma
        # Integer floor division: exact for any step, where float32 division would round near multiples.
        return lambda step: jnp.float32(gamma) ** (jnp.asarray(step) // size).astype(jnp.float32)


@dataclasses.dataclass(frozen=True)
class MultiStepScheduler(ComposerScheduler):
    """alpha = gamma ** (number of milestones already reached)."""

    milestones: Sequence[TimeLike]
    gamma: float = 0.1

    def __post_init__(self):
        if isinstance(self.milestones, (str, Time)):
            raise TypeError(
                f"milestones must be a list of Times or time strings, got the single value {self.milestones!r}."
            )
        object.__setattr__(self, "milestones",
                           tuple(time_arg(m, "milestones[i]", _EXAMPLES, TypeError) for m in self.milestones))

    def _build(self, ctx):
        marks = [ctx.batches(m) for m in self.milestones]
        gamma = self.gamma

        def fn(step):
            step = jnp.asarray(step)
            passed = sum((step >= m).astype(jnp.float32) for m in marks) if marks else jnp.float32(0.0)
            return jnp.float32(gamma) ** passed

        return fn


@dataclasses.dataclass(frozen=True)
class ConstantScheduler(ComposerScheduler):
    """alpha while t < t_max, then 1."""

    alpha: float = 1.0
    t_max: TimeLike = "1dur"

    def _build(self, ctx):
        t_max, alpha = ctx.batches(self.t_max), self.alpha
        return lambda step: jnp.where(jnp.asarray(step) < t_max, jnp.float32(alpha), jnp.float32(1.0))


@dataclasses.dataclass(frozen=True)
class LinearScheduler(ComposerScheduler):
    """alpha_i + (alpha_f - alpha_i) * tau, tau = clip(t / t_max)."""

    alpha_i: float = 1.0
    alpha_f: float = 0.0
    t_max: TimeLike = "1dur"

    def _build(self, ctx):
        t_max, a_i, a_f = ctx.batches(self.t_max), self.alpha_i, self.alpha_f
        return lambda step: _linear(_frac(_float(step), 0, t_max), a_i, a_f)


@dataclasses.dataclass(frozen=True)
class ExponentialScheduler(ComposerScheduler):
    """alpha = gamma ** (t / decay_period)."""

    gamma: float
    decay_period: TimeLike = "1ep"

    def _build(self, ctx):
        period = _check_positive(ctx.batches(self.decay_period), "decay_period", self.decay_period)
        gamma = self.gamma
        return lambda step: jnp.float32(gamma) ** (_float(step) / period)


@dataclasses.dataclass(frozen=True)
class CosineAnnealingScheduler(ComposerScheduler):
    """alpha_f + (1 - alpha_f) * (1 + cos(pi * tau)) / 2, tau = clip(t / t_max)."""

    t_max: TimeLike = "1dur"
    alpha_f: float = 0.0

    def _build(self, ctx):
        t_max, a_f = ctx.batches(self.t_max), self.alpha_f
        return lambda step: _cosine(_frac(_float(step), 0, t_max), a_f)


@dataclasses.dataclass(frozen=True)
class CosineAnnealingWarmRestartsScheduler(ComposerScheduler):
    """Cosine annealing restarted every cycle; cycle i lasts int(t_0 * t_mult**i) batches (truncated each cycle,
    as Composer does)."""

    t_0: TimeLike
    t_mult: float = 1.0
    alpha_f: float = 0.0

    def __post_init__(self):
        super().__post_init__()
        if not self.t_mult > 0:
            raise ValueError(f"t_mult must be > 0, got {self.t_mult!r}.")

    def _build(self, ctx):
        t_0 = _check_positive(ctx.batches(self.t_0), "t_0", self.t_0)
        a_f = self.alpha_f
        if self.t_mult == 1.0:
            return lambda step: _cosine((jnp.asarray(step) % t_0).astype(jnp.float32) / t_0, a_f)
        # Unequal cycles: list the cycle starts that fall in the run on the host, then look the step up.
        starts, lengths, start, length = [], [], 0, t_0
        while start <= ctx.max_batches:
            if length <= 0:
                raise ValueError(
                    f"t_mult={self.t_mult!r} shrinks the restart cycles of t_0={self.t_0.to_timestring()!r} to 0 "
                    f"batches before max_batches={ctx.max_batches}; use a larger t_mult or t_0."
                )
            starts.append(start)
            lengths.append(length)
            start, length = start + length, int(length * self.t_mult)
        starts_a, lengths_a = jnp.asarray(starts, jnp.int32), jnp.asarray(lengths, jnp.int32)

        def fn(step):
            step = jnp.asarray(step, jnp.int32)
            i = jnp.searchsorted(starts_a, step, side="right") - 1
            into = (step - starts_a[i]).astype(jnp.float32)
            return _cosine(jnp.clip(into / lengths_a[i].astype(jnp.float32), 0.0, 1.0), a_f)

        return fn


@dataclasses.dataclass(frozen=True)
class PolynomialScheduler(ComposerScheduler):
    """alpha_f + (1 - alpha_f) * (1 - tau) ** power, tau = clip(t / t_max)."""

    power: float
    t_max: TimeLike = "1dur"
    alpha_f: float = 0.0

    def _build(self, ctx):
        t_max, a_f, power = ctx.batches(self.t_max), self.alpha_f, self.power
        return lambda step: _polynomial(_frac(_float(step), 0, t_max), power, a_f)


# ----- warmup schedulers --------------------------------------------------------------------------------------


class _Warmup(ComposerScheduler):
    """Linear warmup from 0 over t_warmup batches to the peak ``_after_warmup`` gives, then its ``after(step)``.

    Composer's checks, run by ``schedule()`` before anything is compiled, for the schedulers with a ``t_max``
    (Composer's ``_raise_if_warmup_and_max_incompatible`` and ``_raise_if_max_duration_exceeds_t_max``; Composer's
    MultiStepWithWarmupScheduler has neither):

    1. after Composer's conversion ('dur' takes the unit of max_duration, or 'ba' when that is 'ep'; 'ep' becomes
       'ba'), t_warmup and t_max must have the same unit. So t_warmup='10ba' with t_max='1dur' is refused when
       max_duration is in 'sp' or 'tok', and accepted when it is in 'ba' or 'ep';
    2. t_max, scaled by ssr, must be >= max_duration when the two are comparable (the same unit, or t_max in 'ba'
       and max_duration in 'ep'); units that cannot be compared are not checked. So t_max='0.75dur' is always
       refused, and '1dur' always accepted.

    Composer does not refuse a warmup longer than t_max or max_duration (the multiplier ramps for the whole run,
    and after t_max, when reached, is the post-warmup value at fraction 0); we compute the same and warn.
    """

    def _check(self, ctx: _Context) -> None:
        if not hasattr(self, "t_max"):
            return
        name = type(self).__name__
        t_w = ctx.composer_time(self.t_warmup, "t_warmup", scale=False)
        t_max = ctx.composer_time(self.t_max, "t_max")
        md = ctx.max_duration
        if t_w.unit != t_max.unit:
            raise ValueError(
                f"{name}: Cannot use warmup scheduler with t_max={self.t_max.to_timestring()!r} (in "
                f"'{t_max.unit.value}' after conversion) and t_warmup={self.t_warmup.to_timestring()!r} (in "
                f"'{t_w.unit.value}'): t_warmup and t_max must use the same units. A 'dur' time takes the unit of "
                f"max_duration={md.to_timestring()!r} ('ba' if that is in 'ep') and 'ep' becomes 'ba'; give "
                f"t_warmup in '{t_max.unit.value}'" + (" or 'dur'." if self.t_max.unit == TimeUnit.DURATION else ".")
            )
        if t_max.unit == md.unit:
            limit = md.value
        elif t_max.unit == TimeUnit.BATCH and md.unit == TimeUnit.EPOCH and ctx.steps_per_epoch is not None:
            limit = md.value * ctx.steps_per_epoch
        else:
            return  # Composer cannot compare the units either, and does not check
        if t_max.value < limit:
            raise ValueError(
                f"{name}: t_max={self.t_max.to_timestring()!r} is {t_max.to_timestring()!r} after conversion, "
                f"less than max_duration={md.to_timestring()!r} ({limit}{t_max.unit.value}); t_max must be greater "
                f"than or equal to max_duration, otherwise the LR schedule is not defined for the entire training "
                f"duration. Use t_max='1dur' (the default) or a later time."
            )

    def _warmup_batches(self, ctx: _Context) -> int:
        t_w = ctx.batches(self.t_warmup, scale=self.scale_warmup)
        if t_w == 0:
            warnings.warn(
                f"{type(self).__name__}: t_warmup={self.t_warmup.to_timestring()!r} is 0 batches, so there is "
                f"no warmup; use the scheduler without warmup if that is intended.",
                stacklevel=4,
            )
        return t_w

    def _warn_if_warmup_outlasts(self, t_w: int, ctx: _Context, t_max: int | None = None) -> None:
        limit, limit_name = (t_max, "t_max") if t_max is not None and t_max <= ctx.max_batches else (
            ctx.max_batches, "max_duration")
        if t_w > limit:
            warnings.warn(
                f"{type(self).__name__}: t_warmup={self.t_warmup.to_timestring()!r} ({t_w} batches) is longer than "
                f"{limit_name} ({limit} batches), so the warmup does not finish before it. Composer accepts this, "
                f"and so do we; shorten t_warmup if it is not intended.",
                stacklevel=4,
            )

    def _build(self, ctx):
        t_w = self._warmup_batches(ctx)
        t_max = ctx.batches(self.t_max) if hasattr(self, "t_max") else None
        self._warn_if_warmup_outlasts(t_w, ctx, t_max)
        peak, after = self._after_warmup(ctx, t_w, t_max)

        def fn(step):
            t = _float(step)
            ramp = peak * t / max(t_w, 1)  # max() only guards the division; t < 0 never selects it
            return jnp.where(t < t_w, ramp, after(step))

        return fn

    def _after_warmup(self, ctx: _Context, t_w: int, t_max: int | None) -> tuple[float, Schedule]:
        """``(peak, after)``: the multiplier the warmup ramps up to, and ``after(step)``, the multiplier from
        t_warmup on (``t_w`` batches; ``t_max`` in batches, None for a scheduler without one)."""
        raise NotImplementedError  # pragma: no cover - abstract


@dataclasses.dataclass(frozen=True)
class MultiStepWithWarmupScheduler(_Warmup):
    """Warmup 0 -> 1 over t_warmup, then MultiStepScheduler(milestones, gamma)."""

    t_warmup: TimeLike
    milestones: Sequence[TimeLike]
    gamma: float = 0.1
    scale_warmup: bool = False

    def __post_init__(self):
        super().__post_init__()
        object.__setattr__(self, "milestones", MultiStepScheduler(self.milestones).milestones)

    def _after_warmup(self, ctx, t_w, t_max):
        return 1.0, MultiStepScheduler(self.milestones, self.gamma)._build(ctx)


@dataclasses.dataclass(frozen=True)
class ConstantWithWarmupScheduler(_Warmup):
    """Warmup 0 -> alpha over t_warmup, then alpha, also after t_max.

    As Composer's code, which is ``LinearWithWarmupScheduler(t_warmup, alpha_i=alpha, alpha_f=alpha, t_max)``:
    the same checks of t_warmup, t_max and max_duration, and ``alpha`` after t_max (Composer's docstring says 1.0
    after t_max, but its code returns alpha; since t_max must be >= max_duration, only the last step or a t_max in
    a unit not comparable with max_duration can get there)."""

    t_warmup: TimeLike
    alpha: float = 1.0
    t_max: TimeLike = "1dur"
    scale_warmup: bool = False

    def _after_warmup(self, ctx, t_w, t_max):
        alpha = self.alpha
        return alpha, lambda step: jnp.float32(alpha)


@dataclasses.dataclass(frozen=True)
class LinearWithWarmupScheduler(_Warmup):
    """Warmup 0 -> alpha_i over t_warmup, then linear alpha_i -> alpha_f with tau = (t - t_w) / (t_max - t_w)."""

    t_warmup: TimeLike
    alpha_i: float = 1.0
    alpha_f: float = 0.0
    t_max: TimeLike = "1dur"
    scale_warmup: bool = False

    def _after_warmup(self, ctx, t_w, t_max):
        a_i, a_f = self.alpha_i, self.alpha_f
        return a_i, lambda step: _linear(_past_warmup(step, t_w, t_max), a_i, a_f)


@dataclasses.dataclass(frozen=True)
class CosineAnnealingWithWarmupScheduler(_Warmup):
    """Warmup 0 -> 1 over t_warmup, then cosine with tau = (t - t_w) / (t_max - t_w) (Composer's code)."""

    t_warmup: TimeLike
    t_max: TimeLike = "1dur"
    alpha_f: float = 0.0
    scale_warmup: bool = False

    def _after_warmup(self, ctx, t_w, t_max):
        a_f = self.alpha_f
        return 1.0, lambda step: _cosine(_past_warmup(step, t_w, t_max), a_f)


@dataclasses.dataclass(frozen=True)
class PolynomialWithWarmupScheduler(_Warmup):
    """Warmup 0 -> 1 over t_warmup, then alpha_f + (1 - alpha_f) * (1 - tau) ** power, tau from t_warmup."""

    t_warmup: TimeLike
    power: float = 2.0
    t_max: TimeLike = "1dur"
    alpha_f: float = 0.0
    scale_warmup: bool = False

    def _after_warmup(self, ctx, t_w, t_max):
        a_f, power = self.alpha_f, self.power
        return 1.0, lambda step: _polynomial(_past_warmup(step, t_w, t_max), power, a_f)


def call_function_scheduler(scheduler: Callable, state, ssr: float = 1.0):
    """A Composer-style function scheduler's LR multiplier at ``state``, called as Composer's
    ``compile_composer_scheduler`` calls it: ``scheduler(state)`` when its signature has exactly one parameter
    (``lambda state: 0.5``), ``scheduler(state, ssr)`` otherwise. A one-parameter scheduler cannot be scaled, so
    with ``ssr != 1`` it raises a :class:`ConfigurationError` (a ``ValueError``, as Composer's)."""
    try:
        n_params = len(inspect.signature(scheduler).parameters)
    except (TypeError, ValueError):  # a callable without a signature gets the two-argument call, as any other
        n_params = None
    if n_params != 1:
        return scheduler(state, ssr)
    if ssr != 1.0:
        raise ConfigurationError(f"Scheduler {getattr(scheduler, '__name__', scheduler)!r} does not support "
                                 f"`scale_schedule_ratio` (got {ssr}). To use `scale_schedule_ratio`, the scheduler "
                                 "must take two arguments (state, ssr).")
    return scheduler(state)
