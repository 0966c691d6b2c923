"""profile_run sizes the KV pool from a worst-case step, and a step with a drafter runs
the drafter too: the draft model's forward runs in profile_run over every token of the
profile batch (the most its per-step forward over the target's tokens ever sees), into
KV layers of its own; the allocator's peak during profile_run, measured by torch's
profiler, grows by more than the draft model's scratch KV bytes; and that KV is counted
once in a block's bytes (the target's layers plus the draft's, from the configs).
The heads (MTP, EAGLE-3) are checked beside their fixtures (test_spec_mtp.py,
test_spec_eagle.py)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from accord.backends import get_backend
from accord.core.config import EngineConfig
from accord.core.worker.worker import Worker
from spec_decode_models import Calls, profile_worker

#: The profile batch's maxima: TOKEN_BUDGET tokens over MAX_NUM_SEQS sequences.
MAX_NUM_SEQS, TOKEN_BUDGET = 4, 48


def draft_spec(draft_dir: Path) -> dict:
    return {"method": "draft_model", "model": str(draft_dir), "num_speculative_tokens": 3}


def peak_bytes(run) -> int:
    """The most CPU bytes torch held at once while `run()` ran: the running sum, in time
    order, of every allocation and free the profiler records."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    events = sorted(prof.events(), key=lambda event: event.time_range.start)
    live = peak = 0
    for event in events:
        live += event.self_cpu_memory_usage
        peak = max(peak, live)
    return peak


def kv_bytes_per_token(model_dir: Path) -> int:
    """fp32 K and V bytes of one token over all layers, from the model's config.json."""
    raw = json.loads((model_dir / "config.json").read_text())
    head_dim = raw["hidden_size"] // raw["num_attention_heads"]
    return raw["num_hidden_layers"] * 2 * raw["num_key_value_heads"] * head_dim * 4


def test_profile_run_runs_the_draft_model_over_every_profiled_token(counting_llama_dir, counting_draft_dir):
    worker = profile_worker(counting_llama_dir, draft_spec(counting_draft_dir), MAX_NUM_SEQS, TOKEN_BUDGET)
    draft = worker.runner.drafter.model
    calls = Calls(draft)
    worker.determine_num_blocks(TOKEN_BUDGET)
    num_layers = json.loads((counting_draft_dir / "config.json").read_text())["num_hidden_layers"]
    assert calls.shapes(0) == [(TOKEN_BUDGET,)]  # input_ids
    assert [len(args[3]) for args in calls.args] == [num_layers]  # its own KV layers


def test_profile_run_peak_grows_by_more_than_the_draft_models_kv(counting_llama_dir, counting_draft_dir):
    torch.manual_seed(0)
    plain = profile_worker(counting_llama_dir, None, MAX_NUM_SEQS, TOKEN_BUDGET)
    drafting = profile_worker(counting_llama_dir, draft_spec(counting_draft_dir), MAX_NUM_SEQS, TOKEN_BUDGET)
    plain.determine_num_blocks(TOKEN_BUDGET)  # warm-up: first calls allocate lazily
    drafting.determine_num_blocks(TOKEN_BUDGET)
    without = peak_bytes(lambda: plain.determine_num_blocks(TOKEN_BUDGET))
    with_draft = peak_bytes(lambda: drafting.determine_num_blocks(TOKEN_BUDGET))
    # The profile batch: MAX_NUM_SEQS sequences of TOKEN_BUDGET / MAX_NUM_SEQS tokens,
    # each in whole blocks of the default block size.
    block_size = EngineConfig(model=str(counting_llama_dir)).block_size
    blocks = MAX_NUM_SEQS * -(-(TOKEN_BUDGET // MAX_NUM_SEQS) // block_size)
    draft_kv = blocks * block_size * kv_bytes_per_token(counting_draft_dir)
    assert with_draft - without > draft_kv


def test_a_block_counts_the_draft_models_kv_once(counting_llama_dir, counting_draft_dir):
    config = EngineConfig(model=str(counting_llama_dir), max_model_len=64,
                          speculative_config=draft_spec(counting_draft_dir))
    worker = Worker(config, lambda: get_backend("cpu"))
    expected = config.block_size * (kv_bytes_per_token(counting_llama_dir) + kv_bytes_per_token(counting_draft_dir))
    assert worker.info().bytes_per_block == expected
