"""Logs and artifacts to an object store, against a real S3 server on the loopback (moto's, started here):
Composer's RemoteUploaderDownloader (uploads in the background, the newest file of a name wins, overwrite=False
kept, the bucket checked at INIT), FileLogger's remote_file_name, ExportForInferenceCallback to an s3:// save_path,
and a Trainer whose run_dir is a bucket folder."""
import json

import numpy as np
import pytest

from jaxcomposer import Callback, Trainer
from jaxcomposer.callbacks import ExportForInferenceCallback
from jaxcomposer.errors import ObjectStoreError
from jaxcomposer.loggers import FileLogger, RemoteUploaderDownloader
from jaxcomposer.utils import S3ObjectStore
from jaxcomposer.utils.object_store import RemoteFolder

from tests.trainer.helpers import loaders, mlp_task
from tests.trainer.s3_server import s3  # noqa: F401 (the server, a module fixture)

pytestmark = pytest.mark.xdist_group("s3_server")


def train(**kw):
    train_loader, _ = loaders(n_train=128)
    trainer = Trainer(model=mlp_task(), train_dataloader=train_loader, max_duration="2ba", seed=0,
                      progress_bar=False, run_name="up", **kw)
    trainer.fit()
    trainer.close()
    return trainer


def test_uploads_keep_the_newest_file_of_a_name_and_refuse_to_overwrite_when_asked(s3, tmp_path):
    rud = RemoteUploaderDownloader("s3://ckpt/uploads", file_path_format_string="{run_name}/{remote_file_name}",
                                   num_concurrent_uploads=2)
    files = []
    for i in range(5):
        files.append(tmp_path / f"v{i}.txt")
        files[-1].write_text(f"version {i}")

    class Uploads(Callback):  # hands files over while training
        def batch_end(self, state, logger):
            for f in files:
                logger.upload_file(remote_file_name="same.txt", file_path=f, overwrite=True)
            logger.upload_file(remote_file_name=f"batch{int(state.timestamp.batch)}.txt", file_path=files[0])

    train(loggers=[rud], callbacks=[Uploads()])
    remote = RemoteFolder("s3://ckpt/uploads")
    assert remote.get_bytes("up/same.txt") == b"version 4"
    assert remote.get_bytes("up/batch2.txt") == b"version 0"
    assert ".credentials_validated_successfully" in " ".join(remote.list("up/"))
    rud.download_file("up/same.txt", tmp_path / "back.txt")
    assert (tmp_path / "back.txt").read_text() == "version 4"
    with pytest.raises(FileExistsError, match="overwrite"):
        rud.download_file("up/same.txt", tmp_path / "back.txt")
    again = RemoteUploaderDownloader("s3://ckpt/uploads", file_path_format_string="{run_name}/{remote_file_name}")
    with pytest.raises(FileExistsError, match="already exists, and overwrite was False"):
        train(loggers=[again], callbacks=[Uploads()])  # batch1.txt is there: raised at the next batch's end
    assert remote.get_bytes("up/batch1.txt") == b"version 0"  # and left as it was


def test_refusals_before_training(s3):
    with pytest.raises(ValueError, match="carry credentials"):
        RemoteUploaderDownloader("s3://ckpt/x", backend_kwargs={"aws_secret_access_key": "shh"})
    with pytest.raises(ValueError, match=r"\['color'\] are not understood"):
        RemoteUploaderDownloader("s3://ckpt/x", backend_kwargs={"color": "blue"})
    with pytest.raises(ObjectStoreError, match="s3://no-bucket.*the bucket does not exist"):
        train(loggers=[RemoteUploaderDownloader("s3://no-bucket/logs")])  # INIT's check, before any step


def test_file_logger_export_and_run_dir_go_to_the_bucket(s3, tmp_path):
    rud = RemoteUploaderDownloader("s3://ckpt/artifacts")
    export = ExportForInferenceCallback("safetensors", "s3://ckpt/models/mlp.safetensors")
    trainer = train(run_dir="s3://ckpt/runs/up", callbacks=[export],
                    loggers=[rud, FileLogger(str(tmp_path / "log.txt"), capture_stdout=False, capture_stderr=False)])
    artifacts = RemoteFolder("s3://ckpt/artifacts")
    assert b"loss/train/total" in artifacts.get_bytes("up/logs-rank0.txt")  # FileLogger's remote_file_name
    models = S3ObjectStore("ckpt", prefix="models")
    models.download_object("mlp.safetensors", tmp_path / "mlp.safetensors")
    from safetensors.numpy import load_file
    weights = load_file(tmp_path / "mlp.safetensors")
    assert weights and all(np.isfinite(v).all() for v in weights.values())
    run = RemoteFolder("s3://ckpt/runs/up")
    names = set(run.list())
    assert {"metrics.jsonl", "metrics.png"} <= names and any(n.startswith("tensorboard/") for n in names)
    lines = [json.loads(line) for line in run.get_bytes("metrics.jsonl").decode().splitlines()]
    assert any("loss/train/total" in line.get("metrics", line) for line in lines)
    assert not trainer.run_dir.exists()  # the staged copy went with close()
