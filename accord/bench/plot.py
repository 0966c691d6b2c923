"""The pictures of `accord bench serve` sweeps: request throughput and goodput against
the offered rate, and median / p99 TTFT and TPOT against it with the SLO lines, the
operating point marked; several sweeps (two engines, two configs) overlay on one
picture (`accord bench plot A.json B.json`). A PNG through matplotlib (the `bench`
extra), and an HTML page with the picture and each sweep's table."""

from __future__ import annotations

import argparse
import base64
import html
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .serve.sweep import operating_point, render_table


def load_sweep(path: Path) -> dict[str, Any]:
    """A sweep document from `path`: a sweep.json, or one `bench serve --save-result`
    file (ours or vLLM's), read as a sweep of one rung."""
    document = json.loads(path.read_text())
    if "rungs" in document:
        return document
    if "request_rate" not in document:
        raise ValueError(f"{path}: neither a sweep.json nor a bench serve result (no rungs, no request_rate)")
    rungs = [document]
    return {
        "label": document.get("label") or document.get("backend") or path.stem,
        "model_id": document.get("model_id"),
        "goodput_slos_ms": document.get("goodput_slos_ms") or {},
        "rungs": rungs,
        "operating_point": operating_point(rungs),
    }


def _positions(sweeps: Sequence[dict[str, Any]]) -> tuple[dict[Any, float], float | None]:
    """Where each offered rate sits on the x axis (log scale): its own value, and `inf`
    one doubling past the highest finite rate; and that position for inf (or None)."""
    finite = [r["request_rate"] for s in sweeps for r in s["rungs"] if r["request_rate"] != "inf"]
    has_inf = any(r["request_rate"] == "inf" for s in sweeps for r in s["rungs"])
    inf_at = 2 * max(finite, default=0.5) if has_inf else None
    return {rate: float(rate) for rate in finite} | ({"inf": inf_at} if has_inf else {}), inf_at


def plot_sweeps(sweeps: Sequence[dict[str, Any]], png: Path) -> Path:
    """Draw the sweeps into `png` (three panels side by side) and return its path."""
    import matplotlib

    matplotlib.use("Agg")  # no display: files only
    import matplotlib.pyplot as plt

    x_of, inf_at = _positions(sweeps)
    figure, (load, ttft, tpot) = plt.subplots(1, 3, figsize=(16, 5), layout="constrained")
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    finite = sorted(x for rate, x in x_of.items() if rate != "inf")
    if finite:
        load.plot(finite, finite, color="0.7", linestyle=":", label="offered load")
    for index, sweep in enumerate(sweeps):
        color, name = colors[index % len(colors)], sweep.get("label", f"sweep {index + 1}")
        rungs = sorted(sweep["rungs"], key=lambda r: x_of[r["request_rate"]])
        xs = [x_of[r["request_rate"]] for r in rungs]
        load.plot(xs, [r["request_throughput"] for r in rungs], "o-", color=color, label=f"{name} throughput")
        goodput = [r["request_goodput"] for r in rungs]
        if None not in goodput:
            load.plot(xs, goodput, "s--", color=color, markerfacecolor="none", markersize=9, label=f"{name} goodput")
        point = sweep.get("operating_point")
        if point is not None:
            at = next(r for r in rungs if r["request_rate"] == point)
            good = at["request_goodput"] if at["request_goodput"] is not None else at["request_throughput"]
            load.plot([point], [good], "*", color=color, markersize=18, markeredgecolor="black",
                      label=f"{name} operating point ({point:g} req/s)")  # fmt: skip
            for axis in (ttft, tpot):
                axis.axvline(point, color=color, linestyle=":", linewidth=1)
        for axis, metric in ((ttft, "ttft"), (tpot, "tpot")):
            for key, style, which in ((f"median_{metric}_ms", "o-", "p50"), (f"p99_{metric}_ms", "^--", "p99")):
                if all(key in r for r in rungs):
                    axis.plot(xs, [r[key] for r in rungs], style, color=color, label=f"{name} {which}")
    slos = {name: bound for s in sweeps for name, bound in (s.get("goodput_slos_ms") or {}).items()}
    for axis, metric, title in ((ttft, "ttft", "TTFT"), (tpot, "tpot", "TPOT")):
        if metric in slos:
            axis.axhline(slos[metric], color="red", linewidth=1.5, label=f"SLO {slos[metric]:g} ms")
        axis.set(title=f"{title} vs offered rate", ylabel=f"{title} (ms)")
        axis.set_ylim(bottom=0)
    load.set(title="throughput and goodput vs offered rate", ylabel="requests/s")
    ticks = sorted(x_of.items(), key=lambda item: item[1])
    for axis in (load, ttft, tpot):
        axis.set_xscale("log", base=2)
        axis.set_xticks([x for _, x in ticks], [("inf" if rate == "inf" else f"{rate:g}") for rate, _ in ticks])
        axis.minorticks_off()
        axis.set_xlabel("offered rate (requests/s)" + ("; inf: all at once" if inf_at else ""))
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize=7)
    models = sorted({str(s.get("model_id")) for s in sweeps})
    figure.suptitle(f"accord bench serve: {', '.join(models)}")
    png.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(png, dpi=110)
    plt.close(figure)
    return png


