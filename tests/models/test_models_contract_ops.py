"""What `--backend auto` asks of a backend for a model: the op contracts its graph
calls, answered from config.json alone (`worker_contract_ops`), are the ops a worker's
profile run of that model really calls (recorded), for every family, with fp8 linears
where the checkpoint or the load quantises."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

from accord.backends import get_backend
from accord.core.config import EngineConfig
from accord.core.worker.contract_ops import SAMPLER_OPS, worker_contract_ops
from accord.core.worker.worker import Worker
from accord.op_contracts.recording import read_recordings
from deepseek_v4_models import build_v4_dir
from tiny_models import build_tiny_model, write_block_fp8


def recorded_graph_ops(model_dir: Path, calls: Path, quantization: str | None = None) -> set[str]:
    """The ops one worker's profile run of `model_dir` called on the reference backend."""
    config = EngineConfig(
        model=str(model_dir), max_model_len=64, max_num_seqs=2, max_num_batched_tokens=32, record_op_calls=str(calls),
        quantization=quantization,  # type: ignore[arg-type]
    )
    Worker(config, lambda: get_backend("reference")).determine_num_blocks(32)
    return {call.op for rank_calls in read_recordings(calls).values() for call in rank_calls}


@pytest.mark.parametrize("name", ["llama", "qwen2", "qwen3", "mixtral", "qwen3_moe", "deepseek_v3"])
def test_each_family_declares_the_ops_its_graph_calls(
    name: str, checkpoint: Callable[[str], Path], tmp_path: Path
) -> None:
    model_dir = checkpoint(name)
    assert recorded_graph_ops(model_dir, tmp_path / "calls") == worker_contract_ops(model_dir) - SAMPLER_OPS


@pytest.mark.slow
def test_deepseek_v4_declares_the_ops_its_graph_calls(tmp_path: Path) -> None:
    model_dir = build_v4_dir(tmp_path / "v4")
    assert recorded_graph_ops(model_dir, tmp_path / "calls") == worker_contract_ops(model_dir) - SAMPLER_OPS


def test_fp8_linears_join_for_a_block_fp8_checkpoint_and_for_fp8_at_load(
    checkpoint: Callable[[str], Path], tmp_path: Path
) -> None:
    bf16 = tmp_path / "deepseek"
    build_tiny_model("deepseek_v3", moe_intermediate_size=128).save_pretrained(bf16)
    (tmp_path / "deepseek_fp8").mkdir()
    block_fp8 = write_block_fp8(bf16, tmp_path / "deepseek_fp8")
    assert {"quantize_fp8", "scaled_mm"} <= worker_contract_ops(block_fp8)
    assert recorded_graph_ops(block_fp8, tmp_path / "block") == worker_contract_ops(block_fp8) - SAMPLER_OPS
    llama = checkpoint("llama")
    assert not {"quantize_fp8", "scaled_mm"} & worker_contract_ops(llama)
    recorded = recorded_graph_ops(llama, tmp_path / "at_load", quantization="fp8")
    assert recorded == worker_contract_ops(llama, "fp8") - SAMPLER_OPS
