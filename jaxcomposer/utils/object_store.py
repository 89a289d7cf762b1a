"""Folders in object stores (``s3://bucket/prefix``, ``gs://bucket/prefix``), through obstore.

obstore (the Rust ``object_store`` crate) is the client: one small wheel for S3, S3-compatible servers and GCS;
every request retried with exponential backoff and jitter on 5xx and throttling responses, dropped connections and
timeouts; uploads signed over their payload's SHA-256 and, with ``checksum_algorithm``, checked by the server
against it; conditional puts (``mode="create"``) for markers that must never be replaced. Against boto3's transfer
manager it uploads at the same speed to the test server (``benchmarks/remote_checkpoints.py``) and it outlasted
every injected fault (``tests/trainer/test_remote_checkpoints.py``) with its built-in retries, without the
dependency stacks of boto3 or s3fs (botocore, aiobotocore, aiohttp). Credentials, region and
endpoint come only from the environment (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``,
``AWS_REGION``, ``AWS_ENDPOINT_URL`` (an S3-compatible server), ``AWS_ALLOW_HTTP``; ``GOOGLE_*`` for GCS) or the
provider's instance metadata: nothing of them is taken from configs or written to a run, and errors name the URI
and the cause, never a credential.
"""
from __future__ import annotations

import os
import re
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, TypeVar

from jaxcomposer.errors import ObjectStoreError
from jaxcomposer.utils.extras import optional_import

SCHEMES = ("s3", "gs")
T = TypeVar("T")

# How long one request may take before it is retried, and how long retries may go on: a checkpoint upload outlives
# short outages (a restarted server, throttling) but a dead endpoint fails the save within minutes, not hours.
# Tests shorten them with these variables.
REQUEST_TIMEOUT_ENV, RETRY_TIMEOUT_ENV, MAX_RETRIES_ENV = (
    "JAXCOMPOSER_OBJECT_STORE_REQUEST_TIMEOUT", "JAXCOMPOSER_OBJECT_STORE_RETRY_TIMEOUT",
    "JAXCOMPOSER_OBJECT_STORE_MAX_RETRIES")


STAGING_ENV = "JAXCOMPOSER_STAGING_DIR"  # where files bound for an object store are staged


def staging_root() -> Path:
    """The folder under which files bound for an object store are staged (``JAXCOMPOSER_STAGING_DIR``, default
    ``~/.cache/jaxcomposer/staging``), made if missing."""
    root = Path(os.environ.get(STAGING_ENV) or Path.home() / ".cache" / "jaxcomposer" / "staging")
    root.mkdir(parents=True, exist_ok=True)
    return root


def is_uri(path: Any) -> bool:
    """Whether ``path`` names an object-store folder (``s3://...``, ``gs://...``) rather than a local path."""
    return isinstance(path, str) and re.match(r"^[a-z0-9]+://", path) is not None


def split_uri(uri: str, argument: str) -> tuple[str, str, str]:
    """``(scheme, bucket, prefix)``; a URI of another scheme, or without a bucket, is refused naming
    ``argument``."""
    match = re.match(r"^([a-z0-9]+)://([^/]+)/?(.*)$", uri)
    if match is None or match.group(1) not in SCHEMES:
        raise ObjectStoreError(f"{argument}: {uri!r} is not an object-store folder; expected "
                               f"{' or '.join(s + '://bucket/prefix' for s in SCHEMES)}, or a local path")
    if "@" in match.group(2) or ":" in match.group(2):  # said without repeating the URI: it may hold a secret
        raise ObjectStoreError(f"{argument}: credentials are not taken from a URI (they would be written to the "
                               "run's logs and configs); set them in the environment (AWS_ACCESS_KEY_ID, "
                               "AWS_SECRET_ACCESS_KEY, ...) and give s3://bucket/prefix")
    return match.group(1), match.group(2), match.group(3).strip("/")


def _seconds(name: str, default: float) -> timedelta:
    return timedelta(seconds=float(os.environ.get(name, default)))


