"""Whole objects on S3 through boto3, where pyarrow's S3 output stream falls short: it
uploads fixed 10 MiB parts (so no object over ~98 GiB: S3 takes 10,000 parts,
apache/arrow#40420, #41506), cannot abort a multipart upload (closing it, even from a
destructor, completes it), cannot list the ones a dead process left, and sends one
part at a time.

``S3Whole`` uploads parts sized to the file (at least ``size / max_parts``), several
in flight within a byte budget, each checked by S3 against the CRC32 boto3 sends
with it; the object carries the content digest of what was sent, and a failure
aborts the upload. The client is made from the pyarrow ``S3FileSystem`` the user
gave (its endpoint, region, scheme and credentials, or boto3's default chain where
it names none, as pyarrow's does); it lives in memory only.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow.fs as pafs

from air_transfer.core.threads import pool
from air_transfer.storage.durable.boto_loader import botocore_session

if TYPE_CHECKING:
    from typing_extensions import Buffer  # collections.abc.Buffer from Python 3.12

MiB = 1024 * 1024
#: S3's limits: parts per upload, smallest part but the last, largest single copy.
MAX_PARTS = 10_000
MIN_PART_BYTES = 5 * MiB
MAX_COPY_BYTES = 5 * 1024 * MiB
#: The object metadata key holding the content digest of what was uploaded.
DIGEST_KEY = "air-transfer-digest"
_clients: dict[tuple[Any, ...], Any] = {}
_clients_lock = threading.Lock()


def client_for(fs: pafs.FileSystem) -> Any | None:
    """A boto3 S3 client for pyarrow's ``fs`` (same endpoint, region, credentials);
    None where it cannot be made alike (not S3, an assumed role, a proxy)."""
    if str(fs.type_name) != "s3":
        return None
    kwargs = fs.__reduce__()[1][0]
    if kwargs.get("role_arn") or (kwargs.get("proxy_options") or {}).get("host"):
        return None
    key = tuple(sorted((k, repr(v)) for k, v in kwargs.items()))
    with _clients_lock:
        if key not in _clients:
            _clients[key] = _make_client(kwargs)
        return _clients[key]


def _make_client(kwargs: dict[str, Any]) -> Any:
    import boto3
    import botocore.config
    from botocore import UNSIGNED

    session = boto3.session.Session(
        botocore_session=botocore_session(),
        aws_access_key_id=kwargs.get("access_key") or None,
        aws_secret_access_key=kwargs.get("secret_key") or None,
        aws_session_token=kwargs.get("session_token") or None,
        region_name=kwargs.get("region") or None,
    )
    endpoint = kwargs.get("endpoint_override") or ""
    scheme = kwargs.get("scheme") or "https"
    connect = kwargs.get("connect_timeout", -1)
    read = kwargs.get("request_timeout", -1)
    config = botocore.config.Config(
        retries={"max_attempts": 3, "mode": "standard"},
        connect_timeout=connect if connect and connect > 0 else 10,
        read_timeout=read if read and read > 0 else 120,
        max_pool_connections=64,
        s3={
            "addressing_style": "path"
            if endpoint and not kwargs.get("force_virtual_addressing")
            else "auto"
        },
        signature_version=UNSIGNED if kwargs.get("anonymous") else None,
    )
    url = None
    if endpoint:
        url = endpoint if "://" in endpoint else f"{scheme}://{endpoint}"
    return session.client("s3", endpoint_url=url, config=config)


#: S3 error codes that mean "not allowed" (credentials wrong, missing or expired).
_REFUSED = ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken")


@contextlib.contextmanager
def errors(what: str, path: str) -> Iterator[None]:
    """boto3's errors as the built-in ones pyarrow raises, naming ``what`` was done to
    ``path``: a connection that fails as ConnectionError, refused credentials as
    PermissionError, a missing object as FileNotFoundError, anything else OSError.
    So the drain's retries and a reader's wait treat both libraries alike."""
    from botocore.exceptions import (
        BotoCoreError,
        ClientError,
        HTTPClientError,
        NoCredentialsError,
    )
    from botocore.exceptions import ConnectionError as BotoConnectionError

    try:
        yield
    except ClientError as e:
        code = str(e.response.get("Error", {}).get("Code", ""))
        kind: type[OSError] = OSError
        if code in _REFUSED:
            kind = PermissionError
        elif code in ("404", "NoSuchKey", "NotFound", "NoSuchUpload"):
            kind = FileNotFoundError
        raise kind(f"S3 {what} {path}: {e}") from None
    except (BotoConnectionError, HTTPClientError) as e:
        raise ConnectionError(f"S3 {what} {path}: the endpoint did not answer ({e})") from None
    except NoCredentialsError as e:
        raise PermissionError(f"S3 {what} {path}: {e}") from None
    except BotoCoreError as e:
        raise OSError(f"S3 {what} {path}: {e}") from None


def split(path: str) -> tuple[str, str]:
    """``(bucket, key)`` of a pyarrow S3 path ``bucket/key``."""
    bucket, _, key = path.partition("/")
    return bucket, key


def part_bytes(size: int | None, base: int, max_parts: int = MAX_PARTS) -> int:
    """The part size of an upload of ``size`` bytes (None: unknown, ``base``): at
    least ``base`` and S3's smallest, and large enough that ``max_parts`` parts hold
    the file, rounded up to a MiB."""
    wanted = max(base, MIN_PART_BYTES, -(-(size or 0) // max_parts))
    return -(-wanted // MiB) * MiB


@dataclass(frozen=True)
class Head:
    """An object as S3 answers for it: its size, ETag and our digest (if any)."""

    size: int
    tag: str
    digest: str | None


def head(client: Any, path: str) -> Head | None:
    """The object at ``path``; None if there is none."""
    bucket, key = split(path)
    try:
        with errors("HEAD", path):
            found = client.head_object(Bucket=bucket, Key=key)
    except FileNotFoundError:
        return None
    meta = found.get("Metadata") or {}
    return Head(int(found["ContentLength"]), str(found["ETag"]).strip('"'), meta.get(DIGEST_KEY))


def get(client: Any, path: str) -> bytes | None:
    """The object at ``path`` in one GET (one version of it); None if there is none."""
    bucket, key = split(path)
    try:
        with errors("GET", path):
            found = client.get_object(Bucket=bucket, Key=key)
            body: bytes = found["Body"].read()
    except FileNotFoundError:
        return None
    return body


class PartBudget:
    """At most ``limit`` bytes of parts in flight over every upload of a store (one
    larger part may go alone), and the threads that send them."""

    def __init__(self, limit: int, threads: int) -> None:
        self.limit = limit
        self._held = 0
        self._cond = threading.Condition()
        self.pool: ThreadPoolExecutor = pool("air-transfer-s3-parts", threads)

    def take(self, nbytes: int) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._held == 0 or self._held + nbytes <= self.limit)
            self._held += nbytes

    def give(self, nbytes: int) -> None:
        with self._cond:
            self._held -= nbytes
            self._cond.notify_all()


class S3Whole:
    """One object written whole or not at all: parts of ``part`` bytes sent as they
    fill, ``commit`` completes the upload (one PUT if it never filled a part) and
    returns the object's ETag; ``abort`` (or any failure) aborts it."""

    def __init__(
        self, client: Any, path: str, part: int, budget: PartBudget, digest: str | None
    ) -> None:
        self.client, self.path, self.part, self.budget = client, path, part, budget
        self.bucket, self.key = split(path)
        self._meta = {DIGEST_KEY: digest} if digest else {}
        self._buffer = bytearray()
        self._upload: str | None = None
        self._parts: list[Future[dict[str, Any]]] = []
        self._done = False

    def write(self, data: Buffer) -> None:
        self._buffer += memoryview(data).cast("B")
        while len(self._buffer) >= self.part:
            body = bytes(self._buffer[: self.part])
            del self._buffer[: self.part]
            with errors("upload", self.path):
                self._send(body)

    def _send(self, body: bytes) -> None:
        if self._upload is None:
            made = self.client.create_multipart_upload(
                Bucket=self.bucket, Key=self.key, Metadata=self._meta
            )
            self._upload = str(made["UploadId"])
        number = len(self._parts) + 1
        if number > MAX_PARTS:
            raise OSError(f"{self.path}: more than {MAX_PARTS} parts of {self.part} bytes")
        self._failed()
        self.budget.take(len(body))
        self._parts.append(self.budget.pool.submit(self._part, number, body))

    def _part(self, number: int, body: bytes) -> dict[str, Any]:
        try:
            sent = self.client.upload_part(
                Bucket=self.bucket, Key=self.key, UploadId=self._upload, PartNumber=number,
                Body=body,
            )  # fmt: skip
            return {"PartNumber": number, "ETag": sent["ETag"]}
        finally:
            self.budget.give(len(body))

    def _failed(self) -> None:
        """Raise the error of a part that failed already (do not send more)."""
        for future in self._parts:
            if future.done() and future.exception() is not None:
                future.result()

    def commit(self) -> str:
        try:
            with errors("upload", self.path):
                return self._complete()
        except BaseException:
            self.abort()
            raise

    def _complete(self) -> str:
        if self._upload is None:
            put = self.client.put_object(
                Bucket=self.bucket, Key=self.key, Body=bytes(self._buffer), Metadata=self._meta
            )
            self._done = True
            return str(put["ETag"]).strip('"')
        if self._buffer:
            self._send(bytes(self._buffer))
            self._buffer.clear()
        parts = [future.result() for future in self._parts]
        done = self.client.complete_multipart_upload(
            Bucket=self.bucket, Key=self.key, UploadId=self._upload,
            MultipartUpload={"Parts": parts},
        )  # fmt: skip
        self._done = True
        return str(done["ETag"]).strip('"')

    def abort(self) -> None:
        """Abort the upload (best effort: one left behind is aborted by the next
        drain's ``abort_uploads``)."""
        if self._done:
            return
        self._done = True
        for future in self._parts:
            future.cancel()
        for future in self._parts:
            if not future.cancelled():
                with contextlib.suppress(Exception):  # aborting anyway
                    future.result()
        if self._upload is not None:
            # The endpoint down: the next drain's abort_uploads aborts it.
            with contextlib.suppress(Exception):
                self.client.abort_multipart_upload(
                    Bucket=self.bucket, Key=self.key, UploadId=self._upload
                )


