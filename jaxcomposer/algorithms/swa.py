"""Stochastic weight averaging (SWA).

Method card
-----------
**What it does.** Averages the weights visited late in training and swaps the average in at ``swa_end``. The
average is an equal-weight running mean of the params sampled every ``update_interval`` from ``swa_start``;
training (if any is left) goes on from the averaged weights. Optionally anneals the learning rate to ``swa_lr``
once averaging starts (SWALR).

**When it helps.** The last 10-30% of image-classifier training (ResNets on CIFAR/ImageNet: +0.5-1% top-1 in
Izmailov et al.), where SGD bounces around a wide basin: the average sits nearer its centre. Costs one extra
copy of the params. Leave at least an epoch after ``swa_end`` so BatchNorm statistics adapt to the averaged
weights (see below).

**Hyperparameters** (Composer's names, defaults and rules):

- ``swa_start='0.7dur'``, ``swa_end='0.97dur'``: same unit, ``'dur'`` (in ``[0, 1]``) or ``'ep'``, start < end.
- ``update_interval='1ep'``: ``'Nep'`` samples at every N-th epoch end, ``'Nba'`` every N-th batch, counted from
  the first sample (the first matching event at or past ``swa_start``).
- ``schedule_swa_lr=False``; ``anneal_strategy='linear'`` (or ``'cos'``); ``anneal_steps=10`` (counted in SWA
  updates, as Composer); ``swa_lr=None``.

**Timing, exactly as Composer's event logic.** ``n`` batches are complete after the step at clock ``n - 1``
(``ctx.step``: the batches trained before that one). The matching events are every batch end (``'ba'`` interval) or
every epoch end (``n % steps_per_epoch == 0``, ``'ep'``). The time compared with ``swa_start``/``swa_end`` is ``n /
total_steps`` (``'dur'``) or the epoch count Composer's timestamp holds at that event (``n // spe`` at an epoch
end, ``(n - 1) // spe`` at a batch end). At the first matching event with time >= ``swa_start`` the average
restarts (Composer re-creates its ``AveragedModel``); the m-th matching event from there (m = 0, 1, ...) samples
when ``m % interval == 0``; at the first matching event with time >= ``swa_end`` (after sampling, if due) the
params become the average and averaging stops. The average is torch's ``AveragedModel``: the first sample is
copied, then ``avg += (p - avg) / (swa_n + 1)``. All of this is integer arithmetic on the clock, planned on the
host: one compile for the whole run.

**BatchNorm.** Composer (with torch's ``AveragedModel(use_buffers=False)``) loads the averaged *params* and keeps
the model's *current* buffers, then relies on the remaining training to refresh BN statistics (it warns that
``swa_end='1dur'`` leaves them stale; no ``update_bn`` pass). We do the same: the model state is never touched.

**SWALR** (``schedule_swa_lr=True``): from the first sample, the LR multiplier after ``k`` samples is
``(1 - f) * a0 + f * target``, ``f = anneal(min(k / anneal_steps, 1))`` (``t`` or ``(1 - cos(pi t)) / 2``),
``a0`` the multiplier in force at ``swa_start``, ``target = swa_lr / base_lr`` (``a0`` when ``swa_lr`` is None:
hold the LR), then held to the end of training. This is ``torch.optim.swa_utils.SWALR`` as intended. Composer
differs in two ways we do not copy: it overwrites ``swa_lr`` with the current LR whenever ``schedule_swa_lr`` is
set (so the annealing is a hold whatever ``swa_lr`` says; 1.0 with no scheduler), and its per-batch LR scheduler
rewrites the LR between SWALR steps.

**How it plugs in.** ``tx`` slot, ``tx(optax_tx, ctx) -> optax_tx``, because only the optimizer can replace params
inside the jitted step; it is built inside every step from that step's ctx (docs/design.md, "Methods and slots").
Its clock is ``ctx.step`` (docs/design.md, "The clock"): the wrapper keeps no counter, so a step skipped for a
non-finite loss still advances SWA's timing, as it advances the timestamp (that step's sample, if one was due, is
not taken: its params were discarded; if it was the step at ``swa_end``, the swap does not happen). The wrapper's
state (:class:`SWAState`: ``swa_n``, the average, the wrapped optimizer's state) is in every checkpoint with
``TrainState.step``, so resume mid-averaging is exact; at ``swa_end`` its update is ``average - params`` (so the
new params equal the average up to one rounding of ``p + (avg - p)``). The average is of the params this wrapper's
optimizer produces: list SWA before other ``tx`` methods (outermost). Evaluation needs no ``eval`` slot: before
``swa_end`` Composer evaluates the raw model, after it the params are the average. ``schedule`` slot,
``schedule(alpha, ctx) -> alpha``: SWALR (its target needs ``ctx.run.base_lr``). The sampling plan is made from
``ctx.run`` (total steps, epoch length). :func:`find_swa_state` reads the average out of a train state's
``opt_state``.

**Reference.** Izmailov et al., "Averaging Weights Leads to Wider Optima and Better Generalization", UAI 2018
(arXiv:1803.05407). Composer: ``composer/algorithms/swa``.
"""
from __future__ import annotations