class RemoteFolder:
    """The folder ``uri`` of an object store: keys below it are read, written, listed and deleted by their path
    relative to it (``"12/weights/data.npz"``). Every failure, after the client's retries, raises
    :class:`~jaxcomposer.errors.ObjectStoreError` naming the URI and the cause."""

    def __init__(self, uri: str, argument: str = "save_folder", *, endpoint_url: str | None = None,
                 region: str | None = None):
        """``endpoint_url`` and ``region`` override the environment's (``AWS_ENDPOINT_URL``, ``AWS_REGION``)."""
        self.scheme, self.bucket, self.prefix = split_uri(uri, argument)
        self.uri = f"{self.scheme}://{self.bucket}" + (f"/{self.prefix}" if self.prefix else "")
        self._obstore = optional_import("obstore", needed_by=f"{argument}={uri!r}", package="obstore",
                                        extra="remote")
        from obstore.store import from_url
        retry = {"max_retries": int(os.environ.get(MAX_RETRIES_ENV, 10)),
                 "retry_timeout": _seconds(RETRY_TIMEOUT_ENV, 180.0),
                 "backoff": {"init_backoff": timedelta(milliseconds=100), "max_backoff": timedelta(seconds=15),
                             "base": 2}}
        client = {"timeout": _seconds(REQUEST_TIMEOUT_ENV, 120.0), "connect_timeout": timedelta(seconds=10)}
        if os.environ.get("AWS_ALLOW_HTTP", "").lower() in ("1", "true"):
            client["allow_http"] = True
        config = {"checksum_algorithm": "sha256"} if self.scheme == "s3" else {}
        if (endpoint_url is not None or region is not None) and self.scheme != "s3":
            raise ObjectStoreError(f"{argument}: an endpoint_url or region applies to s3:// folders, not {uri!r}")
        if endpoint_url is not None:
            config["endpoint"] = endpoint_url
            client["allow_http"] = client.get("allow_http", False) or endpoint_url.startswith("http://")
        if region is not None:
            config["region"] = region
        self._store = self._call(lambda: from_url(self.uri, retry_config=retry, client_options=client, **config),
                                 "open")

    def __repr__(self) -> str:
        return f"RemoteFolder({self.uri!r})"

    def _call(self, fn: Callable[[], T], what: str, key: str | None = None, *, missing_ok: bool = False) -> T:
        """``fn()``, its errors as ObjectStoreError; with ``missing_ok`` an object that is not there raises
        FileNotFoundError for the caller (a missing bucket is an error all the same)."""
        try:
            return fn()
        except Exception as e:  # obstore's errors: the cause is in the message, credentials never are
            if missing_ok and isinstance(e, FileNotFoundError) and "NoSuchBucket" not in str(e):
                raise FileNotFoundError(key) from None
            where = self.uri + (f"/{key}" if key else "")
            raise ObjectStoreError(f"{what} {where} failed: {_cause(e)}") from None

    def put_file(self, key: str, path: Path) -> None:
        self._call(lambda: self._obstore.put(self._store, key, Path(path)), "upload to", key)

    def put_bytes(self, key: str, data: bytes, *, create: bool = False) -> bool:
        """Write ``data`` at ``key``; with ``create``, only if nothing is there yet (returns False then)."""
        def put() -> bool:
            try:
                self._obstore.put(self._store, key, data, mode="create" if create else None)
            except Exception as e:
                if create and type(e).__name__ in ("AlreadyExistsError", "PreconditionError"):
                    return False
                raise
            return True
        return self._call(put, "write to", key)

    def get_bytes(self, key: str) -> bytes | None:
        """The object at ``key``, or None when there is none."""
        try:
            return bytes(self._call(lambda: self._obstore.get(self._store, key).bytes(), "read", key,
                                    missing_ok=True))
        except FileNotFoundError:
            return None

    def get_file(self, key: str, path: Path) -> None:
        data = self.get_bytes(key)
        if data is None:
            raise ObjectStoreError(f"read {self.uri}/{key} failed: no such object")
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".part")
        tmp.write_bytes(data)
        tmp.replace(path)

    def get_folder(self, into: Path) -> None:
        """Every object below this folder written under ``into`` by its key."""
        for key in self.list():
            self.get_file(key, Path(into) / key)

    def list(self, prefix: str = "") -> dict[str, int]:
        """``{key: size}`` of every object below ``prefix`` (relative to this folder)."""
        def run():
            out = {}
            for batch in self._obstore.list(self._store, prefix=prefix or None):
                out.update({obj["path"]: int(obj["size"]) for obj in batch})
            return out
        return self._call(run, "list", prefix)

    def children(self) -> list[str]:
        """The names directly below this folder (its "subdirectories")."""
        listed = self._call(lambda: self._obstore.list_with_delimiter(self._store), "list")
        return [p.rstrip("/").rsplit("/", 1)[-1] for p in listed["common_prefixes"]]

    def delete(self, keys: list[str]) -> None:
        for key in keys:
            try:
                self._call(lambda: self._obstore.delete(self._store, key), "delete", key, missing_ok=True)
            except FileNotFoundError:
                pass


