"""The report: one result row per contender and size, ratios to ``cp``, linearity,
the text table and the PNG plot (matplotlib is imported only when a plot is asked
for)."""

from __future__ import annotations

import argparse
import math
import statistics
from typing import Any

from air_transfer import TransferConfig
from benchmarks.bench.data import GB
from benchmarks.bench.measure import Measurement
from benchmarks.units import MiB

#: What each field of a contender's result row means (in the JSON's config).
CONTENDER_METRICS = {
    "seconds": "driver wall clock around the whole round trip",
    "call_seconds": "how long the producer's call blocked: to_object_ref (sync, "
    "= pack_s) or to_object_ref_async (returns once packing is submitted)",
    "pack_s": "until the source directory was free again (every chunk packed)",
    "peak_private": "RssAnon high water from /proc/<pid>/status, 20 ms samples; "
    "agent: the producer node's agent, which packs the chunks",
    "object_store": "cluster - available object_store_memory over all nodes, "
    "20 ms samples, minus the value at start (raylets report ~every 100 ms)",
    "size_gb": "decimal GB (10**9 bytes)",
    "cpu_s": "median CPU seconds (user + system, /proc/<pid>/stat) per process over "
    "the trip: producer, consumer, agent, raylet, gcs_server, driver (with its "
    "samplers), other Ray processes, and their total; kernel threads not counted",
}


def run_config(
    opts: argparse.Namespace,
    config: TransferConfig,
    contenders: list[str],
    store_per_node: float,
    metrics: dict[str, str],
) -> dict[str, Any]:
    """The ``config`` section of a JSON report: the flags, the transfer config, the
    object store per node and what each metric means."""
    return {
        **{k: v for k, v in vars(opts).items() if k not in ("run",)},
        "contenders": contenders,
        "data_dir": opts.data_dir,
        "transfer_config": {
            "chunk_bytes": config.chunk_bytes,
            "window": config.window,
            "inline_limit": config.inline_limit,
            "verify": config.verify,
            "direct_io": config.direct_io,
            "cache_bytes": config.cache_bytes,
            "progress": config.progress,
        },
        "object_store_bytes_per_node": int(store_per_node),
        "metrics": metrics,
    }


def _cpu_medians(runs: list[Measurement]) -> dict[str, float] | None:
    """The median CPU seconds of each process role over ``runs`` (``bench.cpu``)."""
    spent = [m.cpu_s for m in runs if m.cpu_s]
    if not spent:
        return None
    roles = dict.fromkeys(role for s in spent for role in s)
    return {r: round(statistics.median(s.get(r, 0.0) for s in spent), 4) for r in roles}


def _mib(value: int | None) -> float | None:
    return None if value is None else round(value / MiB, 1)


def summarize(
    name: str, layout: str, size_gb: float, nbytes: int, runs: list[Measurement]
) -> dict[str, Any]:
    """One result row of the JSON from the repeats of one contender at one size."""
    ok = [m for m in runs if m.trip is not None and m.error is None]
    failure = next((m.error for m in runs if m.error), None)
    seconds = [round(m.trip.seconds, 4) for m in ok if m.trip is not None]
    median = statistics.median(seconds) if seconds else None
    calls = [round(m.trip.call_s, 5) for m in ok if m.trip and m.trip.call_s is not None]

    def peak(role: str) -> float | None:
        values = [m.peaks[role] for m in runs if role in m.peaks]
        return _mib(max(values)) if values else None

    def phase(attr: str) -> float | None:
        values = [getattr(m.trip, attr) for m in ok if getattr(m.trip, attr) is not None]
        return round(statistics.median(values), 4) if values else None

    return {
        "contender": name,
        "size_gb": size_gb,
        "layout": layout,
        "bytes": nbytes,
        "status": "failed" if failure else "ok",
        "reason": failure,
        "seconds": seconds,
        "median_s": median,
        "min_s": min(seconds) if seconds else None,
        "max_s": max(seconds) if seconds else None,
        "s_per_gb": round(median / (nbytes / GB), 4) if median is not None else None,
        "ratio_to_cp": None,
        "ratio_to_cp_direct": None,
        "call_seconds": calls,
        "call_median_s": round(statistics.median(calls), 5) if calls else None,
        "call_max_s": max(calls) if calls else None,
        "pack_s": phase("pack_s"),
        "unpack_s": phase("unpack_s"),
        "producer_peak_private_mib": peak("producer"),
        "consumer_peak_private_mib": peak("consumer"),
        "agent_peak_private_mib": peak("agent"),
        "cpu_s": _cpu_medians(ok),
        "object_store_peak_mib": _mib(max((m.store_peak for m in runs), default=0)),
        "verified": bool(ok) and not failure,
    }


