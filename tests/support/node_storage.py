"""What the node storage tests share: the config and the file body they use, and
reading or failing through any pyarrow filesystem."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pyarrow.fs as pafs
import pytest
import ray

from air_transfer import TransferConfig, node_agent
from tests.support.checkpoints import MiB
from tests.support.cluster import node_ids

CONFIG = TransferConfig(chunk_bytes=MiB, window=3)
BODY = os.urandom(3 * MiB + 12345)  # four chunks, the last one partial


def raises(kind: type[BaseException], op: Callable[[], Any]) -> BaseException:
    """The ``kind`` error that ``op()`` raises (the test fails if it raises none)."""
    with pytest.raises(kind) as info:
        op()
    return info.value


def read(f: pafs.FileSystem, path: str) -> bytes:
    with f.open_input_stream(path) as s:
        return s.read()


def read_counters(node: str) -> dict[str, int]:
    """The node-storage counters of the agent of ``node`` (a custom resource name)."""
    counters: dict[str, int] = ray.get(node_agent(node_ids()[node]).read_counters.remote())
    return counters
