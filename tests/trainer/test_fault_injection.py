"""Exact autoresume, with real processes: SIGKILL at random moments (inside an asynchronous save, then right after a
committed one), each followed by autoresume, ends with the same bits as a run never interrupted. (Restores onto
other device counts and layouts: tests/parallel/test_mesh_layouts.py and test_processes.py.)"""
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest


SCRIPT = Path(__file__).with_name("fault_run.py")
ROOT = SCRIPT.parents[2]
pytestmark = pytest.mark.slow
# what the test session adds to compile faster (tests/conftest.py); an optimized run drops them
FAST_COMPILE_FLAGS = ("--xla_cpu_use_fusion_emitters", "--xla_cpu_parallel_codegen_split_count")


def launch(folder, devices, batches, out, *extra) -> subprocess.Popen:
    """A run compiled as users run it: without the XLA optimizations and emitters the test session trades for
    compile time (tests/conftest.py), so bitwise resume is checked in the configuration users run."""
    env = dict(os.environ)
    env.pop("JAX_DISABLE_MOST_OPTIMIZATIONS", None)
    env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split() if not f.startswith(FAST_COMPILE_FLAGS))
    return subprocess.Popen([sys.executable, str(SCRIPT), str(folder), str(devices), str(batches), str(out), *extra],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


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


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The run never interrupted (it saves nothing)."""
    path = tmp_path_factory.mktemp("reference") / "reference.npz"
    finish(launch("-", DEVICES, BATCHES, path))
    return path


def test_sigkill_at_random_moments_then_autoresume_is_bitwise(tmp_path, reference):
    """Killed inside an asynchronous save, resumed; killed again right after a random later committed save, resumed
    to the end: the same bits as a run never interrupted."""
    rng = random.Random(2026)

    folder, first = tmp_path / "b", rng.choice([4, 6])
    kill_when(launch(folder, DEVICES, BATCHES, tmp_path / "b.npz"), folder, lambda f: saving(f, first))
    torn = [p.name for p in folder.iterdir() if p.name.endswith(".orbax-checkpoint-tmp")]
    assert torn, "the kill was meant to land inside a save"
    torn_step = int(torn[0].split(".")[0])
    second = min(torn_step + rng.choice([2, 4]), BATCHES - 2)  # a later save, with batches left after it
    kill_when(launch(folder, DEVICES, BATCHES, tmp_path / "b.npz", "--autoresume"), folder,
              lambda f: second in committed(f))
    resumed = finish(launch(folder, DEVICES, BATCHES, tmp_path / "b.npz", "--autoresume"))
    assert int(resumed.split("START batch=")[1].split()[0]) >= second > torn_step
    assert not any(p.name.endswith(".orbax-checkpoint-tmp") for p in folder.iterdir())
    assert_same_bits(reference, tmp_path / "b.npz")



def test_sigkill_inside_an_upload_then_autoresume_from_the_bucket_is_bitwise(tmp_path, reference):
    """Saving to an S3 server (moto's, on the loopback): killed while a step's objects are being uploaded, before
    its commit marker; autoresume reads the newest committed step back from the bucket, passes over the torn one,
    and ends with the same bits as a run never interrupted."""
    pytest.importorskip("moto")
    pytest.importorskip("obstore")
    from jaxcomposer.trainer.remote_checkpoints import COMMIT, committed_steps
    from jaxcomposer.utils.object_store import RemoteFolder

    from .s3_server import s3_environment

    with s3_environment(tmp_path / "staging"):
        folder = "s3://ckpt/sigkill"
        remote = RemoteFolder(folder)

        def uploading(at_least: int) -> bool:
            keys = remote.list()
            steps = {int(k.split("/")[0]) for k in keys if k.split("/")[0].isdigit()}
            return any(s >= at_least and f"{s}/{COMMIT}" not in keys for s in steps)

        proc = launch(folder, DEVICES, BATCHES, tmp_path / "b.npz")
        kill_when(proc, tmp_path, lambda _: uploading(4))
        committed = committed_steps(remote)
        torn = {int(k.split("/")[0]) for k in remote.list() if k.split("/")[0].isdigit()} - set(committed)
        assert committed and torn and min(torn) > max(committed), (committed, torn)
        resumed = finish(launch(folder, DEVICES, BATCHES, tmp_path / "b.npz", "--autoresume"))
        assert int(resumed.split("START batch=")[1].split()[0]) == max(committed)
        assert_same_bits(reference, tmp_path / "b.npz")
        assert committed_steps(remote)[-1] == BATCHES
