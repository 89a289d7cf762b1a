"""Checkpoints in an object store, against a real S3 server on the loopback (moto's standalone server, started
here) with faults injected between the client and it: save, autoresume from the bucket (bitwise equal to a
straight run), keep-N, load_path by name or folder, torn and corrupt steps passed over, and what each fault does.
In every case the checkpoints committed before a failure stay in the bucket and verify."""
import dataclasses
import json
import os
import warnings

import numpy as np
import pytest

from jaxcomposer import Trainer
from jaxcomposer.errors import ConfigurationError, ObjectStoreError
from jaxcomposer.trainer.remote_checkpoints import COMMIT, committed_steps, download_step
from jaxcomposer.utils.object_store import RemoteFolder

from .helpers import leaves, loaders, mlp_task
from .s3_server import Fault, environment, s3  # noqa: F401 (s3: the server, a module fixture)

pytestmark = pytest.mark.xdist_group("s3_server")


@pytest.fixture
def proxy(s3):
    s3.faults, s3.log = [], []
    yield s3
    s3.faults = []


def run(folder, duration="6ba", **kw):
    train, _ = loaders(n_train=256)
    kw = {"save_interval": "2ba", "run_name": "r", **kw}
    trainer = Trainer(model=mlp_task(), train_dataloader=train, max_duration=duration, save_folder=folder, seed=0,
                      progress_bar=False, **kw)
    trainer.fit()
    trainer.close()
    return trainer


def names(folder):
    return sorted(k for k in RemoteFolder(folder).list() if "/" not in k)


def test_autoresume_from_the_bucket_equals_a_straight_run(proxy):
    folder = "s3://ckpt/resume"
    run(folder, "6ba")
    assert committed_steps(RemoteFolder(folder)) == [2, 4, 6]
    assert names(folder) == ["ep0-ba2-rank0.pt", "ep0-ba4-rank0.pt", "ep0-ba6-rank0.pt", "latest-rank0.pt"]
    assert json.loads(RemoteFolder(folder).get_bytes("latest-rank0.pt")) == {"step": 6}
    resumed = run(folder, "8ba", autoresume=True)
    train, _ = loaders(n_train=256)
    straight = Trainer(model=mlp_task(), train_dataloader=train, max_duration="8ba", seed=0, progress_bar=False)
    straight.fit()
    for a, b in zip(leaves(resumed.state.train_state), leaves(straight.state.train_state)):
        np.testing.assert_array_equal(a, b)
    assert committed_steps(RemoteFolder(folder)) == [2, 4, 6, 8]


def test_keep_n_prunes_old_steps_and_their_names_after_the_new_commit(proxy):
    folder = "s3://ckpt/keep"
    run(folder, "8ba", save_num_checkpoints_to_keep=2)
    assert committed_steps(RemoteFolder(folder)) == [6, 8]
    assert not [k for k in RemoteFolder(folder).list() if k.split("/")[0] in ("2", "4")]  # every object gone
    assert names(folder) == ["ep0-ba6-rank0.pt", "ep1-ba8-rank0.pt", "latest-rank0.pt"]


def test_load_path_takes_a_name_a_step_or_the_folder(proxy):
    folder = "s3://ckpt/load"
    trained = run(folder, "4ba")
    want = leaves(trained.state.train_state.params)
    for load_path in (f"{folder}/latest-rank0.pt", f"{folder}/4", folder):
        train, _ = loaders(n_train=256)
        loaded = Trainer(model=mlp_task(seed=1), train_dataloader=train, max_duration="4ba", load_path=load_path,
                         progress_bar=False)
        for a, b in zip(leaves(loaded.state.train_state.params), want):
            np.testing.assert_array_equal(a, b)
        assert int(loaded.state.timestamp.batch) == 4


