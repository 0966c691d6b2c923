"""Tensor parallelism over a GGUF file: each rank asks the checkpoint for only its slices
of the split tensors (read_slice, whose blocks-only dequantisation tests/gguf checks),
and `LLM(file.gguf, tensor_parallel_size=2)` generates the greedy tokens tp=1 does,
under chunked prefill, prefix caching and preemption."""

from __future__ import annotations

from pathlib import Path

import pytest
from gguf_files import Q, build_model, write_gguf
from test_executor_mp import PRESSURE, generate
from test_shard_loading import RANK1_OF_2, SPLIT
from test_tp_llm import tp2_mp_greedy_under_pressure

from accord import LLM
from accord.backends import get_backend
from accord.core.model_loader.gguf import open_gguf_model
from accord.core.model_loader.gguf.checkpoint import GgufCheckpoint
from accord.core.model_loader.load import load_model
from accord.op_contracts import OpDispatcher


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory):
    """`tiny_gguf(type)`: a tiny llama GGUF file (4 heads, 2 kv heads) with matrices in `type`."""

    def get(tensor_type: Q) -> Path:
        path = tmp_path_factory.mktemp("tp-gguf") / f"tiny-{tensor_type.name}.gguf"
        return write_gguf(path, build_model("llama"), "llama", tensor_type)

    return get


def test_a_rank_reads_only_its_slices_of_a_gguf_file(tiny_gguf, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tiny_gguf(Q.Q8_0)
    reads: dict[str, list[tuple[int, int]]] = {}
    real_read_slice = GgufCheckpoint.read_slice

    def logged(self: GgufCheckpoint, name: str, dim: int, start: int, stop: int):
        reads.setdefault(name, []).append((dim, stop - start))
        return real_read_slice(self, name, dim, start, stop)

    monkeypatch.setattr(GgufCheckpoint, "read_slice", logged)
    monkeypatch.setenv("ACCORD_GGUF_PACKED", "0")  # every tensor through read_slice (packed: tests/quant)
    load_model(path, OpDispatcher(get_backend("cpu")), dtype="float32", parallel=RANK1_OF_2)
    checkpoint = open_gguf_model(path).checkpoint
    shapes = {name: checkpoint.shape(name) for name in checkpoint.names()}
    split = {name for name in shapes if SPLIT.search(name)}
    assert split and set(reads) == set(shapes)
    for name, shape in shapes.items():
        (dim, extent), = reads[name]
        assert extent == (shape[dim] // 2 if name in split else shape[dim]), (name, dim, extent)


# Q4_K's 256-wide blocks are wider than a rank's 128 o_proj columns, so that slice is
# cut out of whole blocks; Q8_0's 32-wide blocks split exactly.
@pytest.mark.slow
@pytest.mark.parametrize("tensor_type", [Q.Q4_K, Q.Q8_0], ids=lambda t: t.name)
def test_tp2_greedy_on_a_quantised_gguf_equals_tp1(tensor_type: Q, tiny_gguf, monkeypatch) -> None:
    # The dequantised path, exact to fp32 rounding across TP sizes. Packed, this model's
    # first-token logprobs under TP=2 differ from TP=1's by up to 4e-3 (dequantised: 4e-6),
    # and its greedy tokens part at a near tie: not yet explained (docs/quantization.md).
    monkeypatch.setenv("ACCORD_GGUF_PACKED", "0")
    path = str(tiny_gguf(tensor_type))
    prompts, tp2_tokens = tp2_mp_greedy_under_pressure(path, dtype="float32")
    assert tp2_tokens == generate(LLM(path, **PRESSURE, dtype="float32"), prompts)
