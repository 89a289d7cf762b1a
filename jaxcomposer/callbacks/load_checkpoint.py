"""``LoadCheckpoint``: a jaxcomposer checkpoint loaded into the running Trainer at a chosen event, as Composer's."""
from __future__ import annotations

import glob
from pathlib import Path
from typing import Any, Sequence

from jaxcomposer.core.events import CALLBACK_EVENTS, IN_STEP_EVENTS, Callback, Event

__all__ = ["LoadCheckpoint"]

# Composer's load events fire inside its Trainer's __init__, around its own load_path; ours is INIT, the end of
# __init__, after the Trainer's load_path
_COMPOSER_LOAD_EVENTS = ("before_load", "after_load")


class LoadCheckpoint(Callback):
    """Composer's ``LoadCheckpoint(load_path, load_weights_only=False, strict_model_weights=True, ignore_keys=None,
    event=Event.BEFORE_LOAD)``: at ``event``, loads the checkpoint at ``load_path`` into the run's train state.

    ``load_path``: a checkpoint directory (a ``Trainer.save_checkpoint`` directory or a step of a ``save_folder``)
    or a ``save_folder`` (its newest good checkpoint); local paths only. Without ``load_weights_only`` everything is
    restored: weights, optimizer state, method state, RNG key and the timestamp (the run continues from the
    checkpoint's batch); with it, the params and model state only. ``ignore_keys``: globs on the checkpoint's dotted
    paths (``'params.head.*'``, ``'opt_state.*'``) whose leaves keep the run's values; Composer's form, a function
    that edits the state dict, is refused. ``strict_model_weights=False`` loads the weights the checkpoint and the
    model have in common and leaves the others as they are (as torch's ``load_state_dict(strict=False)``: a weight of
    another shape is still an error).

    ``event``: an :class:`~jaxcomposer.core.events.Event` or its name (``'fit_start'``, ``'FIT_START'``). Composer's
    ``BEFORE_LOAD`` and ``AFTER_LOAD`` (its default) are INIT here, which fires at the end of the Trainer's
    ``__init__``, after the Trainer's own ``load_path`` is loaded: so with both, this callback's checkpoint is the
    one that stays (in Composer, with ``BEFORE_LOAD``, the Trainer's ``load_path`` would).

    The user's module gets the loaded weights at the Trainer's next write-back (the end of ``fit``, ``eval``,
    ``predict``, ``save_checkpoint``); the run itself uses them from the next step on.
    """

    def __init__(self, load_path: str | Path, load_weights_only: bool = False, strict_model_weights: bool = True,
                 ignore_keys: Sequence[str] | None = None, event: str | Event = "before_load"):
        if callable(ignore_keys):
            raise NotImplementedError("LoadCheckpoint: ignore_keys as a function of Composer's state dict is not "
                                      "supported; pass globs on the checkpoint's dotted paths, e.g. "
                                      "['params.head.*', 'opt_state.*']")
        if ignore_keys is not None and (isinstance(ignore_keys, str) or
                                        not all(isinstance(k, str) for k in ignore_keys)):
            raise ValueError(f"LoadCheckpoint: ignore_keys must be a list of glob strings, got {ignore_keys!r}")
        self.load_path = load_path
        self.load_weights_only, self.strict_model_weights = bool(load_weights_only), bool(strict_model_weights)
        self.ignore_keys = list(ignore_keys or [])
        self.event = _parse_event(event)
        self.loaded_from: Path | None = None  # the checkpoint directory, once loaded

    def run_event(self, event: Event, state, logger) -> None:
        if event == self.event:
            self._load(state, logger)
        super().run_event(event, state, logger)

    def _load(self, state, logger) -> None:
        from jaxcomposer.trainer import checkpoint  # (the trainer package imports jaxcomposer.callbacks)

        path = checkpoint.resolve_load_path(self.load_path)
        ignore = list(self.ignore_keys)
        if not self.strict_model_weights:
            ignore += _unshared_weights(checkpoint, path, state.train_state)
        state.train_state, timestamp, _ = checkpoint.restore(
            path, state.train_state, weights_only=self.load_weights_only, ignore_keys=ignore,
            label=f"LoadCheckpoint {path}")
        if timestamp is not None:
            state.timestamp = timestamp
        self.loaded_from = path
        if logger is not None:
            logger.log_hyperparameters({"load_checkpoint/path": str(path),
                                        "load_checkpoint/batch": int(state.timestamp.batch)})


def _unshared_weights(checkpoint, path: Path, train_state: Any) -> list[str]:
    """Globs matching exactly the weights that only one of the checkpoint and the run has."""
    saved = set(checkpoint.read_weights(path))
    fields = checkpoint.WEIGHT_FIELDS
    ours = {name for name in checkpoint.flat_paths(train_state) if name.split(".", 1)[0] in fields}
    return [glob.escape(name) for name in sorted(saved ^ ours)]


def _parse_event(event: Any) -> Event:
    if isinstance(event, Event):
        return event
    name = getattr(event, "value", event)  # Composer's Event is a string enum too
    if isinstance(name, str):
        lowered = name.lower()
        if lowered in _COMPOSER_LOAD_EVENTS:
            return Event.INIT
        for candidate in (e for e in CALLBACK_EVENTS if e not in IN_STEP_EVENTS):  # nothing loads mid-step
            if lowered in (candidate.value, candidate.name.lower()):
                return candidate
    names = [e.value for e in CALLBACK_EVENTS if e not in IN_STEP_EVENTS] + list(_COMPOSER_LOAD_EVENTS)
    raise ValueError(f"LoadCheckpoint: event must be one of {names}, "
                     f"got {event!r}")
