"""The side-by-side table of `accord bench`: output tokens/s per workload per engine."""

from __future__ import annotations

from .results import EngineRun, Runs


def render_cell(runs: Runs | None) -> str:
    """A table cell: the median output tokens/s, and the min-max range when repeated."""
    if runs is None:
        return "-"
    if len(runs.runs) == 1:
        return f"{runs.output_tokens_per_s:.1f} tok/s"
    low, high = runs.rate_range
    return f"{runs.output_tokens_per_s:.1f} tok/s ({low:.1f}-{high:.1f})"


def render_table(engines: dict[str, EngineRun]) -> str:
    """Output tokens/s per workload per engine (a repeated workload's median run, with
    the min-max range), start-up to ready, and accord's ratio of medians to the other
    engine when both ran."""
    names = list(engines)
    rows = [["workload", *names] + (["ratio"] if len(names) == 2 else [])]
    workloads_seen = list(dict.fromkeys(w for run in engines.values() for w in run.results))
    repeated: dict[str, set[int]] = {}
    for workload in workloads_seen:
        runs = [engines[n].results.get(workload) for n in names]
        row = [workload, *(render_cell(r) for r in runs)]
        if len(names) == 2:
            row.append(f"{runs[0].output_tokens_per_s / runs[1].output_tokens_per_s:.2f}x" if None not in runs else "-")
        rows.append(row)
        counts = {len(r.runs) for r in runs if r is not None}
        if counts - {1}:
            repeated[workload] = counts
    startups = [engines[n].startup for n in names]
    row = ["start-up to ready", *("-" if t is None else f"{t:.1f} s" for t in startups)]
    if len(names) == 2:
        row.append("-" if None in startups else f"{startups[1] / startups[0]:.1f}x faster")
    rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["| " + " | ".join(cell.ljust(w) for cell, w in zip(row, widths)) + " |" for row in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    lines += [
        f"{workload}: median of {' / '.join(map(str, sorted(counts)))} runs per engine (min-max tok/s in brackets), "
        "each on fresh prompts"
        for workload, counts in repeated.items()
    ]
    return "\n".join(lines)
