"""The ``air-transfer`` command line without Ray: addresses, the parser, what the
commands print, and that parsing (``--help``) joins no cluster."""

from __future__ import annotations

import importlib
import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from air_transfer.cli.address import NodePath, OtherPath, parse_location, parse_node_path
from air_transfer.cli.listing import render, state_text
from air_transfer.cli.main import build_parser, main
from air_transfer.cli.output import emit_json, human_age, human_bytes, table
from tests.support.procs import REPO_ROOT, child_env

NODE_ID = "ab" * 28


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("node:///mnt/runs/exp", NodePath(None, "/mnt/runs/exp")),
        ("node://head/mnt/runs/", NodePath("head", "/mnt/runs")),
        ("node://10.0.0.5/a/../b", NodePath("10.0.0.5", "/b")),
        ("node://[fe80::1]/a", NodePath("fe80::1", "/a")),
        (f"node://{NODE_ID}/a", NodePath(NODE_ID, "/a")),
        ("/mnt/runs//exp/", NodePath(None, "/mnt/runs/exp")),
    ],
)
def test_node_paths(text: str, expected: NodePath) -> None:
    assert parse_node_path(text) == expected
    if text.startswith("node://"):  # in cp, a plain path is this machine's
        assert parse_location(text) == expected


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("runs/exp", "absolute path"),
        ("node://head", "ABSOLUTE/PATH"),
        ("node://head/", None),
        ("node://mynode/a", "node must be 'head', a Ray node id"),
        ("node://[::1/a", "closed by ']'"),
        ("node://abcd/a", "node must be"),
    ],
)
def test_bad_node_paths_name_the_form(text: str, says: str | None) -> None:
    if says is None:
        assert parse_node_path(text) == NodePath("head", "/")
        return
    with pytest.raises(ValueError, match=says.replace("(", r"\(").replace("[", r"\[")):
        parse_node_path(text)


@pytest.mark.parametrize(
    "name", ["head", NODE_ID, "10.0.0.5", "fe80::1", "mynode", "abcd", NODE_ID.upper(), ""]
)
def test_the_command_line_and_node_take_the_same_node_names(name: str) -> None:
    """``node://NODE/...`` and ``storage_filesystem(node=...)`` check one grammar
    (``core.node_names``); an empty NODE on the command line is the default node."""
    from air_transfer.cluster.nodes import check_node_spec

    def accepts(check: Callable[[str], object], text: str) -> bool:
        try:
            check(text)
        except ValueError:
            return False
        return True

    named = name in ("head", NODE_ID, "10.0.0.5", "fe80::1")
    typed = f"node://[{name}]/a" if ":" in name else f"node://{name}/a"
    assert accepts(parse_node_path, typed) == (named or name == "")
    assert accepts(check_node_spec, name) == named


def test_other_locations() -> None:
    assert parse_location("s3://bucket/runs/exp1") == OtherPath("s3://bucket/runs/exp1")
    assert parse_location("s3://bucket/x").is_uri  # type: ignore[union-attr]
    assert not parse_location("./backup").is_uri  # type: ignore[union-attr]
    with pytest.raises(ValueError):
        parse_location("")


def test_parser_takes_every_command_and_its_options() -> None:
    parser = build_parser()
    args = parser.parse_args(
        ["ls", "/mnt/runs", "--json", "--node", "head", "--durable", "s3://b/r"]
    )
    assert (args.command, args.root, args.json, args.node, args.durable) == (
        "ls", "/mnt/runs", True, "head", "s3://b/r",
    )  # fmt: skip
    args = parser.parse_args(["verify", "/mnt/runs", "exp/checkpoint_1", "--no-progress"])
    assert (args.root, args.path, args.progress, args.address) == (
        "/mnt/runs", "exp/checkpoint_1", False, "auto",
    )  # fmt: skip
    args = parser.parse_args(["cp", "node:///a", "s3://b/a", "--overwrite", "--progress"])
    assert (args.src, args.dst, args.overwrite, args.progress) == (
        "node:///a", "s3://b/a", True, True,
    )  # fmt: skip
    args = parser.parse_args(["clean", "/mnt/runs", "--dry-run", "--upload-age", "60"])
    assert (args.dry_run, args.upload_age) == (True, 60.0)


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["mv", "a", "b"],
        ["verify", "/mnt/runs"],
        ["clean", "/r", "--upload-age", "-1"],
        ["clean", "/r", "--upload-age", "soon"],
        ["clean", "/r", "--upload-age", "nan"],  # was taken, and removed a live upload
        ["clean", "/r", "--upload-age", "inf"],
        ["cp", "a", "b", "--progress", "--no-progress"],
    ],
)
def test_a_bad_command_line_exits_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert "usage: air-transfer" in capsys.readouterr().err


