"""Figures of the benchmark JSONs: time and peak memory against size, as PNGs (matplotlib, Agg backend).

Reads what ``benchmarks/bmm.py --json`` and ``benchmarks/crf.py --json`` write and draws
    bmm_fwd_time.png       forward time vs n (log-log), one panel per op, one line per implementation
    bmm_fwd_bwd_time.png   forward + backward time vs n
    bmm_peak_memory.png    peak MiB vs n (solid: forward + backward, dashed: forward)
    crf_time.png           train and decode time per B,T,C shape (grouped bars, log y)
    crf_peak_memory.png    peak MiB of one train step per shape
Failed cells (OOM, ERR, skip) are gaps marked with their reason; "n/a" and "unavailable" are left out.
A figure with no value at all (peak memory of a CPU run) is not written.

Usage:
    python benchmarks/plots.py --bmm bmm.json --crf crf.json --out docs/
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

OURS = ("semiring_ops", "ours")
NOT_RUN = ("n/a", "unavailable")  # values of systems that do not have that measurement: left out, unmarked
BMM_TIME = {"bmm_fwd_time.png": ("fwd_ms", "forward"), "bmm_fwd_bwd_time.png": ("fwd_bwd_ms", "forward + backward")}
BMM_MEMORY = (("fwd_bwd_peak_mib", "-", "fwd+bwd"), ("fwd_peak_mib", "--", "fwd"))
CRF_TIME = (("train_ms", "train (NLL forward + backward)"), ("decode_ms", "decode (Viterbi)"))


def _pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend, imported on first use."""
    try:
        import matplotlib
    except ImportError:
        raise SystemExit(
            "benchmarks/plots.py needs matplotlib: pip install matplotlib (or pip install -e '.[bench]')"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# ---------------------------------------------------------------- cell values


def number(value: object) -> float | None:
    """The value as a plottable number on a log axis (finite, > 0), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None


def failure(value: object) -> str | None:
    """Short reason of a failed cell ('OOM', 'ERR', 'skip'), None for numbers, nulls and 'n/a' / 'unavailable'."""
    if not isinstance(value, str) or not value.strip() or value in NOT_RUN:
        return None
    return value.split()[0].rstrip(":")


def present(value: object) -> bool:
    """Whether a cell is drawn: a number or a failure mark."""
    return number(value) is not None or failure(value) is not None


def unique(items: Iterable[Any]) -> list[Any]:
    """Items in order of first appearance, without repeats."""
    return list(dict.fromkeys(items))


def colors(names: Iterable[str]) -> dict[str, str]:
    """A fixed colour per implementation (ours first), the same in every figure."""
    ordered = sorted(unique(names), key=lambda name: name not in OURS)
    return {name: f"C{i % 10}" for i, name in enumerate(ordered)}


# ---------------------------------------------------------------- figure furniture


def title(data: dict, what: str) -> str:
    """'what — GPU, torch x, date' from whichever of these the JSON holds (bmm: top level; crf: meta)."""
    meta = {**data, **data.get("meta", {})}
    where = meta.get("gpu") or meta.get("device")
    parts = [
        str(where) if where else None,
        f"torch {meta['torch']}" if meta.get("torch") else None,
        "ragged masks" if meta.get("ragged") else None,
        meta.get("date"),
    ]
    details = ", ".join(p for p in parts if p)
    return f"{what} — {details}" if details else what


def mark_line_failure(ax: Any, x: float, text: str, color: str, slot: int, last: bool) -> None:
    """Marks a failed point of a line at data x: an x near the top of the axes (lower for later slots) and the
    text beside it (on its left for the line's last point, so that it stays inside the axes)."""
    y = 0.95 - 0.07 * slot
    transform = ax.get_xaxis_transform()  # x in data, y in axes fraction
    ax.plot([x], [y], marker="x", color=color, transform=transform)
    label = f"{text} " if last else f" {text}"
    ax.text(
        x, y, label, color=color, transform=transform, fontsize="x-small", ha="right" if last else "left", va="center"
    )


def mark_bar_failure(ax: Any, x: float, reason: str, color: str) -> None:
    """Writes a failed bar's reason upright at the foot of its slot."""
    transform = ax.get_xaxis_transform()
    ax.text(
        x, 0.03, reason, color=color, transform=transform, fontsize="x-small", ha="center", va="bottom", rotation=90
    )


def decades(ax: Any) -> float | None:
    """How many decades the log y axis shows (None before it has positive limits, e.g. with no data)."""
    low, high = ax.get_ylim()
    return math.log10(high / low) if 0 < low < high and math.isfinite(high) else None


def log_y(ax: Any, headroom: float = 0.3) -> None:
    """Log y axis with ``headroom`` (a fraction of its decades) above the data for the legend and failure marks,
    labelled with plain numbers (0.02, 400); minor ticks labelled too where few decades show (2 and 5 under 1.5
    decades, all under 0.6)."""
    from matplotlib.ticker import FuncFormatter

    def minor(value: float, _pos: object) -> str:
        span = decades(ax)
        mantissa = round(value / 10 ** math.floor(math.log10(value) + 1e-9))
        few = span is not None and (span < 0.6 or (span < 1.5 and mantissa in (2, 5)))
        return f"{value:g}" if few else ""

    ax.set_yscale("log")
    span = decades(ax)
    if span is None:  # nothing but failure marks: an unlabelled range to put them on
        ax.set_ylim(1, 10)
        ax.tick_params(axis="y", which="both", labelleft=False)
    else:
        low, high = ax.get_ylim()
        ax.set_ylim(low, high * 10 ** (span * headroom))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _pos: f"{value:g}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(minor))


def panels(plt: Any, count: int, width: float, height: float) -> tuple[Any, list[Any]]:
    """A figure with ``count`` panels, at most 2 a row."""
    ncols = min(count, 2)
    nrows = math.ceil(count / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), layout="constrained", squeeze=False)
    flat = list(axes.flat)
    for ax in flat[count:]:
        ax.set_visible(False)
    return fig, flat[:count]


def save(plt: Any, fig: Any, path: Path) -> Path:
    """Writes the figure as a PNG and closes it."""
    fig.savefig(path, dpi=150)
    plt.close(fig)
    return path


# ---------------------------------------------------------------- bmm: lines against n


def bmm_figure(plt: Any, data: dict, series: Sequence[tuple[str, str, str]], ylabel: str, what: str) -> Any | None:
    """One panel per op, one line per implementation and series (key, line style, label suffix); None if no
    row has any of the series."""
    rows = [r for r in data.get("rows", []) if any(present(r.get(key)) for key, _, _ in series)]
    if not rows:
        return None
    palette = colors(r["impl"] for r in rows)
    batches = unique(r.get("B") for r in rows)
    ops = unique(r["op"] for r in rows)
    fig, axes = panels(plt, len(ops), 5.5, 4.0)
    for ax, op in zip(axes, ops, strict=True):
        op_rows = [r for r in rows if r["op"] == op]
        sizes = sorted(unique(r["n"] for r in op_rows))
        slot = 0
        for impl in unique(r["impl"] for r in op_rows):
            for B in batches:
                line_rows = sorted((r for r in op_rows if r["impl"] == impl and r.get("B") == B), key=lambda r: r["n"])
                name = impl if len(batches) == 1 else f"{impl}, B={B}"
                slot = bmm_line(ax, line_rows, series, name, palette[impl], slot)
        ax.set_xscale("log", base=2)
        log_y(ax)
        ax.set_xticks(sizes, [str(n) for n in sizes])
        ax.xaxis.set_minor_locator(plt.NullLocator())
        batch = f", B = {batches[0]}" if len(batches) == 1 else ""
        ax.set(title=f"{op}{batch}", xlabel="n = k = m", ylabel=ylabel)
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize="small")
    fig.suptitle(title(data, what))
    return fig