# S3's error codes a user can act on, said plainly
KNOWN_CODES = {"NoSuchBucket": "the bucket does not exist", "InvalidAccessKeyId": "the access key is not valid",
               "SignatureDoesNotMatch": "the secret key does not match the access key", "AccessDenied": "access denied",
               "SlowDown": "the server throttled every retry", "InternalError": "the server failed every retry",
               "ServiceUnavailable": "the server stayed unavailable"}


def _cause(error: BaseException) -> str:
    """The useful part of an obstore error: the server's code and message, or the connection failure."""
    text = " ".join(str(error).split())
    code = re.search(r"<Code>([^<]+)</Code>", text)
    message = re.search(r"<Message>([^<]+)</Message>", text)
    if code:
        said = message.group(1) if message else ""
        return f"{KNOWN_CODES.get(code.group(1), code.group(1))} ({code.group(1)}: {said})"
    status = re.search(r"status code: (\d{3}[^:]*)", text)
    if status:
        return f"the server answered {status.group(1).strip()}"
    for pattern, plain in ((r"[Cc]onnection refused", "connection refused"),
                           (r"timed? ?out", "the request timed out"),
                           (r"error sending request|connection closed|reset by peer", "the connection failed")):
        if re.search(pattern, text):
            return f"{plain} ({type(error).__name__})"
    return text[:300]


class ObjectStore:
    """Composer's ``ObjectStore`` interface (``composer.utils.S3ObjectStore``, ``GCSObjectStore``) on a
    :class:`RemoteFolder`: what a Composer script or callback calls to move files to and from a bucket. Credentials
    come from the environment only; keyword arguments that carry them are refused."""

    SCHEME = "s3"

    def __init__(self, bucket: str, prefix: str = "", *, region_name: str | None = None,
                 endpoint_url: str | None = None, **credentials: Any):
        if credentials:
            raise ObjectStoreError(f"{type(self).__name__}: {sorted(credentials)} are not taken: credentials come "
                                   "from the environment only (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, "
                                   "GOOGLE_APPLICATION_CREDENTIALS, ...)")
        uri = f"{self.SCHEME}://{bucket}" + (f"/{prefix.strip('/')}" if prefix.strip("/") else "")
        self.folder = RemoteFolder(uri, type(self).__name__, endpoint_url=endpoint_url, region=region_name)
        self.bucket, self.prefix = bucket, prefix

    def get_uri(self, object_name: str) -> str:
        return f"{self.folder.uri}/{object_name.lstrip('/')}"

    def upload_object(self, object_name: str, filename: str | Path, callback: Callable | None = None) -> None:
        self.folder.put_file(object_name.lstrip("/"), Path(filename))
        if callback is not None:
            size = Path(filename).stat().st_size
            callback(size, size)

    def download_object(self, object_name: str, filename: str | Path, overwrite: bool = False,
                        callback: Callable | None = None) -> None:
        path = Path(filename)
        if path.exists() and not overwrite:
            raise FileExistsError(f"{type(self).__name__}.download_object: {path} exists; pass overwrite=True")
        self.folder.get_file(object_name.lstrip("/"), path)
        if callback is not None:
            callback(path.stat().st_size, path.stat().st_size)

    def get_object_size(self, object_name: str) -> int:
        key = object_name.lstrip("/")
        listed = self.folder.list(key)
        if key not in listed:
            raise FileNotFoundError(f"{self.get_uri(object_name)} does not exist")
        return listed[key]

    def list_objects(self, prefix: str | None = None) -> list[str]:
        return sorted(self.folder.list(prefix or ""))

    def close(self) -> None:
        pass


class S3ObjectStore(ObjectStore):
    """Composer's ``S3ObjectStore(bucket, prefix='', region_name=None, endpoint_url=None)``."""
    SCHEME = "s3"


class GCSObjectStore(ObjectStore):
    """Composer's ``GCSObjectStore(bucket, prefix='')``."""
    SCHEME = "gs"
