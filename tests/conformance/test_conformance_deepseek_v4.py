"""DeepSeek-V4's conformance: its cases carry the motivating dtype mix, the edges of
compressed attention and the expert-parallel holes, and `accord conformance` catches a
router that reads the int32 tid2eid companion at the int64 width of the token ids."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from conformance_doubles import broken, route_reading_companions_at_token_id_width

from accord.backends import get_backend
from accord.conformance import cases_for
from accord.gate.recording import CacheSignature, cache_args, replay_args
from accord.op_contracts import CONTRACTS, OpDispatcher
from accord.cli.main import main
from accord.cli.commands import conformance as command


def legal(op: str):
    return [case for case in cases_for(op) if not case.expect_refusal]


def test_moe_route_runs_the_v4_hash_layer_at_the_release_dtype_mix() -> None:
    v4 = [case for case in legal("moe_route") if case.name.startswith("v4 hash")]
    assert {case.args["ids_dtype"] for case in v4} == {torch.int32, torch.int64}
    for case in v4:
        assert case.args["token_ids"].dtype == torch.int64 and case.args["hash_table"].dtype == torch.int32
        assert case.args["hash_table"].shape == (129280, 6)


def test_fused_moe_v4_cases_send_a_token_wholly_off_rank_and_leave_a_local_expert_idle() -> None:
    for case in [c for c in legal("fused_moe") if c.name.startswith("v4") and "expert map" in c.name]:
        local = case.args["expert_map"].long()[case.args["topk_ids"].long()]
        assert bool((local[0] < 0).all()), "token 0's hash experts are all on other ranks"
        assert set(local[local >= 0].tolist()) < set(range(case.args["w13"].shape[0])), "a local expert is idle"
        assert case.args["topk_ids"].dtype == torch.int32 and case.args["swiglu_limit"] > 0


def test_fused_moe_v4_cases_clip_fp8_block_scaled_weights_and_local_ids_too() -> None:
    clipped = [c for c in legal("fused_moe") if c.args.get("swiglu_limit", 0) > 0]
    assert any(c.args["w13_scale"] is not None for c in clipped), "swiglu_limit with fp8 block-scaled weights"
    assert any(c.args.get("expert_map") is None for c in clipped), "swiglu_limit without an expert map"


def test_compressed_cases_include_prompts_ending_mid_block_and_a_first_token() -> None:
    cases = legal("compressed_attention")
    rate = 4
    ends = {int(n) for case in cases for n in case.args["seq_lens"].tolist()}
    assert 1 in ends and any(n % rate for n in ends if n > rate)
    assert {case.args["compress_rate"] for case in cases} == {0, rate}
    assert any(case.args["topk_ids"] is not None and bool((case.args["topk_ids"] < 0).any()) for case in cases)


@pytest.mark.slow
@pytest.mark.parametrize("op", ["kv_compress", "indexer_topk", "compressed_attention"])
def test_cpu_passes_the_compressed_kv_contracts(op: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["conformance", "--backend", "cpu", "--op", op]) == 0
    assert "fail 0" in capsys.readouterr().out.splitlines()[-1]


@pytest.mark.slow
def test_accord_conformance_catches_tid2eid_read_at_token_id_width(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    misreader = broken("tid2eid-misreader", "moe_route", route_reading_companions_at_token_id_width)
    backends = {"tid2eid-misreader": misreader, "reference": get_backend("reference")}
    monkeypatch.setattr(command, "default_registry", lambda: SimpleNamespace(get=backends.__getitem__))
    assert main(["conformance", "--backend", "tid2eid-misreader", "--op", "moe_route"]) == 1
    rows = capsys.readouterr().out.splitlines()
    mix = "router_logits=fp32 token_ids=int64 hash_table=int32"
    table_rows = [row for row in rows if row.startswith(f"moe_route  {mix}")]
    assert len(table_rows) == 2 and all("FAIL 1/1" in row for row in table_rows)
    assert sum("v4 hash" in row and mix in row for row in rows) == 2, "each failing V4 case is named"
    assert rows[-1].startswith("FAILED:")


@pytest.mark.parametrize("op", ["kv_compress", "indexer_topk", "compressed_attention"])
def test_the_gate_replays_a_recorded_call_of_each_compressed_op(op: str) -> None:
    contract = CONTRACTS[op]
    caches = cache_args(contract)
    case = max(legal(op), key=lambda c: sum(v is not None for v in c.args.values()))
    recorded = {
        name: CacheSignature(value.dtype, tuple(value.shape[1:])) if name in caches and value is not None else value
        for name, value in case.args.items()
    }
    args = replay_args(op, recorded, torch.Generator().manual_seed(0))
    OpDispatcher(get_backend("reference"), strict=True).call(contract, (), args)
