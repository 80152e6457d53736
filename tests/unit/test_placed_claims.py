"""The replica registry's claims on placed blobs (``placed_claims``): one repair of a
blob at a time; a claim whose owner is dead is taken by the next that asks; one
given back is free; claims are saved and known to a registry started again."""

from __future__ import annotations

from air_transfer.storage.replica_wire import Owner
from air_transfer.storage.server.placed_claims import PlacedClaims

A, B = Owner("worker-a", "node-1"), Owner("worker-b", "node-2")


class DictStore:
    def __init__(self) -> None:
        self.saved: dict[str, bytes] = {}

    def save(self, name: str, value: bytes) -> None:
        self.saved[name] = value

    def delete(self, name: str) -> None:
        self.saved.pop(name, None)

    def load_all(self) -> dict[str, bytes]:
        return dict(self.saved)


def test_one_claim_holds_a_blob_until_given_back() -> None:
    dead: set[Owner] = set()
    claims = PlacedClaims(lambda o: o not in dead)
    assert claims.claim("k", "blob", "c1", A)
    assert claims.claim("k", "blob", "c1", A)  # asked again: still its own
    assert not claims.claim("k", "blob", "c2", B)
    assert not claims.claim("k", "blob", "c3", A)  # the same process, another repair
    assert claims.state("k", "blob") == ("c1", 2)
    assert claims.claim("k", "other", "c2", B)  # another blob is another claim
    assert claims.claim("k2", "blob", "c4", B)  # as is another storage's
    claims.release("k", "blob", "c2")  # not its own: nothing
    assert claims.state("k", "blob")[0] == "c1"
    claims.release("k", "blob", "c1")
    assert claims.claim("k", "blob", "c2", B)
    assert claims.state("k", "blob") == ("c2", 1)  # c3 still asks


def test_a_dead_owners_claim_is_taken_by_the_next() -> None:
    dead: set[Owner] = set()
    claims = PlacedClaims(lambda o: o not in dead)
    assert claims.claim("k", "blob", "c1", A)
    assert not claims.claim("k", "blob", "c2", B)
    dead.add(A)
    assert claims.claim("k", "blob", "c2", B)
    assert not claims.claim("k", "blob", "c3", Owner("worker-c", "node-1"))
    claims.release("k", "blob", "c1")  # the dead one's late release frees nothing
    assert claims.state("k", "blob")[0] == "c2"


def test_claims_are_saved_and_loaded_again() -> None:
    store = DictStore()
    first = PlacedClaims(lambda o: True, store)
    assert first.claim("k", "blob", "c1", A)
    assert first.claim("k", "gone", "c2", A)
    first.release("k", "gone", "c2")
    again = PlacedClaims(lambda o: True, store)
    assert not again.claim("k", "blob", "c3", B)
    assert again.claim("k", "gone", "c3", B)
    again.release("k", "blob", "c1")
    assert again.claim("k", "blob", "c4", B)
