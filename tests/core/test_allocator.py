"""The allocator check: jemalloc's default oversize arena is detected in the running process, and the Trainer warns."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from jaxcomposer import Trainer
from jaxcomposer.core import allocator
from tests.trainer.helpers import mlp_task

MODULE = Path(allocator.__file__)
# loads the module file alone: the check must work before (and without) importing JAX
PROBE = ("import importlib.util as u; s = u.spec_from_file_location('a', %r); m = u.module_from_spec(s); "
         "s.loader.exec_module(m); print(m.jemalloc_oversize_threshold()); print(m.slow_allocator_warning())")


def _jemalloc() -> str | None:
    if shutil.which("ldconfig") is None:
        return None
    out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
    return next((line.split("=>")[-1].strip() for line in out.splitlines() if "libjemalloc.so.2 " in line), None)


def _probe(**env: str) -> list[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "MALLOC_CONF")}
    out = subprocess.run([sys.executable, "-c", PROBE % str(MODULE)], env={**base, **env}, capture_output=True,
                         text=True, check=True)
    return out.stdout.splitlines()


def test_glibc_malloc_is_not_flagged():
    assert _probe() == ["None", "None"]


@pytest.mark.parametrize("conf, threshold", [(None, 8 * 2**20), ("oversize_threshold:0", 0)])
def test_jemalloc_threshold_is_read_from_the_running_allocator(conf, threshold):
    lib = _jemalloc()
    if lib is None:
        pytest.skip("libjemalloc2 is not installed (make malloc installs it)")
    threshold_line, warning = _probe(LD_PRELOAD=lib, **({"MALLOC_CONF": conf} if conf else {}))
    assert int(threshold_line) == threshold
    if threshold:
        assert f"oversize_threshold={threshold} bytes" in warning and allocator.FIX in warning
    else:
        assert warning == "None"


def test_trainer_warns_once_per_construction_on_a_slow_allocator(monkeypatch):
    monkeypatch.setattr(allocator, "jemalloc_oversize_threshold", lambda: 8 * 2**20)
    with pytest.warns(RuntimeWarning, match="MALLOC_CONF=oversize_threshold:0") as record:
        Trainer(model=mlp_task(), max_duration="1ba", progress_bar=False, log_to_console=False)
    assert sum("jemalloc" in str(w.message) for w in record) == 1
    monkeypatch.setattr(allocator, "jemalloc_oversize_threshold", lambda: 0)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        Trainer(model=mlp_task(), max_duration="1ba", progress_bar=False, log_to_console=False)
    assert not [w for w in record if "jemalloc" in str(w.message)]
