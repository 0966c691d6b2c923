"""Multi-LoRA serving: many adapters on one resident base, batched in one forward
(`request.py`: LoRARequest; `peft.py`: reading PEFT directories; `layout.py`: where
PEFT's modules sit in accord's fused projections; `layer.py`: the projections' hook;
`slots.py`: device slots and the host cache; `registry.py`: the engine's checked
adapters). The per-token delta is the `lora_linear` op contract. Only the request is
imported here: the scheduler and the server need it without the rest."""

from .request import LoRARequest

__all__ = ["LoRARequest"]
