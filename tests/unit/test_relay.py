"""``transfer.relay.Relays`` (no Ray): the agent's side of a ref whose value the
caller hands over after returning it. Whichever of give and take comes first, the
taker gets the value once; an exception given is raised; a giver that died frees
the taker; nothing stays behind."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from air_transfer.errors import CheckpointLostError
from air_transfer.transfer.relay import Relays


def test_give_before_take_and_take_before_give() -> None:
    relays = Relays()
    relays.give("a", "early")
    assert relays.take("a", os.getpid(), poll_s=0.01) == "early"
    got: list[object] = []
    taker = threading.Thread(target=lambda: got.append(relays.take("b", os.getpid(), poll_s=0.01)))
    taker.start()
    relays.give("b", "late")
    taker.join(timeout=60)
    assert got == ["late"] and relays.waiting() == 0


@pytest.mark.parametrize("run", range(20))
def test_give_racing_take(run: int) -> None:
    """Either order of the two calls (a race, run 20 times) ends the same: the taker
    has the value and no slot is left."""
    relays = Relays()
    got: list[object] = []
    start = threading.Barrier(2)

    def take() -> None:
        start.wait()
        got.append(relays.take("k", os.getpid(), poll_s=0.01))

    def give() -> None:
        start.wait()
        relays.give("k", run)

    threads = [threading.Thread(target=take), threading.Thread(target=give)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert got == [run] and relays.waiting() == 0


def test_an_exception_given_is_raised_to_the_taker() -> None:
    relays = Relays()
    relays.give("k", OSError(5, "submitting failed"))
    with pytest.raises(OSError, match="submitting failed"):
        relays.take("k", os.getpid(), poll_s=0.01)
    assert relays.waiting() == 0


def test_a_giver_that_died_frees_the_taker() -> None:
    """The giver above is this process; here it is one that has exited."""
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)  # fmt: skip
    relays = Relays()
    with pytest.raises(CheckpointLostError, match=rf"process {child.stdout.strip()} exited"):
        relays.take("k", int(child.stdout), poll_s=0.01)
    assert relays.waiting() == 0
