"""A real S3 API over HTTP for the durable tier's tests: moto's standalone server in a
process of its own (as Ray's own suite uses it), reached through pyarrow's own
``S3FileSystem``, behind a TCP proxy that the tests take down and bring back (the
endpoint unreachable for a while, its objects kept).

Authentication is on (``INITIAL_NO_AUTH_ACTION_COUNT``): one IAM user may do
everything, and a URI with another secret is refused as AWS refuses it.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from air_transfer.storage.durable.boto_loader import botocore_session
from tests.support.waiting import eventually

REGION = "us-east-1"


def _session() -> Any:
    """A boto3 session loading botocore's models through the library's one loader."""
    import boto3

    return boto3.session.Session(botocore_session=botocore_session())


def load_models() -> None:
    """Load botocore's S3 and IAM models (a client of each, made and dropped; no
    request) before the suite's ``gc.freeze()``: ~70,000 objects every later garbage
    collection (one per poll of ``eventually``) would otherwise scan, ~50 ms each."""
    for service in ("s3", "iam"):
        _session().client(
            service, endpoint_url="http://127.0.0.1:9", region_name=REGION,
            aws_access_key_id="unused", aws_secret_access_key="unused",
        )  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class TcpProxy:
    """Forwards 127.0.0.1:``port`` to ``backend``; ``down()`` refuses connections and
    cuts the open ones, ``up()`` accepts again on the same port."""

    def __init__(self, backend: int) -> None:
        self.backend = backend
        self.port = free_port()
        self._listener: socket.socket | None = None
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self.up()

    def up(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def down(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            conns, self._conns = self._conns, []
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            c.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.backend))
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not listener:
                    client.close()
                    server.close()
                    return
                self._conns += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=_pump, args=(a, b), daemon=True).start()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(1 << 16):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


class S3Server:
    """moto's S3 server with one user (``key``/``secret``) behind a ``TcpProxy``."""

    def __init__(self, log_dir: Path) -> None:
        self.backend = free_port()
        env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "3"}
        moto = Path(sys.executable).with_name("moto_server")
        self._log = open(log_dir / "moto.log", "wb")
        self.process = subprocess.Popen(
            [str(moto), "-H", "127.0.0.1", "-p", str(self.backend)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        eventually(self._answers, "moto's S3 server answers", 30)
        self.key, self.secret = self._make_user()
        self.proxy = TcpProxy(self.backend)

    def _answers(self) -> bool:
        if self.process.poll() is not None:
            raise RuntimeError(f"moto_server exited with {self.process.returncode}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{self.backend}/moto-api/", timeout=2)
        except OSError:
            return False
        return True

    def _make_user(self) -> tuple[str, str]:
        iam = _session().client(
            "iam",
            endpoint_url=f"http://127.0.0.1:{self.backend}",
            aws_access_key_id="bootstrap",
            aws_secret_access_key="bootstrap",
            region_name=REGION,
        )
        iam.create_user(UserName="air-transfer-tests")
        key = iam.create_access_key(UserName="air-transfer-tests")["AccessKey"]
        everything = {"Effect": "Allow", "Action": "*", "Resource": "*"}
        policy = {"Version": "2012-10-17", "Statement": [everything]}
        iam.put_user_policy(
            UserName="air-transfer-tests", PolicyName="all", PolicyDocument=json.dumps(policy)
        )
        return key["AccessKeyId"], key["SecretAccessKey"]

    def client(self) -> object:
        """A boto3 S3 client straight to the server (for the tests' own checks)."""
        return _session().client(
            "s3",
            endpoint_url=f"http://127.0.0.1:{self.backend}",
            aws_access_key_id=self.key,
            aws_secret_access_key=self.secret,
            region_name=REGION,
        )

    def create_bucket(self, name: str) -> None:
        self.client().create_bucket(Bucket=name)  # type: ignore[attr-defined]

    def uri(self, bucket: str, prefix: str, secret: str | None = None) -> str:
        """A URI for ``pyarrow.fs.FileSystem.from_uri``, through the proxy."""
        quoted = urllib.parse.quote(secret or self.secret, safe="")
        return (
            f"s3://{self.key}:{quoted}@{bucket}/{prefix}"
            f"?endpoint_override=127.0.0.1:{self.proxy.port}&scheme=http&region={REGION}"
        )

    def filesystem(self, attempts: int = 3) -> object:
        """pyarrow's S3 filesystem through the proxy, trying each request
        ``attempts`` times (1: an endpoint that is down fails at once)."""
        import pyarrow.fs as pafs

        return pafs.S3FileSystem(
            access_key=self.key,
            secret_key=self.secret,
            endpoint_override=f"127.0.0.1:{self.proxy.port}",
            scheme="http",
            region=REGION,
            retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=attempts),
        )

    def stop(self) -> None:
        self.proxy.down()
        self.process.terminate()
        self.process.wait(30)
        self._log.close()


@contextlib.contextmanager
def s3_server(log_dir: Path) -> Iterator[S3Server]:
    server = S3Server(log_dir)
    try:
        yield server
    finally:
        server.stop()


def bucket_server(log_dir: Path, bucket: str) -> Iterator[S3Server]:
    """The body of a module's ``s3`` fixture: a server holding ``bucket``."""
    with s3_server(log_dir) as server:
        server.create_bucket(bucket)
        yield server
