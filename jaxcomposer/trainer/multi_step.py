"""``steps_per_execution``: which batches one compiled call trains."""
from __future__ import annotations

from typing import Callable, Iterable, Iterator

from jaxcomposer.core.time import Time, TimeUnit, Timestamp


def call_length(steps_per_execution: int, timestamp: Timestamp, max_duration: Time, steps_per_epoch: int | None,
                intervals: list) -> int:
    """How many batches the next compiled call may train from ``timestamp``: ``steps_per_execution``, cut where
    the host must act between two batches (an evaluation or a checkpoint due in batches at one of ``intervals``,
    the end of the epoch or of the duration); 1 where that cannot be told ahead (an interval given as a function,
    a duration in samples or tokens)."""
    k = steps_per_execution
    done = int(timestamp.get(TimeUnit.BATCH).value)
    if max_duration.unit == TimeUnit.BATCH:
        k = min(k, max_duration.value - done)
    elif max_duration.unit != TimeUnit.EPOCH:
        return 1
    if steps_per_epoch:
        k = min(k, steps_per_epoch - int(timestamp.batch_in_epoch))
    for interval in intervals:
        if callable(interval):
            return 1
        if interval is not None and interval.unit == TimeUnit.BATCH:
            k = min(k, interval.value - done % interval.value)
    return max(k, 1)


def group_calls(batches: Iterable[dict], length: Callable[[], int]) -> Iterator[list[dict]]:
    """``batches`` grouped into the calls that train them: lists of up to ``length()`` batches (asked before each
    call) of one shape."""
    it, held = iter(batches), None
    while True:
        first, held = (held, None) if held is not None else (next(it, None), None)
        if first is None:
            return
        n, chunk = length(), [first]
        shapes = {k: v.shape for k, v in first.items()}
        while len(chunk) < n:
            nxt = next(it, None)
            if nxt is None:
                break
            if {k: v.shape for k, v in nxt.items()} != shapes:
                held = nxt
                break
            chunk.append(nxt)
        yield chunk
