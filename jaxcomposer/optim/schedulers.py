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

Where Composer's code and its intent disagree we follow the intent, and say so:
- fractions of ``t_max`` are clipped to [0, 1] in every scheduler (Composer clips only some of them; unclipped,
  cosine would rise again and a fractional polynomial power would give NaN after ``t_max``);
- with ``scale_warmup=True`` the scaled warmup length is used everywhere (Composer compares the step with the
  unscaled length, which leaves a flat stretch or a jump at the end of warmup).
"""
from __future__ import annotations

import dataclasses
import warnings
from typing import Callable, Sequence, Union

import jax.numpy as jnp

from jaxcomposer.core.time import Time, TimeUnit, time_arg, to_batches

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

    def batches(self, t: Time, *, scale: bool = True) -> int:
        """Composer's ``_convert_time``: ``dur`` is relative to the already-scaled max duration, others get ssr."""
        if t.unit == TimeUnit.DURATION:
            return int(t.value * self.max_batches)
        n = to_batches(
            t, steps_per_epoch=self.steps_per_epoch, max_batches=self.max_batches,
            batch_size=self.batch_size, tokens_per_batch=self.tokens_per_batch,
        )
        return int(n * self.ssr) if scale else n


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
    ) -> Schedule:
        """Compile to ``alpha(step)``. ``max_batches`` is the run length in batches, already multiplied by ssr."""
        if isinstance(max_batches, bool) or not isinstance(max_batches, int) or max_batches <= 0:
            raise ValueError(f"max_batches must be a positive int (the run length in batches), got {max_batches!r}.")
        if not ssr > 0:
            raise ValueError(f"ssr (scale_schedule_ratio) must be > 0, got {ssr!r}.")
        ctx = _Context(max_batches, steps_per_epoch, float(ssr), batch_size, tokens_per_batch)
        fn = self._build(ctx)

        def alpha(step) -> jnp.ndarray:
            return jnp.asarray(fn(step), jnp.float32)

        return alpha

    def _build(self, ctx: _Context) -> Schedule:  # pragma: no cover - abstract
        raise NotImplementedError


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
        return lambda step: a_i + (a_f - a_i) * _frac(_float(step), 0, t_max)


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
        return lambda step: a_f + (1.0 - a_f) * (1.0 - _frac(_float(step), 0, t_max)) ** power


# ----- warmup schedulers --------------------------------------------------------------------------------------


class _Warmup(ComposerScheduler):
    """Linear warmup from 0 over t_warmup batches, then ``_after(t, t_warmup_batches)``."""

    def _warmup_batches(self, ctx: _Context) -> int:
        t_w = ctx.batches(self.t_warmup, scale=self.scale_warmup)
        if t_w == 0:
            warnings.warn(
                f"{type(self).__name__}: t_warmup={self.t_warmup.to_timestring()!r} is 0 batches, so there is "
                f"no warmup; use the scheduler without warmup if that is intended.",
                stacklevel=3,
            )
        return t_w

    def _check_warmup(self, t_w: int, t_max: int, limit_name: str) -> None:
        if t_w > t_max:
            raise ValueError(
                f"{type(self).__name__}: t_warmup={self.t_warmup.to_timestring()!r} ({t_w} batches) must be <= "
                f"{limit_name} ({t_max} batches)."
            )

    def _check_t_max_covers_run(self, ctx: _Context) -> None:
        # Composer refuses a t_max shorter than max_duration: the LR would sit at alpha_f for the rest of the run.
        raw = ctx.batches(self.t_max, scale=False) if self.t_max.unit != TimeUnit.DURATION else ctx.max_batches
        if raw < ctx.max_batches:
            raise ValueError(
                f"{type(self).__name__}: t_max={self.t_max.to_timestring()!r} ({raw} batches) is shorter than "
                f"max_duration ({ctx.max_batches} batches); set t_max >= max_duration, e.g. '1dur'."
            )

    @staticmethod
    def _warm(step, t_w: int, peak: float, after: jnp.ndarray) -> jnp.ndarray:
        t = _float(step)
        ramp = peak * t / max(t_w, 1)  # max() only guards the division; t < 0 never selects it
        return jnp.where(t < t_w, ramp, after)


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

    def _build(self, ctx):
        t_w = self._warmup_batches(ctx)
        self._check_warmup(t_w, ctx.max_batches, "max_duration")
        steps = MultiStepScheduler(self.milestones, self.gamma)._build(ctx)
        return lambda step: self._warm(step, t_w, 1.0, steps(step))


