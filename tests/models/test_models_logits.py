"""A bf16 model's logits are fp32: its LM head sums the bf16 products in fp32 and rounds
once, to fp32, never to bf16 (which ties tokens closer than a bf16 ulp, as it tied the
default model's first answer token). Checked on every cpu path (native bf16 with and
without the bf16-copy GEMM, bf16 computed in fp32) and on the reference backend, against
the head weight as transformers loads it, times the same rows, in fp64."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from accord.backends import get_backend
from accord.conformance.compare import nmse
from accord.core.model_loader.load import load_model
from accord.op_contracts import CONTRACTS, OpDispatcher
from tiny_models import build_tiny_model, load_transformers

pytestmark = pytest.mark.isa

#: The contract's bound for an fp32 output (a bf16 rounding of the logits exceeds it).
FP32_LOGITS_BOUND = CONTRACTS["linear"].tolerance[torch.float32]
ROWS = (1, 4, 33)


@pytest.fixture(scope="module")
def bf16_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("llama-bf16")
    build_tiny_model("llama").to(torch.bfloat16).save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def head_weight(bf16_checkpoint: Path) -> torch.Tensor:
    return load_transformers(bf16_checkpoint, torch.bfloat16).lm_head.weight.detach()


@pytest.fixture(params=["native", "native without bf16 copies", "fp32"])
def cpu_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The cpu backend on one bf16 path; "without bf16 copies" reports an AVX2 CPU, so
    the weights are prepacked for oneDNN alone."""
    request.getfixturevalue("forced_fp32_bf16" if request.param == "fp32" else "forced_native_bf16")
    if request.param == "native without bf16 copies":
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    return request.param


def logits_and_expected(checkpoint: Path, head_weight: torch.Tensor, backend: str, rows: int):
    engine_backend = get_backend(backend)
    loaded = load_model(checkpoint, OpDispatcher(engine_backend, strict=True), dtype="bfloat16",
                        compute_dtype=engine_backend.compute_dtype)
    hidden = torch.randn(rows, loaded.config.hidden_size, generator=torch.Generator().manual_seed(rows))
    hidden = hidden.bfloat16().to(loaded.config.dtype)  # bf16 values, in the dtype the model computes in
    expected = (hidden.double() @ head_weight.double().t()).float()
    return loaded.model.compute_logits(hidden), expected


@pytest.mark.parametrize("rows", ROWS)
def test_cpu_logits_of_a_bf16_model_are_fp32(bf16_checkpoint, head_weight, cpu_path: str, rows: int) -> None:
    logits, expected = logits_and_expected(bf16_checkpoint, head_weight, "cpu", rows)
    assert logits.dtype == torch.float32
    assert nmse(logits, expected) <= FP32_LOGITS_BOUND
    # What the check tells apart: the same logits rounded to bf16.
    assert nmse(expected.bfloat16().float(), expected) > FP32_LOGITS_BOUND


@pytest.mark.parametrize("rows", ROWS)
def test_reference_logits_of_a_bf16_model_are_fp32(bf16_checkpoint, head_weight, rows: int) -> None:
    logits, expected = logits_and_expected(bf16_checkpoint, head_weight, "reference", rows)
    assert logits.dtype == torch.float32
    assert nmse(logits, expected) <= FP32_LOGITS_BOUND
