"""`accord bench serve` against `accord serve` on the random demo model: a short sweep
writes vLLM's result keys for each rung (the list below is taken from vLLM's
vllm/benchmarks/serve.py: the run's header in main_async, the result dict of
benchmark(), and process_one_metric's mean/median/std/pXX keys), counts the tokens
the flags ask for, records the server, the seeds and the prefix cache's reset, and
draws the picture."""

from __future__ import annotations

import json

import pytest
from server_harness import ENGINE_FLAGS, ServerProcess

from accord.cli.main import main

#: vLLM `bench serve --save-result` keys (its default, without --save-detailed).
VLLM_HEADER_KEYS = [
    "date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id", "num_prompts",
    "request_rate", "burstiness", "max_concurrency",
]  # fmt: skip
VLLM_RESULT_KEYS = [
    "duration", "completed", "failed", "total_input_tokens", "total_output_tokens", "request_throughput",
    "request_goodput", "output_throughput", "total_token_throughput", "max_output_tokens_per_s",
    "max_concurrent_requests",
]  # fmt: skip
VLLM_METRIC_KEYS = [
    f"{stat}_{metric}_ms" for metric in ("ttft", "tpot", "itl", "e2el") for stat in ("mean", "median", "std", "p99")
]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def accord_cache(tmp_path_factory):
    """A private accord cache: the server generates the demo model there, and the bench
    reads its tokenizer from it."""
    return tmp_path_factory.mktemp("accord-cache")


@pytest.fixture(scope="module")
def accord_server(accord_cache):
    process = ServerProcess(*ENGINE_FLAGS, cache_dir=accord_cache)
    yield process
    process.stop()


def test_a_short_sweep_writes_vllms_keys_and_a_picture(accord_server, accord_cache, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("ACCORD_CACHE_DIR", str(accord_cache))
    argv = [
        "bench", "serve", "--base-url", accord_server.url, "--tokenizer", "accord-demo-random",
        "--dataset-name", "random", "--random-input-len", "16", "--random-output-len", "6", "--num-prompts", "4",
        "--ignore-eos", "--temperature", "0", "--request-rate", "4,inf", "--goodput", "ttft:2000", "tpot:100",
        "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99", "--seed", "7",
        "--save-result", "--result-dir", str(tmp_path), "--label", "accord-demo", "--disable-tqdm",
        "--reset-prefix-cache",
    ]  # fmt: skip
    assert main(argv) == 0
    table = capsys.readouterr().out
    sweep = json.loads((tmp_path / "sweep.json").read_text())
    assert [rung["request_rate"] for rung in sweep["rungs"]] == [4.0, "inf"]
    rung_files = sorted(tmp_path.glob("accord-demo-*qps-accord-demo-random-*.json"))
    assert len(rung_files) == 2
    for rung in sweep["rungs"]:
        missing = [k for k in VLLM_HEADER_KEYS + VLLM_RESULT_KEYS + VLLM_METRIC_KEYS if k not in rung]
        assert not missing, missing
        assert rung["completed"] == 4 and rung["failed"] == 0
        # 4 prompts of 16 ids, 6 tokens each (ignore_eos): the server's usage says so.
        assert rung["total_input_tokens"] == 4 * 16 and rung["total_output_tokens"] == 4 * 6
        assert rung["model_id"] == "accord-demo-random" and rung["label"] == "accord-demo"
        assert rung["num_warmups"] == 1 and rung["warmups_failed"] == 0
        assert rung["server"]["models"]["data"][0]["id"] == "accord-demo-random"
        assert rung["prefix_cache"] == "reset", "accord serve offers POST /reset_prefix_cache"
        assert 0 <= rung["good_requests"] <= 4 and rung["goodput_slos_ms"] == {"ttft": 2000.0, "tpot": 100.0}
        assert rung["median_ttft_ms"] > 0 and rung["p99_tpot_ms"] >= rung["median_tpot_ms"] > 0
    assert [rung["seed"] for rung in sweep["rungs"]] == [7, 1007]
    assert json.loads(rung_files[0].read_text()).keys() == sweep["rungs"][0].keys()
    png = tmp_path / "sweep.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "data:image/png;base64," in (tmp_path / "sweep.html").read_text()
    assert "goodput req/s" in table and "SLOs: ttft <= 2000 ms, tpot <= 100 ms" in table

