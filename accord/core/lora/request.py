"""A request's adapter, as vLLM's API names it: `LoRARequest(lora_name, lora_int_id, lora_path)`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LoRARequest:
    """Which LoRA adapter a request runs under: a name (what the server's `model` field
    says), a positive integer id unique to the adapter (its identity in the prefix
    cache and the device slots) and the PEFT directory it loads from."""

    lora_name: str
    lora_int_id: int
    lora_path: str
    #: The model the adapter was trained on (vLLM's `--lora-modules` JSON key; informative).
    base_model_name: str | None = None

    def __post_init__(self) -> None:
        if self.lora_int_id < 1:
            raise ValueError(f"lora_int_id must be a positive integer (0 is the base model), got {self.lora_int_id}")
        if not self.lora_name:
            raise ValueError("lora_name must not be empty")
