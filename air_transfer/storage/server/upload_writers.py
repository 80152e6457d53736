"""Node storage, the storage-node side: who writes each upload in progress, so that
the staging file of a writer that died is removed.

A writer removes its upload's staging file when a write fails or it drops the
stream; one killed mid-upload (a torch DCP rank, a Ray Train worker) cannot, and its
hidden file would stay until its directory is deleted. So an upload begun by a known
writer is noted with it (``begin``) until its commit or abort (``end``); while any is
noted, a daemon thread asks every ``period_s`` which of their writers are dead
(``dead``: in the agent, by the lock each writer holds on its own node,
``cluster.liveness``) and discards their uploads (``discard``). A writer that cannot
be judged now (its node's agent does not answer) keeps its uploads until it can be.
Plain Python.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from air_transfer.core.threads import Periodic

logger = logging.getLogger(__name__)
W = TypeVar("W", bound=Hashable)


class UploadWriters(Generic[W]):
    """The uploads in progress by writer; those of dead writers discarded."""

    def __init__(
        self,
        dead: Callable[[set[W]], set[W]],
        discard: Callable[[str, str], None],
        period_s: float,
    ) -> None:
        self._dead, self._discard = dead, discard
        self._lock = threading.Lock()
        self._uploads: dict[str, tuple[str, W]] = {}  # staging -> (root, writer)
        self._reaper = Periodic("air-transfer-upload-reaper", lambda: period_s, self._reap_logged)
        self.reaped = 0  # uploads discarded because their writer died

    def begin(self, root: str, staging: str, writer: W | None) -> None:
        """Note the upload staged at ``staging`` (under ``root``) as ``writer``'s
        (None: a writer nobody can judge; nothing is noted)."""
        if writer is None:
            return
        with self._lock:
            self._uploads[staging] = (root, writer)
            self._reaper.start()

    def end(self, staging: str) -> None:
        """The upload at ``staging`` is committed or aborted."""
        with self._lock:
            self._uploads.pop(staging, None)

    def writing(self) -> int:
        """Uploads noted now."""
        with self._lock:
            return len(self._uploads)

    def reap(self) -> list[str]:
        """Discard the uploads whose writer is dead; the staging files discarded."""
        with self._lock:
            noted = dict(self._uploads)
        if not noted:
            return []
        dead = self._dead({writer for _, writer in noted.values()})
        gone = [staging for staging, (_, writer) in noted.items() if writer in dead]
        for staging in gone:
            root, _ = noted[staging]
            try:
                self._discard(root, staging)
            except FileNotFoundError:
                pass  # its directory was deleted, and the file with it
            except OSError as e:  # tried again at the next round
                logger.warning("could not remove %s, left by a writer that died: %s", staging, e)
                continue
            self.end(staging)
            self.reaped += 1
        return gone

    def _reap_logged(self) -> None:
        try:
            self.reap()
        except Exception as e:  # a bug or an unreachable cluster: try again later
            logger.warning("air-transfer: reaping dead writers' uploads failed: %s", e)