import warnings
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxcomposer.core.method import Method, MethodEntry, RunInfo, StepCtx
from jaxcomposer.core.state import tree_select
from jaxcomposer.core.time import Time, TimeUnit, time_arg

__all__ = ["SWA", "SWAState", "swa_tx", "swalr_schedule", "update_swa_average", "find_swa_state"]

_SWA_TIMES = "'0.7dur', '6ep' or '1ba'"
_NEVER = 2**31 - 1  # an event count no run reaches
ANNEAL_STRATEGIES = {"linear": "linear", "lin": "linear", "cos": "cos", "cosine": "cos"}


class SWAState(NamedTuple):
    """The wrapper's state; its clock is ``ctx.step``, not a counter of its own."""

    swa_n: jax.Array  # params sampled into the average so far (torch's n_averaged)
    average: Any  # the running mean; meaningless while swa_n == 0
    inner_state: Any


class _Plan(NamedTuple):
    """When things happen, in completed batches ``n``: samples at ``first, first + stride, ...`` up to ``end``
    (inclusive), where the params are replaced. ``_NEVER`` for events the run does not reach."""

    first: int
    stride: int
    end: int

    @property
    def num_samples(self) -> int:
        if self.first == _NEVER:
            return 0
        return _NEVER if self.end == _NEVER else (self.end - self.first) // self.stride + 1


def update_swa_average(average, params, swa_n):
    """One ``AveragedModel.update_parameters``: ``params`` if ``swa_n == 0`` else ``avg + (p - avg) / (swa_n + 1)``,
    tree-wise, in the average's dtype (``swa_n`` may be traced)."""
    def leaf(a, p):
        p = p.astype(a.dtype)
        n = jnp.asarray(swa_n)
        return jnp.where(n == 0, p, a + (p - a) / (n + 1).astype(a.dtype))

    return jax.tree.map(leaf, average, params)


def find_swa_state(opt_state) -> SWAState | None:
    """The :class:`SWAState` inside a (possibly chained) optimizer state, or None."""
    found = [x for x in jax.tree_util.tree_leaves(opt_state, is_leaf=lambda x: isinstance(x, SWAState))
             if isinstance(x, SWAState)]
    return found[0] if found else None


