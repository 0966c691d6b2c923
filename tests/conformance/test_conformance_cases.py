"""The generated cases: every contract has them, they cover every legal dtype of every
tensor and the named edges, legal ones obey their contract, illegal ones break it,
and a seed reproduces them bit for bit."""

from __future__ import annotations

import functools

import pytest
import torch

from accord.backends import get_backend
from accord.conformance import GENERATORS, Case, cases_for
from accord.conformance.cases.paged import BLOCK_SIZE
from accord.conformance.compare import same_bits
from accord.op_contracts import CONTRACTS, ContractError, OpDispatcher


@pytest.fixture(scope="module")
def golden() -> OpDispatcher:
    return OpDispatcher(get_backend("reference"), strict=True)


@functools.cache
def cases(op: str) -> tuple[Case, ...]:
    """Seed 0's cases of `op`, generated once per test session."""
    return tuple(cases_for(op))


def legal(op: str) -> list[Case]:
    return [case for case in cases(op) if not case.expect_refusal]


def test_every_contract_has_a_case_generator() -> None:
    assert sorted(set(CONTRACTS) - set(GENERATORS)) == []


@pytest.mark.parametrize("op", sorted(CONTRACTS))
def test_cases_cover_every_dtype_each_tensor_allows(op: str) -> None:
    contract = CONTRACTS[op]
    for spec in contract.tensors:
        seen = {case.args[spec.name].dtype for case in legal(op) if case.args.get(spec.name) is not None}
        assert seen == set(spec.dtypes), f"{op}.{spec.name}"


@pytest.mark.parametrize("op", sorted(CONTRACTS))
def test_legal_cases_obey_their_contract(golden: OpDispatcher, op: str) -> None:
    for case in legal(op):
        golden.plan_for(op, **case.fresh_args())


@pytest.mark.parametrize("op", sorted(CONTRACTS))
def test_illegal_cases_break_their_contract(golden: OpDispatcher, op: str) -> None:
    illegal = [case for case in cases(op) if case.expect_refusal]
    assert len(illegal) >= 2
    for case in illegal:
        with pytest.raises(ContractError):
            golden.plan_for(op, **case.fresh_args())


def test_a_seed_reproduces_its_cases_bit_for_bit() -> None:
    first, second = cases_for("paged_attention", seed=3), cases_for("paged_attention", seed=3)
    for a, b in zip(first, second):
        assert all(same_bits(v, b.args[k]) for k, v in a.args.items() if isinstance(v, torch.Tensor))


def test_another_seed_draws_other_values() -> None:
    assert not same_bits(cases_for("rms_norm", seed=0)[0].args["x"], cases_for("rms_norm", seed=1)[0].args["x"])


def test_cache_writer_cases_fill_a_block_and_spill_one_past_it_with_padding_slots() -> None:
    token_counts = {case.args["key"].shape[0] for case in legal("reshape_and_cache")}
    assert {1, BLOCK_SIZE, BLOCK_SIZE + 1} <= token_counts
    batched = [case for case in legal("reshape_and_cache") if case.args["key"].shape[0] > 1]
    assert all((case.args["slot_mapping"] < 0).any() for case in batched)


def test_attention_cases_include_decodes_on_and_just_past_a_block_edge() -> None:
    lengths = {int(n) for case in legal("paged_attention") for n in case.args["seq_lens"]}
    assert {1, BLOCK_SIZE, BLOCK_SIZE + 1} <= lengths


def test_fused_moe_cases_starve_an_expert_and_route_to_other_ranks() -> None:
    starved, remote = False, False
    for case in legal("fused_moe"):
        ids, expert_map = case.args["topk_ids"].long(), case.args.get("expert_map")
        local = ids if expert_map is None else expert_map.long()[ids]
        starved |= len(set(local[local >= 0].tolist())) < case.args["w13"].shape[0]
        remote |= bool((local < 0).any())
    assert starved and remote


def test_hash_routing_cases_mix_index_widths() -> None:
    hashed = [case for case in legal("moe_route") if case.args.get("token_ids") is not None]
    mixes = {(case.args["token_ids"].dtype, case.args["hash_table"].dtype) for case in hashed}
    assert mixes == {(a, b) for a in (torch.int32, torch.int64) for b in (torch.int32, torch.int64)}


@pytest.mark.parametrize("op", sorted(op for op, contract in CONTRACTS.items() if contract.dtype_groups))
def test_illegal_cases_split_every_dtype_group(op: str) -> None:
    split = {case.name.split(":")[1].split()[0] for case in cases(op) if case.name.startswith("mixed dtype group")}
    assert split == {group[1] for group in CONTRACTS[op].dtype_groups}