@dataclasses.dataclass(frozen=True)
class ConstantWithWarmupScheduler(_Warmup):
    """Warmup 0 -> alpha over t_warmup, then alpha until t_max, then 1 (ConstantScheduler's rule)."""

    t_warmup: TimeLike
    alpha: float = 1.0
    t_max: TimeLike = "1dur"
    scale_warmup: bool = False

    def _build(self, ctx):
        t_w = self._warmup_batches(ctx)
        self._check_warmup(t_w, ctx.batches(self.t_max), "t_max")
        const = ConstantScheduler(self.alpha, self.t_max)._build(ctx)
        return lambda step: self._warm(step, t_w, self.alpha, const(step))


@dataclasses.dataclass(frozen=True)
class LinearWithWarmupScheduler(_Warmup):
    """Warmup 0 -> alpha_i over t_warmup, then linear alpha_i -> alpha_f with tau = (t - t_w) / (t_max - t_w)."""

    t_warmup: TimeLike
    alpha_i: float = 1.0
    alpha_f: float = 0.0
    t_max: TimeLike = "1dur"
    scale_warmup: bool = False

    def _build(self, ctx):
        t_w, t_max = self._warmup_batches(ctx), ctx.batches(self.t_max)
        self._check_warmup(t_w, t_max, "t_max")
        self._check_t_max_covers_run(ctx)
        a_i, a_f = self.alpha_i, self.alpha_f

        def fn(step):
            after = a_i + (a_f - a_i) * _frac(_float(step), t_w, t_max - t_w, empty=0.0)
            return self._warm(step, t_w, a_i, after)

        return fn


@dataclasses.dataclass(frozen=True)
class CosineAnnealingWithWarmupScheduler(_Warmup):
    """Warmup 0 -> 1 over t_warmup, then cosine with tau = (t - t_w) / (t_max - t_w) (Composer's code)."""

    t_warmup: TimeLike
    t_max: TimeLike = "1dur"
    alpha_f: float = 0.0
    scale_warmup: bool = False

    def _build(self, ctx):
        t_w, t_max = self._warmup_batches(ctx), ctx.batches(self.t_max)
        self._check_warmup(t_w, t_max, "t_max")
        self._check_t_max_covers_run(ctx)
        a_f = self.alpha_f

        def fn(step):
            after = _cosine(_frac(_float(step), t_w, t_max - t_w, empty=0.0), a_f)
            return self._warm(step, t_w, 1.0, after)

        return fn


@dataclasses.dataclass(frozen=True)
class PolynomialWithWarmupScheduler(_Warmup):
    """Warmup 0 -> 1 over t_warmup, then alpha_f + (1 - alpha_f) * (1 - tau) ** power, tau from t_warmup."""

    t_warmup: TimeLike
    power: float = 2.0
    t_max: TimeLike = "1dur"
    alpha_f: float = 0.0
    scale_warmup: bool = False

    def _build(self, ctx):
        t_w, t_max = self._warmup_batches(ctx), ctx.batches(self.t_max)
        self._check_warmup(t_w, t_max, "t_max")
        self._check_t_max_covers_run(ctx)
        a_f, power = self.alpha_f, self.power

        def fn(step):
            after = a_f + (1.0 - a_f) * (1.0 - _frac(_float(step), t_w, t_max - t_w, empty=0.0)) ** power
            return self._warm(step, t_w, 1.0, after)

        return fn
