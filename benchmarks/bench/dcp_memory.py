"""``bench --dcp``'s load memory: how much private memory a rank's load takes at its
peak. ``RssAnon`` (``/proc/self/status``: the process's resident anonymous pages,
not the object store's shared ones nor the page cache) has no peak field, so a
thread samples it every ``EVERY_S`` during the load; the figure is the highest
sample's growth over the value just before the load. A peak shorter than a sample
period can be missed; pages the allocator kept from earlier work and reuses do not
count as growth.
"""

from __future__ import annotations

import threading
from types import TracebackType

#: How often the sampler reads ``RssAnon``, in seconds.
EVERY_S = 0.005
STATUS = "/proc/self/status"


def rss_anon() -> int:
    """This process's resident anonymous memory in bytes (Linux)."""
    with open(STATUS, "rb") as f:
        for line in f:
            if line.startswith(b"RssAnon:"):
                return int(line.split()[1]) * 1024  # the kernel says kB
    raise RuntimeError(f"{STATUS} has no RssAnon line")


class PeakPrivateGrowth:
    """``with PeakPrivateGrowth() as m: load(...)``; then ``m.growth``: the peak of
    ``RssAnon`` during the block less its value on entry, in bytes (>= 0)."""

    def __init__(self, every_s: float = EVERY_S) -> None:
        self.every_s = every_s
        self.baseline = 0
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="rss-anon", daemon=True)

    @property
    def growth(self) -> int:
        return max(0, self.peak - self.baseline)

    def __enter__(self) -> PeakPrivateGrowth:
        self.baseline = self.peak = rss_anon()
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_anon())

    def _sample(self) -> None:
        while not self._stop.wait(self.every_s):
            self.peak = max(self.peak, rss_anon())
