"""``air-transfer clean``'s walk on the storage node (``storage.server.leftovers``),
without Ray: real writers (one killed mid-publish, one alive), real lock files; what
is proven dead goes, what is alive or recent stays, nothing of the user's is touched,
and a dry run changes nothing."""

from __future__ import annotations

import os
from pathlib import Path

from air_transfer.storage.server.leftovers import clean_tree
from tests.support.writer_child import old_files
from tests.support.writer_procs import Child, put_files

N = 50  # files in each checkpoint the writers merge into


def snapshot(top: Path) -> dict[str, bytes | None]:
    """Every path under ``top`` (not following symlinks) and each file's bytes."""
    found: dict[str, bytes | None] = {}
    for parent, dirs, files in os.walk(top):
        for name in dirs:
            found[os.path.relpath(os.path.join(parent, name), top)] = None
        for name in files:
            path = os.path.join(parent, name)
            found[os.path.relpath(path, top)] = Path(path).read_bytes()
    return found


def user_view(tree: dict[str, bytes | None]) -> dict[str, bytes | None]:
    return {p: v for p, v in tree.items() if ".air-" not in p}


def make_leftovers(tmp_path: Path) -> tuple[Path, Child]:
    """A storage root ``root`` whose run ``exp`` holds the staging of a writer killed
    mid-publish and of one still writing (returned: kill it when done), a publish
    lock nobody holds (each writer holds one too), an upload file, a delete's trash
    and a set-aside; and a symlink to a directory outside the root holding a dead
    writer's staging too."""
    root, exp = tmp_path / "root", tmp_path / "root" / "exp"
    for name in ("checkpoint_1", "checkpoint_2"):
        put_files(exp / name, old_files(N))
    dead = Child("merge", str(exp / "checkpoint_1"), str(N), "--pause", "before-swap")
    live = Child("merge", str(exp / "checkpoint_2"), str(N), "--pause", "before-swap")
    dead.wait_for("ready")
    live.wait_for("ready")
    dead.kill()
    (exp / ".checkpoint_3.air-lock").touch()
    (exp / "checkpoint_1" / ".d00.air-upload-0123abcd").write_bytes(b"u" * 300)
    trash = exp / ".checkpoint_0.air-trash-4567ef"
    (trash / "sub").mkdir(parents=True)
    (trash / "sub" / "shard").write_bytes(b"t" * 700)
    (exp / ".checkpoint_4.air-old-3-cccccccccccccccc").mkdir()
    outside = tmp_path / "outside"
    (outside / ".x.air-staging-9-dddddddddddddddd").mkdir(parents=True)
    (root / "link").symlink_to(outside)
    return root, live


def by_kind(found: list[object]) -> dict[str, list[str]]:
    kinds: dict[str, list[str]] = {}
    for leftover in found:
        kinds.setdefault(leftover.kind, []).append(leftover.action)  # type: ignore[attr-defined]
    return {kind: sorted(actions) for kind, actions in sorted(kinds.items())}


def test_a_dry_run_judges_every_leftover_and_changes_nothing(tmp_path: Path) -> None:
    root, live = make_leftovers(tmp_path)
    try:
        before = snapshot(tmp_path)
        found = clean_tree(str(root), dry_run=True)
        assert snapshot(tmp_path) == before
    finally:
        live.kill()
    assert by_kind(found) == {
        # the killed writer's and the untouched one; the live writer's is held
        "publish-lock": ["kept: its writer is alive", "would remove", "would remove"],
        "set-aside": ["kept: a swap left half done; its target's next write settles it"],
        "staging": ["kept: its writer is alive", "would remove"],
        "staging-lock": ["kept: its writer is alive", "would remove"],
        "trash": ["would remove"],
        "upload": [found[[f.kind for f in found].index("upload")].action],
    }
    assert found[[f.kind for f in found].index("upload")].action.startswith("kept: written to")
    assert all(not f.path.startswith("link") for f in found)  # the symlink is not followed
    trash = next(f for f in found if f.kind == "trash")
    assert (trash.path, trash.nbytes) == ("exp/.checkpoint_0.air-trash-4567ef", 700)


def test_clean_removes_what_is_proven_dead_and_keeps_the_rest(tmp_path: Path) -> None:
    """The killed writer's staging and lock file, the free publish lock, the trash
    and (past its age) the upload go; the live writer's staging and lock, the
    set-aside, the user's files and everything outside the root stay."""
    root, live = make_leftovers(tmp_path)
    try:
        before = snapshot(tmp_path)
        first = clean_tree(str(root), upload_age_s=3600)
        second = clean_tree(str(root), upload_age_s=0)
        third = clean_tree(str(root), upload_age_s=0)
        after = snapshot(tmp_path)
    finally:
        live.kill()
    assert user_view(after) == user_view(before)  # byte for byte
    assert by_kind(first)["upload"][0].startswith("kept: written to")
    assert by_kind(second)["upload"] == ["removed"]
    assert third == [f for f in second if f.action.startswith("kept")]  # nothing else found
    removed = next(f for f in first if f.kind == "staging" and f.action == "removed")
    assert removed.path.startswith("exp/.checkpoint_1.air-staging-") and removed.nbytes > 0
    hidden_before = {p for p in before if p.count("/") == 2 and p.startswith("root/exp/.")}
    hidden_after = {p for p in after if p.count("/") == 2 and p.startswith("root/exp/.")}
    assert hidden_after == {
        p
        for p in hidden_before
        if p.startswith(("root/exp/.checkpoint_2.", "root/exp/.checkpoint_4."))
    }  # the live writer's staging, its lock file and its publish lock; the set-aside
    assert len(hidden_after) == 4 and len(hidden_before) == 9
    assert "root/exp/checkpoint_1/.d00.air-upload-0123abcd" not in after
    assert "outside/.x.air-staging-9-dddddddddddddddd" in after
