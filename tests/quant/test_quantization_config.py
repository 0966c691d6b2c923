"""config.json's quantization_config: compressed-tensors pack-quantized W4A16/W8A16, AWQ
GEMM and GPTQ read into one scheme; every other method, format or option refused by
name, at config time and so at load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from compressed_tensors_writer import quantization_config
from tiny_models import build_tiny_model

from accord.backends import get_backend
from accord.core.model_loader.group_quant.scheme import GroupQuantScheme, QuantizationConfigError, group_quant_scheme
from accord.core.model_loader.load import load_model
from accord.core.model_loader.model_config import ModelConfigError
from accord.op_contracts import OpDispatcher


def test_compressed_tensors_w4a16_reads_its_weight_scheme() -> None:
    assert group_quant_scheme(quantization_config(4, False, 128)) == GroupQuantScheme("compressed-tensors", 4, 128, False)
    assert group_quant_scheme(quantization_config(8, True, -1)) == GroupQuantScheme("compressed-tensors", 8, -1, True)


def test_gptq_v1_zero_points_carry_an_offset_of_one_and_v2_none() -> None:
    v1 = group_quant_scheme({"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": True})
    v2 = group_quant_scheme({"quant_method": "gptq", "bits": 4, "group_size": 128, "checkpoint_format": "gptq_v2"})
    assert (v1.zero_offset, v2.zero_offset) == (1, 0)  # type: ignore[union-attr]


def test_awq_reads_bits_and_group() -> None:
    scheme = group_quant_scheme({"quant_method": "awq", "bits": 4, "group_size": 64, "zero_point": True, "version": "GEMM"})
    assert scheme == GroupQuantScheme("awq", 4, 64, False)


def with_group(**changes: object) -> dict:
    """A W4A16 config whose one config group has `changes`."""
    config = quantization_config(4, True, 128)
    config["config_groups"]["group_0"].update(changes)
    return config


def with_weights(**changes: object) -> dict:
    """A W4A16 config whose weight scheme has `changes`."""
    config = quantization_config(4, True, 128)
    config["config_groups"]["group_0"]["weights"].update(changes)
    return config


REFUSED = {
    "bitsandbytes": ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "quant_method 'bitsandbytes'"),
    "hqq": ({"quant_method": "hqq", "nbits": 4}, "quant_method 'hqq'"),
    "compressed-tensors float-quantized": (with_group(format="float-quantized"), "format 'float-quantized'"),
    "compressed-tensors W8A8": (with_group(input_activations={"num_bits": 8, "type": "int"}), "quantised activations"),
    "compressed-tensors int3": (with_weights(num_bits=3), "3-bit weights"),
    "compressed-tensors fp weights": (with_weights(type="float"), "only static int weights"),
    "compressed-tensors kv cache": ({**quantization_config(4, True, 128), "kv_cache_scheme": {"num_bits": 8}},
                                    "kv_cache_scheme"),
    "awq gemv": ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemv"}, "version 'gemv'"),
    "gptq marlin": ({"quant_method": "gptq", "bits": 4, "group_size": 128, "checkpoint_format": "marlin"},
                    "checkpoint_format 'marlin'"),
}


@pytest.mark.parametrize("name", REFUSED)
def test_anything_else_is_refused_by_name(name: str) -> None:
    config, message = REFUSED[name]
    with pytest.raises(QuantizationConfigError, match=message):
        group_quant_scheme(config)


def test_a_bitsandbytes_checkpoint_is_refused_at_load(tmp_path: Path) -> None:
    build_tiny_model("llama").save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["quantization_config"] = REFUSED["bitsandbytes"][0]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelConfigError, match="quant_method 'bitsandbytes' is not supported"):
        load_model(tmp_path, OpDispatcher(get_backend("cpu")))
