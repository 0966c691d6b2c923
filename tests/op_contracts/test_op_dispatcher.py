"""The dispatcher: validation on first sight, caching per signature, strict mode,
declared adapters, and ContractErrors that name op, argument, expected and got."""

from __future__ import annotations

import logging

import pytest
import torch

from accord.op_contracts import CastAdapter, ContractError, KernelSet, OpDispatcher


class CountingBackend:
    """A minimal kernel provider whose rms_norm and moe-like kernels count their calls."""

    name = "counting"
    device_type = "cpu"

    def __init__(self, kernels: KernelSet) -> None:
        self.kernels = kernels

    def kernel_for(self, op: str):
        return self.kernels.get(op)


def make_rms_backend(calls: list[torch.dtype]) -> CountingBackend:
    kernels = KernelSet()

    @kernels.register("rms_norm")
    def rms_norm(x, weight, eps, out):
        calls.append(x.dtype)
        out.copy_(x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight)

    return CountingBackend(kernels)


def make_int32_router_backend(seen: list[torch.dtype]) -> CountingBackend:
    """A fused_moe kernel that takes int32 topk_ids only and declares the cast."""
    kernels = KernelSet()

    @kernels.register(
        "fused_moe",
        claims={"topk_ids": (torch.int32,)},
        adapters=(CastAdapter("topk_ids", torch.int32),),
    )
    def fused_moe(hidden, w13, w2, topk_weights, topk_ids, expert_map, w13_scale, w2_scale, activation, swiglu_limit, out):
        seen.append(topk_ids.dtype)
        out.zero_()

    return CountingBackend(kernels)


