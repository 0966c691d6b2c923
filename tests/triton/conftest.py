"""Fixtures for the Triton kernels' tests: they run under the Triton interpreter on the
CPU (no GPU on CI), compared with the reference backend through strict dispatchers.

Triton picks interpreter or compiler when a kernel is decorated, so TRITON_INTERPRET is
set here, before anything imports the kernel modules; if they were imported earlier
without it (another test in this process), the tests skip with that reason.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from accord.backends import get_backend  # noqa: E402
from accord.op_contracts import CONTRACTS, OpDispatcher  # noqa: E402

pytest.importorskip("triton", reason="the triton extra is not installed")

_IMPORTED_COMPILED = (
    "accord.backends.triton.kernels" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1"
)


def nmse(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Normalised mean squared error, sum((out-ref)^2) / sum(ref^2), in fp64."""
    out64, ref64 = out.double(), ref.double()
    return ((out64 - ref64).pow(2).sum() / ref64.pow(2).sum().clamp_min(1e-30)).item()


@pytest.fixture(scope="session")
def nmse_of() -> Callable[[torch.Tensor, torch.Tensor], float]:
    """`nmse`, for tests that hold an output to a bound of their own."""
    return nmse


@pytest.fixture(scope="session")
def triton_ops() -> OpDispatcher:
    """The triton backend (on the interpreter) behind a dispatcher that validates every call."""
    if _IMPORTED_COMPILED:
        pytest.skip("the Triton kernels were imported without TRITON_INTERPRET=1 in this process")
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("no GPU run configured: the Triton tests run under TRITON_INTERPRET=1")
    return OpDispatcher(get_backend("triton"), strict=True)


@pytest.fixture(scope="session")
def reference_ops() -> OpDispatcher:
    """The golden: the reference backend behind a strict dispatcher."""
    return OpDispatcher(get_backend("reference"), strict=True)


@pytest.fixture
def assert_matches_reference(triton_ops: OpDispatcher, reference_ops: OpDispatcher) -> Callable[..., None]:
    """Run an op on both backends and check every output against the reference with
    the contract's tolerance for the call's dtypes, NaN-free and at the same dtype."""

    def check(op: str, *args: Any, **kwargs: Any) -> None:
        got, want = getattr(triton_ops, op)(*args, **kwargs), getattr(reference_ops, op)(*args, **kwargs)
        got = got if isinstance(got, tuple) else (got,)
        want = want if isinstance(want, tuple) else (want,)
        contract = CONTRACTS[op]
        call = reference_ops.bind(contract, args, kwargs)
        dtypes = {t.name: None if call[t.name] is None else call[t.name].dtype for t in contract.tensors}
        dtypes.update({o.name: w.dtype for o, w in zip(contract.outputs, want)})
        override = triton_ops.backend.tolerance_override(op, {n: d for n, d in dtypes.items() if d is not None})
        bound = contract.tolerance_for(dtypes) if override is None else override.nmse
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and g.shape == w.shape
            assert not torch.isnan(g.float()).any(), f"{op}: NaN in the Triton output"
            if g.dtype in (torch.int32, torch.int64) or bound == 0.0:
                torch.testing.assert_close(g.float(), w.float(), rtol=0, atol=0)
            else:
                assert nmse(g, w) <= bound, f"{op}: nmse {nmse(g, w):.3g} > {bound:.3g}"

    return check

