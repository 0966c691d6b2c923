"""The LoRA engine settings: the host cache holds at least the device slots, and LoRA
under tensor parallelism is refused at start (its slots are not sharded) rather than
served wrong; `--lora-modules` takes vLLM's two forms."""

from __future__ import annotations

import pytest

from accord.core.config import EngineConfig
from accord.server.lora_modules import LoRAModulePath, parse_lora_module


def test_fewer_cpu_loras_than_device_slots_is_refused() -> None:
    with pytest.raises(ValueError, match=r"max_cpu_loras \(2\) must be at least max_loras \(4\)"):
        EngineConfig(model="m", enable_lora=True, max_loras=4, max_cpu_loras=2)
    assert EngineConfig(model="m", enable_lora=True, max_loras=4).lora_cpu_cache_size == 4


def test_lora_with_tensor_parallelism_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="enable_lora with tensor_parallel_size > 1 is not supported"):
        EngineConfig(model="m", enable_lora=True, tensor_parallel_size=2)


@pytest.mark.parametrize("text, want", [
    ("sql=/adapters/sql", LoRAModulePath("sql", "/adapters/sql")),
    ('{"name": "chat", "path": "/a/chat", "base_model_name": "base"}', LoRAModulePath("chat", "/a/chat", "base")),
])
def test_lora_modules_take_vllm_s_forms(text: str, want: LoRAModulePath) -> None:
    assert parse_lora_module(text) == want


@pytest.mark.parametrize("text", ["sql", "=/path", '{"name": "x"}'])
def test_a_malformed_lora_module_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="--lora-modules"):
        parse_lora_module(text)
