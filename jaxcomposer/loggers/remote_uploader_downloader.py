"""``RemoteUploaderDownloader``: Composer's logger destination that uploads the run's files to an object store.

Whatever calls ``logger.upload_file(remote_file_name, file_path, overwrite)`` (``FileLogger`` with a
``remote_file_name``, ``ExportForInferenceCallback``, a user's callback) has the file copied into a staging folder
at once (the caller may change or delete it afterwards) and uploaded by background threads; a name logged again
before its upload started is uploaded once, with the newest file. The destination checks at INIT that it can
write to the bucket (Composer's ``.credentials_validated_successfully`` object), raises an upload's failure at the
next batch's end, and waits for every upload at the end of ``fit`` and at ``close``.

Differences from Composer, each deliberate: uploads run in threads, not processes (the client releases the GIL for
its I/O, so ``use_procs`` is accepted and changes nothing); each request is retried by the client with backoff
(``jaxcomposer.utils.object_store``), and ``num_attempts`` repeats a whole upload that still failed; credentials
come from the environment only, so ``backend_kwargs`` takes ``bucket``, ``prefix``, ``endpoint_url`` and
``region_name`` and refuses keys that carry credentials.
"""
from __future__ import annotations

import queue
import shutil
import tempfile
import threading
import uuid
from pathlib import Path
from typing import Any

from jaxcomposer.errors import ObjectStoreError
from jaxcomposer.loggers.logger import LoggerDestination, dist_info
from jaxcomposer.utils.object_store import RemoteFolder, split_uri

__all__ = ["RemoteUploaderDownloader"]

BACKEND_KWARGS = ("bucket", "prefix", "endpoint_url", "region_name")
CREDENTIAL_KWARGS = ("aws_access_key_id", "aws_secret_access_key", "aws_session_token", "key", "secret",
                     "credentials", "service_account", "token")


