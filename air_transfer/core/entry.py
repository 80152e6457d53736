"""One entry of a manifest: a directory, regular file or symlink, as plain data."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from air_transfer.errors import ManifestError

EntryKind = Literal["dir", "file", "symlink"]
KINDS = ("dir", "file", "symlink")


@dataclass(frozen=True)
class Entry:
    """One directory, regular file or symlink of the checkpoint.

    ``path`` is relative and POSIX (``sub/model.bin``); ``size`` is the byte count of
    a file (0 otherwise); ``mode`` the permission bits; ``target`` a symlink's text.
    """

    path: str
    kind: EntryKind
    size: int = 0
    mode: int = 0o644
    mtime_ns: int = 0
    target: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """This entry as plain data (``from_dict`` reads it back)."""
        d: dict[str, Any] = dict(vars(self))  # the fields, in order
        if self.target is None:
            del d["target"]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Entry:
        """The entry ``to_dict`` wrote; ManifestError for an unknown key or kind, or a
        field of the wrong type."""
        if not isinstance(d, Mapping):
            raise ManifestError(f"manifest entry must be a mapping, got {d!r}")
        unknown = set(d) - {"path", "kind", "size", "mode", "mtime_ns", "target"}
        if unknown:
            raise ManifestError(
                f"manifest entry {d.get('path')!r} has unknown fields {sorted(unknown)}"
            )
        try:
            return cls(
                path=d["path"],
                kind=d["kind"],
                size=d.get("size", 0),
                mode=d.get("mode", 0o644),
                mtime_ns=d.get("mtime_ns", 0),
                target=d.get("target"),
            )
        except KeyError as e:
            raise ManifestError(f"manifest entry {dict(d)!r} lacks field {e}") from e