def copy(client: Any, src: str, dst: str, size: int, part: int) -> str:
    """A server-side copy of ``src`` (``size`` bytes) to ``dst`` with its metadata;
    the new object's ETag. Over 5 GiB, a multipart copy of ``part``-byte ranges."""
    with errors(f"copy of {src} to", dst):
        return _copy(client, src, dst, size, part)


def _copy(client: Any, src: str, dst: str, size: int, part: int) -> str:
    bucket, key = split(dst)
    source_bucket, source_key = split(src)
    source = {"Bucket": source_bucket, "Key": source_key}
    if size <= MAX_COPY_BYTES:
        done = client.copy_object(CopySource=source, Bucket=bucket, Key=key)
        return str(done["CopyObjectResult"]["ETag"]).strip('"')
    found = head(client, src)
    meta = {DIGEST_KEY: found.digest} if found is not None and found.digest else {}
    upload = client.create_multipart_upload(Bucket=bucket, Key=key, Metadata=meta)["UploadId"]
    try:
        parts = []
        for number, offset in enumerate(range(0, size, part), 1):
            last = min(offset + part, size) - 1
            made = client.upload_part_copy(
                Bucket=bucket, Key=key, UploadId=upload, PartNumber=number, CopySource=source,
                CopySourceRange=f"bytes={offset}-{last}",
            )  # fmt: skip
            parts.append({"PartNumber": number, "ETag": made["CopyPartResult"]["ETag"]})
        done = client.complete_multipart_upload(
            Bucket=bucket, Key=key, UploadId=upload, MultipartUpload={"Parts": parts}
        )
        return str(done["ETag"]).strip('"')
    except BaseException:
        with contextlib.suppress(Exception):
            client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload)
        raise


def abort_uploads(client: Any, prefix_path: str) -> int:
    """Abort every multipart upload under ``prefix_path`` (``bucket/prefix``): those
    a drain that died or lost its connection left (S3 bills their parts until a
    lifecycle rule removes them). How many."""
    with errors("abort of the uploads under", prefix_path):
        return _abort_uploads(client, prefix_path)


def _abort_uploads(client: Any, prefix_path: str) -> int:
    bucket, prefix = split(prefix_path)
    aborted = 0
    paginator = client.get_paginator("list_multipart_uploads")
    for page in paginator.paginate(Bucket=bucket, Prefix=prefix.rstrip("/") + "/"):
        for upload in page.get("Uploads", []):
            client.abort_multipart_upload(
                Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"]
            )
            aborted += 1
    return aborted