class RemoteUploaderDownloader(LoggerDestination):
    """Composer's ``RemoteUploaderDownloader(bucket_uri, backend_kwargs=None,
    file_path_format_string='{remote_file_name}', num_concurrent_uploads=1, upload_staging_folder=None,
    use_procs=True, num_attempts=3)`` for ``s3://`` and ``gs://`` buckets."""

    def __init__(self, bucket_uri: str, backend_kwargs: dict[str, Any] | None = None,
                 file_path_format_string: str = "{remote_file_name}", num_concurrent_uploads: int = 1,
                 upload_staging_folder: str | None = None, use_procs: bool = True, num_attempts: int = 3):
        kwargs = dict(backend_kwargs or {})
        secret = sorted(k for k in kwargs if k in CREDENTIAL_KWARGS)
        if secret:
            raise ValueError(f"RemoteUploaderDownloader: backend_kwargs {secret} carry credentials, which are taken "
                             "from the environment only (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, ...), so that "
                             "no config or log of the run holds them")
        unknown = sorted(set(kwargs) - set(BACKEND_KWARGS))
        if unknown:
            raise ValueError(f"RemoteUploaderDownloader: backend_kwargs {unknown} are not understood; expected some "
                             f"of {list(BACKEND_KWARGS)}")
        if num_concurrent_uploads < 1:
            raise ValueError("RemoteUploaderDownloader: num_concurrent_uploads must be >= 1, got "
                             f"{num_concurrent_uploads}")
        if num_attempts < 1:
            raise ValueError(f"RemoteUploaderDownloader: num_attempts must be >= 1, got {num_attempts}")
        scheme, bucket, path = split_uri(bucket_uri, "RemoteUploaderDownloader(bucket_uri)")
        if kwargs.get("bucket", bucket) != bucket:
            raise ValueError(f"RemoteUploaderDownloader: backend_kwargs bucket={kwargs['bucket']!r} is not the "
                             f"bucket of bucket_uri={bucket_uri!r}")
        prefix = "/".join(p.strip("/") for p in (path, kwargs.get("prefix", "")) if p.strip("/"))
        self.bucket_uri = f"{scheme}://{bucket}" + (f"/{prefix}" if prefix else "")
        self._backend = {"endpoint_url": kwargs.get("endpoint_url"), "region": kwargs.get("region_name")}
        self.file_path_format_string = file_path_format_string
        self.num_concurrent_uploads, self.num_attempts, self.use_procs = num_concurrent_uploads, num_attempts, use_procs
        self._given_staging = upload_staging_folder
        self._staging: Path | None = None
        self._remote: RemoteFolder | None = None
        self._run_name = ""
        self._pending: dict[str, tuple[Path, bool]] = {}  # key -> newest staged file not yet taken by a worker
        self._key_locks: dict[str, threading.Lock] = {}
        self._queue: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._errors: list[BaseException] = []
        self._workers: list[threading.Thread] = []
        self.uploaded: list[str] = []  # keys uploaded, in order (what a caller may list or check)

    # ---- Composer's API ----
    @property
    def remote(self) -> RemoteFolder:
        if self._remote is None:
            self._remote = RemoteFolder(self.bucket_uri, "RemoteUploaderDownloader(bucket_uri)",
                                        endpoint_url=self._backend["endpoint_url"], region=self._backend["region"])
        return self._remote

    def remote_file_name(self, remote_file_name: str) -> str:
        """The object's key: ``file_path_format_string`` with ``{remote_file_name}``, ``{run_name}`` and the
        ranks, leading slashes stripped."""
        return self.file_path_format_string.format(remote_file_name=remote_file_name, run_name=self._run_name,
                                                   **dist_info()).lstrip("/")

    def get_uri_for_file(self, remote_file_name: str) -> str:
        return f"{self.bucket_uri}/{self.remote_file_name(remote_file_name)}"

    def can_upload_files(self) -> bool:
        return True

    def init(self, state, logger) -> None:
        if self._workers:
            raise RuntimeError("RemoteUploaderDownloader: already initialized (one Trainer per destination)")
        self._run_name = state.run_name
        if dist_info()["rank"] == 0:  # fail now, before training, when the bucket cannot be written
            self.remote.put_bytes(self.remote_file_name(".credentials_validated_successfully"), b"")
        self._start()

    def upload_file(self, remote_file_name: str, file_path: str | Path, overwrite: bool = False) -> None:
        """Copy ``file_path`` to the staging folder now and upload it in the background."""
        self._raise_errors()
        if not self._workers:
            self._start()
        staged = self.staging / f"{uuid.uuid4().hex}-{Path(file_path).name}"
        shutil.copy2(file_path, staged)
        key = self.remote_file_name(remote_file_name)
        with self._lock:  # a name already waiting takes the newest file when a worker gets to it
            older = self._pending.get(key)
            self._pending[key] = (staged, overwrite)
        if older is not None:
            older[0].unlink(missing_ok=True)
        else:
            self._queue.put(key)

    def download_file(self, remote_file_name: str, destination: str | Path, overwrite: bool = False,
                      progress_bar: bool = True) -> None:
        """The object ``remote_file_name`` (as stored: not formatted) written to ``destination``."""
        destination = Path(destination)
        if destination.exists() and not overwrite:
            raise FileExistsError(f"RemoteUploaderDownloader: {destination} exists; pass overwrite=True")
        self.remote.get_file(remote_file_name, destination)

    def batch_end(self, state, logger) -> None:
        self._raise_errors()

    def fit_end(self, state, logger) -> None:
        self.wait()

    def close(self, state, logger) -> None:
        self.post_close()

    def post_close(self) -> None:
        try:
            self.wait()
        finally:
            for _ in self._workers:
                self._queue.put(None)
            for worker in self._workers:
                worker.join()
            self._workers = []
            if self._given_staging is None and self._staging is not None:
                shutil.rmtree(self._staging, ignore_errors=True)
                self._staging = None

    def wait(self) -> None:
        """Block until every upload asked for so far is done; raise the first that failed."""
        self._queue.join()
        self._raise_errors()

    # ---- workers ----
    @property
    def staging(self) -> Path:
        if self._staging is None:
            if self._given_staging is not None:
                self._staging = Path(self._given_staging)
                self._staging.mkdir(parents=True, exist_ok=True)
            else:
                self._staging = Path(tempfile.mkdtemp(prefix="jaxcomposer-uploads-"))
        return self._staging

    def _start(self) -> None:
        for i in range(self.num_concurrent_uploads):
            worker = threading.Thread(target=self._work, name=f"jaxcomposer-uploader-{i}", daemon=True)
            worker.start()
            self._workers.append(worker)

    def _work(self) -> None:
        while True:
            key = self._queue.get()
            if key is None:
                self._queue.task_done()
                return
            with self._lock:
                key_lock = self._key_locks.setdefault(key, threading.Lock())
            # one upload of a name at a time, so an older file never lands after a newer one
            with key_lock:
                with self._lock:
                    staged, overwrite = self._pending.pop(key)
                try:
                    self._upload(key, staged, overwrite)
                except BaseException as e:  # raised in the training thread (batch end, fit end, close)
                    self._errors.append(e)
                finally:
                    staged.unlink(missing_ok=True)
                    self._queue.task_done()

    def _upload(self, key: str, staged: Path, overwrite: bool) -> None:
        for attempt in range(self.num_attempts):
            try:
                if overwrite:
                    self.remote.put_file(key, staged)
                elif not self.remote.put_bytes(key, staged.read_bytes(), create=True):
                    raise FileExistsError(f"RemoteUploaderDownloader: {self.remote.uri}/{key} already exists, and "
                                          "overwrite was False")
                self.uploaded.append(key)
                return
            except ObjectStoreError:  # (the client retried its requests already; this repeats the whole upload)
                if attempt == self.num_attempts - 1:
                    raise

    def _raise_errors(self) -> None:
        if self._errors:
            error, self._errors = self._errors[0], []
            raise error


class FolderUploader(LoggerDestination):
    """Hands every file of a local ``folder`` (a run directory staged for an object store) to
    ``logger.upload_file`` under its path relative to the folder, at each epoch's end and at the end of ``fit``;
    placed after the destinations that write there and before the uploader, whose ``fit_end`` waits for them."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)

    def _hand_over(self, logger) -> None:
        if self.folder.is_dir():
            for path in sorted(p for p in self.folder.rglob("*") if p.is_file()):
                logger.upload_file(remote_file_name=str(path.relative_to(self.folder)), file_path=path,
                                   overwrite=True)

    def epoch_end(self, state, logger) -> None:
        self._hand_over(logger)

    def fit_end(self, state, logger) -> None:
        self._hand_over(logger)