def test_a_torn_or_corrupt_step_is_passed_over_with_a_warning(proxy, tmp_path):
    folder = "s3://ckpt/torn"
    run(folder, "4ba")
    remote = RemoteFolder(folder)
    for key in remote.list("4/"):  # step 6: uploaded, its marker never written (the process died)
        if not key.endswith(COMMIT):
            remote.put_bytes("6/" + key.split("/", 1)[1], remote.get_bytes(key))
    weights = sorted(k for k in remote.list("4/") if k.startswith("4/weights/") and not k.endswith("metadata"))
    remote.put_bytes(weights[0], b"bit rot")  # step 4: committed, then one of its files changed
    assert committed_steps(remote) == [2, 4]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed = run(folder, "6ba", autoresume=True)
    assert any("skipping checkpoint step 4" in str(w.message) for w in caught)
    assert int(resumed.state.timestamp.batch) == 6
    assert committed_steps(remote) == [2, 4, 6]  # resumed from 2; 4 and 6 saved again, each replacing its bad copy
    for step in (2, 4, 6):
        download_step(remote, step, tmp_path)


# Faults the client outlasts, each injected on the uploads of one save (the step in its path) of one run that saves
# every batch: the run goes on, and every step is committed and verifies.
RECOVERED = {
    "503 SlowDown, 3 times": Fault("PUT", status=503, code="SlowDown", times=3),
    "500 InternalError, twice": Fault("PUT", status=500, code="InternalError", times=2),
    "429 TooManyRequests, twice": Fault("PUT", status=429, code="TooManyRequests", times=2),
    "connection cut mid-upload, twice": Fault("PUT", cut=True, times=2),
    "an answer slower than the request timeout": Fault("PUT", delay=1.3, times=1),
}


def test_faults_the_client_outlasts_are_retried(proxy, tmp_path):
    folder = "s3://ckpt/outlast"
    faults = {what: dataclasses.replace(fault, path=f"/outlast/{step}/")
              for step, (what, fault) in enumerate(RECOVERED.items(), start=2)}
    proxy.faults = list(faults.values())
    run(folder, "6ba", save_interval="1ba")
    assert {what: fault.times for what, fault in faults.items()} == {what: 0 for what in faults}  # each was hit
    remote = RemoteFolder(folder)
    assert committed_steps(remote) == [1, 2, 3, 4, 5, 6]
    for step in range(1, 7):
        download_step(remote, step, tmp_path)


@pytest.mark.parametrize("fault,cause", [
    (Fault("PUT", path="/4/", status=503, code="SlowDown", times=10_000), "the server throttled every retry"),
    (Fault("PUT", path="/4/", status=403, code="InvalidAccessKeyId", times=10_000), "the access key is not valid"),
], ids=["throttled-throughout", "bad-credentials"])
def test_a_fault_that_lasts_fails_the_run_naming_the_uri_and_keeps_what_was_committed(proxy, fault, cause,
                                                                                      tmp_path):
    folder = f"s3://ckpt/lasting-{fault.status}"
    proxy.faults = [dataclasses.replace(fault)]
    with pytest.raises(ObjectStoreError, match=cause) as error:
        run(folder, "6ba")
    assert folder in str(error.value) and "testing" not in str(error.value)  # the URI; never a credential
    proxy.faults = []
    remote = RemoteFolder(folder)
    assert committed_steps(remote) == [2]  # step 4 never committed; step 2 intact, and latest still names it
    assert json.loads(remote.get_bytes("latest-rank0.pt")) == {"step": 2}
    download_step(remote, 2, tmp_path)


def test_a_missing_bucket_and_a_refused_connection_fail_before_training(proxy):
    with pytest.raises(ConfigurationError, match=r"s3://no-such-bucket/run.*the bucket does not exist"):
        run("s3://no-such-bucket/run")
    with environment({"AWS_ENDPOINT_URL": "http://127.0.0.1:9"}):  # nothing listens there
        with pytest.raises(ConfigurationError, match=r"s3://ckpt/refused.*connection refused"):
            run("s3://ckpt/refused")
    assert os.environ["AWS_ENDPOINT_URL"] != "http://127.0.0.1:9"