def moe_args(ids_dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    tokens, hidden, inter, experts, top_k = 3, 8, 4, 2, 1
    return (
        torch.randn(tokens, hidden),
        torch.randn(experts, 2 * inter, hidden),
        torch.randn(experts, hidden, inter),
        torch.ones(tokens, top_k),
        torch.zeros(tokens, top_k, dtype=ids_dtype),
    )


def test_valid_call_returns_output_at_contract_dtype_and_shape():
    ops = OpDispatcher(make_rms_backend([]))
    out = ops.rms_norm(torch.randn(5, 8, dtype=torch.float16), torch.ones(8, dtype=torch.float16))
    assert out.dtype == torch.float16 and out.shape == (5, 8)


def test_mixed_dtype_group_is_refused_naming_op_arg_expected_and_got():
    calls: list[torch.dtype] = []
    ops = OpDispatcher(make_rms_backend(calls))
    with pytest.raises(ContractError) as info:
        ops.rms_norm(torch.randn(2, 8), torch.ones(8, dtype=torch.bfloat16))
    error = info.value
    assert (error.op, error.arg, error.backend) == ("rms_norm", "weight", "counting")
    assert "fp32" in error.expected and error.got == "bf16"
    assert calls == [], "an illegal call must never reach the kernel"


def test_shape_mismatch_is_refused():
    ops = OpDispatcher(make_rms_backend([]))
    with pytest.raises(ContractError, match=r"rms_norm: weight expected dim 0 = H = 8"):
        ops.rms_norm(torch.randn(2, 8), torch.ones(7))


def test_wrong_rank_and_missing_tensor_and_unknown_argument_are_refused():
    ops = OpDispatcher(make_rms_backend([]))
    with pytest.raises(ContractError, match="rank 2"):
        ops.rms_norm(torch.randn(8), torch.ones(8))
    with pytest.raises(ContractError, match="weight expected a tensor, got absent"):
        ops.rms_norm(torch.randn(2, 8))
    with pytest.raises(ContractError, match="an unknown argument"):
        ops.rms_norm(torch.randn(2, 8), torch.ones(8), epsilon=1e-5)


def test_param_type_and_choice_are_checked():
    ops = OpDispatcher(make_rms_backend([]))
    with pytest.raises(ContractError, match="eps expected float"):
        ops.rms_norm(torch.randn(2, 8), torch.ones(8), eps="small")


def test_first_sight_is_cached_so_later_calls_skip_validation(monkeypatch):
    from accord.op_contracts import dispatcher as dispatcher_module

    validations = []
    real = dispatcher_module.validate_call
    monkeypatch.setattr(dispatcher_module, "validate_call", lambda c, call: validations.append(1) or real(c, call))
    ops = OpDispatcher(make_rms_backend([]), strict=False)
    for tokens in (1, 2, 3):
        ops.rms_norm(torch.randn(tokens, 8), torch.ones(8))
    assert len(validations) == 1
    ops.rms_norm(torch.randn(2, 8, dtype=torch.float16), torch.ones(8, dtype=torch.float16))
    assert len(validations) == 2, "a new signature is validated again"


def test_strict_mode_validates_every_call_and_catches_shape_drift():
    ops = OpDispatcher(make_rms_backend([]), strict=True)
    ops.rms_norm(torch.randn(2, 8), torch.ones(8))
    with pytest.raises(ContractError):
        ops.rms_norm(torch.randn(2, 8), torch.ones(9))  # same signature, bad shape


def test_strict_mode_follows_the_environment_variable(monkeypatch):
    monkeypatch.setenv("ACCORD_STRICT_CONTRACTS", "1")
    assert OpDispatcher(make_rms_backend([])).strict
    monkeypatch.setenv("ACCORD_STRICT_CONTRACTS", "0")
    assert not OpDispatcher(make_rms_backend([])).strict


def test_missing_kernel_is_an_error_not_a_fallback():
    ops = OpDispatcher(make_rms_backend([]))
    with pytest.raises(ContractError, match="no silent fallback"):
        ops.silu_and_mul(torch.randn(2, 8))


def test_declared_adapter_casts_at_the_boundary_logs_once_and_counts(caplog):
    seen: list[torch.dtype] = []
    ops = OpDispatcher(make_int32_router_backend(seen))
    with caplog.at_level(logging.WARNING, logger="accord.contracts"):
        for _ in range(3):
            ops.fused_moe(*moe_args(torch.int64))
    assert seen == [torch.int32] * 3
    adapter_logs = [r for r in caplog.records if "adapter" in r.getMessage()]
    assert len(adapter_logs) == 1 and "topk_ids int64->int32" in adapter_logs[0].getMessage()
    assert ops.adapter_counts["fused_moe.topk_ids"] == 3


def test_claimed_dtype_needs_no_adapter():
    seen: list[torch.dtype] = []
    ops = OpDispatcher(make_int32_router_backend(seen))
    ops.fused_moe(*moe_args(torch.int32))
    assert seen == [torch.int32] and not ops.adapter_counts


def test_unclaimed_dtype_without_adapter_is_refused_before_the_kernel():
    calls: list[torch.dtype] = []
    backend = make_rms_backend(calls)
    kernel = backend.kernels.get("rms_norm")
    narrowed = KernelSet()
    narrowed.register("rms_norm", claims={"x": (torch.float32,)})(kernel.fn)
    backend.kernels = narrowed
    ops = OpDispatcher(backend)
    with pytest.raises(ContractError, match="kernel claims fp32 only") as info:
        ops.rms_norm(torch.randn(2, 8, dtype=torch.bfloat16), torch.ones(8, dtype=torch.bfloat16))
    assert info.value.arg == "x" and calls == []


def test_output_width_is_chosen_by_the_caller_not_inferred():
    from accord.backends import get_backend

    ops = OpDispatcher(get_backend("reference"))
    logits = torch.randn(4, 8)
    for ids_dtype in (torch.int32, torch.int64):
        weights, ids = ops.moe_route(logits, top_k=2, ids_dtype=ids_dtype)
        assert ids.dtype == ids_dtype and weights.dtype == torch.float32


def test_tensor_on_wrong_device_type_is_refused():
    class MetaBackend(CountingBackend):
        device_type = "meta"

    ops = OpDispatcher(MetaBackend(make_rms_backend([]).kernels))
    with pytest.raises(ContractError, match="a tensor on meta"):
        ops.rms_norm(torch.randn(2, 8), torch.ones(8))