def _plan(start: Time, end: Time, interval: Time, run: RunInfo) -> _Plan:
    """The plan for a run (``ctx.run``): its length in steps and, for 'ep' units, its epoch length."""
    total = max(int(run.total_steps), 1)
    epoch_events = interval.unit == TimeUnit.EPOCH
    needs_epochs = epoch_events or start.unit == TimeUnit.EPOCH
    if needs_epochs and not run.steps_per_epoch:
        raise ValueError("SWA: 'ep' units need the epoch length; this run has no steps_per_epoch (a loader "
                         "without len()). Use 'dur' for swa_start/swa_end and 'Nba' for update_interval.")
    spe = int(run.steps_per_epoch) if needs_epochs else 1
    grid = spe if epoch_events else 1  # matching events are n = j * grid, j >= 1

    def time_at(n: int):
        if start.unit == TimeUnit.DURATION:
            return n / total  # Composer's elapsed duration, a float64 compare as in Composer
        return n // spe if epoch_events else (n - 1) // spe  # the epoch count at EPOCH_END / BATCH_END

    def first_event(value) -> int:
        lo, hi = 1, total // grid + 1  # binary search over event index j; time is nondecreasing in n
        while lo < hi:
            mid = (lo + hi) // 2
            if time_at(mid * grid) >= value:
                hi = mid
            else:
                lo = mid + 1
        return lo * grid if lo <= total // grid else _NEVER

    first = first_event(start.value)
    end = max(first_event(end.value), first) if first != _NEVER else _NEVER
    return _Plan(first, int(interval.value) * grid, end)


def swa_tx(inner: optax.GradientTransformation, plan: _Plan, step) -> optax.GradientTransformation:
    """``inner`` plus SWA's sampling and the replacement of the params by the average at ``plan.end``, for the step
    at clock ``step`` (``ctx.step``: batches trained before this one; traced in jit). Build it for each step."""
    def init(params):
        # zeros, not a copy: nothing is averaged before the first sample, and no buffer is shared with params
        return SWAState(jnp.zeros((), jnp.int32), jax.tree.map(jnp.zeros_like, params), inner.init(params))

    def update(updates, state, params=None):
        if params is None:
            raise ValueError("SWA: the optimizer update needs params (the average is of the new params); call "
                             "update(grads, state, params).")
        updates, inner_state = inner.update(updates, state.inner_state, params)
        n = jnp.asarray(step, jnp.int32) + 1  # batches complete after this step
        sample = (n >= plan.first) & (n <= plan.end) & ((n - plan.first) % plan.stride == 0)
        replace = n == plan.end
        new_params = optax.apply_updates(params, updates)  # exactly what the trainer will compute
        averaged = update_swa_average(state.average, new_params, state.swa_n)
        average = tree_select(sample, averaged, state.average)
        updates = jax.tree.map(lambda u, a, p: jnp.where(replace, (a - p).astype(u.dtype), u),
                               updates, average, params)
        return updates, SWAState(state.swa_n + sample.astype(jnp.int32), average, inner_state)

    return optax.GradientTransformation(init, update)


