"""Composer's file-name variables, for trace folders and file names."""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from jaxcomposer.core.time import Timestamp
from jaxcomposer.loggers.logger import dist_info

_COUNTERS = ("epoch", "batch", "batch_in_epoch", "sample", "sample_in_epoch", "token", "token_in_epoch")
_CLOCKS = ("total_wct", "epoch_wct", "batch_wct")


def format_name(pattern: str, run_name: str, timestamp: Timestamp | None = None, *, argument: str) -> str:
    """``pattern`` with Composer's variables: ``{run_name}``, ``{rank}``, ``{local_rank}``, ``{world_size}``,
    ``{local_world_size}``, ``{node_rank}``, and with a timestamp also ``{epoch}``, ``{batch}``,
    ``{batch_in_epoch}``, ``{sample}``, ``{sample_in_epoch}``, ``{token}``, ``{token_in_epoch}`` and the
    wall-clock seconds ``{total_wct}``, ``{epoch_wct}``, ``{batch_wct}``."""
    values: dict[str, Any] = {"run_name": run_name, **dist_info()}
    if timestamp is not None:
        values.update({name: int(getattr(timestamp, name)) for name in _COUNTERS})
        values.update({name: int(getattr(timestamp, name).total_seconds()) for name in _CLOCKS})
    try:
        return pattern.format(**values)
    except (KeyError, IndexError, ValueError) as e:
        raise ValueError(f"{argument}: {pattern!r} uses {e}, which is not one of the variables available here: "
                         f"{sorted(values)}") from None


def check_pattern(pattern: str, argument: str, *, with_time: bool) -> None:
    """Refuse a pattern that cannot be formatted, when the object is built rather than at the first save."""
    if not isinstance(pattern, str) or not pattern:
        raise ValueError(f"{argument}: expected a non-empty format string, got {pattern!r}")
    format_name(pattern, "run", Timestamp() if with_time else None, argument=argument)


def ensure_empty(folder: Path, argument: str) -> None:
    """Composer's rule without ``overwrite``: the folder traces go to must not hold files from an earlier run."""
    if folder.is_dir() and any(p.is_file() or p.is_symlink() for p in folder.rglob("*")):
        raise FileExistsError(f"{argument}: {folder} already holds files; pass overwrite=True to write into it, "
                              "or choose another folder")


def remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        os.remove(path)
