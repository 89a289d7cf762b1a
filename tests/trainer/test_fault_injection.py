"""Exact autoresume and device-count portability, with real processes: SIGKILL at random moments (inside an
asynchronous save, then right after a committed one), each followed by autoresume, ends with the same bits as a run
never interrupted; a checkpoint written on 8 devices restores bitwise on 1, and one written on 1 restores bitwise
on 8 (the 8-device runs are processes of their own; the 1-device one is a Trainer of this process on one of its
devices)."""
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from tests.trainer import fault_run

SCRIPT = Path(__file__).with_name("fault_run.py")
ROOT = SCRIPT.parents[2]
pytestmark = pytest.mark.slow
# what the test session adds to compile faster (tests/conftest.py); an optimized run drops them
FAST_COMPILE_FLAGS = ("--xla_cpu_use_fusion_emitters", "--xla_cpu_parallel_codegen_split_count")


def launch(folder, devices, batches, out, *extra, optimized: bool = False) -> subprocess.Popen:
    """``optimized``: compile as users do, with the XLA optimizations and emitters the test session trades for
    compile time (tests/conftest.py)."""
    env = dict(os.environ)
    if optimized:
        env.pop("JAX_DISABLE_MOST_OPTIMIZATIONS", None)
        env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split()
                                    if not f.startswith(FAST_COMPILE_FLAGS))
    return subprocess.Popen([sys.executable, str(SCRIPT), str(folder), str(devices), str(batches), str(out), *extra],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def launch_optimized(*args) -> subprocess.Popen:
    """A run compiled as users run it (the SIGKILL test checks bitwise resume in that configuration)."""
    return launch(*args, optimized=True)


def finish(proc: subprocess.Popen) -> str:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0 and "DONE" in out, err[-3000:]
    return out


def kill_when(proc: subprocess.Popen, folder: Path, ready, timeout: float = 240) -> None:
    """SIGKILL ``proc`` the moment ``ready(folder)`` holds (polled every millisecond)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            _, err = proc.communicate()
            raise AssertionError(f"the run ended before it could be killed:\n{err[-3000:]}")
        if folder.is_dir() and ready(folder):
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=60)
            return
        time.sleep(0.001)
    proc.kill()
    raise AssertionError("timed out waiting for the moment to kill")


def committed(folder: Path) -> list[int]:
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())


def saving(folder: Path, at_least: int) -> bool:
    return any(p.name.endswith(".orbax-checkpoint-tmp") and int(p.name.split(".")[0]) >= at_least
               for p in folder.iterdir())


def assert_same_bits(a_path, b_path, skip=()) -> None:
    a, b = np.load(a_path), np.load(b_path)
    assert sorted(a.files) == sorted(b.files)
    for name in set(a.files) - set(skip):  # every train-state leaf, the timestamp and the loader position
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


BATCHES = 12
DEVICES = 2  # a sharded run; more fake devices only repeat the replicated optimizer work on the same cores


def test_sigkill_at_random_moments_then_autoresume_is_bitwise(tmp_path):
    """Killed inside an asynchronous save, resumed; killed again right after a random later committed save, resumed
    to the end: the same bits as a run never interrupted."""
    rng = random.Random(2026)
    reference = tmp_path / "reference.npz"
    finish(launch_optimized("-", DEVICES, BATCHES, reference))  # saves nothing: a run never interrupted

    folder, first = tmp_path / "b", rng.choice([4, 6])
    kill_when(launch_optimized(folder, DEVICES, BATCHES, tmp_path / "b.npz"), folder, lambda f: saving(f, first))
    torn = [p.name for p in folder.iterdir() if p.name.endswith(".orbax-checkpoint-tmp")]
    assert torn, "the kill was meant to land inside a save"
    torn_step = int(torn[0].split(".")[0])
    second = min(torn_step + rng.choice([2, 4]), BATCHES - 2)  # a later save, with batches left after it
    kill_when(launch_optimized(folder, DEVICES, BATCHES, tmp_path / "b.npz", "--autoresume"), folder,
              lambda f: second in committed(f))
    resumed = finish(launch_optimized(folder, DEVICES, BATCHES, tmp_path / "b.npz", "--autoresume"))
    assert int(resumed.split("START batch=")[1].split()[0]) >= second > torn_step
    assert not any(p.name.endswith(".orbax-checkpoint-tmp") for p in folder.iterdir())
    assert_same_bits(reference, tmp_path / "b.npz")


def test_restore_from_8_devices_onto_1_and_back(tmp_path):
    folder = tmp_path / "ck"
    finish(launch(folder, 8, 6, tmp_path / "eight.npz", "--small"))
    # onto one device of this process: the bits compared are restored ones, whatever this process compiles with
    fault_run.main(str(folder), 10, str(tmp_path / "one.npz"), autoresume=True, restored=str(tmp_path / "on_one.npz"),
                   small=True, devices=jax.devices()[:1])
    # (a freshly built trainer has not yet moved its loader: fit seeks it from the timestamp)
    assert_same_bits(tmp_path / "eight.npz", tmp_path / "on_one.npz", skip=["loader"])
    finish(launch(folder, 8, 12, tmp_path / "eight_again.npz", "--autoresume", "--restored",
                  tmp_path / "on_eight.npz", "--small"))
    assert_same_bits(tmp_path / "one.npz", tmp_path / "on_eight.npz", skip=["loader"])
    assert committed(folder)[-1] == 12
