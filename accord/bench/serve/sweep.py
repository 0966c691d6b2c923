"""A sweep over arrival rates: each rung's result under vLLM's keys, the operating
point (the highest rate whose goodput stays within 5% of the offered load), the
`sweep.json` document that holds them, and the table printed at the end."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

#: Goodput within this share of the offered load counts as keeping up.
KEEPING_UP = 0.95
#: The rates `--sweep` runs when `--request-rate` gives none.
DEFAULT_SWEEP = (1.0, 2.0, 4.0, 8.0, math.inf)


def parse_rates(text: str) -> list[float]:
    """`--request-rate` as its rates: "4", or "1,2,4,inf" for a sweep."""
    rates = []
    for item in text.split(","):
        try:
            rate = float(item)
        except ValueError:
            raise ValueError(f"--request-rate takes numbers or inf, comma-separated; got {item!r}") from None
        if not rate > 0:
            raise ValueError(f"--request-rate must be positive, got {item!r}")
        rates.append(rate)
    return rates


def rate_in_json(rate: float) -> float | str:
    """A rate as vLLM's result JSON writes it: the number, or "inf"."""
    return "inf" if math.isinf(rate) else rate


def good_rate(rung: dict[str, Any]) -> float:
    """Requests a second that met every SLO (all completed ones when no SLO was set)."""
    goodput = rung.get("request_goodput")
    return rung["request_throughput"] if goodput is None else goodput


def tail_allowance_s(rungs: Sequence[dict[str, Any]]) -> float:
    """The seconds a finite rung runs past its last arrival even on a server that keeps
    up: one unloaded request's latency, the median E2EL of the lowest finite rate (0 when
    E2EL was not measured: the plain rule)."""
    finite = [rung for rung in rungs if rung["request_rate"] != "inf"]
    lowest = min(finite, key=lambda rung: rung["request_rate"], default={})
    return lowest.get("median_e2el_ms", 0.0) / 1000


def offered_rate(rung: dict[str, Any], allowance_s: float) -> float:
    """The request rate a server that keeps up shows on this finite rung: its N requests
    over the N/rate seconds they arrive in plus `allowance_s` for the last one's answer
    (the rate itself for a long rung; 16 requests at 2/s on a 1 s request: 1.78)."""
    count = rung["completed"] + rung["failed"]
    return count / (count / rung["request_rate"] + allowance_s)


def operating_point(rungs: Sequence[dict[str, Any]]) -> float | None:
    """The highest finite rate whose goodput is at least 95% of the offered load, or
    None when no rung keeps up (an infinite rate offers no load to compare with). The
    offered load of a finite rung allows for its last answer (`offered_rate`): without
    that, a short rung of a server that keeps up reads as falling behind."""
    allowance = tail_allowance_s(rungs)
    kept = [
        rung["request_rate"]
        for rung in rungs
        if rung["request_rate"] != "inf" and good_rate(rung) >= KEEPING_UP * offered_rate(rung, allowance)
    ]
    return max(kept, default=None)


def _cell(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def render_table(sweep: dict[str, Any]) -> str:
    """One row per rung: offered rate, completed/failed, request throughput and
    goodput, output tokens/s, and median / p99 TTFT and TPOT where measured; the
    operating point's row is starred."""
    point = sweep.get("operating_point")
    columns = [
        ("rate req/s", lambda r: "inf" if r["request_rate"] == "inf" else f"{r['request_rate']:g}"),
        ("ok/failed", lambda r: f"{r['completed']}/{r['failed']}"),
        ("req/s", lambda r: _cell(r["request_throughput"], 2)),
        ("goodput req/s", lambda r: _cell(r["request_goodput"], 2)),
        ("out tok/s", lambda r: _cell(r["output_throughput"])),
        ("TTFT p50 ms", lambda r: _cell(r.get("median_ttft_ms"))),
        ("TTFT p99 ms", lambda r: _cell(r.get("p99_ttft_ms"))),
        ("TPOT p50 ms", lambda r: _cell(r.get("median_tpot_ms"))),
        ("TPOT p99 ms", lambda r: _cell(r.get("p99_tpot_ms"))),
    ]
    rows = [[title for title, _ in columns]]
    for rung in sweep["rungs"]:
        row = [cell(rung) for _, cell in columns]
        if point is not None and rung["request_rate"] == point:
            row[0] += " *"
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(columns))]
    lines = ["| " + " | ".join(cell.rjust(w) for cell, w in zip(row, widths)) + " |" for row in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    slos = sweep.get("goodput_slos_ms") or {}
    slo_text = ", ".join(f"{name} <= {bound:g} ms" for name, bound in slos.items()) or "none (goodput = throughput)"
    where = f"{point:g} req/s" if point is not None else "none (no rung kept up)"
    allowance = tail_allowance_s(sweep["rungs"])
    lines.append(
        f"SLOs: {slo_text}; operating point (*, goodput >= 95% of the offered load, allowing "
        f"{allowance * 1000:.0f} ms for each rung's last answer): {where}"
    )
    return "\n".join(lines)
