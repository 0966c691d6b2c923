"""A tiny random Llama quantised to W4A16 by compressed-tensors' own code and saved in
its pack-quantized layout loads packed (every projection a GroupQuantLinear over the
stored codes), and generates the same greedy tokens as accord running the checkpoint
compressed-tensors' decompressor writes, with logits within a stated bound."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from compressed_tensors_writer import compress, decompress, quantization_config, scheme
from safetensors.torch import load_file, save_file
from single_sequence import SingleSequenceRunner
from tiny_models import build_tiny_model, fixed_prompt

from accord.backends import get_backend
from accord.core.model_loader.load import load_model
from accord.core.quantization import GroupQuantLinear
from accord.op_contracts import OpDispatcher

#: Wide enough for 128-channel groups (compressed-tensors needs K a multiple of them).
WIDE = dict(hidden_size=128, intermediate_size=256)
NEW_TOKENS = 16
#: Both sides hold the same fp32 weights ((code - zero) * scale, one fp32 rounding);
#: only GEMM blocking differs, so logits agree to fp32 accumulation noise (measured
#: 4.7e-7 and 7.9e-7 of the logits' largest magnitude for the two schemes).
LOGITS_BOUND = 1e-5
SCHEMES = [(4, True, 128), (4, False, 32)]


def is_quantised(name: str) -> bool:
    """The linears llm-compressor's W4A16 recipe quantises (targets Linear, ignores lm_head)."""
    return name.startswith("model.layers.") and name.endswith("proj.weight")


def write_checkpoints(source: Path, packed: Path, dense: Path, bits: int, symmetric: bool, group_size: int) -> None:
    """`source` quantised with compressed-tensors into `packed` (pack-quantized, config
    declaring it) and the same codes decompressed by it into `dense` (plain fp32)."""
    chosen = scheme(bits, symmetric, group_size)
    packed_tensors, dense_tensors = {}, {}
    for name, tensor in load_file(source / "model.safetensors").items():
        if not is_quantised(name):
            packed_tensors[name] = dense_tensors[name] = tensor
            continue
        state = compress(tensor, chosen)
        prefix = name.removesuffix(".weight")
        packed_tensors.update({f"{prefix}.{part}": value for part, value in state.items()})
        dense_tensors[name] = decompress(state, chosen)
    config = json.loads((source / "config.json").read_text())
    for directory, tensors, quant in ((packed, packed_tensors, quantization_config(bits, symmetric, group_size)),
                                      (dense, dense_tensors, None)):
        save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
        (directory / "config.json").write_text(json.dumps({**config, **({"quantization_config": quant} if quant else {})}))


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("llama_fp32")
    build_tiny_model("llama", **WIDE).save_pretrained(directory)
    return directory


def generate(directory: Path) -> tuple[torch.Tensor, list[int], object]:
    loaded = load_model(directory, OpDispatcher(get_backend("cpu")), dtype="float32")
    runner = SingleSequenceRunner(loaded.model, len(fixed_prompt()) + NEW_TOKENS)
    logits, tokens = runner.generate(fixed_prompt(), NEW_TOKENS)
    return logits, tokens, loaded.model


@pytest.mark.slow
@pytest.mark.parametrize(("bits", "symmetric", "group_size"), SCHEMES, ids=["w4a16 sym g128", "w4a16 asym g32"])
def test_packed_load_matches_the_decompressed_checkpoint(tiny_llama, tmp_path, bits, symmetric, group_size) -> None:
    packed, dense = tmp_path / "packed", tmp_path / "dense"
    packed.mkdir(), dense.mkdir()
    write_checkpoints(tiny_llama, packed, dense, bits, symmetric, group_size)
    packed_logits, packed_tokens, model = generate(packed)
    dense_logits, dense_tokens, _ = generate(dense)
    layer = model.layers[0]
    linears = [layer.attention.qkv, layer.attention.o_proj, layer.feed_forward.gate_up, layer.feed_forward.down]
    assert all(isinstance(linear, GroupQuantLinear) for linear in linears)
    assert packed_tokens == dense_tokens
    scale = dense_logits.abs().max()
    assert (packed_logits - dense_logits).abs().max() / scale < LOGITS_BOUND