def skipped(name: str, layout: str, size_gb: float, nbytes: int, reason: str) -> dict[str, Any]:
    """A result row for a contender that was not run, with why."""
    row = summarize(name, layout, size_gb, nbytes, [])
    return {**row, "status": "skipped", "reason": reason, "verified": False}


def add_ratios(results: list[dict[str, Any]], floors: dict[str, str] | None = None) -> None:
    """Each row's median over the median of a floor contender at the same layout
    and size: ``ratio_to_<key>`` for each ``key: contender`` of ``floors`` (default:
    ``cp`` and ``cp-direct``); None where the floor did not run."""
    floors = floors or {"cp": "cp", "cp_direct": "cp-direct"}
    for key, floor in floors.items():
        base = {
            (r["layout"], r["bytes"]): r["median_s"]
            for r in results
            if r["contender"] == floor and r["median_s"]
        }
        for r in results:
            median = base.get((r["layout"], r["bytes"]))
            ratio = None if not median or r["median_s"] is None else r["median_s"] / median
            r[f"ratio_to_{key}"] = None if ratio is None else round(ratio, 3)


def linearity(results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per layout and contender: s/GB at the largest size over s/GB at the size
    closest to 0.5 GB among the smaller ones. 1.0 is linear; 2.0 means doubling the
    checkpoint took four times as long. None with fewer than two measured sizes."""
    out: dict[str, dict[str, Any]] = {}
    for r in results:
        out.setdefault(r["layout"], {}).setdefault(r["contender"], None)
    for layout, by_name in out.items():
        for name in by_name:
            ok = sorted(
                (r["size_gb"], r["s_per_gb"])
                for r in results
                if r["layout"] == layout and r["contender"] == name and r["status"] == "ok"
            )
            if len(ok) < 2:
                continue
            (big, big_rate), smaller = ok[-1], ok[:-1]
            ref, ref_rate = min(smaller, key=lambda sr: abs(sr[0] - 0.5))
            by_name[name] = {
                "ratio": round(big_rate / ref_rate, 3),
                "largest_size_gb": big,
                "reference_size_gb": ref,
            }
    return out


# -- output ------------------------------------------------------------------------------


def num(value: float | None, digits: int = 3) -> str:
    """A table cell: ``value`` with ``digits`` decimals, or "-" for none."""
    return "-" if value is None else f"{value:.{digits}f}"


def aligned(header: list[str], rows: list[list[str]], left: set[int]) -> list[str]:
    """``header``, a rule and ``rows`` in columns: the ``left`` ones left-aligned,
    the others (numbers) right-aligned."""
    widths = [max(len(str(c)) for c in column) for column in zip(header, *rows, strict=True)]

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.ljust(w) if i in left else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return [line(header), line(["-" * w for w in widths]), *map(line, rows)]


def reasons(results: list[dict[str, Any]]) -> list[str]:
    """The lines saying why a row was skipped or failed (none if all ran)."""
    notes = [
        f"  {r['contender']} {r['layout']} {r['size_gb']:g} GB {r['status']}: {r['reason']}"
        for r in results
        if r["reason"]
    ]
    return ["", "not run or failed:", *notes] if notes else []


def format_table(results: list[dict[str, Any]]) -> str:
    """The results as plain text in aligned columns, then the skip/failure reasons.
    ``call_s`` is the median time the producer's call blocked."""
    header = [
        "contender", "layout", "size_gb", "status", "median_s", "min_s", "max_s",
        "call_s", "s/GB", "x_cp", "x_cpd", "prod_MiB", "cons_MiB", "agent_MiB", "store_MiB",
        "verified",
    ]  # fmt: skip
    rows = [
        [
            r["contender"], r["layout"], f"{r['size_gb']:g}", r["status"],
            num(r["median_s"]), num(r["min_s"]), num(r["max_s"]), num(r["call_median_s"], 4),
            num(r["s_per_gb"]), num(r["ratio_to_cp"], 2), num(r["ratio_to_cp_direct"], 2),
            num(r["producer_peak_private_mib"], 0), num(r["consumer_peak_private_mib"], 0),
            num(r["agent_peak_private_mib"], 0), num(r["object_store_peak_mib"], 0),
            "yes" if r["verified"] else "no",
        ]
        for r in results
    ]  # fmt: skip
    return "\n".join(aligned(header, rows, {0, 1, 3}) + reasons(results))


def format_train_table(results: list[dict[str, Any]]) -> str:
    """``--train``: each path's median against both floors and against its own."""
    header = [
        "path", "layout", "size_gb", "status", "median_s", "min_s", "max_s", "s/GB",
        "x_cp_direct", "x_raw", "floor", "x_floor", "verified",
    ]  # fmt: skip
    rows = [
        [
            r["contender"], r["layout"], f"{r['size_gb']:g}", r["status"],
            num(r["median_s"]), num(r["min_s"]), num(r["max_s"]), num(r["s_per_gb"]),
            num(r["ratio_to_cp_direct"], 2), num(r["ratio_to_raw"], 2), r["floor"] or "-",
            num(r["ratio_to_floor"], 2), "yes" if r["verified"] else "no",
        ]
        for r in results
    ]  # fmt: skip
    return "\n".join(aligned(header, rows, {0, 1, 3, 10}) + reasons(results))


def pushed_text(ratios: dict[str, Any]) -> str:
    """``node:pushed`` for every node Ray pushed anything from (x the checkpoint)."""
    moved = [f"{node}:{r['pushed']:.2f}" for node, r in ratios.items() if r["pushed"]]
    return " ".join(moved) or "-"


def format_readers_table(results: list[dict[str, Any]]) -> str:
    """``--readers N``: the N at once against one alone, what the storage nodes'
    disks read (``read_x``: per repeat, as multiples of the checkpoint), and, for
    the first repeat, what Ray pushed from each node (``pushed_x``)."""
    header = [
        "run", "readers", "layout", "size_gb", "status", "median_s", "min_s", "max_s",
        "x_one", "reader_median_s", "read_x", "served_x", "pushed_x", "verified",
    ]  # fmt: skip

    def ratios(values: list[float]) -> str:
        return "/".join(f"{v:.2f}" for v in values) or "-"

    rows = [
        [
            r["contender"], str(r["readers"]), r["layout"], f"{r['size_gb']:g}", r["status"],
            num(r["median_s"]), num(r["min_s"]), num(r["max_s"]), num(r["ratio_to_one"], 2),
            num(r["reader_median_s"]), ratios(r["read_ratio"]), ratios(r["served_ratio"]),
            pushed_text(r["pushed"][0]) if r.get("pushed") else "-",
            "yes" if r["verified"] else "no",
        ]
        for r in results
    ]  # fmt: skip
    return "\n".join(aligned(header, rows, {0, 2, 4, 12}) + reasons(results))


def format_linearity(lin: dict[str, dict[str, Any]]) -> str:
    """One line per layout and contender, or a note why it is missing."""
    lines = ["linearity (s/GB at the largest size / s/GB at the reference size; 1.00 = linear):"]
    width = max((len(name) for by_name in lin.values() for name in by_name), default=10)
    for layout, by_name in lin.items():
        for name, value in by_name.items():
            if value is None:
                text = "n/a (fewer than two measured sizes)"
            else:
                text = (
                    f"{value['ratio']:.2f}  ({value['largest_size_gb']:g} GB vs "
                    f"{value['reference_size_gb']:g} GB)"
                )
            lines.append(f"  {name:<{width}} {layout:<6} {text}")
    return "\n".join(lines)


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend, imported only when a plot is asked for."""
    try:
        import matplotlib
    except ImportError as e:
        raise ImportError(
            "--plot needs matplotlib, an optional dependency: pip install 'air-transfer[bench]'"
        ) from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_plot(results: list[dict[str, Any]], path: str) -> None:
    """Left: s/GB against size per contender (log x; flat = linear). Right: peak
    private memory against size, consumer solid and producer dashed."""
    plt = pyplot()
    fig, (speed, memory) = plt.subplots(1, 2, figsize=(13, 5))
    series: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in results:
        if r["status"] == "ok":
            series.setdefault((r["contender"], r["layout"]), []).append(r)
    multi_layout = len({layout for _, layout in series}) > 1
    for index, ((name, layout), rows) in enumerate(series.items()):
        rows.sort(key=lambda r: r["size_gb"])
        label = f"{name} ({layout})" if multi_layout else name
        color = f"C{index % 10}"
        x = [r["size_gb"] for r in rows]
        speed.plot(x, [r["s_per_gb"] for r in rows], "o-", color=color, label=label)
        for role, style in (("consumer", "o-"), ("producer", "x--")):
            y = [r[f"{role}_peak_private_mib"] for r in rows]
            if any(v is not None for v in y):
                memory.plot(x, [math.nan if v is None else v for v in y], style, color=color)
        memory.plot([], [], "o-", color=color, label=label)
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    sizes = sorted({r["size_gb"] for rows in series.values() for r in rows})
    for ax in (speed, memory):
        ax.set_xscale("log")
        # Ticks at the measured sizes, labelled plainly ("0.5", not "5 x 10^-1").
        ax.xaxis.set_major_locator(FixedLocator(sizes))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("checkpoint size (GB)")
        ax.grid(True, which="both", alpha=0.3)
    speed.set_yscale("log")
    speed.set_ylabel("seconds per GB (flat = linear, lower = faster)")
    speed.set_title("round-trip time per GB")
    memory.set_ylabel("peak private memory, MiB (RssAnon)")
    memory.set_title("consumer (solid) and producer (dashed) peak private memory")
    speed.legend(fontsize="small")
    memory.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
