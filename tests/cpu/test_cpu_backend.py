"""What the cpu backend decides besides kernels: the dtype models compute in, and the
completeness of its kernel table."""

from __future__ import annotations

import pytest
import torch

from accord.backends.cpu import capability
from accord.backends import get_backend
from accord.op_contracts import CONTRACTS

#: Decides by the CPU's ISA: `.ci/run` reruns it as on each kind of CPU (tests/conftest.py).
pytestmark = pytest.mark.isa


@pytest.mark.parametrize("half", [torch.bfloat16, torch.float16])
def test_half_models_compute_in_fp32_without_native_bf16(monkeypatch, half) -> None:
    monkeypatch.setattr(capability, "cpu_has_native_bf16", lambda: False)
    assert get_backend("cpu").compute_dtype(half) == torch.float32


@pytest.mark.parametrize("half", [torch.bfloat16, torch.float16])
def test_half_models_stay_half_with_native_bf16(monkeypatch, half) -> None:
    monkeypatch.setattr(capability, "cpu_has_native_bf16", lambda: True)
    assert get_backend("cpu").compute_dtype(half) == half


def test_fp32_models_compute_in_fp32() -> None:
    assert get_backend("cpu").compute_dtype(torch.float32) == torch.float32


def test_every_contract_has_a_cpu_kernel() -> None:
    assert set(get_backend("cpu").kernels().ops()) == set(CONTRACTS)
