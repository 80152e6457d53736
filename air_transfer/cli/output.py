"""What the commands print: a table for people (sizes and ages in units one reads at
a glance) and JSON for scripts (exact bytes, seconds, nanosecond times), with the
secret of every URI that carries one hidden (``redact``). Plain Python.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Sequence
from typing import Any, TextIO

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
#: A URI's user and secret (``s3://KEY:SECRET@bucket/...``): the secret runs to the
#: last ``@`` before a space (a secret may hold ``/``, ``:`` or ``@`` unencoded).
_SECRET = re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.-]*://[^/\s:@]*):[^\s]*@")
HIDDEN = "***"


def redact(text: str) -> str:
    """``text`` with the secret of each URI in it hidden: ``s3://KEY:SECRET@bucket``
    reads ``s3://KEY:***@bucket``. Whatever a command prints goes through it: an
    error, a table, a progress bar's label and every string of its JSON."""
    return _SECRET.sub(rf"\1:{HIDDEN}@", text)


def human_bytes(n: int) -> str:
    """``n`` bytes in binary units, three significant figures: ``1.50 GiB``."""
    if n < 1024:
        return f"{n} B"
    value, unit = float(n), 0
    while value >= 1024 and unit < len(_UNITS) - 1:
        value /= 1024
        unit += 1
    digits = 2 if value < 10 else 1 if value < 100 else 0
    return f"{value:.{digits}f} {_UNITS[unit]}"


def human_age(seconds: float) -> str:
    """An age, rounded down to its largest unit: ``45 s``, ``12 min``, ``3 h``, ``2 d``."""
    seconds = max(0.0, seconds)
    for size, unit in ((86400, "d"), (3600, "h"), (60, "min")):
        if seconds >= size:
            return f"{int(seconds // size)} {unit}"
    return f"{int(seconds)} s"


def table(
    headers: Sequence[str], rows: Sequence[Sequence[object]], right: Sequence[str] = ()
) -> str:
    """``rows`` under ``headers`` in columns two spaces apart; the columns named in
    ``right`` (sizes, counts) right-aligned; None shows as ``-``."""
    cells = [[str(h) for h in headers], *[[_cell(v) for v in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    aligned = [h in right for h in headers]
    lines = []
    for row in cells:
        parts = [
            cell.rjust(width) if align else cell.ljust(width)
            for cell, width, align in zip(row, widths, aligned, strict=True)
        ]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def emit_json(document: Any, out: TextIO | None = None) -> None:
    """``document`` as one JSON document on stdout (keys sorted: stable to diff), every
    string in it redacted (``redact``)."""
    json.dump(_redacted(document), out or sys.stdout, indent=2, sort_keys=True)
    (out or sys.stdout).write("\n")


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def _redacted(value: Any) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {redact(str(k)): _redacted(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_redacted(v) for v in value]
    return value