def bmm_line(
    ax: Any, rows: list[dict], series: Sequence[tuple[str, str, str]], name: str, color: str, slot: int
) -> int:
    """Draws one implementation's series (NaN gaps where a cell has no number) and marks its failed cells;
    returns the next free failure-mark slot."""
    for key, style, suffix in series:
        cells = [(r["n"], r.get(key)) for r in rows]
        if not any(present(v) for _, v in cells):
            continue
        label = f"{name} {suffix}" if len(series) > 1 else name
        ys = [number(v) or math.nan for _, v in cells]
        ax.plot([n for n, _ in cells], ys, style, marker="o", color=color, label=label)
        failed = [(n, failure(v)) for n, v in cells if failure(v)]
        for n, reason in failed:
            mark_line_failure(ax, n, f"{label}: {reason}", color, slot, last=n == cells[-1][0])
        slot += bool(failed)
    return slot


# ---------------------------------------------------------------- crf: grouped bars per shape


def crf_figure(plt: Any, data: dict, keys: Sequence[tuple[str, str]], ylabel: str, what: str) -> Any | None:
    """One panel per (key, panel title): bars grouped by B,T,C shape, one bar per system; None if no row has
    any of the keys."""
    from matplotlib.patches import Patch

    rows = data.get("rows", [])
    keys = [(key, name) for key, name in keys if any(present(r.get(key)) for r in rows)]
    if not keys:
        return None
    palette = colors(r["system"] for r in rows)
    shapes = unique((r["B"], r["T"], r["C"]) for r in rows)
    fig, axes = panels(plt, len(keys), max(5.5, 1.3 * len(shapes) + 1.5), 4.2)
    for ax, (key, name) in zip(axes, keys, strict=True):
        systems = crf_bars(ax, rows, shapes, key, palette)
        log_y(ax)
        ax.set_xlim(-0.5, len(shapes) - 0.5)
        ax.set_xticks(range(len(shapes)), [",".join(map(str, s)) for s in shapes])
        ax.set(title=name, xlabel="B, T, C", ylabel=ylabel)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(handles=[Patch(color=palette[s], label=s) for s in systems], fontsize="small")
    fig.suptitle(title(data, what))
    return fig


