"""The few exceptions air-transfer raises, each a subclass of the built-in a caller
would already catch (fsspec's ``exceptions.py`` is the model: small, built-in bases).

Every message names the path, chunk, size or limit involved and says what to do.
"""

from __future__ import annotations

import os


class ManifestError(ValueError):
    """A manifest (or the directory it was made from) cannot be trusted or reproduced:
    an unsafe path, an inconsistent size, an unknown schema, a link leaving the tree."""


class ChecksumError(OSError):
    """A chunk's bytes do not match the checksum recorded when it was packed; the
    target is not published."""


class CodecError(ValueError):
    """An encoded chunk cannot be decoded into the bytes that were encoded: truncated,
    a damaged header or payload (its checksum fails), a format version this release
    does not read, or a length other than the file's record says; or a codec name no
    codec is registered under. Never wrong bytes returned silently."""


class SourceChangedError(OSError):
    """A source file changed (size, times, inode or link count) between the directory
    scan and the end of the read of its bytes, or vanished, so the packed checkpoint
    would not be the one that was described; the errno is EAGAIN (ENOENT if it
    vanished) and ``filename`` names the file (or the checkpoint directory)."""


class CheckpointLostError(RuntimeError):
    """A chunk of a transferred checkpoint can no longer be fetched because its owner
    died or it was freed; the message names the owner and how to keep it alive."""


def error_at(e: OSError, path: str, doing: str = "") -> OSError:
    """``e`` again, naming ``path`` and what was being done: a call on a descriptor (a
    write, a ``*at`` call relative to a directory) names no path, or only its last
    component. The errno is kept, and with it the subclass (ENOSPC, ENOENT...)."""
    detail = f" ({doing})" if doing else ""
    return OSError(e.errno, f"{e.strerror or os.strerror(e.errno or 0)}{detail}", path)
