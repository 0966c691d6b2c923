"""The contracts as torch.library custom ops (accord.op_contracts.torch_ops), what a
compiled dispatcher's traced calls become: a call runs the dispatcher's kernel,
refusals stay ContractErrors, the fake implementation the
compiler traces with gives the contract's output shapes and refuses what the contract
refuses, and a cache the op writes is declared mutated."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from accord.backends.registry import get_backend
from accord.op_contracts import CONTRACTS, ContractError, OpDispatcher
from accord.op_contracts.torch_ops import register_contract_ops, traced_call


@pytest.fixture(scope="module")
def ops() -> OpDispatcher:
    return OpDispatcher(get_backend("reference"), strict=True, compiled=True)


def test_custom_op_runs_the_dispatchers_kernel(ops: OpDispatcher) -> None:
    x, residual, weight = torch.randn(5, 32), torch.randn(5, 32), torch.rand(32) + 0.5
    out, new_residual = torch.ops.accord.fused_add_rms_norm(ops.key, x, residual, weight, 1e-5)
    summed = x + residual
    expected = summed * torch.rsqrt(summed.pow(2).mean(-1, keepdim=True) + 1e-5) * weight
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(new_residual, summed)


def test_refused_call_raises_the_contract_error(ops: OpDispatcher) -> None:
    rms_norm = CONTRACTS["rms_norm"]
    with pytest.raises(ContractError, match="weight"):
        traced_call(ops, rms_norm, (torch.randn(4, 32), torch.randn(31)), {"eps": 1e-6})
    with pytest.raises(ContractError, match="unknown argument"):
        traced_call(ops, rms_norm, (torch.randn(4, 32), torch.randn(32)), {"epsilon": 1e-6})


def test_fake_gives_contract_shapes_and_refuses(ops: OpDispatcher) -> None:
    with FakeTensorMode():
        logits = torch.empty(3, 50)
        token_ids, logprobs, top_logprobs, top_ids = torch.ops.accord.sample(
            0, logits, torch.empty(3), torch.empty(3, dtype=torch.int32), torch.empty(3), torch.empty(3),
            torch.empty(3, dtype=torch.int64), 5,
        )
        assert (token_ids.shape, token_ids.dtype) == ((3,), torch.int64)
        assert (top_logprobs.shape, top_ids.dtype) == ((3, 5), torch.int64)
        with pytest.raises(ContractError, match="weight"):
            torch.ops.accord.rms_norm(0, torch.empty(4, 32), torch.empty(31), 1e-6)


def test_written_caches_are_declared_mutated() -> None:
    register_contract_ops()
    schema = torch.ops.accord.reshape_and_cache.default._schema
    written = {arg.name for arg in schema.arguments if arg.alias_info is not None and arg.alias_info.is_write}
    assert written == {spec.name for spec in CONTRACTS["reshape_and_cache"].tensors if spec.mutated}
    assert written  # the contract does mark its caches


def test_eager_calls_on_a_compiled_dispatcher_take_the_fast_path() -> None:
    """Outside a trace a compiled dispatcher's handle runs as any other: its second call
    of a signature is the fast path, not the custom op."""
    handle = OpDispatcher(get_backend("reference"), strict=False, compiled=True).rms_norm
    x, weight = torch.randn(3, 16), torch.rand(16) + 0.5
    first, second = handle(x, weight, 1e-6), handle(x, weight, 1e-6)
    assert handle.fast_paths == 1
    torch.testing.assert_close(first, second)
