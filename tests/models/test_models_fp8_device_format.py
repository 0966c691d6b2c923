"""The loader stores fp8 in the device's format: a backend that reports an e4m3fnuz
device (MI300-class) gets the checkpoint's e4m3fn weights through
`Backend.prepare_fp8_weight` and `quantization="fp8"` weights quantised in e4m3fnuz,
and the model still matches transformers' bf16 logits as the e4m3fn path does."""

from __future__ import annotations

import pytest
import torch

from accord.backends.cpu import CpuBackend
from accord.backends.triton.device import e4m3fn_to_e4m3fnuz
from accord.core.model_loader.load import load_model
from accord.op_contracts import OpDispatcher
from single_sequence import SingleSequenceRunner
from test_models_fp8 import (  # noqa: F401  (module fixtures: the tiny checkpoints)
    FP8_LOGITS_BOUND,
    bf16_deepseek,
    bf16_llama,
    fp8_deepseek,
    token_quantile_diff,
    token_stream,
    transformers_bf16_logits,
)


class FnuzDevice(CpuBackend):
    """The cpu kernels behind a device that computes fp8 as e4m3fnuz, recording what
    the loader hands its load-time conversion."""

    name = "cpu-fnuz"

    def __init__(self) -> None:
        super().__init__()
        self.prepared: list[torch.dtype] = []

    def fp8_dtype(self) -> torch.dtype:
        return torch.float8_e4m3fnuz

    def prepare_fp8_weight(self, weight: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.prepared.append(weight.dtype)
        return e4m3fn_to_e4m3fnuz(weight, scale)


def _load(model_dir, backend: FnuzDevice, quantization: str | None = None):
    return load_model(model_dir, OpDispatcher(backend, strict=True), dtype=torch.bfloat16, quantization=quantization).model


def test_checkpoint_fp8_goes_through_prepare_fp8_weight(fp8_deepseek):
    backend = FnuzDevice()
    model = _load(fp8_deepseek, backend)
    assert backend.prepared and set(backend.prepared) == {torch.float8_e4m3fn}
    assert model.layers[1].feed_forward.experts.w13.dtype == torch.float8_e4m3fnuz
    assert model.layers[1].attention.o_proj.weight.dtype == torch.float8_e4m3fnuz


def test_checkpoint_fp8_on_an_fnuz_device_stays_near_bf16(fp8_deepseek, bf16_deepseek):
    tokens = token_stream(bf16_deepseek)
    logits = SingleSequenceRunner(_load(fp8_deepseek, FnuzDevice()), len(tokens)).step(list(tokens))
    assert token_quantile_diff(logits, transformers_bf16_logits(bf16_deepseek, tokens)) < FP8_LOGITS_BOUND


@pytest.mark.parametrize("model", ["llama", "deepseek"])
def test_load_time_fp8_uses_the_devices_format(model, bf16_llama, bf16_deepseek):
    model_dir = bf16_llama if model == "llama" else bf16_deepseek
    backend = FnuzDevice()
    loaded = _load(model_dir, backend, quantization="fp8")
    assert loaded.layers[0].attention.o_proj.weight.dtype == torch.float8_e4m3fnuz
    assert not backend.prepared  # quantised straight into e4m3fnuz: nothing to convert
    tokens = token_stream(model_dir)
    logits = SingleSequenceRunner(loaded, len(tokens)).step(list(tokens))
    assert token_quantile_diff(logits, transformers_bf16_logits(model_dir, tokens)) < FP8_LOGITS_BOUND
