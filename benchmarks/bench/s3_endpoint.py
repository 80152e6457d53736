"""An S3 endpoint for ``bench --tiered``: moto's standalone server in a process of its
own on this machine (``pip install 'moto[server]'``: not in the bench extra, which
keeps the main job's install small), reached through pyarrow's ``S3FileSystem``."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from types import TracebackType
from typing import Any

REGION = "us-east-1"
KEY = SECRET = "bench"


class S3Endpoint:
    def __init__(self, log_dir: str) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        self._log = open(os.path.join(log_dir, "moto-server.log"), "wb")
        moto = os.path.join(os.path.dirname(sys.executable), "moto_server")
        if not os.path.exists(moto):
            raise SystemExit("bench --tiered runs moto's S3 server: pip install 'moto[server]'")
        self.process = subprocess.Popen(
            [moto, "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while not self._answers():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"moto's S3 server did not start (see {self._log.name})")
            time.sleep(0.1)

    def _answers(self) -> bool:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{self.port}/moto-api/", timeout=2)
        except OSError:
            return False
        return True

    def filesystem(self) -> Any:
        import pyarrow.fs as pafs

        return pafs.S3FileSystem(
            access_key=KEY,
            secret_key=SECRET,
            endpoint_override=f"127.0.0.1:{self.port}",
            scheme="http",
            region=REGION,
        )

    def create_bucket(self, name: str) -> None:
        import pyarrow.fs as pafs

        pafs.S3FileSystem(
            access_key=KEY,
            secret_key=SECRET,
            endpoint_override=f"127.0.0.1:{self.port}",
            scheme="http",
            region=REGION,
            allow_bucket_creation=True,
        ).create_dir(name)

    def __enter__(self) -> S3Endpoint:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.process.terminate()
        self.process.wait(30)
        self._log.close()
