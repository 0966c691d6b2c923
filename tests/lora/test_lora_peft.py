"""Reading PEFT adapter directories: the scaling folded into B is PEFT's own (alpha / r,
and alpha / sqrt(r) with rsLoRA), and what accord does not serve is refused at load with
a message naming it: DoRA, modules_to_save, lm_head LoRA, a rank above --max-lora-rank,
a missing weights file, an adapter made for another base model (naming the tensor)."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
import torch
from lora_helpers import ADAPTER_A, ADAPTER_B, make_adapter

from accord.core.lora import LoRARequest
from accord.core.lora.peft import LoRAAdapterError, read_adapter
from accord.core.lora.layout import LoRALayout
from accord.core.model_loader.load import read_model_config


@pytest.fixture(scope="module")
def layout(llama_dir: Path) -> LoRALayout:
    return LoRALayout.of(read_model_config(llama_dir))


def read(path: Path, layout: LoRALayout, max_rank: int = 16):
    return read_adapter(LoRARequest("x", 1, str(path)), layout, max_rank)


@pytest.mark.parametrize("name, settings", [("a", ADAPTER_A), ("b", ADAPTER_B)])
def test_the_scaling_folded_into_b_is_peft_s(
    name: str, settings: dict, llama_dir: Path, llama_adapters: dict[str, Path], layout: LoRALayout
) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(llama_dir), llama_adapters[name])
    q_proj = peft_model.base_model.model.model.layers[1].self_attn.q_proj
    adapter = read(llama_adapters[name], layout)
    a, b = adapter.weights[(1, "q_proj")]
    assert adapter.rank == settings["r"] and adapter.modules == set(settings["target_modules"])
    torch.testing.assert_close(a, q_proj.lora_A["default"].weight)
    torch.testing.assert_close(b, q_proj.lora_B["default"].weight * q_proj.scaling["default"])


@pytest.mark.parametrize("settings, message", [
    (dict(r=4, target_modules=["q_proj"], use_dora=True), "DoRA"),
    (dict(r=4, target_modules=["q_proj"], modules_to_save=["lm_head"]), "modules_to_save"),
    (dict(r=4, target_modules=["q_proj", "lm_head"]), "LoRA on lm_head is not supported"),
])
def test_what_accord_does_not_serve_is_refused_by_name(
    settings: dict, message: str, llama_dir: Path, layout: LoRALayout, tmp_path: Path
) -> None:
    path = make_adapter(llama_dir, tmp_path / "adapter", seed=5, **settings)
    with pytest.raises(LoRAAdapterError, match=message):
        read(path, layout)


def test_a_rank_above_the_slots_is_refused(llama_adapters: dict[str, Path], layout: LoRALayout) -> None:
    with pytest.raises(LoRAAdapterError, match="rank 16 exceeds --max-lora-rank 8"):
        read(llama_adapters["b"], layout, max_rank=8)


def test_a_missing_weights_file_is_named(llama_adapters: dict[str, Path], layout: LoRALayout, tmp_path: Path) -> None:
    partial = tmp_path / "partial"
    partial.mkdir()
    shutil.copy(llama_adapters["a"] / "adapter_config.json", partial)
    with pytest.raises(LoRAAdapterError, match="adapter_model.safetensors is missing"):
        read(partial, layout)


def test_an_adapter_for_another_base_is_refused_naming_the_tensor(
    llama_dir: Path, llama_adapters: dict[str, Path]
) -> None:
    wider = LoRALayout.of(dataclasses.replace(read_model_config(llama_dir), intermediate_size=256))
    with pytest.raises(LoRAAdapterError, match=r"tensor base_model\.model\.model\.layers\.0\.\*\.down_proj\.lora_A"
                                               r"\.weight has shape \(8, 128\).*\(8, 256\).*another base model"):
        read(llama_adapters["a"], wider)