def test_a_bad_path_is_an_error_before_any_connection(capsys: pytest.CaptureFixture[str]) -> None:
    """Exit status 1 and the reason on stderr, with no Ray started."""
    assert main(["ls", "relative/dir", "--address", "127.0.0.1:1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("air-transfer ls: error: 'relative/dir': give the absolute path")


def test_help_joins_no_cluster() -> None:
    """``--help`` is argparse alone: no Ray session is started or joined, and no
    module of Ray Train is imported (each command imports what it needs when run)."""
    code = (
        "import sys\n"
        "from air_transfer.cli.main import main\n"
        "try:\n    main(['ls', '--help'])\nexcept SystemExit as e:\n    assert e.code == 0\n"
        "import ray\n"
        "assert not ray.is_initialized()\n"
        "assert 'ray.train' not in sys.modules, 'Ray Train imported'\n"
        "assert 'air_transfer.cli.session' not in sys.modules\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, env=child_env(), capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "list the checkpoints under ROOT" in done.stdout or "ROOT" in done.stdout


def test_sizes_and_ages_read_at_a_glance() -> None:
    assert [human_bytes(n) for n in (0, 1023, 1024, 1536, 10 * 1024**2, 3 * 1024**3 // 2)] == [
        "0 B", "1023 B", "1.00 KiB", "1.50 KiB", "10.0 MiB", "1.50 GiB",
    ]  # fmt: skip
    assert human_bytes(200 * 1024**4) == "200 TiB"
    assert [human_age(s) for s in (-1, 5.9, 61, 7200, 3 * 86400 + 5)] == [
        "0 s", "5 s", "1 min", "2 h", "3 d",
    ]  # fmt: skip


def test_table_aligns_columns() -> None:
    text = table(["NAME", "SIZE", "OK"], [["a", "1 B", True], ["long-name", "10.0 MiB", None]],
                 right=("SIZE",))  # fmt: skip
    assert text.splitlines() == [
        "NAME           SIZE  OK",
        "a               1 B  yes",
        "long-name  10.0 MiB  -",
    ]


def record(copies: int, durable: bool | None, dcp: bool = False) -> dict[str, object]:
    return {
        "path": "/r/exp/checkpoint_000001", "bytes": 3 * 1024**2, "files": 2, "age_s": 90.0,
        "dcp": dcp, "copies": copies, "durable": durable,
    }  # fmt: skip


def test_ls_states_in_words() -> None:
    states = ((1, None), (2, None), (1, False), (1, True), (0, True))
    assert [state_text(record(copies, durable)) for copies, durable in states] == [
        "local", "on 2 copies", "local, not yet durable", "durable", "durable only",
    ]  # fmt: skip
    lines = render([record(1, None), record(2, None, dcp=True)]).splitlines()
    assert lines[0].split() == ["CHECKPOINT", "SIZE", "FILES", "AGE", "KIND", "STATE"]
    assert lines[1] == "/r/exp/checkpoint_000001  3.00 MiB      2  1 min  files  local"
    assert lines[2] == "/r/exp/checkpoint_000001  3.00 MiB      2  1 min  dcp    on 2 copies"


def test_json_is_one_sorted_document(capsys: pytest.CaptureFixture[str]) -> None:
    emit_json({"b": 1, "a": [record(1, None)]})
    out = capsys.readouterr().out
    assert json.loads(out)["a"][0]["copies"] == 1
    assert out.index('"a"') < out.index('"b"')


def test_the_console_script_is_main() -> None:
    """``pip install air-transfer`` puts ``air-transfer`` on PATH, running ``main``."""
    pyproject = (Path(REPO_ROOT) / "pyproject.toml").read_text()
    [target] = re.findall(r'^air-transfer = "([\w.:]+)"$', pyproject, re.M)
    module, _, name = target.partition(":")
    assert getattr(importlib.import_module(module), name) is main
