"""Where the durable tier is: a pyarrow filesystem and a base path in it, from a URI
that ``pyarrow.fs.FileSystem.from_uri`` accepts or a ``(filesystem, path)`` pair.

A path ``root/p`` of node storage is ``base/p`` there. The tier also keeps its own
records under ``base/.air-transfer/`` (``records``), out of the way of anything that
reads the checkpoints with plain pyarrow or Ray (which see hidden names as files, so
nothing of ours sits inside a checkpoint directory).

Secrets: a URI's ``user:secret@`` part is never shown (``uri`` is redacted, and so is
every message naming what was given), and what is saved for an agent that starts
again (``persistable``) holds no credential: it finds them where pyarrow and boto3
look (the environment, a credentials file, an instance role), or waits for its next
caller to attach the tier again.
"""

from __future__ import annotations

import logging
import posixpath
import uuid
from dataclasses import dataclass, field
from typing import Any

import pyarrow.fs as pafs

from air_transfer.config import redacted
from air_transfer.core.confine import storage_path

#: The tier's own records, under its base: never a path of node storage.
META_DIR = ".air-transfer"
#: The mark of a file staged under a temporary name (filesystems whose writes are
#: not atomic): ``.<name>.air-durable-<id>``, moved to ``<name>`` once whole.
STAGED_MARK = ".air-durable-"
#: Filesystem types whose saved form may hold a credential, and its fields.
_SECRET_FIELDS = {
    "s3": ("access_key", "secret_key", "session_token"),
    "gcs": ("access_token", "credential_token_expiration"),
}
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DurableTarget:
    """The durable tier: ``filesystem`` at ``base`` (no trailing slash), named
    ``uri`` in messages (never with a secret). Picklable (pyarrow's filesystems are),
    so it travels with the storage filesystem to every process that uses it."""

    filesystem: pafs.FileSystem = field(compare=False, repr=False)
    base: str
    uri: str

    @classmethod
    def parse(cls, value: object) -> DurableTarget:
        """A ``DurableTarget`` from a URI or a ``(pyarrow.fs.FileSystem, path)``
        pair; ValueError naming what is wrong with it."""
        if isinstance(value, DurableTarget):
            return value
        if isinstance(value, str):
            shown = redacted(value)
            try:
                fs, path = pafs.FileSystem.from_uri(value)
            except (ValueError, TypeError, OSError) as e:
                raise ValueError(
                    f"durable={shown!r} is not a URI pyarrow.fs.FileSystem.from_uri "
                    f"accepts (s3://bucket/prefix?endpoint_override=..., gs://..., "
                    f"file:///mnt/nfs/..., hdfs://...): {redacted(str(e), value)}"
                ) from None
            return cls(fs, _base(path, shown), shown)
        if (
            isinstance(value, tuple)
            and len(value) == 2
            and isinstance(value[0], pafs.FileSystem)
            and isinstance(value[1], str)
        ):
            fs, path = value
            name = f"{fs.type_name}:{path}"
            return cls(fs, _base(path, name), name)
        raise TypeError(
            "durable must be a URI (str) or a (pyarrow.fs.FileSystem, path) pair, "
            f"got {type(value).__name__}"
        )

    def path(self, rel: str) -> str:
        """The tier's path of node storage's relative path ``rel`` ("" = the base)."""
        return f"{self.base}/{rel}" if rel else self.base

    def rel(self, path: str) -> str:
        """The relative path of the tier's ``path`` (under the base)."""
        if path == self.base:
            return ""
        prefix = self.base + "/"
        if not path.startswith(prefix):
            raise ValueError(f"{path!r} is not under the durable tier's base {self.base!r}")
        return path[len(prefix) :]

    def persistable(self) -> DurableTarget | None:
        """This tier with no credential in its filesystem (for a record others can
        read), or None where that cannot be made (a filesystem of unknown kind)."""
        fs = self.filesystem
        kind = str(fs.type_name)
        if kind in ("local", "hdfs"):
            return self
        fields = _SECRET_FIELDS.get(kind)
        if fields is None:
            return None
        rebuild, (kwargs,) = fs.__reduce__()
        clean: dict[str, Any] = dict(kwargs)
        for name in fields:
            if name in clean:
                clean[name] = None if name == "credential_token_expiration" else ""
        return DurableTarget(rebuild(clean), self.base, self.uri)

    def check(self) -> None:
        """Raise ValueError where the tier cannot be used: a bucket (or the base's
        parent on a filesystem) that does not exist, or a base that is a file. An
        endpoint that does not answer or refuses (credentials) is logged, not raised:
        the agents that drain may reach it where this process cannot, and the drain
        retries."""
        fs = self.filesystem
        object_store = str(fs.type_name) in ("s3", "gcs")
        top = self.base.split("/", 1)[0] if object_store else None
        probe = [top] if top else [posixpath.dirname(self.base) or "/"]
        try:
            infos = fs.get_file_info([*probe, self.base])
        except OSError as e:  # unreachable, or refused: credentials may differ there
            logger.warning(
                "air-transfer: could not check the durable tier %s now (%s); its drain "
                "retries in the background, and reports land in node storage meanwhile",
                self.uri, e,
            )  # fmt: skip
            return
        if infos[0].type == pafs.FileType.NotFound:
            what = f"bucket {top!r}" if top else f"directory {probe[0]!r}"
            raise ValueError(f"the durable tier {self.uri}: its {what} does not exist")
        if infos[1].type == pafs.FileType.File:
            raise ValueError(f"the durable tier {self.uri}: {self.base!r} is a file")


def relative(root: str, path: str) -> str:
    """Node storage's ``path`` (confined to ``root``) relative to the root: its path
    in the durable tier under the base ("" for the root itself)."""
    top, full = storage_path(root, ""), storage_path(root, path)
    return full[len(top) :].lstrip("/")


def is_staged(name: str) -> bool:
    """Whether ``name`` is a staged upload's temporary name (never a stored file)."""
    return name.startswith(".") and STAGED_MARK in name


def staged_name(name: str) -> str:
    """A fresh temporary name beside ``name`` for a file written whole."""
    return f".{name}{STAGED_MARK}{uuid.uuid4().hex}"


def _base(path: str, what: str) -> str:
    base = path.rstrip("/")
    if not base or base in (".", "/"):
        raise ValueError(
            f"durable={what}: give a prefix or directory for the checkpoints (e.g. "
            "s3://bucket/runs), not the root of the filesystem"
        )
    return base
