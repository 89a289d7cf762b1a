"""One XLA:CPU thread beside oneDNN's convolutions: set before JAX starts, only where it was measured to pay, never
over the user's own setting; the thread count checked in fresh processes."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from jaxcomposer.core import cpu_threads

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# a fresh process: fit's preparation, then one computation, then XLA's intra-op threads counted by name
PROBE = ("import os, jax.numpy as jnp; from jaxcomposer import config; from jaxcomposer.runner import prepare_process; "
         "cfg = config.load_config('configs/quickstart.yaml', ['compilation_cache_dir=null', 'model.conv_impl=%s']); "
         "print(prepare_process(cfg)); jnp.ones(8).sum().block_until_ready(); "
         "names = [open(f'/proc/self/task/{t}/comm').read().strip() for t in os.listdir('/proc/self/task')]; "
         "print(names.count('tf_XLAEigen')); print(os.environ.get('PJRT_NPROC'))")


def _probe(conv_impl: str, **env: str) -> list[str]:
    # as a user's process starts: without the test session's two fake CPU devices (tests/conftest.py)
    base = {k: v for k, v in os.environ.items() if k not in ("PJRT_NPROC", "NPROC", "XLA_FLAGS")}
    out = subprocess.run([sys.executable, "-c", PROBE % conv_impl], env={**base, **env}, cwd=ROOT,
                         capture_output=True, text=True, check=True)
    return out.stdout.splitlines()


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through Linux's /proc")
def test_fit_runs_oneDNN_models_with_one_XLA_thread_and_keeps_the_users_setting():
    if cpu_threads.usable_cores() > cpu_threads.MAX_CORES:
        pytest.skip(f"{cpu_threads.usable_cores()} cores: XLA's default pool stays (tested in-process below)")
    note, threads, env = _probe("onednn")
    assert (note, threads, env) == ("PJRT_NPROC=1 (oneDNN convolutions on %d cores)" % cpu_threads.usable_cores(),
                                    "1", "1")
    note, threads, env = _probe("onednn", PJRT_NPROC="3")
    assert (note, threads, env) == ("PJRT_NPROC=3 (set in the environment, kept)", "3", "3")


def test_the_pool_is_left_alone_without_oneDNN_on_a_larger_machine_or_after_JAX_started(monkeypatch):
    monkeypatch.delenv("PJRT_NPROC", raising=False)
    monkeypatch.delenv("NPROC", raising=False)
    assert cpu_threads.one_xla_thread_for_onednn({"name": "convnet", "conv_impl": "xla"}) == \
        "XLA's default pool (the model has no oneDNN convolutions)"
    assert cpu_threads.one_xla_thread_for_onednn({"name": "mlp"}).endswith("(the model has no oneDNN convolutions)")
    onednn = {"name": "convnet", "conv_impl": "onednn"}
    monkeypatch.setattr(cpu_threads, "usable_cores", lambda: 8)
    assert cpu_threads.one_xla_thread_for_onednn(onednn) == \
        "XLA's default pool (8 cores: more than the 4 a single XLA thread is chosen for)"
    monkeypatch.setattr(cpu_threads, "usable_cores", lambda: 2)
    import jax
    jax.devices()  # this test process has its backends: too late for the pool's size
    assert cpu_threads.one_xla_thread_for_onednn(onednn).startswith("XLA's default pool (JAX's backends existed")
    monkeypatch.setenv("NPROC", "2")  # XLA's other spelling is the user's setting too
    assert cpu_threads.one_xla_thread_for_onednn(onednn) == "NPROC=2 (set in the environment, kept)"
    assert "PJRT_NPROC" not in os.environ
