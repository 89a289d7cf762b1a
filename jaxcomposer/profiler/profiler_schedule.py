"""``cyclic_schedule``: Composer's profiling window, repeated in every epoch."""
from __future__ import annotations

from typing import Any, Callable

from jaxcomposer.profiler.profiler_action import ProfilerAction

__all__ = ["cyclic_schedule"]


def cyclic_schedule(skip_first: int = 0, wait: int = 0, warmup: int = 1, active: int = 4,
                    repeat: int = 1) -> Callable[[Any], ProfilerAction]:
    """A schedule of the state (``schedule(state) -> ProfilerAction``), as Composer's ``cyclic_schedule``.

    In every epoch, counting batches from the epoch's start (``state.timestamp.batch_in_epoch``): skip the first
    ``skip_first`` batches, then run cycles of ``wait`` skipped batches, ``warmup`` warm-up batches and ``active``
    recorded ones, ``repeat`` cycles per epoch (``0``: cycles until the epoch ends). The last active batch of a
    cycle, and an active batch that is the epoch's last (when the loader has a length), are ``ACTIVE_AND_SAVE``:
    the traces are written at its end.

    After a resumption mid-epoch, ``skip_first`` counts from the batch training resumed at, as in Composer: the
    schedule reads ``state.profiler.resumption_batch_idx`` (0 when the state has no profiler).
    """
    for name, value in (("skip_first", skip_first), ("wait", wait), ("warmup", warmup), ("active", active),
                        ("repeat", repeat)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"cyclic_schedule: {name} must be an int >= 0, got {value!r}")
    cycle_len = wait + warmup + active
    if cycle_len == 0:
        # Composer divides by the cycle length here; say so before training instead of at the first batch
        raise ValueError("cyclic_schedule: wait + warmup + active must be at least 1")

    def schedule(state: Any) -> ProfilerAction:
        batch_idx = int(state.timestamp.batch_in_epoch)
        profiler = getattr(state, "profiler", None)
        first = skip_first + (int(getattr(profiler, "resumption_batch_idx", 0)) if profiler is not None else 0)
        if batch_idx < first:
            return ProfilerAction.SKIP
        if repeat != 0 and batch_idx >= cycle_len * repeat + first:
            return ProfilerAction.SKIP
        position = (batch_idx - first) % cycle_len
        if position < wait:
            return ProfilerAction.SKIP
        if position < wait + warmup:
            return ProfilerAction.WARMUP
        length = state.dataloader_len
        last_in_epoch = length is not None and batch_idx == int(getattr(length, "value", length)) - 1
        if position == cycle_len - 1 or last_in_epoch:
            return ProfilerAction.ACTIVE_AND_SAVE
        return ProfilerAction.ACTIVE

    return schedule