def render_html(sweeps: Sequence[dict[str, Any]], png: Path | None) -> str:
    """A page with the picture inline (when drawn) and each sweep's table and server."""
    parts = ["<!doctype html><meta charset='utf-8'><title>accord bench serve</title>",
             "<body style='font-family: sans-serif'><h1>accord bench serve</h1>"]  # fmt: skip
    if png is not None:
        data = base64.b64encode(png.read_bytes()).decode()
        parts.append(f"<img alt='sweep' style='max-width: 100%' src='data:image/png;base64,{data}'>")
    else:
        parts.append("<p>No picture: matplotlib is not installed (<code>pip install 'accord[bench]'</code>).</p>")
    for sweep in sweeps:
        parts.append(f"<h2>{html.escape(str(sweep.get('label')))}: {html.escape(str(sweep.get('model_id')))}</h2>")
        parts.append(f"<pre>{html.escape(render_table(sweep))}</pre>")
        if "server" in sweep:
            parts.append(f"<p>server: <code>{html.escape(json.dumps(sweep['server']))}</code></p>")
    return "\n".join(parts) + "\n</body>\n"


def picture_or_none(sweeps: Sequence[dict[str, Any]], png: Path) -> Path | None:
    """`plot_sweeps` when matplotlib is installed, else None (the page says so)."""
    try:
        import matplotlib  # noqa: F401
    except ModuleNotFoundError:
        return None
    return plot_sweeps(sweeps, png)


def write_sweep_files(sweep: dict[str, Any], folder: Path) -> list[Path]:
    """sweep.json, sweep.png (with matplotlib) and sweep.html in `folder`; their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    document = folder / "sweep.json"
    document.write_text(json.dumps(sweep, indent=1))
    png = picture_or_none([sweep], folder / "sweep.png")
    page = folder / "sweep.html"
    page.write_text(render_html([sweep], png))
    return [p for p in (document, png, page) if p is not None]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`accord bench plot`'s arguments."""
    parser.add_argument("results", nargs="+", type=Path, help="sweep.json files (or single bench serve results)")
    parser.add_argument("-o", "--output", type=Path, default=Path("overlay.png"), help="the PNG (default: overlay.png)")


def run(args: argparse.Namespace) -> int:
    """Overlay the sweeps on one picture, with the HTML page beside it."""
    try:
        sweeps = [load_sweep(path) for path in args.results]
    except (OSError, ValueError) as error:
        print(f"accord bench plot: {error}", file=sys.stderr)
        return 2
    png = picture_or_none(sweeps, args.output)
    page = args.output.with_suffix(".html")
    page.write_text(render_html(sweeps, png))
    for sweep in sweeps:
        print(render_table(sweep))
    print("\n".join(f"wrote {p}" for p in (png, page) if p is not None))
    return 0
