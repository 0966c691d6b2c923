"""The sweep's verdicts and files: the operating point is the highest finite rate whose
goodput is at least 95% of the offered load (a finite rung's allowing for its last
answer, one unloaded request's latency); the table marks it; `accord bench plot`
overlays two sweeps (or single results) on one PNG with an HTML page beside it, and a
file that is neither is refused."""

from __future__ import annotations

import json

import pytest

from accord.bench.plot import load_sweep
from accord.bench.serve.sweep import operating_point, render_table
from accord.cli.main import main


def rung(rate, throughput, goodput, ttft=100.0, tpot=20.0):
    return {
        "request_rate": rate, "completed": 10, "failed": 0, "request_throughput": throughput,
        "request_goodput": goodput, "output_throughput": 10 * throughput, "median_ttft_ms": ttft,
        "p99_ttft_ms": 2 * ttft, "median_tpot_ms": tpot, "p99_tpot_ms": 2 * tpot,
    }  # fmt: skip


def sweep(label, rungs, slos=None):
    return {"label": label, "model_id": "m", "goodput_slos_ms": slos or {}, "rungs": rungs,
            "operating_point": operating_point(rungs)}  # fmt: skip


def test_the_operating_point_is_the_highest_rate_kept_within_five_percent():
    # 4 req/s: goodput 3.8 = 95% keeps up; 8: 7.5 < 7.6 does not; inf offers no load to keep up with.
    rungs = [rung(1.0, 1.0, 0.99), rung(4.0, 4.0, 3.8), rung(8.0, 7.9, 7.5), rung("inf", 9.0, 9.0)]
    assert operating_point(rungs) == 4.0
    assert operating_point([rung(2.0, 1.0, 1.0)]) is None
    # Without SLOs (goodput None) throughput stands in.
    assert operating_point([rung(2.0, 1.95, None), rung(4.0, 3.0, None)]) == 2.0
    table = render_table(sweep("a", rungs, {"ttft": 500.0}))
    assert "|        4 * |" in table and "8 *" not in table
    assert "SLOs: ttft <= 500 ms; operating point (*, goodput >= 95% of the offered load, allowing 0 ms" in table
    assert table.endswith("last answer): 4 req/s")


def test_a_short_rung_is_allowed_its_last_answer():
    # 16 requests a rung; an unloaded request (the 1 req/s rung's median E2EL) takes 1 s.
    # At 2 req/s a server that keeps up needs 8 + 1 s: 16 / 9 = 1.78 req/s offered, and
    # 1.75 is 98% of it (only 92% of the bare rate). At 4 req/s: 16 / 5 = 3.2 offered; 2.9 is 91%.
    rungs = [rung(1.0, 0.94, 0.94) | {"median_e2el_ms": 1000.0}, rung(2.0, 1.75, 1.75), rung(4.0, 2.9, 2.9)]
    for r in rungs:
        r["completed"] = 16
    assert operating_point(rungs) == 2.0
    assert operating_point([{**r, "median_e2el_ms": 0.0} for r in rungs]) is None
    assert "allowing 1000 ms for each rung's last answer): 2 req/s" in render_table(sweep("a", rungs))


def test_plot_overlays_two_sweeps_and_a_single_result(tmp_path, capsys):
    first = tmp_path / "a.json"
    first.write_text(json.dumps(sweep("engine A", [rung(1.0, 1.0, 1.0), rung(2.0, 2.0, 1.9), rung("inf", 3.0, 2.0)],
                                      {"ttft": 300.0, "tpot": 50.0})))  # fmt: skip
    second = tmp_path / "b.json"
    second.write_text(json.dumps(sweep("engine B", [rung(1.0, 1.0, 0.5, ttft=400.0), rung(2.0, 1.5, 0.2, ttft=900.0)])))
    single = tmp_path / "single.json"
    single.write_text(json.dumps(rung(2.0, 1.8, None) | {"backend": "openai-chat", "label": None, "model_id": "m"}))
    png = tmp_path / "out" / "overlay.png"
    png.parent.mkdir()
    assert main(["bench", "plot", str(first), str(second), str(single), "-o", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = png.with_suffix(".html").read_text()
    assert page.count("<pre>") == 3 and "engine A" in page and "engine B" in page and "openai-chat" in page
    out = capsys.readouterr().out
    assert "last answer): 2 req/s" in out  # engine A
    assert load_sweep(single)["rungs"][0]["request_throughput"] == 1.8


def test_plot_refuses_a_file_that_is_no_result(tmp_path, capsys):
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"hello": 1}))
    assert main(["bench", "plot", str(other), "-o", str(tmp_path / "x.png")]) == 2
    assert "neither a sweep.json nor a bench serve result" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--request-rate", "1,fast"], "--request-rate takes numbers or inf"),
    (["--goodput", "latency:5"], "is no SLO metric"),
    (["--percentile-metrics", "ttft,p99"], "'p99' is not one of"),
    (["--max-concurrency", "0"], "--max-concurrency must be at least 1"),
])
def test_bad_serve_flags_exit_2_with_the_reason(argv, message, capsys):
    # The model is given, so nothing is asked of a server before the flags are checked.
    base = ["bench", "serve", "--base-url", "http://127.0.0.1:9", "--model", "m", "--disable-tqdm"]
    assert main(base + argv) == 2
    assert message in capsys.readouterr().err
