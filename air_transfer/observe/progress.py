"""Progress bars for long transfers: bytes, rate and ETA per checkpoint, the way Ray
Data shows its own (``ray/data/_internal/progress/progress_bar.py`` is the model).

Whether a transfer shows one (``progress_enabled``): ``TransferConfig.progress`` when
set, else the environment variable ``AIR_TRANSFER_PROGRESS`` (``1``/``0``), else
whether this process's stderr is a terminal. The most specific word wins: a call
site's config over the process's environment over the guess, as tqdm's own ``TQDM_*``
variables only change defaults. Ray workers write to log files, not a terminal, so
their bars are off unless the variable (e.g. in a Train run's ``runtime_env``) or the
config turns them on.

Where a bar is drawn: inside a Ray worker (task, actor, Train worker, node agent)
through Ray's ``ray.experimental.tqdm_ray``, which sends the bar's state to the driver
in the worker's log stream (Ray's default ``log_to_driver``) at most once a second; the
driver draws every worker's bars once, each in its own line. Elsewhere (the driver, a
plain process) with ``tqdm`` itself on stderr, in the same format (bytes with decimal
units, as ``tqdm_ray`` draws them).

Cost: a bar is advanced once per chunk (tens of MiB), never per byte, and drawn only
once the transfer has run for ``KNOBS.progress_delay_s``, so a quick transfer prints
nothing; with progress off no bar object exists at all. A bar that cannot be made is
logged at debug level and skipped: a transfer never fails because of its bar.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Protocol

import ray

from air_transfer.core import environ

logger = logging.getLogger(__name__)

#: The environment variable that turns progress bars on (``1``, ``true``, ``yes``,
#: ``on``) or off (``0``, ``false``, ``no``, ``off``) where the config leaves it open.
ENV_VAR = environ.PROGRESS
_ON = ("1", "true", "yes", "on")
_OFF = ("0", "false", "no", "off")
#: A description longer than this is cut (Ray Data cuts its names at 100).
MAX_DESC = 48

_env_warned: set[str] = set()


def progress_enabled(setting: bool | None) -> bool:
    """Whether a transfer shows a bar: ``setting`` (``TransferConfig.progress``) if
    not None, else ``AIR_TRANSFER_PROGRESS`` if set, else whether stderr is a terminal.
    An unrecognised value of the variable is logged once and ignored."""
    if setting is not None:
        return setting
    value = os.environ.get(ENV_VAR, "").strip().lower()
    if value in _ON:
        return True
    if value in _OFF:
        return False
    if value and value not in _env_warned:
        _env_warned.add(value)
        logger.warning(
            "air-transfer: ignoring %s=%r (expected one of %s to turn progress bars on, "
            "%s to turn them off)",
            ENV_VAR,
            value,
            "/".join(_ON),
            "/".join(_OFF),
        )
    try:
        return bool(sys.stderr is not None and sys.stderr.isatty())
    except (AttributeError, ValueError):  # replaced by an object without it, or closed
        return False


class _TqdmLike(Protocol):
    """What both ``tqdm.tqdm`` and ``tqdm_ray.tqdm`` offer and a ``Bar`` uses."""

    def update(self, n: int = 1) -> object: ...

    def close(self) -> None: ...


def in_ray_worker() -> bool:
    """Whether this process is a Ray worker (task or actor), whose output goes to log
    files that Ray forwards to the driver, rather than a driver or plain process."""
    try:
        return bool(
            ray.is_initialized() and ray.get_runtime_context().worker.mode == ray.WORKER_MODE
        )
    except Exception:  # no runtime context: not a worker
        return False


def make_bar(desc: str, total: int | None, initial: int) -> _TqdmLike:
    """A bar of bytes: ``tqdm_ray`` inside a Ray worker, ``tqdm`` elsewhere (raises
    ImportError without tqdm, which ``tqdm_ray`` needs on the driver as well)."""
    if in_ray_worker():
        from ray.experimental import tqdm_ray

        bar: _TqdmLike = tqdm_ray.tqdm(desc=desc, total=total, unit="B")
        if initial:
            bar.update(initial)
        return bar
    from tqdm.auto import tqdm

    return tqdm(  # type: ignore[no-any-return]
        desc=desc,
        total=total,
        initial=initial,
        unit="B",
        unit_scale=True,
        dynamic_ncols=True,
        file=sys.stderr,
    )


class Bar:
    """The progress of one transfer in bytes, drawn once it has run for ``delay``
    seconds (the first ``update`` after that draws it with what came before).

    Not thread-safe: one thread advances a bar."""

    def __init__(self, desc: str, total: int | None, delay: float) -> None:
        self.desc = desc if len(desc) <= MAX_DESC else desc[: MAX_DESC - 3] + "..."
        self.total = total
        self.delay = delay
        self.n = 0
        self._started = time.monotonic()
        self._bar: _TqdmLike | None = None
        self._broken = False

    @property
    def drawn(self) -> bool:
        """Whether the bar has been drawn (it ran longer than ``delay``)."""
        return self._bar is not None

    def update(self, nbytes: int) -> None:
        """``nbytes`` more done (call per chunk, not per byte)."""
        self.n += nbytes
        if self._broken:
            return
        try:
            if self._bar is not None:
                self._bar.update(nbytes)
            elif time.monotonic() - self._started >= self.delay:
                self._bar = make_bar(self.desc, self.total, self.n)
        except Exception as e:
            self._give_up(e)

    def close(self) -> None:
        """Draw the final state and release the bar's line."""
        bar, self._bar = self._bar, None
        if bar is not None:
            try:
                bar.close()
            except Exception as e:
                self._give_up(e)

    def _give_up(self, error: Exception) -> None:
        self._broken, self._bar = True, None
        logger.debug("air-transfer: no progress bar for %r: %r", self.desc, error)
