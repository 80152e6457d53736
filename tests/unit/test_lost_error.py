"""What ``CheckpointLostError`` tells a reader (no Ray started): the process to blame.
A chunk whose owner exited says to keep the owner alive or pack with
``owner="node"``; a chunk whose packing agent died (Ray's ``RayActorError``) says so,
and does not blame the owner, which is alive."""

from __future__ import annotations

from ray.exceptions import ActorDiedError, OwnerDiedError

from air_transfer.transfer.handle import lost_error


def test_a_dead_packing_agent_is_named_not_the_owner() -> None:
    message = str(lost_error(None, "chunk 3", ActorDiedError()))
    assert "agent that was packing it died" in message and "transfer it again" in message
    assert "exited or the object was freed" not in message


def test_a_dead_owner_is_named_with_how_to_keep_it_alive() -> None:
    message = str(lost_error(None, "chunk 3", OwnerDiedError("ab" * 28, None, "")))
    assert "exited or the object was freed (OwnerDiedError)" in message
    assert "owner='node'" in message and "agent that was packing" not in message
