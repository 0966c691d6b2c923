"""A tensor-parallel rank's `read_packed` of a group-quantised linear (its output rows,
or its input channels on whole words and groups) is the matching cut of the whole
linear's read, dequantises to that slice of the weight the format's own writer says the
stored tensors hold (compressed-tensors' decompressor; AutoAWQ's and AutoGPTQ's packing
as test_awq_gptq_loading writes it), reads only the stored entries covering it, and a
cut no packed weight can hold is refused, naming the tensor."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from compressed_tensors_writer import quantization_config, quantiser, scheme
from safetensors.torch import save_file
from test_awq_gptq_loading import FORMATS

from accord.backends.reference.kernels.group_quant import dequantize
from accord.core.model_loader.group_quant.checkpoint import GroupQuantCheckpoint
from accord.core.model_loader.group_quant.scheme import group_quant_scheme
from accord.core.model_loader.hf_checkpoint import CheckpointError, SafetensorsCheckpoint
from accord.core.quantization import GroupQuantWeight

ROWS, DEPTH = 64, 256
PREFIX = "layer.proj"
WRITERS = {
    **FORMATS,
    "compressed-tensors w4 asym g32": (quantiser(scheme(4, False, 32)), quantization_config(4, False, 32)),
    "compressed-tensors w8 sym g128": (quantiser(scheme(8, True, 128)), quantization_config(8, True, 128)),
}
ACT_ORDER = "gptq int4 g32 act-order v1"
#: (dim, start, stop): halves of rows and of input channels as tp=2 cuts them, middle
#: rows, and rows off the words that pack 8 (4-bit) or 4 (8-bit) zero points or codes.
SHARDS = [(0, 0, 32), (0, 32, 64), (0, 16, 48), (0, 4, 36), (0, 3, 61), (1, 0, 128), (1, 128, 256)]
#: A stored word holds at most 8 channels: a read is widened by at most that each side.
WORD = 8


def stored_linear(tmp_path: Path, name: str) -> tuple[GroupQuantCheckpoint, torch.Tensor]:
    """One linear written by `name`'s writer, opened as the loader opens it, and the
    dequantised weight the writer says it stores."""
    writer, quant_config = WRITERS[name]
    weight = torch.randn(ROWS, DEPTH, generator=torch.Generator().manual_seed(len(name)))
    stored, expected = writer(weight)
    save_file({f"{PREFIX}.{part}": value.contiguous() for part, value in stored.items()}, tmp_path / "model.safetensors")
    chosen = group_quant_scheme(quant_config)
    assert chosen is not None
    return GroupQuantCheckpoint(SafetensorsCheckpoint(tmp_path), chosen), expected.float()


def read(checkpoint: GroupQuantCheckpoint, dim: int, start: int, stop: int) -> GroupQuantWeight:
    weight = checkpoint.read_packed(f"{PREFIX}.weight", dim, start, stop)
    assert weight is not None
    return weight


def dense(w: GroupQuantWeight) -> torch.Tensor:
    return dequantize(w.qweight, w.scales, w.zeros, w.g_idx, w.bits, w.group_size, w.in_features)


def fields(weight: GroupQuantWeight) -> dict:
    return {field.name: getattr(weight, field.name) for field in dataclasses.fields(weight)}


@pytest.mark.parametrize("name", WRITERS)
@pytest.mark.parametrize("shard", SHARDS, ids=lambda s: f"dim{s[0]}[{s[1]}:{s[2]}]")
def test_a_shard_is_that_cut_of_the_whole_read(tmp_path: Path, name: str, shard) -> None:
    checkpoint, _ = stored_linear(tmp_path, name)
    dim, start, stop = shard
    whole = read(checkpoint, 0, 0, ROWS)
    cut = whole.rows(start, stop) if dim == 0 else whole.columns(start, stop)
    got, want = fields(read(checkpoint, *shard)), fields(cut)
    assert got.keys() == want.keys()
    for part, value in want.items():
        if isinstance(value, torch.Tensor):
            # Contiguous too: the kernels' contract takes no strided views.
            assert got[part].dtype == value.dtype and torch.equal(got[part], value), part
            assert got[part].is_contiguous(), part
        else:
            assert got[part] == value, part


@pytest.mark.parametrize("name", WRITERS)
@pytest.mark.parametrize("shard", SHARDS, ids=lambda s: f"dim{s[0]}[{s[1]}:{s[2]}]")
def test_a_shard_dequantises_to_the_slice_of_the_written_weight(tmp_path: Path, name: str, shard) -> None:
    checkpoint, expected = stored_linear(tmp_path, name)
    dim, start, stop = shard
    got = dense(read(checkpoint, *shard)).float()
    torch.testing.assert_close(got, expected.narrow(dim, start, stop - start), rtol=0, atol=1e-6)


@pytest.mark.parametrize("start", [8, 40])
def test_act_order_input_channels_need_only_whole_words(tmp_path: Path, start: int) -> None:
    # With g_idx every group stays with every shard, so a cut through a group is fine.
    checkpoint, expected = stored_linear(tmp_path, ACT_ORDER)
    weight = read(checkpoint, 1, start, 200)
    assert weight.scales.shape[1] == DEPTH // 32
    torch.testing.assert_close(dense(weight).float(), expected[:, start:200], rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", WRITERS)
@pytest.mark.parametrize("shard", [(0, 32, 64), (0, 4, 36), (1, 128, 256)], ids=str)
def test_a_shard_reads_only_the_stored_entries_covering_it(tmp_path: Path, name: str, shard, monkeypatch) -> None:
    checkpoint, _ = stored_linear(tmp_path, name)
    whole_reads: list[str] = []
    slices: list[tuple[str, int, int, int]] = []
    read_whole, read_slice = SafetensorsCheckpoint.read, SafetensorsCheckpoint.read_slice
    monkeypatch.setattr(SafetensorsCheckpoint, "read", lambda self, n: whole_reads.append(n) or read_whole(self, n))
    monkeypatch.setattr(
        SafetensorsCheckpoint, "read_slice",
        lambda self, n, d, a, b: slices.append((n, d, a, b)) or read_slice(self, n, d, a, b),
    )
    read(checkpoint, *shard)
    marker = f"{PREFIX}.{'weight_packed' if name.startswith('compressed') else 'qweight'}"
    assert marker not in whole_reads
    (codes,) = [(dim, start, stop) for n, dim, start, stop in slices if n == marker]
    stored, extent = checkpoint.checkpoint.shape(marker)[codes[0]], (ROWS, DEPTH)[shard[0]]
    assert codes[2] - codes[1] <= (shard[2] - shard[1] + 2 * WORD) * stored // extent < stored


def test_input_channels_cut_through_a_group_are_refused_naming_the_tensor(tmp_path: Path) -> None:
    checkpoint, _ = stored_linear(tmp_path, "compressed-tensors w8 sym g128")
    with pytest.raises(CheckpointError, match=r"layer.proj.weight cannot be split.*\[64:192\] of 256 split a group"):
        read(checkpoint, 1, 64, 192)


def test_act_order_input_channels_cut_through_a_word_are_refused(tmp_path: Path) -> None:
    checkpoint, _ = stored_linear(tmp_path, ACT_ORDER)
    with pytest.raises(CheckpointError, match=r"layer.proj.weight cannot be split.*\[4:256\] of 256 split a word"):
        read(checkpoint, 1, 4, 256)


@pytest.mark.parametrize("shard", [(0, 32, 65), (1, -8, 128), (0, 40, 32)], ids=str)
def test_a_shard_outside_the_linear_is_refused(tmp_path: Path, shard) -> None:
    checkpoint, _ = stored_linear(tmp_path, "awq g32")
    with pytest.raises(CheckpointError, match=r"layer.proj.weight has .* is outside it"):
        read(checkpoint, *shard)