def test_the_command_line_saves_and_resumes_through_the_bucket(proxy, tmp_path):
    """``jaxcomposer fit`` with ``--save_folder`` and ``--run_dir`` in the bucket; a relaunch with autoresume
    continues from the bucket's checkpoint. The config uploaded with the run holds no credential."""
    import yaml

    from jaxcomposer.cli import main
    from tests.config.test_config import TINY

    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump({**TINY, "max_duration": "4ba", "save_interval": "2ba", "eval_interval": "4ba",
                                      "schedulers": [{"name": "cosine_annealing_with_warmup", "t_warmup": "1ba"}]}))
    argv = ["fit", str(config), "--save_folder", "s3://ckpt/cli/checkpoints", "--run_dir", "s3://ckpt/cli/runs"]
    assert main(argv) == 0
    assert committed_steps(RemoteFolder("s3://ckpt/cli/checkpoints")) == [2, 4]
    runs = RemoteFolder("s3://ckpt/cli/runs")
    assert {"tiny/config.yaml", "tiny/metrics.jsonl"} <= set(runs.list())
    uploaded = runs.get_bytes("tiny/config.yaml").decode()
    assert "s3://ckpt/cli/checkpoints" in uploaded and os.environ["AWS_SECRET_ACCESS_KEY"] not in uploaded
    assert main(argv + ["--max_duration", "6ba", "--autoresume", "true"]) == 0
    assert committed_steps(RemoteFolder("s3://ckpt/cli/checkpoints")) == [2, 4, 6]
    lines = runs.get_bytes("tiny/metrics.jsonl").decode().splitlines()
    resumed = [line for line in lines if "resumed_from" in line]
    assert len(resumed) == 1 and "s3://ckpt/cli/checkpoints/4" in resumed[0]  # appended to the first run's lines
    assert len([line for line in lines if "loss/train/total" in line]) == 6  # batches 1-4, then 5-6


def test_sigterm_waits_for_the_upload_of_the_step_it_saves(proxy):
    """A preemption saves the step in flight and waits for its upload before stopping: the bucket holds it,
    committed, when ``Preempted`` reaches the caller."""
    import signal

    from jaxcomposer import Callback
    from jaxcomposer.errors import Preempted

    class Preempt(Callback):
        def batch_end(self, state, logger):
            if int(state.timestamp.batch) == 3:
                signal.raise_signal(signal.SIGTERM)

    folder = "s3://ckpt/preempted"
    proxy.faults = [Fault("PUT", path="/preempted/3/", delay=0.5, times=2)]  # a slow upload of the step saved
    with pytest.raises(Preempted, match="stopped after batch 3"):
        run(folder, "6ba", save_interval="2ba", callbacks=[Preempt()])
    assert committed_steps(RemoteFolder(folder)) == [2, 3]
    assert json.loads(RemoteFolder(folder).get_bytes("latest-rank0.pt")) == {"step": 3}


def test_checkpoint_saver_takes_a_bucket_folder(proxy):
    """Composer's CheckpointSaver callback with ``folder='s3://...'``: the same committed steps and names."""
    from jaxcomposer.callbacks import CheckpointSaver

    train_loader, _ = loaders(n_train=256)
    trainer = Trainer(model=mlp_task(), train_dataloader=train_loader, max_duration="4ba", seed=0,
                      progress_bar=False, run_name="saver",
                      callbacks=[CheckpointSaver(folder="s3://ckpt/{run_name}/checkpoints", save_interval="2ba")])
    trainer.fit()
    trainer.close()
    remote = RemoteFolder("s3://ckpt/saver/checkpoints")
    assert committed_steps(remote) == [2, 4]
    assert json.loads(remote.get_bytes("latest-rank0.pt")) == {"step": 4}
    with pytest.raises(ValueError, match="for a bucket, give folder='s3://bucket/prefix'"):
        CheckpointSaver(remote_file_name="{run_name}/ep{epoch}.pt")
