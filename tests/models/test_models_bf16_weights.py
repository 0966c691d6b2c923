"""A bf16 checkpoint on a CPU that computes bf16 in fp32: the cpu backend streams its
weights as bf16 for decode rows (fp32 activations and accumulation), and every decode
step's logits stay those of transformers running the same weights in fp32."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from accord.backends import get_backend
from accord.backends.cpu.kernels.linear import BF16_COPY, streams_bf16_weights
from accord.core.model_loader.load import load_model
from accord.op_contracts import OpDispatcher
from single_sequence import SingleSequenceRunner
from test_models_parity import FP32_BOUND, relative_max_diff
from tiny_models import NEW_TOKENS, PROMPT_LEN, build_tiny_model, fixed_prompt, load_transformers

pytestmark = [
    pytest.mark.isa,
    pytest.mark.skipif(
        not streams_bf16_weights(),
        reason="bf16 weights are streamed on fp32 activations only on AVX512 CPUs, with oneDNN and a C compiler",
    ),
    # As on a CPU that computes bf16 in fp32, whatever this host has (one with native bf16
    # computes this checkpoint in bf16).
    pytest.mark.usefixtures("forced_fp32_bf16"),
]


@pytest.fixture(scope="module")
def bf16_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("llama-bf16")
    build_tiny_model("llama").to(torch.bfloat16).save_pretrained(directory)
    return directory


def test_decode_steps_on_bf16_weights_match_transformers_in_fp32(bf16_checkpoint: Path) -> None:
    ops = OpDispatcher(get_backend("cpu"), strict=True)
    loaded = load_model(bf16_checkpoint, ops, dtype="auto", compute_dtype=get_backend("cpu").compute_dtype)
    assert loaded.config.dtype == torch.float32
    # The decode path under test is taken: the projections carry their bf16 copies.
    assert hasattr(loaded.model.layers[0].feed_forward.gate_up.weight, BF16_COPY)
    runner = SingleSequenceRunner(loaded.model, PROMPT_LEN + NEW_TOKENS)
    reference = load_transformers(bf16_checkpoint, torch.float32)
    with torch.no_grad():
        out = reference(torch.tensor([fixed_prompt()]), use_cache=True)
        runner.step(fixed_prompt())
        token = int(out.logits[0, -1].argmax())
        for _ in range(8):
            got = runner.step([token])[-1]
            out = reference(torch.tensor([[token]]), cache=out.cache, use_cache=True)
            want = out.logits[0, -1]
            assert relative_max_diff(got, want) < FP32_BOUND
            assert int(got.argmax()) == int(want.argmax())
            token = int(want.argmax())
