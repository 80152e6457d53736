"""Names a checkpoint may hold: safe relative POSIX paths the writer can create on
Linux (no ``..``, NUL or empty segment; NAME_MAX and PATH_MAX in bytes), and the short
rendering of a value that every error message uses."""

from __future__ import annotations

from air_transfer.errors import ManifestError

# What the writer can apply: a value outside these would fail there (ENAMETOOLONG...)
# after bytes were transferred, so decoding refuses it first.
#: A file name's bytes (NAME_MAX).
MAX_NAME_BYTES = 255
#: A path's or a symlink target's bytes (PATH_MAX less its NUL).
MAX_PATH_BYTES = 4095


def under(root: str, relpath: str) -> str:
    """``relpath`` (checked by ``check_relative_path``: no "", ".", "..") joined under
    ``root``, as ``os.path.join`` would, without its checks."""
    return f"{root}/{relpath}"


def check_relative_path(path: object) -> str:
    """Return ``path`` if it is a safe relative POSIX path the writer can create, else
    raise ManifestError.

    Safe means: a non-empty str, not absolute, no NUL, no empty, ``.`` or ``..``
    segment, so joined under any directory it stays under it; and creatable: it encodes
    to file-name bytes (see ``fs_bytes``), no segment is longer than NAME_MAX (255) bytes
    and the whole is at most PATH_MAX - 1 (4095) bytes.
    """
    if not isinstance(path, str) or not path:
        raise ManifestError(f"manifest path {short(path)} must be a non-empty string")
    if path.startswith("/"):
        raise ManifestError(f"manifest path {short(path)} is absolute")
    size = -1
    for name in path.split("/"):
        size += 1 + check_name(path, name)
    check_path_size(path, size)
    return path


def check_name(path: str, name: str) -> int:
    """Check one segment of ``path``; return its length in bytes."""
    if name in ("", ".", ".."):
        raise ManifestError(
            f"manifest path {short(path)} has a {name or 'empty'!r} segment; "
            "only plain relative paths are allowed"
        )
    if "\x00" in name:
        raise ManifestError(f"manifest path {short(path)} contains a NUL byte")
    size = len(name) if name.isascii() else len(fs_bytes(name, f"manifest path {path!r}"))
    if size > MAX_NAME_BYTES:
        raise ManifestError(
            f"manifest path {short(path)} has a segment of {size} bytes, more "
            f"than the {MAX_NAME_BYTES} a file name may have (NAME_MAX)"
        )
    return size


def check_path_size(path: str, size: int) -> None:
    if size > MAX_PATH_BYTES:
        raise ManifestError(
            f"manifest path {short(path)} is {size} bytes long, more than the "
            f"{MAX_PATH_BYTES} a path may have (PATH_MAX)"
        )


def fs_bytes(text: str, what: str) -> bytes:
    """The bytes ``text`` names on disk, as ``os.fsencode`` makes them on Linux (UTF-8,
    undecodable bytes carried as the surrogates U+DC80..U+DCFF that ``os.listdir``
    returns for them, so checkpoints with such names still travel).

    Refused: a lone surrogate no file name decodes to (the writer's ``os.mkdir`` would
    raise UnicodeEncodeError), and escapes of bytes that are valid UTF-8 (``\\udcc3\\udca9``
    would name the same file as ``é``: two entries, one file).
    """
    try:
        raw = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError as e:
        raise ManifestError(
            f"{what} cannot be encoded as a file name: {e.reason} at character {e.start}"
        ) from e
    if raw.decode("utf-8", "surrogateescape") != text:
        raise ManifestError(
            f"{what} escapes bytes that are valid UTF-8, so it would name the same file "
            "as their UTF-8 text; list the decoded name instead"
        )
    return raw


def short(value: object, limit: int = 80) -> str:
    """``repr(value)`` cut to a readable length: a 4 KiB path in a message helps nobody."""
    if isinstance(value, str) and len(value) > limit:
        return f"{value[:limit]!r}... ({len(value)} characters)"
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}..."
