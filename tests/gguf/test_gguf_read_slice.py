"""A tensor-parallel rank's slice of a GGUF tensor: for every supported type and both
dims, `read_slice` equals the same slice of the whole dequantised tensor (q/k rows
un-permuted per head), and dequantises only the blocks that hold the slice."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf_files import Q, add_matrix

from accord.core.model_loader.gguf import SUPPORTED_TYPES, GgufError
from accord.core.model_loader.gguf.checkpoint import GgufCheckpoint
from accord.core.model_loader.gguf.reader import open_gguf

HEADS, KV_HEADS = 4, 2
ROWS, COLS = 256, 512  # q: 4 heads of 64 rows; two 256-wide K-quant blocks per row
Q_PROJ, DOWN, Q_BIAS = "model.layers.0.self_attn.q_proj", "model.layers.0.mlp.down_proj", "model.layers.0.self_attn.q_proj.bias"
#: (dim, start, stop): two-rank shards of either dim, a one-head shard, and column
#: slices that start or end inside a block (widened to block edges, then trimmed).
SLICES = [(0, 0, 128), (0, 128, 256), (0, 64, 128), (1, 0, 256), (1, 256, 512), (1, 128, 256), (1, 40, 300)]


def write_matrices(path: Path, tensor_type: Q) -> Path:
    """A llama GGUF holding q_proj and down_proj [ROWS, COLS] in `tensor_type` and an F32
    q bias, random values (random blocks where gguf-py cannot quantise the type)."""
    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(str(path), "llama")
    for name in ("blk.0.attn_q.weight", "blk.0.ffn_down.weight"):
        add_matrix(writer, name, rng.normal(0.0, 0.1, (ROWS, COLS)).astype(np.float32), tensor_type, rng)
    add_matrix(writer, "blk.0.attn_q.bias", rng.normal(0.0, 0.1, ROWS).astype(np.float32), Q.F32, rng)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory):
    """`checkpoints(type)`: a GgufCheckpoint of the matrices stored as `type`."""
    files: dict[Q, Path] = {}

    def get(tensor_type: Q) -> GgufCheckpoint:
        if tensor_type not in files:
            files[tensor_type] = write_matrices(tmp_path_factory.mktemp("slice") / f"{tensor_type.name}.gguf", tensor_type)
        return GgufCheckpoint(open_gguf(files[tensor_type]), HEADS, KV_HEADS)

    return get


def covering_bytes(tensor_type: Q, dim: int, start: int, stop: int) -> int:
    """Bytes of the stored blocks that hold [start, stop) of `dim` of a [ROWS, COLS] matrix."""
    block, block_bytes = gguf.GGML_QUANT_SIZES[tensor_type]
    row_bytes = COLS // block * block_bytes
    if dim == 0:
        return (stop - start) * row_bytes
    return ROWS * (-(-stop // block) - start // block) * block_bytes


def assert_slice_of_whole(checkpoint: GgufCheckpoint, name: str, dim: int, start: int, stop: int) -> None:
    index = (slice(None),) * dim + (slice(start, stop),)
    assert torch.equal(checkpoint.read_slice(name, dim, start, stop), checkpoint.read(name)[index])


@pytest.mark.parametrize("dim,start,stop", SLICES, ids=[f"dim{d}[{a}:{b}]" for d, a, b in SLICES])
@pytest.mark.parametrize("tensor_type", SUPPORTED_TYPES, ids=lambda t: t.name)
def test_a_slice_equals_the_slice_of_the_whole_tensor(tensor_type, dim, start, stop, checkpoints) -> None:
    assert_slice_of_whole(checkpoints(tensor_type), f"{DOWN}.weight", dim, start, stop)


# The per-head un-permutation of q/k rows does not depend on how the rows are stored.
@pytest.mark.parametrize("dim,start,stop", SLICES, ids=[f"dim{d}[{a}:{b}]" for d, a, b in SLICES])
@pytest.mark.parametrize("tensor_type", [Q.F32, Q.Q4_K], ids=lambda t: t.name)
def test_a_slice_of_q_rows_equals_the_slice_of_the_un_permuted_tensor(tensor_type, dim, start, stop, checkpoints) -> None:
    assert_slice_of_whole(checkpoints(tensor_type), f"{Q_PROJ}.weight", dim, start, stop)


@pytest.mark.parametrize("dim,start,stop", SLICES, ids=[f"dim{d}[{a}:{b}]" for d, a, b in SLICES])
@pytest.mark.parametrize("tensor_type", SUPPORTED_TYPES, ids=lambda t: t.name)
def test_a_slice_dequantises_only_the_blocks_that_hold_it(tensor_type, dim, start, stop, checkpoints, monkeypatch) -> None:
    checkpoint = checkpoints(tensor_type)
    dequantised: list[int] = []
    real = gguf.quants.dequantize

    def logged(data: np.ndarray, qtype: Q) -> np.ndarray:
        dequantised.append(data.nbytes)
        return real(data, qtype)

    monkeypatch.setattr(gguf.quants, "dequantize", logged)
    checkpoint.read_slice(f"{DOWN}.weight", dim, start, stop)
    assert dequantised == [covering_bytes(tensor_type, dim, start, stop)]


def test_a_slice_of_a_bias_is_un_permuted_per_head(checkpoints) -> None:
    assert_slice_of_whole(checkpoints(Q.F32), Q_BIAS, 0, 64, 192)


def test_a_slice_of_q_rows_that_splits_a_head_is_refused(checkpoints) -> None:
    with pytest.raises(GgufError, match=r"rows \[32:128\] of 'model.layers.0.self_attn.q_proj.weight' do not hold whole heads"):
        checkpoints(Q.Q8_0).read_slice(f"{Q_PROJ}.weight", 0, 32, 128)


@pytest.mark.parametrize("dim,start,stop", [(1, 0, 600), (2, 0, 1), (0, 64, 64)])
def test_a_slice_that_is_empty_or_outside_the_tensor_is_refused(dim, start, stop, checkpoints) -> None:
    with pytest.raises(GgufError, match=rf"slice \[{start}:{stop}\] of dim {dim} is empty or outside tensor"):
        checkpoints(Q.Q4_K).read_slice(f"{DOWN}.weight", dim, start, stop)
