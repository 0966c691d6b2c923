"""A tiny random Llama quantised to W4A16 by compressed-tensors' own code and saved in
its pack-quantized layout loads packed (every projection a GroupQuantLinear over the
stored codes), and generates the same greedy tokens as accord running the checkpoint
compressed-tensors' decompressor writes, with logits within a stated bound."""

from __future__ import annotations

from pathlib import Path

import pytest
from compressed_tensors_writer import quantization_config, quantiser, scheme
from group_quant_models import generate, relative_gap, save_tiny_llama, write_pair

from accord.core.quantization import GroupQuantLinear

#: Both sides hold the same fp32 weights ((code - zero) * scale, one fp32 rounding);
#: only GEMM blocking differs, so logits agree to fp32 accumulation noise (measured
#: 4.7e-7 and 7.9e-7 of the logits' largest magnitude for the two schemes).
LOGITS_BOUND = 1e-5
SCHEMES = [(4, True, 128), (4, False, 32)]


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("llama_fp32"))


@pytest.mark.slow
@pytest.mark.parametrize(("bits", "symmetric", "group_size"), SCHEMES, ids=["w4a16 sym g128", "w4a16 asym g32"])
def test_packed_load_matches_the_decompressed_checkpoint(tiny_llama, tmp_path, bits, symmetric, group_size) -> None:
    chosen = scheme(bits, symmetric, group_size)
    packed, dense = tmp_path / "packed", tmp_path / "dense"
    write_pair(tiny_llama, packed, dense, quantiser(chosen), quantization_config(bits, symmetric, group_size))
    packed_logits, packed_tokens, model = generate(packed)
    dense_logits, dense_tokens, _ = generate(dense)
    layer = model.layers[0]
    linears = [layer.attention.qkv, layer.attention.o_proj, layer.feed_forward.gate_up, layer.feed_forward.down]
    assert all(isinstance(linear, GroupQuantLinear) for linear in linears)
    assert packed_tokens == dense_tokens
    assert relative_gap(packed_logits, dense_logits) < LOGITS_BOUND
