"""Tensor-parallel shards of a packed GroupQuantWeight: output rows and input channels
cut on whole words and groups dequantise to the same slice of the whole weight; a cut
through a word or a group is refused; act-order weights keep every group's scales. A
layer whose tensors disagree with its layout is named at load."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from accord.backends.reference.kernels.group_quant import dequantize
from accord.conformance.cases.group_quant import act_order, random_scales, random_words
from accord.core.model_loader.group_quant.checkpoint import layout_problem
from accord.core.quantization import GroupQuantWeight


def weight(bits: int, group_size: int, with_g_idx: bool = False) -> GroupQuantWeight:
    g = torch.Generator().manual_seed(bits + group_size)
    rows, depth = 16, 256
    groups = depth // group_size
    zeros = torch.randint(0, 1 << bits, (rows, groups), generator=g, dtype=torch.uint8)
    g_idx = act_order(g, depth, group_size) if with_g_idx else None
    return GroupQuantWeight(
        random_words(g, rows, depth, bits), random_scales(g, rows, groups, torch.float16), zeros, g_idx, bits,
        group_size, depth,
    )


def dense(w: GroupQuantWeight) -> torch.Tensor:
    return dequantize(w.qweight, w.scales, w.zeros, w.g_idx, w.bits, w.group_size, w.in_features)


@pytest.mark.parametrize(("bits", "group_size", "with_g_idx"), [(4, 64, False), (8, 32, False), (4, 64, True)])
def test_shards_dequantise_to_slices_of_the_whole(bits: int, group_size: int, with_g_idx: bool) -> None:
    whole = weight(bits, group_size, with_g_idx)
    assert torch.equal(dense(whole.rows(4, 12)), dense(whole)[4:12])
    assert torch.equal(dense(whole.columns(128, 256)), dense(whole)[:, 128:256])


def test_act_order_shards_keep_every_groups_scales() -> None:
    shard = weight(4, 64, with_g_idx=True).columns(0, 128)
    assert shard.scales.shape == (16, 4) and shard.g_idx is not None and shard.g_idx.shape == (128,)


@pytest.mark.parametrize(("start", "stop", "what"), [(4, 128, "a word"), (32, 128, "a group")])
def test_a_cut_through_a_word_or_a_group_is_refused(start: int, stop: int, what: str) -> None:
    with pytest.raises(ValueError, match=what):
        weight(4, 64).columns(start, stop)


def test_a_checkpoint_layer_of_the_wrong_layout_is_named() -> None:
    good = weight(4, 64)
    assert layout_problem(good, (16, 256)) is None
    short = dataclasses.replace(good, scales=good.scales[:, :3])
    assert "scales has shape (16, 3), the layout implies (16, 4)" in layout_problem(short, (16, 256))  # type: ignore[operator]
    assert "qweight has shape (16, 32), the layout implies (16, 38)" in layout_problem(good, (16, 300))  # type: ignore[operator]
    scattered = weight(4, 64, with_g_idx=True)
    scattered.g_idx[3] = 4  # type: ignore[index]
    assert "g_idx names groups outside [0, 4)" in layout_problem(scattered, (16, 256))  # type: ignore[operator]
