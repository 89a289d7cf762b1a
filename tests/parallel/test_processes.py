"""Several processes, one run: ``jaxcomposer launch`` with 2 processes x 2 CPU devices (gloo collectives).

- the 2-process run trains to the parameters of a 1-process run on 4 devices (the same global batches, FSDP
  over all four devices), saving its checkpoints to an S3 bucket (a loopback server), from which one process
  resumes;
- R8: SIGTERM to the launcher makes every process stop after the same step, save it and exit 143; a process
  killed with SIGKILL stops the others at once, with a message naming it; each relaunch autoresumes, and the run
  ends bitwise equal to an uninterrupted 2-process run.
"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.parallel import process_worker

WORKER = Path(__file__).with_name("process_worker.py")
# one worker runs the whole file: its module fixture (a subprocess run) then runs once, not once per worker
pytestmark = pytest.mark.xdist_group("processes")
GRACE_S = 30  # for processes asked to stop (SIGTERM): they finish a step and save it
# once a process is lost the survivor is stuck in a collective (or in JAX's shutdown barrier) and ignores SIGTERM
# (JAX's preemption notifier holds it): the launcher SIGKILLs it after this grace, so keep it short
LOST_GRACE_S = 3


def launch_code(out: Path, *extra: str, grace_s: float = GRACE_S) -> str:
    return ("import sys\nfrom jaxcomposer.launch import launch\n"
            f"sys.exit(launch([sys.executable, {str(WORKER)!r}, {str(out)!r}, 'fsdp', *{list(extra)!r}], 2, "
            f"cpu_devices_per_process=2, log_dir={str(out / 'logs')!r}, grace_s={grace_s}))")


def start_launcher(out: Path, *extra: str, grace_s: float = GRACE_S, **env) -> subprocess.Popen:
    out.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen([sys.executable, "-c", launch_code(out, *extra, grace_s=grace_s)],
                            stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **env})


def finish(proc: subprocess.Popen, timeout: float = 300) -> tuple[int, str]:
    _, err = proc.communicate(timeout=timeout)
    return proc.returncode, err


def result(out: Path) -> dict[str, np.ndarray]:
    with np.load(out / "result.npz") as f:
        return dict(f)


BUCKET_FOLDER = "s3://ckpt/processes"


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The 2-process run, saving its checkpoints to an S3 server on the loopback (moto's; its environment reaches
    the processes): process 0 commits each step once all processes have gathered it."""
    pytest.importorskip("moto")
    pytest.importorskip("obstore")
    from tests.trainer.s3_server import s3_environment

    out = tmp_path_factory.mktemp("two_processes")
    with s3_environment(tmp_path_factory.mktemp("staging")):
        code, err = finish(start_launcher(out, WORKER_SAVE_FOLDER=BUCKET_FOLDER))
        assert code == 0, err[-3000:]
        yield out


@pytest.mark.slow
def test_two_processes_train_as_one_process_on_the_same_devices(uninterrupted, tmp_path):
    one = tmp_path / "one_process"
    one.mkdir()
    flags = os.environ.get("XLA_FLAGS", "").replace("--xla_force_host_platform_device_count=2", "")
    proc = subprocess.run([sys.executable, str(WORKER), str(one), "fsdp"], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "XLA_FLAGS": flags + " --xla_force_host_platform_device_count=4"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    two_info = json.loads((uninterrupted / "losses.json").read_text())
    one_info = json.loads((one / "losses.json").read_text())
    assert (two_info["processes"], two_info["devices"]) == (2, 4) and (one_info["processes"], one_info["devices"]) == (1, 4)
    np.testing.assert_allclose(list(two_info["losses"].values()), list(one_info["losses"].values()), rtol=1e-6)
    two, one_params = result(uninterrupted), result(one)
    for k in one_params:  # gloo's sums run in another order than one process's: equal up to rounding
        np.testing.assert_allclose(two[k], one_params[k], rtol=1e-5, atol=2e-5, err_msg=k)
    # the checkpoints are in the bucket: 6 batches, one every 2
    from jaxcomposer.trainer.remote_checkpoints import committed_steps
    from jaxcomposer.utils.object_store import RemoteFolder
    assert committed_steps(RemoteFolder(BUCKET_FOLDER)) == [2, 4, 6]

    # and this test process (one process, the suite's 2 devices) restores what the two saved: autoresume from the
    # bucket finds the run complete at batch 6
    restored = tmp_path / "restored"
    restored.mkdir()
    os.environ["WORKER_SAVE_FOLDER"] = BUCKET_FOLDER
    try:
        process_worker.main(str(restored), "fsdp", None)
    finally:
        del os.environ["WORKER_SAVE_FOLDER"]
    assert json.loads((restored / "losses.json").read_text())["losses"] == {}  # nothing left to train
    again = result(restored)
    assert all(np.array_equal(again[k], two[k]) for k in two)


@pytest.mark.slow
def test_sigterm_saves_everywhere_sigkill_stops_everyone_and_autoresume_is_bitwise(uninterrupted, tmp_path):
    out = tmp_path / "interrupted"
    # 1. SIGTERM to the launcher once batch 2 is done: all processes stop after one agreed step, saved, exit 143
    proc = start_launcher(out, WORKER_SLEEP_S="0.5")
    progress = out / "progress"
    deadline = time.monotonic() + 240
    while not (progress.exists() and "2" in progress.read_text().split()):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    code, err = finish(proc, timeout=GRACE_S + 60)
    assert code == 143, err[-3000:]
    stopped_after = int(progress.read_text().split()[-1])
    steps = sorted(int(p.name) for p in (out / "checkpoints").iterdir() if p.name.isdigit())
    assert 2 <= stopped_after < 6 and steps[-1] == stopped_after, (stopped_after, steps)

    # 2. relaunch: it resumes there; process 1 is then killed with SIGKILL after batch 5
    started = time.monotonic()
    code, err = finish(start_launcher(out, "5", grace_s=LOST_GRACE_S), timeout=240)
    assert code == 128 + signal.SIGKILL, err[-3000:]
    assert "process 1" in err and "SIGKILL" in err, err[-3000:]
    assert time.monotonic() - started < 200  # no hang: the launcher stopped the survivor itself
    assert (out / "killed_after").read_text() == "5"

    # 3. relaunch again: autoresume from the newest committed checkpoint, then the end equals the uninterrupted run
    code, err = finish(start_launcher(out))
    assert code == 0, err[-3000:]
    resumed, reference = result(out), result(uninterrupted)
    assert all(np.array_equal(resumed[k], reference[k]) for k in reference)
    losses = json.loads((out / "losses.json").read_text())["losses"]
    reference_losses = json.loads((uninterrupted / "losses.json").read_text())["losses"]
    assert losses and all(losses[b] == reference_losses[b] for b in losses)
