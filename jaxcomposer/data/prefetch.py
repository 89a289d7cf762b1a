"""Overlap host batch preparation and host-to-device copies with compute.

Why a thread: ``jax.device_put`` is asynchronous but the host work before it (gathering, transforms) is not.
A background thread that gathers *and* issues the transfer keeps ``size`` batches already on device, so the
training step never waits on the host. The queue is bounded, so memory stays bounded, and the thread is stopped
when the consumer stops (``break``, ``close()`` or garbage collection of the generator).

Note for checkpointing: the producer runs ahead of the consumer by up to ``size + 1`` batches, so a loader's
``get_state()`` read while prefetching is *ahead* of what training consumed. Record the consumed position
yourself (epoch and batches consumed) and pass that to ``ArrayLoader.set_state``.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import jax

_POLL_S = 0.05  # how often a blocked producer re-checks the stop flag


class _End:
    """Sentinel: the source iterator is exhausted."""


class _Failure:
    """Carries an exception raised by the producer to the consumer thread."""

    def __init__(self, error: BaseException):
        self.error = error


def _produce(source: Iterable[Any], out: queue.Queue, stop: threading.Event, place: Callable[[Any], Any]) -> None:
    iterator = iter(source)

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                out.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    try:
        for batch in iterator:
            if stop.is_set():
                return
            if not put(place(batch)):
                return
        put(_End())
    except BaseException as error:  # noqa: BLE001 - everything must reach the consumer, not die in the thread
        put(_Failure(error))
    finally:
        close = getattr(iterator, "close", None)
        if close is not None:  # a generator source must be closed by the thread that runs it
            close()


def prefetch_to_device(iterator: Iterable[Any], size: int = 2, sharding: Any = None,
                       place: Callable[[Any], Any] | None = None) -> Iterator[Any]:
    """Yield the items of ``iterator`` (pytrees of arrays) after ``jax.device_put(item, sharding)``.

    Keeps up to ``size`` transferred batches queued ahead of the consumer. Order is preserved. An exception in
    the source (or in ``device_put``) is re-raised in the consumer at the position where it happened. With
    ``sharding=None`` batches go to the default device; pass e.g. ``NamedSharding(mesh, P('data'))`` to split
    the batch dimension across devices (the batch size must then be divisible by the mesh axis size).
    ``place(item)`` replaces that ``device_put`` when given (e.g. to assemble each process's rows into global
    arrays); it runs on the prefetch thread too.
    """
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"prefetch size must be an int >= 1, got {size!r}")
    buffer: queue.Queue = queue.Queue(maxsize=size)
    stop = threading.Event()
    thread = threading.Thread(
        target=_produce, args=(iterator, buffer, stop, place or (lambda item: jax.device_put(item, sharding))),
        name="jaxcomposer-prefetch", daemon=True
    )
    thread.start()
    try:
        while True:
            item = buffer.get()
            if isinstance(item, _End):
                return
            if isinstance(item, _Failure):
                raise item.error
            yield item
    finally:
        stop.set()
        # Unblock a producer waiting on a full queue; it then sees the stop flag and exits.
        while True:
            try:
                buffer.get_nowait()
            except queue.Empty:
                break
        thread.join(timeout=1.0)
