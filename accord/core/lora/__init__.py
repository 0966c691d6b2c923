"""Multi-LoRA serving: many adapters on one resident base, batched in one forward
(`request.py`: LoRARequest; `peft.py`: reading PEFT directories; `layout.py`: where
PEFT's modules sit in accord's fused projections; `layer.py`: the projections' hook;
`slots.py`: device slots and the host cache). The per-token delta is the `lora_linear`
op contract."""

from .peft import LoRAAdapter, LoRAAdapterError, read_adapter
from .request import LoRARequest

__all__ = ["LoRAAdapter", "LoRAAdapterError", "LoRARequest", "read_adapter"]
