"""``ProfilerAction``: what the profiler does during one batch, as a schedule returns it."""
from __future__ import annotations

import enum

__all__ = ["ProfilerAction"]


class ProfilerAction(str, enum.Enum):
    """Composer's profiler states. A ``str`` enum looked up by value or name, case-insensitively, as Composer's
    ``StringEnum`` (``ProfilerAction('active') is ProfilerAction('ACTIVE') is ProfilerAction.ACTIVE``).

    Attributes:
        SKIP: record nothing new (a duration started earlier is still recorded when it finishes).
        WARMUP: markers record into the JSON trace; the device trace (``jax.profiler``) is not running yet.
        ACTIVE: markers record and the device trace runs.
        ACTIVE_AND_SAVE: as ``ACTIVE``; at the end of this batch the traces of the window are written.
    """

    SKIP = "skip"
    WARMUP = "warmup"
    ACTIVE = "active"
    ACTIVE_AND_SAVE = "active_and_save"

    @classmethod
    def _missing_(cls, value: object):
        if isinstance(value, str):
            for action in cls:
                if value.lower() in (action.value, action.name.lower()):
                    return action
        return None
