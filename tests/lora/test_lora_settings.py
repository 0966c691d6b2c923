"""The LoRA engine settings: the host cache holds at least the device slots;
`--lora-modules` takes vLLM's two forms."""

from __future__ import annotations

import pytest

from accord.core.config import EngineConfig
from accord.server.lora_modules import LoRAModulePath, parse_lora_module


def test_fewer_cpu_loras_than_device_slots_is_refused() -> None:
    with pytest.raises(ValueError, match=r"max_cpu_loras \(2\) must be at least max_loras \(4\)"):
        EngineConfig(model="m", enable_lora=True, max_loras=4, max_cpu_loras=2)
    assert EngineConfig(model="m", enable_lora=True, max_loras=4).lora_cpu_cache_size == 4


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
