"""The engine's view of the adapters it serves: each is read and checked once, when
first named (a request or a load), so a bad adapter is refused before any request runs
on it, with a message naming the problem; the workers then read it as they need it."""

from __future__ import annotations

from ..model_loader.model_config import ModelConfig
from .layout import LoRALayout
from .peft import LoRAAdapterError, read_adapter
from .request import LoRARequest


class LoRARegistry:
    """The checked adapters, by id."""

    def __init__(self, model_config: ModelConfig, max_lora_rank: int) -> None:
        self.layout = LoRALayout.of(model_config)
        self.max_lora_rank = max_lora_rank
        self._checked: dict[int, LoRARequest] = {}

    def add(self, request: LoRARequest) -> bool:
        """Check `request`'s adapter (read it whole) unless already checked; returns
        whether it was new. LoRAAdapterError for an unusable adapter, or an id already
        given to another adapter."""
        known = self._checked.get(request.lora_int_id)
        if known == request:
            return False
        if known is not None:
            raise LoRAAdapterError(
                f"lora_int_id {request.lora_int_id} is already adapter {known.lora_name!r} ({known.lora_path}); "
                "unload it first or pick another id"
            )
        read_adapter(request, self.layout, self.max_lora_rank)
        self._checked[request.lora_int_id] = request
        return True

    def remove(self, lora_int_id: int) -> bool:
        """Forget an adapter (new requests must load it again); whether it was known.
        Requests already running on it finish on it."""
        return self._checked.pop(lora_int_id, None) is not None

    def ids(self) -> set[int]:
        """The ids of the adapters checked and not removed."""
        return set(self._checked)
