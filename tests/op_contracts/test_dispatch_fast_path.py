"""The dispatcher's call-site fast path: after a signature's first call, positional
calls of it skip binding and validation, give the bits the full path gives for every
op's conformance cases, and a call of any other signature is validated again."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from accord.backends import get_backend
from accord.conformance.cases import GENERATORS
from accord.conformance.compare import same_bits
from accord.op_contracts import CONTRACTS, ContractError, OpDispatcher


def _as_tuple(value: Any) -> tuple[Any, ...]:
    return value if isinstance(value, tuple) else () if value is None else (value,)


@pytest.mark.parametrize("op", sorted(CONTRACTS))
def test_fast_path_gives_the_full_paths_bits_for_every_op(op: str) -> None:
    contract = CONTRACTS[op]
    fast = getattr(OpDispatcher(get_backend("cpu"), strict=False), op)
    full = OpDispatcher(get_backend("cpu"), strict=True)
    for case in list(GENERATORS[op](0))[:3]:
        # Every argument (defaults filled in), positionally: the form the fast path serves.
        def fresh() -> dict[str, Any]:
            return full.bind(contract, (), case.fresh_args())

        def positional(args: dict[str, Any]) -> list[Any]:
            return [args[name] for name in contract.arg_names]

        fast(*positional(fresh()))  # first sight: the full path, which compiles the fast one
        fast_args, full_args = fresh(), fresh()
        got = _as_tuple(fast(*positional(fast_args)))
        want = _as_tuple(full.call(contract, (), full_args))
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == w.dtype and same_bits(g, w), f"{op} {case.name}"
        for spec in contract.tensors:
            if spec.mutated and fast_args[spec.name] is not None:
                assert same_bits(fast_args[spec.name], full_args[spec.name]), f"{op} {case.name}: {spec.name}"
    assert 0 < fast.fast_paths <= 4


def test_steady_state_calls_skip_validation(monkeypatch) -> None:
    handle = OpDispatcher(get_backend("cpu"), strict=False).rms_norm
    x, w = torch.randn(3, 8), torch.randn(8)
    handle(x, w, 1e-6)
    import accord.op_contracts.dispatcher as dispatcher

    def refuse(*_: Any) -> None:
        raise AssertionError("validated a signature the handle has seen")

    monkeypatch.setattr(dispatcher, "validate_call", refuse)
    out = handle(torch.randn(5, 8), w, 1e-5)
    assert out.shape == (5, 8) and handle.fast_paths == 1


@pytest.mark.parametrize(
    "changed",
    [
        lambda x, w: (x.int(), w),  # dtype
        lambda x, w: (x[None], w),  # rank
        lambda x, w: (x.t(), w[:4]),  # contiguity
        lambda x, w: (x, w.double()),  # dtype outside the contract
        lambda x, w: (x, None),  # an absent required tensor
        lambda x, w: (x, [1.0] * 8),  # not a tensor
        lambda x, w: (x, w.bfloat16()),  # the dtype group broken
    ],
)
def test_a_changed_signature_is_validated_and_refused(changed) -> None:
    handle = OpDispatcher(get_backend("cpu"), strict=False).rms_norm
    x, w = torch.randn(4, 8), torch.randn(8)
    handle(x, w, 1e-6)
    handle(x, w, 1e-6)
    with pytest.raises(ContractError, match="rms_norm"):
        handle(*changed(x, w), 1e-6)


def test_a_changed_code_path_parameter_is_a_new_signature() -> None:
    ops = OpDispatcher(get_backend("cpu"), strict=False)
    positions, q, k = torch.tensor([0, 3]), torch.randn(2, 2, 8), torch.randn(2, 1, 8)
    table = torch.randn(16, 8)
    neox = ops.rotary_embedding(positions, q, k, table, True)
    gptj = ops.rotary_embedding(positions, q, k, table, False)
    golden = OpDispatcher(get_backend("reference"), strict=True)
    assert torch.allclose(gptj[0], golden.rotary_embedding(positions, q, k, table, is_neox=False)[0], atol=1e-5)
    assert not torch.allclose(neox[0], gptj[0])
    assert ops.rotary_embedding.fast_paths == 2


def test_strict_mode_validates_every_call_of_a_seen_signature() -> None:
    handle = OpDispatcher(get_backend("cpu"), strict=True).linear
    w = torch.randn(6, 8)
    handle(torch.randn(2, 8), w, None)
    with pytest.raises(ContractError, match="linear"):
        handle(torch.randn(2, 7), w, None)  # same signature, a width the contract refuses
    assert handle.fast_paths == 0


def test_keyword_calls_take_a_fast_path_of_their_form(monkeypatch) -> None:
    ops = OpDispatcher(get_backend("cpu"), strict=False)
    golden = OpDispatcher(get_backend("reference"), strict=True)
    x, r, w = torch.randn(3, 8), torch.randn(3, 8), torch.randn(8)
    ops.fused_add_rms_norm(x, r, w, eps=1e-6)
    import accord.op_contracts.dispatcher as dispatcher

    def refuse(*_: Any) -> None:
        raise AssertionError("validated a signature the handle has seen")

    monkeypatch.setattr(dispatcher, "validate_call", refuse)
    x2, r2 = torch.randn(5, 8), torch.randn(5, 8)
    out, residual = ops.fused_add_rms_norm(x2, r2, w, eps=1e-5)
    monkeypatch.undo()
    want_out, want_residual = golden.fused_add_rms_norm(x2, r2, w, eps=1e-5)
    assert torch.allclose(out, want_out, atol=1e-5) and torch.allclose(residual, want_residual, atol=1e-6)
    assert ops.fused_add_rms_norm.fast_paths == 1
    # Another form of the same signature (the weight by name) compiles a path of its own.
    ops.fused_add_rms_norm(x2, r2, weight=w, eps=1e-5)
    ops.fused_add_rms_norm(x2, r2, weight=w, eps=1e-5)
    assert ops.fused_add_rms_norm.fast_paths == 2


@pytest.mark.parametrize(
    "changed",
    [
        lambda x, w: ((x.int(), w), {"eps": 1e-6}),  # dtype of a positional tensor
        lambda x, w: ((x,), {"weight": w.double(), "eps": 1e-6}),  # dtype of a keyword tensor
        lambda x, w: ((x,), {"weight": None, "eps": 1e-6}),  # an absent required tensor, by name
        lambda x, w: ((x, w), {"eps": 1e-6, "epsilon": 1e-6}),  # an unknown keyword
        lambda x, w: ((x, w), {"weight": w, "eps": 1e-6}),  # given positionally and by name
    ],
)
def test_a_changed_keyword_call_is_validated_and_refused(changed) -> None:
    ops = OpDispatcher(get_backend("cpu"), strict=False)
    x, w = torch.randn(4, 8), torch.randn(8)
    ops.rms_norm(x, w, eps=1e-6)
    ops.rms_norm(x, weight=w, eps=1e-6)
    ops.rms_norm(x, w, eps=1e-6)
    args, kwargs = changed(x, w)
    with pytest.raises(ContractError, match="rms_norm"):
        ops.rms_norm(*args, **kwargs)
