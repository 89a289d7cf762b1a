"""Exponential moving average (EMA) of the weights.

Method card
-----------
**What it does.** Keeps a shadow copy of the params *and* of the model state (BatchNorm statistics: Composer
averages buffers too) updated after optimizer steps as ``ema = smoothing * ema + (1 - smoothing) * params``, and
evaluates with the averaged weights once averaging has started.

**When it helps.** Almost any run with a noisy final iterate: image classifiers (ResNets: +0.2-0.5% top-1 with
``half_life='100ba'``), diffusion models and GANs (where EMA weights are the product). Costs one extra copy of the
params and a cheap elementwise update per step.

**Hyperparameters** (Composer's names, defaults and rules):

- ``half_life='1000ba'``: the time after which a term's weight in the average halves; units ``'ba'`` or ``'ep'``.
  ``smoothing = 2 ** (-(update_interval / half_life))`` (a half life of 0 means no averaging: ``smoothing = 0``).
- ``smoothing=None``: give it directly instead of ``half_life``; exactly one of the two must be given, so pass
  ``half_life=None`` with it (as in Composer). It is not adjusted for ``update_interval``.
- ``ema_start='0.0dur'``: training completed before the average starts (``'dur'``, ``'ba'`` or ``'ep'``). At the
  first update boundary at or past it, the average is (re)started from the current weights.
- ``update_interval=None``: how often to update; default 1 unit of ``half_life`` (``'1ba'`` when ``smoothing``
  is given). Units must match ``half_life``'s.

**Timing, step by step.** ``update(extra, params, model_state, ctx)`` runs in jit after the optimizer step at
the clock ``ctx.step`` (batches trained before this one), so ``n = ctx.step + 1`` batches are done (Composer's
``BATCH_END`` timestamp); the method keeps no counter of its own. Unit ``'ba'``: a boundary every batch and an
update when ``n % interval == 0``. Unit ``'ep'``: a boundary at each epoch end (``n % ctx.run.steps_per_epoch ==
0``) and an update when the epoch count is a multiple of the interval (Composer's ``EPOCH_END``). ``ema_start``
compares ``n / ctx.run.total_steps`` (``'dur'``), ``n`` (``'ba'``) or the epoch count Composer's timestamp holds at
that event (``'ep'``). Every decision is a ``jnp`` select: no Python branch on traced values, one compile for the
whole run. A step skipped for a non-finite loss keeps the old average but still advances the clock, so the
boundaries stay on the batch count (docs/design.md, "The clock").

**How it plugs in.** ``post_step`` slot: ``init(params, model_state, ctx)`` copies the weights on the host;
``update`` as above. ``eval`` slot: ``eval(extra, params, model_state, ctx)`` picks the weights evaluation uses
(docs/design.md, "Methods and slots").

**Functional form.** ``compute_ema(model, ema_model, smoothing=0.99)`` takes Composer's positional arguments. On
torch modules it does what Composer's does: the EMA module's parameters and buffers that share a name with the
model's are updated in place with Composer's expression. One deliberate difference: integer buffers (BatchNorm's
``num_batches_tracked``) are copied, not averaged: Composer averages them and truncates the result to an integer,
which stops the counter from counting. On pytrees it is pure and returns the new average (our keyword names are
``params`` and ``ema_params``).

**Eval and checkpoints.** ``eval`` returns the EMA weights once started, the raw weights before. The EMA lives in
the train state's method extras, so checkpoints hold both sets and resume is exact (Composer swaps the EMA weights
into the model for checkpoints instead).

**Reference.** Polyak & Juditsky, "Acceleration of Stochastic Approximation by Averaging", 1992; used by
Tan & Le, "EfficientNet", 2019 (arXiv:1905.11946). Composer: ``composer/algorithms/ema``.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from jaxcomposer.algorithms.functional_io import functional_form
from jaxcomposer.core.method import Method, MethodEntry, PostStep, StepCtx
from jaxcomposer.core.state import tree_select
from jaxcomposer.core.time import Time, TimeUnit, time_arg

__all__ = ["compute_ema", "EMA"]


def _is_float(x) -> bool:
    return hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating)


@functional_form(arrays=("params", "ema_params"), models=("params", "ema_params"))
def compute_ema(params, ema_params, smoothing: float = 0.99):
    """Composer's ``compute_ema(model, ema_model, smoothing=0.99)``. On pytrees (JAX, numpy or torch arrays) it is
    pure: returns ``smoothing * ema + (1 - smoothing) * params`` tree-wise, in the caller's array type.

    Only floating leaves are averaged (kept in the EMA leaf's dtype); other leaves (integer counters, PRNG keys)
    are copied from ``params``, since an average of counts or keys means nothing. On torch modules it is Composer's:
    ``ema_params``'s parameters and buffers are updated in place (through the torch adapter,
    ``torch_bridge.functional.compute_ema``), and the EMA module is returned.
    """
    def leaf(p, e):
        if not _is_float(e):
            return p
        return (e * smoothing + p.astype(e.dtype) * (1.0 - smoothing)).astype(e.dtype)

    return jax.tree_util.tree_map(leaf, params, ema_params)


def _select(pred, on_true, on_false):
    """Tree-wise ``where`` on floating leaves; other leaves (counters, keys) always come from ``on_false``."""
    return jax.tree_util.tree_map(lambda a, b: tree_select(pred, a, b) if _is_float(b) else b, on_true, on_false)


def EMA(half_life: str | None = "1000ba", smoothing: float | None = None, ema_start: str = "0.0dur",
        update_interval: str | None = None) -> Method:
    """Composer's ``EMA`` as a :class:`Method` with ``post_step`` (the averages) and ``eval`` (use them) slots."""
    if half_life is None and smoothing is None:
        raise ValueError("EMA: give either half_life (e.g. '1000ba') or smoothing (e.g. 0.999).")
    if half_life is not None and smoothing is not None:
        raise ValueError("EMA: give only one of half_life and smoothing; with smoothing, pass half_life=None "
                         f"(got half_life={half_life!r}, smoothing={smoothing!r}).")
    half = time_arg(half_life, "EMA: half_life") if half_life is not None else None
    start = time_arg(ema_start, "EMA: ema_start")
    if update_interval is None:
        interval = Time(1, half.unit if half is not None else TimeUnit.BATCH)
    else:
        interval = time_arg(update_interval, "EMA: update_interval")
    if half is not None and half.unit != interval.unit:
        raise ValueError(f"EMA: units of half_life ({half.unit.value}) and update_interval "
                         f"({interval.unit.value}) must match.")
    if interval.unit not in (TimeUnit.BATCH, TimeUnit.EPOCH):
        raise ValueError(f"EMA: update_interval must be in 'ba' or 'ep', got {interval.unit.value!r}.")
    if interval.value <= 0:
        raise ValueError(f"EMA: update_interval must be positive, got {interval.value}{interval.unit.value}.")
    if start.unit not in (TimeUnit.DURATION, TimeUnit.BATCH, TimeUnit.EPOCH):
        raise ValueError(f"EMA: ema_start must be in 'dur', 'ba' or 'ep', got {start.unit.value!r}.")
    if half is not None:
        if half.value < 0:
            raise ValueError(f"EMA: half_life must be >= 0, got {half_life!r}.")
        smoothing = 0.0 if half.value == 0 else 2.0 ** (-(interval.value / half.value))
    smoothing = float(smoothing)
    if not 0.0 <= smoothing <= 1.0:
        raise ValueError(f"EMA: smoothing must be in [0, 1], got {smoothing}.")
    unit_is_epoch = interval.unit == TimeUnit.EPOCH

    def init(params, model_state, ctx: StepCtx) -> dict:
        # Composer builds its EMA copy at INIT too, so checkpoints have a fixed structure from step 0.
        # Real copies: a donated train state must not hold the same buffer twice.
        copy = lambda t: jax.tree_util.tree_map(lambda x: jnp.array(x, copy=True), t)
        return {"params": copy(params), "state": copy(model_state), "started": jnp.zeros((), bool)}

    def update(extra: dict, params, model_state, ctx: StepCtx) -> dict:
        n = jnp.asarray(ctx.step, jnp.int32) + 1  # batches completed, including this one
        if unit_is_epoch or start.unit == TimeUnit.EPOCH:
            if not ctx.run.steps_per_epoch:
                raise ValueError("EMA: 'ep' units need steps_per_epoch (ctx.run.steps_per_epoch; the Trainer sets "
                                 "it from the train dataloader's length).")
            spe = int(ctx.run.steps_per_epoch)
        if unit_is_epoch:
            boundary = n % spe == 0
            count = n // spe
        else:
            boundary = jnp.ones((), bool)
            count = n
        if start.unit == TimeUnit.DURATION:
            # n / total >= v, in integers so 0.3 * 10 does not miss batch 3 by a rounding error.
            past_start = n >= math.ceil(start.value * ctx.run.total_steps - 1e-9)
        elif start.unit == TimeUnit.BATCH:
            past_start = n >= start.value
        else:  # Composer's epoch counter: incremented before EPOCH_END, not yet at a mid-epoch BATCH_END.
            epochs = n // spe if unit_is_epoch else (n - 1) // spe
            past_start = epochs >= start.value
        started = extra["started"]
        start_now = boundary & past_start & ~started
        do_update = boundary & started & (count % int(interval.value) == 0)

        def advance(old, new):
            averaged = compute_ema(new, old, smoothing)  # non-float leaves: copies of `new`

            def leaf(o, p, a):
                if not _is_float(o):
                    return a
                return tree_select(start_now, p.astype(o.dtype), tree_select(do_update, a, o))

            return jax.tree_util.tree_map(leaf, old, new, averaged)

        return {"params": advance(extra["params"], params), "state": advance(extra["state"], model_state),
                "started": started | start_now}

    def eval_weights(extra: dict, params, model_state, ctx: StepCtx):
        return _select(extra["started"], extra["params"], params), _select(extra["started"], extra["state"], model_state)

    return Method(name="EMA", post_step=PostStep(init, update), eval=eval_weights,
                  description=f"EMA(smoothing={smoothing}, ema_start={start!r}, update_interval={interval!r})")


# Registration: jaxcomposer.algorithms, jaxcomposer.functional and `jaxcomposer methods` find the method here.
ENTRY = MethodEntry(registry_name="ema", factory=EMA, functional=(compute_ema,))