def crf_bars(ax: Any, rows: list[dict], shapes: list[tuple], key: str, palette: dict[str, str]) -> list[str]:
    """Draws one bar per system with a value for key at each shape (a failure mark where it failed); returns
    the systems drawn."""
    systems = unique(r["system"] for r in rows if present(r.get(key)))
    width = 0.8 / len(systems)
    for i, system in enumerate(systems):
        cells = {(r["B"], r["T"], r["C"]): r.get(key) for r in rows if r["system"] == system}
        for j, shape in enumerate(shapes):
            x, value = j + (i - (len(systems) - 1) / 2) * width, cells.get(shape)
            if number(value) is not None:
                ax.bar(x, number(value), width, color=palette[system])
            elif failure(value):
                mark_bar_failure(ax, x, failure(value), palette[system])
    return systems


# ---------------------------------------------------------------- command line


def figures(plt: Any, bmm: dict | None, crf: dict | None) -> dict[str, Any]:
    """file name -> figure (or None when its JSON has nothing for it)."""
    out: dict[str, Any] = {}
    if bmm is not None:
        for name, (key, what) in BMM_TIME.items():
            out[name] = bmm_figure(plt, bmm, [(key, "-", what)], "ms (median)", f"Semiring bmm {what} time")
        out["bmm_peak_memory.png"] = bmm_figure(
            plt, bmm, BMM_MEMORY, "peak MiB above inputs", "Semiring bmm peak memory"
        )
    if crf is not None:
        out["crf_time.png"] = crf_figure(plt, crf, CRF_TIME, "ms (median)", "Linear-chain CRF time")
        memory = [("peak_mib", "one train step")]
        out["crf_peak_memory.png"] = crf_figure(
            plt, crf, memory, "peak MiB above inputs", "Linear-chain CRF peak memory"
        )
    return out


def load(path: str | None) -> dict | None:
    """The JSON at path (None for no path)."""
    return json.loads(Path(path).read_text()) if path else None


def main(argv: Sequence[str] | None = None) -> list[Path]:
    """Writes the PNGs and returns their paths."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bmm", metavar="JSON", help="written by benchmarks/bmm.py --json")
    parser.add_argument("--crf", metavar="JSON", help="written by benchmarks/crf.py --json")
    parser.add_argument("--out", default="docs", metavar="DIR", help="folder for the PNGs (default docs)")
    args = parser.parse_args(argv)
    if not (args.bmm or args.crf):
        parser.error("give --bmm and/or --crf")
    plt = _pyplot()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, fig in figures(plt, load(args.bmm), load(args.crf)).items():
        if fig is None:
            print(f"{name}: no values in the JSON (e.g. peak memory of a CPU run); not written")
        else:
            written.append(save(plt, fig, out / name))
            print("wrote", written[-1])
    return written


if __name__ == "__main__":
    main()
