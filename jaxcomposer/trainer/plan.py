"""The run's plan from its arguments: ``max_duration`` scaled and converted to steps."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

from jaxcomposer.core.time import Time, TimeUnit, to_batches
from jaxcomposer.errors import ConfigurationError


def scale_duration(t: Time, ssr: float) -> Time:
    """``max_duration`` under Composer's ``scale_schedule_ratio``."""
    if ssr == 1.0:
        return t
    value = t.value * ssr if t.unit == TimeUnit.DURATION else int(t.value * ssr)
    if value == 0:
        raise ConfigurationError(f"scale_schedule_ratio: {ssr} scales max_duration {t.to_timestring()} to zero")
    return Time(value, t.unit)


def steps_per_epoch(loader: Any, subset: int) -> int | None:
    """Batches per epoch: the loader's length (None when it has none), at most ``subset`` when that is >= 0."""
    try:
        n = len(loader)
    except TypeError:
        return None if subset < 0 else subset
    return n if subset < 0 else min(n, subset)


def in_tokens(t: Any) -> bool:
    if not isinstance(t, (Time, str)):
        return False
    try:
        return Time.from_input(t).unit == TimeUnit.TOKEN
    except (TypeError, ValueError):
        return False


def batch_facts(loader: Any, max_duration: Time | None, schedulers: list,
                tokens_in_first_batch: Callable[[], int]) -> tuple[int | None, int | None]:
    """Samples and tokens per batch, for durations in ``sp``/``tok`` (run length, schedulers): the loader's
    ``batch_size``, and the first batch's token count (read only when a ``tok`` time needs it)."""
    batch_size = getattr(loader, "batch_size", None)
    times = [max_duration] + [getattr(sch, f.name) for sch in schedulers if dataclasses.is_dataclass(sch)
                              for f in dataclasses.fields(sch)]
    if not any(in_tokens(t) for t in times) or loader is None:
        return batch_size, None
    return batch_size, (tokens_in_first_batch() or None)


def total_steps(md: Time | None, steps_per_epoch: int | None, batch_size: int | None,
                tokens_per_batch: int | None) -> int:
    """``max_duration`` in batches (1 without a duration: a Trainer built only to evaluate or predict)."""
    if md is None:
        return 1
    try:
        return max(1, to_batches(md, steps_per_epoch=steps_per_epoch, max_batches=None, batch_size=batch_size,
                                 tokens_per_batch=tokens_per_batch))
    except ValueError as e:
        raise ConfigurationError(f"max_duration: {md.to_timestring()} cannot be converted to batches: {e}") from e
