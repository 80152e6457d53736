"""Fan-out of a checkpoint directory's transfer (``storage.server.directory_transfers``)
without Ray: a reader that asks while a reader on another node reads the transfer
gets one relay of it, made on the earliest such reader's node; a reader on that node
gets the transfer itself; the relay goes with the transfer's last reader, and one
on a node gone is made again on a node alive. A ``streamed`` transfer's relay (a
feed) is made for the first reader, on its node, and read by that node's readers
too; a reader on the storage node itself reads the transfer, and no relay is made
there."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from air_transfer.config import TransferConfig
from air_transfer.core.scan import Source
from air_transfer.storage.server import directory_transfers
from air_transfer.storage.server.directory_transfers import DirectoryTransfers
from air_transfer.transfer.fanout import Relayed

CHUNK = 1024
CONFIG = TransferConfig(cache_bytes=CHUNK)


class Starts:
    """Starts a directory transfer as the agent would, recording how many."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, source: Source, config: TransferConfig) -> tuple[Any, Any]:
        self.count += 1
        return f"transfer {self.count}", None


class Relays:
    """Makes a relay as the agent would (``transfer.fanout.relay``), recording where:
    of copies, for readers on other nodes (none for a reader alone), or, ``streamed``,
    a feed its own node's readers read too (made for the first reader)."""

    def __init__(self, streamed: bool = False) -> None:
        self.made: list[tuple[str, str]] = []
        self.streamed = streamed

    def __call__(self, checkpoint: Any, node: str, alone: bool) -> Relayed | None:
        if alone and not self.streamed:
            return None
        self.made.append((checkpoint, node))
        return Relayed(f"relay of {checkpoint} on {node}", for_its_node=self.streamed)


@pytest.fixture
def root(tmp_path: Path) -> str:
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "model.bin").write_bytes(os.urandom(5 * CHUNK))
    return str(tmp_path)


def test_readers_on_other_nodes_share_one_relay_made_on_the_first_readers_node(
    root: str,
) -> None:
    relays, live = Relays(), {"a", "b", "c", "d"}
    transfers = DirectoryTransfers(Starts(), None, relays, lambda: live)
    first = transfers.ref(root, "ckpt", CONFIG, "a")
    same_node = transfers.ref(root, "ckpt", CONFIG, "a")
    assert first[0] == same_node[0] == "transfer 1" and not first[2] and not same_node[2]
    assert relays.made == []  # every reader so far on one node: nothing to relay
    others = [transfers.ref(root, "ckpt", CONFIG, n) for n in ("b", "c", "d", "b")]
    assert relays.made == [("transfer 1", "a")]
    assert {r[0] for r in others} == {"relay of transfer 1 on a"} and all(r[2] for r in others)
    assert transfers.ref(root, "ckpt", CONFIG, "a")[0] == "transfer 1"  # the relay's node
    assert transfers.ref(root, "ckpt", CONFIG)[0] == "transfer 1"  # no node said: never
    assert transfers.relays == 1


def test_the_relay_goes_with_the_last_reader(root: str) -> None:
    relays, live, config = Relays(), {"a", "b", "c", "d"}, CONFIG.replace(cache_bytes=8 * CHUNK)
    transfers = DirectoryTransfers(Starts(), 8 * CHUNK, relays, lambda: live)
    _, a, _ = transfers.ref(root, "ckpt", config, "a")
    _, b, relayed = transfers.ref(root, "ckpt", config, "b")
    assert relayed
    transfers.release(a)  # b still reads the relay: it stays, made on a's node
    ref, c, _ = transfers.ref(root, "ckpt", config, "c")
    assert ref == "relay of transfer 1 on a"
    transfers.release(b)
    transfers.release(c)
    # The transfer is kept (within the budget), its relay is not: a reader alone
    # reads the transfer, and the next on another node gets a relay made anew.
    assert transfers.ref(root, "ckpt", config, "c")[:3:2] == ("transfer 1", False)
    assert transfers.ref(root, "ckpt", config, "d")[0] == "relay of transfer 1 on c"
    assert relays.made == [("transfer 1", "a"), ("transfer 1", "c")]


def test_a_relay_on_a_node_gone_is_made_again_on_a_live_readers_node(root: str) -> None:
    relays, live = Relays(), {"a", "b", "c"}
    transfers = DirectoryTransfers(Starts(), None, relays, lambda: live)
    transfers.ref(root, "ckpt", CONFIG, "a")
    transfers.ref(root, "ckpt", CONFIG, "b")
    live.discard("a")
    ref, _, relayed = transfers.ref(root, "ckpt", CONFIG, "c")
    assert relays.made == [("transfer 1", "a"), ("transfer 1", "b")]
    assert ref == "relay of transfer 1 on b" and relayed


def test_a_transfer_that_cannot_be_relayed_is_read_itself(root: str) -> None:
    transfers = DirectoryTransfers(
        Starts(), None, lambda ref, node, alone: None, lambda: {"a", "b"}
    )
    transfers.ref(root, "ckpt", CONFIG, "a")
    assert transfers.ref(root, "ckpt", CONFIG, "b")[:3:2] == ("transfer 1", False)
    assert transfers.relays == 0


def test_the_relay_of_readers_taken_for_dead_goes_with_their_leases(
    root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [1000.0]
    monkeypatch.setattr(directory_transfers.time, "monotonic", lambda: now[0])
    relays, live = Relays(), {"a", "b", "c", "d"}
    transfers = DirectoryTransfers(Starts(), None, relays, lambda: live)
    transfers.ref(root, "ckpt", CONFIG, "a")  # neither ever lets go
    assert transfers.ref(root, "ckpt", CONFIG, "b")[2]
    now[0] += directory_transfers.KNOBS.read_lease_s
    assert transfers.ref(root, "ckpt", CONFIG, "c")[:3:2] == ("transfer 2", False)
    assert transfers.ref(root, "ckpt", CONFIG, "d")[0] == "relay of transfer 2 on c"


def test_a_streamed_transfers_feed_is_made_for_the_first_reader_and_read_on_its_node(
    root: str,
) -> None:
    """Defect: the relay node's own reader read the ``streamed`` transfer itself, a
    second stream of it from the storage node beside the feed's."""
    relays, live = Relays(streamed=True), {"a", "b", "c"}
    transfers = DirectoryTransfers(Starts(), None, relays, lambda: live, here="s")
    first = transfers.ref(root, "ckpt", CONFIG, "a")
    assert first[0] == "relay of transfer 1 on a" and first[2]
    others = [transfers.ref(root, "ckpt", CONFIG, n)[0] for n in ("a", "b", "c")]
    assert others == ["relay of transfer 1 on a"] * 3
    assert relays.made == [("transfer 1", "a")]


@pytest.mark.parametrize("streamed", [False, True])
def test_a_reader_on_the_storage_node_reads_the_transfer_and_hosts_no_relay(
    root: str, streamed: bool
) -> None:
    """Defect: a reader on the storage node itself was handed the relay on another
    reader's node (its chunks pulled back over the network), and the earliest reader
    there got the relay made on the storage node."""
    relays, live = Relays(streamed), {"s", "a", "b"}
    transfers = DirectoryTransfers(Starts(), None, relays, lambda: live, here="s")
    assert transfers.ref(root, "ckpt", CONFIG, "s")[:3:2] == ("transfer 1", False)
    transfers.ref(root, "ckpt", CONFIG, "a")
    transfers.ref(root, "ckpt", CONFIG, "b")
    assert transfers.ref(root, "ckpt", CONFIG, "s")[:3:2] == ("transfer 1", False)
    assert [node for _, node in relays.made] == ["a"]