def swalr_schedule(alpha: Callable, plan: _Plan, anneal_strategy: str, anneal_steps: int,
                   target: float | None) -> Callable:
    """``alpha`` with SWALR from the first sample on (see the module docstring); ``target`` is ``swa_lr / base_lr``
    or None to hold the multiplier in force at ``swa_start``."""
    if plan.first == _NEVER:
        return alpha
    samples = plan.num_samples

    def new_alpha(step):
        step = jnp.asarray(step, jnp.int32)
        a0 = jnp.asarray(alpha(jnp.asarray(plan.first, jnp.int32)), jnp.float32)
        # samples whose batch end came before this step (step index s runs after s batches are complete)
        k = jnp.where(step >= plan.first, jnp.minimum((step - plan.first) // plan.stride + 1, samples), 0)
        t = jnp.minimum(k.astype(jnp.float32) / anneal_steps, 1.0)
        f = t if anneal_strategy == "linear" else (1.0 - jnp.cos(jnp.pi * t)) / 2.0
        goal = a0 if target is None else jnp.float32(target)
        return jnp.where(k > 0, (1.0 - f) * a0 + f * goal, jnp.asarray(alpha(step), jnp.float32))

    return new_alpha


def SWA(swa_start: str = "0.7dur", swa_end: str = "0.97dur", update_interval: str = "1ep",
        schedule_swa_lr: bool = False, anneal_strategy: str = "linear", anneal_steps: int = 10,
        swa_lr: float | None = None) -> Method:
    """Composer's ``SWA`` as a :class:`Method` (``tx`` slot, plus ``schedule`` when ``schedule_swa_lr``)."""
    start, end, interval = (time_arg(v, f"SWA: {n}", _SWA_TIMES) for v, n in (
        (swa_start, "swa_start"), (swa_end, "swa_end"), (update_interval, "update_interval")))
    if start.unit != end.unit:
        raise ValueError(f"SWA: swa_start and swa_end must have the same unit, got {start.to_timestring()!r} and "
                         f"{end.to_timestring()!r}.")
    if start.unit not in (TimeUnit.DURATION, TimeUnit.EPOCH):
        raise ValueError(f"SWA: swa_start and swa_end must be in 'dur' or 'ep', got {start.to_timestring()!r}.")
    if interval.unit not in (TimeUnit.BATCH, TimeUnit.EPOCH) or interval.value <= 0:
        raise ValueError(f"SWA: update_interval must be a positive number of 'ba' or 'ep', got "
                         f"{interval.to_timestring()!r}.")
    if start.value >= end.value:
        raise ValueError(f"SWA: swa_end must be > swa_start, got swa_start={start.to_timestring()!r}, "
                         f"swa_end={end.to_timestring()!r}.")
    for t, name in ((start, "swa_start"), (end, "swa_end")):
        if t.value < 0 or (t.unit == TimeUnit.DURATION and t.value > 1):
            raise ValueError(f"SWA: {name} must be >= 0 (and <= 1 in 'dur'), got {t.to_timestring()!r}.")
    if isinstance(anneal_steps, bool) or not isinstance(anneal_steps, int) or anneal_steps <= 0:
        raise ValueError(f"SWA: anneal_steps must be a positive int, got {anneal_steps!r}.")
    if not isinstance(anneal_strategy, str) or anneal_strategy.lower() not in ANNEAL_STRATEGIES:
        raise ValueError(f"SWA: anneal_strategy must be one of 'linear' or 'cos', got {anneal_strategy!r}.")
    strategy = ANNEAL_STRATEGIES[anneal_strategy.lower()]
    if swa_lr is not None and not swa_lr > 0:
        raise ValueError(f"SWA: swa_lr must be > 0 or None, got {swa_lr!r}.")
    if end.unit == TimeUnit.DURATION and end.value == 1:
        warnings.warn("SWA: swa_end='1dur' replaces the params with the average after the last batch, so "
                      "BatchNorm statistics never adapt to the averaged weights (Composer warns the same).",
                      stacklevel=2)

    def schedule_fn(alpha, ctx: StepCtx):
        target = None
        if swa_lr is not None:
            if not ctx.run.base_lr:
                raise ValueError("SWA: schedule_swa_lr with swa_lr needs the optimizer's base LR (ctx.run.base_lr); "
                                 "use a jaxcomposer optimizer (DecoupledSGDW, DecoupledAdamW) or swa_lr=None.")
            target = float(swa_lr) / float(ctx.run.base_lr)
        return swalr_schedule(alpha, _plan(start, end, interval, ctx.run), strategy, anneal_steps, target)

    def tx_fn(inner, ctx: StepCtx):
        return swa_tx(inner, _plan(start, end, interval, ctx.run), ctx.step)

    return Method(name="SWA", tx=tx_fn,
                  schedule=schedule_fn if schedule_swa_lr else None,
                  description=f"SWA(swa_start={start.to_timestring()!r}, swa_end={end.to_timestring()!r}, "
                              f"update_interval={interval.to_timestring()!r}, schedule_swa_lr={schedule_swa_lr}, "
                              f"anneal_strategy={strategy!r}, anneal_steps={anneal_steps}, swa_lr={swa_lr})")


# Registration: jaxcomposer.algorithms, jaxcomposer.functional and `jaxcomposer methods` find the method here.
ENTRY = MethodEntry(registry_name="swa", factory=SWA, functional=())
