"""A real S3 server on the loopback for the tests: moto's standalone server (its HTTP API, not an in-process mock
of a client), behind a proxy that injects faults on chosen requests: error responses (5xx, throttling, bad
credentials), a connection cut mid-upload, a slow answer. Started by the tests themselves; nothing runs
beforehand."""
from __future__ import annotations

import contextlib
import dataclasses
import http.client
import os
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

ERROR_BODY = ('<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code><Message>{message}</Message>'
              '</Error>')


@dataclasses.dataclass
class Fault:
    """What the proxy does to the next ``times`` requests whose method is ``method`` (any when None) and whose
    path contains ``path``: answer ``status`` with an S3 error ``code``, ``cut`` the connection after half the
    request body, or ``delay`` the answer by seconds."""
    method: str | None = None
    path: str = ""
    times: int = 1
    status: int | None = None
    code: str = "InternalError"
    cut: bool = False
    delay: float = 0.0


class FaultProxy(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, upstream: tuple[str, int]):
        self.upstream, self.faults, self.log = upstream, [], []
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _Handler)

    def take_fault(self, method: str, path: str) -> Fault | None:
        with self.lock:
            for fault in self.faults:
                if fault.times > 0 and (fault.method in (None, method)) and fault.path in path:
                    fault.times -= 1
                    return fault
        return None


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # quiet
        pass

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().strip().split(b";")[0], 16)
                if size == 0:
                    self.rfile.readline()
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _forward(self):
        server: FaultProxy = self.server
        fault = server.take_fault(self.command, self.path)
        server.log.append((self.command, self.path, None if fault is None else fault.status or
                           ("cut" if fault.cut else "delay")))
        if fault is not None and fault.cut:
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length // 2)
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True
            return
        body = self._body()
        if fault is not None and fault.delay:
            time.sleep(fault.delay)
        if fault is not None and fault.status is not None:
            payload = ERROR_BODY.format(code=fault.code, message=f"injected {fault.code}").encode()
            self.send_response(fault.status)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return
        conn = http.client.HTTPConnection(*server.upstream, timeout=60)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("transfer-encoding", "connection")}
        headers["Content-Length"] = str(len(body))
        conn.request(self.command, self.path, body=body, headers=headers)
        response = conn.getresponse()
        data = response.read()
        self.send_response(response.status)
        for key, value in response.getheaders():
            if key.lower() not in ("transfer-encoding", "connection", "content-length", "server", "date"):
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
        conn.close()

    def _forward_quietly(self):
        try:
            self._forward()
        except (BrokenPipeError, ConnectionResetError):  # the client gave up on a slow answer: it retries
            self.close_connection = True

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward_quietly


@contextlib.contextmanager
def s3_server(bucket: str = "ckpt"):
    """``(proxy, environment)``: moto's server with ``bucket`` made, the fault proxy in front of it, and the
    environment variables that point an S3 client at the proxy (test credentials)."""
    from moto.server import ThreadedMotoServer
    import boto3

    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    try:
        host, port = moto.get_host_and_port()
        proxy = FaultProxy((host, port))
        thread = threading.Thread(target=proxy.serve_forever, daemon=True)
        thread.start()
        env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1",
               "AWS_ENDPOINT_URL": f"http://127.0.0.1:{proxy.server_address[1]}", "AWS_ALLOW_HTTP": "true",
               "AWS_EC2_METADATA_DISABLED": "true"}
        boto3.client("s3", endpoint_url=f"http://{host}:{port}", region_name="us-east-1",
                     aws_access_key_id="testing", aws_secret_access_key="testing").create_bucket(Bucket=bucket)
        try:
            yield proxy, env
        finally:
            proxy.shutdown()
            proxy.server_close()
    finally:
        moto.stop()


@contextlib.contextmanager
def environment(values: dict):
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# Short retries: a fault the client can outlast is outlasted in a second, one it cannot fails within seconds
FAST_RETRIES = {"JAXCOMPOSER_OBJECT_STORE_RETRY_TIMEOUT": "3", "JAXCOMPOSER_OBJECT_STORE_MAX_RETRIES": "4",
                "JAXCOMPOSER_OBJECT_STORE_REQUEST_TIMEOUT": "1"}


@contextlib.contextmanager
def s3_environment(staging_dir):
    """The server and proxy, with this process's environment pointing at it (inherited by subprocesses)."""
    with s3_server() as (proxy, env), environment({**env, **FAST_RETRIES,
                                                    "JAXCOMPOSER_STAGING_DIR": str(staging_dir)}):
        yield proxy


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """The loopback S3 server for a test module (skipped where moto or obstore is not installed)."""
    pytest.importorskip("moto")
    pytest.importorskip("obstore")
    with s3_environment(tmp_path_factory.mktemp("staging")) as proxy:
        yield proxy
