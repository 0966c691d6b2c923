"""Fixtures for the cpu backend's tests: strict dispatchers on the cpu backend and on
the reference (the golden every cpu kernel is compared with)."""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch

from accord.backends import get_backend
from accord.op_contracts import CONTRACTS, OpDispatcher


@pytest.fixture(scope="session")
def cpu_ops() -> OpDispatcher:
    """The cpu backend behind a dispatcher that validates every call."""
    return OpDispatcher(get_backend("cpu"), strict=True)


@pytest.fixture(scope="session")
def reference_ops() -> OpDispatcher:
    """The reference backend behind a dispatcher that validates every call."""
    return OpDispatcher(get_backend("reference"), strict=True)


@pytest.fixture(autouse=True)
def seeded() -> None:
    """Every test draws the same random inputs on every run."""
    torch.manual_seed(0)


def nmse(got: torch.Tensor, want: torch.Tensor) -> float:
    """Normalised mean squared error, as the contracts' tolerances are stated."""
    got, want = got.double(), want.double()
    return float(((got - want) ** 2).sum() / (want**2).sum().clamp_min(1e-300))


@pytest.fixture(scope="session")
def nmse_of() -> Callable[[torch.Tensor, torch.Tensor], float]:
    """`nmse` for tests that call the two backends with different arguments."""
    return nmse


@pytest.fixture(scope="session")
def assert_matches_reference(
    cpu_ops: OpDispatcher, reference_ops: OpDispatcher
) -> Callable[..., tuple[Any, Any]]:
    """Run one op on both backends (on clones, so in-place cache writes do not leak
    between them) and assert every output is within the contract's NMSE bound for the
    call's dtypes. Returns (cpu outputs, reference outputs)."""

    def check(op: str, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        got = getattr(cpu_ops, op)(*_cloned(args), **_cloned(kwargs))
        want = getattr(reference_ops, op)(*_cloned(args), **_cloned(kwargs))
        contract = CONTRACTS[op]
        call = reference_ops.bind(contract, args, kwargs)
        dtypes = {s.name: getattr(call[s.name], "dtype", None) for s in contract.tensors}
        dtypes.update({o.name: w.dtype for o, w in zip(contract.outputs, _as_tuple(want))})
        bound = contract.tolerance_for(dtypes)
        for name, g, w in zip([o.name for o in contract.outputs], _as_tuple(got), _as_tuple(want)):
            assert not g.isnan().any(), f"{op}.{name} has NaNs"
            assert nmse(g, w) <= bound, f"{op}.{name}: nmse {nmse(g, w):.3g} > {bound:.3g}"
        return got, want

    return check


def _clone(value: Any) -> Any:
    return value.clone() if isinstance(value, torch.Tensor) else value


def _cloned(values: Any) -> Any:
    """Tensors among `values` (a tuple or a dict) cloned, everything else as is."""
    if isinstance(values, dict):
        return {name: _clone(v) for name, v in values.items()}
    return tuple(_clone(v) for v in values)


def _as_tuple(outputs: Any) -> tuple[torch.Tensor, ...]:
    return outputs if isinstance(outputs, tuple) else (outputs,)


@pytest.fixture(params=["c", "torch"])
def glue_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs a test once on each path of the cpu glue kernels: the C kernels of
    elementwise.c, and the torch path a host without a C compiler takes (the loader
    monkeypatched to find nothing)."""
    from accord.backends.cpu.kernels import _native_elementwise

    if request.param == "c" and _native_elementwise._library() is None:
        pytest.skip("no C compiler here: elementwise.c cannot be built, only the torch path runs")
    if request.param == "torch":
        monkeypatch.setattr(_native_elementwise, "_library", lambda: None)
    return request.param
