"""/metrics names the LoRA adapters served: vLLM's `vllm:lora_requests_info` (the
adapters of the running and the waiting requests, and --max-loras, as labels) as the
scheduler sees them, and the tokens generated per adapter; a server without LoRA shows
neither series."""

from __future__ import annotations

import time

from prometheus_client.parser import text_string_to_metric_families

from accord.core.lora.request import LoRARequest
from accord.core.sampling_params import SamplingParams
from accord.core.sched.block_manager import BlockManager
from accord.core.sched.request import Request
from accord.core.sched.scheduler import Scheduler
from accord.core.stats import EngineStats
from accord.server.metrics import ServerMetrics

ADAPTERS = {name: LoRARequest(name, number, f"/adapters/{name}") for number, name in enumerate("abc", start=1)}


def request(name: str, adapter: str | None) -> Request:
    return Request(name, [1, 2, 3, 4], SamplingParams(max_tokens=4),
                   lora_request=ADAPTERS[adapter] if adapter else None)


def samples(metrics: ServerMetrics) -> dict[str, list[tuple[dict[str, str], float]]]:
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            found.setdefault(sample.name, []).append((sample.labels, sample.value))
    return found


def test_the_scheduler_reports_which_adapters_run_and_which_wait() -> None:
    # Two device slots: the base request and adapters a and b run; c waits for a slot.
    scheduler = Scheduler(BlockManager(64, 16), max_num_batched_tokens=512, max_num_seqs=8, max_loras=2)
    for name, adapter in [("base", None), ("r1", "a"), ("r2", "b"), ("r3", "a"), ("r4", "c")]:
        scheduler.add_request(request(name, adapter))
    scheduler.schedule()
    stats = scheduler.stats
    assert {r.req_id for r in scheduler.running} == {"base", "r1", "r2", "r3"}
    assert (stats.running_lora_adapters, stats.waiting_lora_adapters, stats.max_lora) == (("a", "b"), ("c",), 2)


def test_lora_requests_info_and_tokens_per_adapter_are_scraped() -> None:
    stats = EngineStats(running_lora_adapters=("a", "b"), waiting_lora_adapters=("c",), max_lora=2,
                        lora_generation_tokens={"a": 7, "b": 3})
    before = time.time()
    found = samples(ServerMetrics("m", lambda: [stats], 256))
    [(labels, value)] = found["vllm:lora_requests_info"]
    assert labels == {"model_name": "m", "engine": "0", "max_lora": "2", "waiting_lora_adapters": "c",
                      "running_lora_adapters": "a,b"}
    assert before <= value <= time.time()  # vLLM's gauge holds the time of its update
    tokens = {labels["lora_name"]: value for labels, value in found["accord:lora_generation_tokens_total"]}
    assert tokens == {"a": 7, "b": 3}


def test_a_server_without_lora_shows_no_lora_series() -> None:
    found = samples(ServerMetrics("m", lambda: [EngineStats(generation_tokens=5)], 256))
    assert "vllm:lora_requests_info" not in found and "accord:lora_generation_tokens_total" not in found
    assert found["vllm:generation_tokens_total"][0][1] == 5
