"""The LoRA adapters a server serves by name, as vLLM's OpenAI server does: a request
names one in `model`, `/v1/models` lists each with the base model as its parent, and
`POST /v1/load_lora_adapter` / `/v1/unload_lora_adapter` change the set at run time
where allowed (`--allow-runtime-lora-updating`, or vLLM's
VLLM_ALLOW_RUNTIME_LORA_UPDATING=true). The engine checks each adapter when it is
added, so a bad one is a 400 naming the problem before any request runs on it."""

from __future__ import annotations

import itertools

from ..core.engine.client import EngineClient
from ..core.lora.request import LoRARequest
from .errors import OpenAIError
from .lora_modules import LoRAModulePath

class ServedAdapters:
    """The adapters by name, each with the id the engine knows it by."""

    def __init__(self, engine: EngineClient, base_names: tuple[str, ...]) -> None:
        self.engine = engine
        self.base_names = base_names
        self._by_name: dict[str, LoRARequest] = {}
        self._ids = itertools.count(1)

    def __iter__(self):
        return iter(self._by_name.values())

    def get(self, name: str) -> LoRARequest | None:
        """The adapter called `name`, or None."""
        return self._by_name.get(name)

    def add(self, module: LoRAModulePath) -> LoRARequest:
        """Check an adapter with the engine and serve it under its name; OpenAIError 400
        for a name in use or an adapter the engine refuses."""
        if module.name in self._by_name or module.name in self.base_names:
            raise OpenAIError(f"The lora adapter '{module.name}' has already been loaded.", param="lora_name",
                              code="lora_adapter_exists")
        request = LoRARequest(module.name, next(self._ids), module.path, module.base_model_name)
        # Reserved before the (slow) check, so a concurrent load of the name is refused.
        self._by_name[module.name] = request
        try:
            self.engine.add_lora(request)
        except ValueError as error:
            del self._by_name[module.name]
            raise OpenAIError(str(error), param="lora_path", code="invalid_lora_adapter") from error
        return request

    def remove(self, name: str) -> None:
        """Stop serving adapter `name` (requests running on it finish); 404 if unknown."""
        request = self._by_name.pop(name, None)
        if request is None:
            raise OpenAIError(f"The lora adapter '{name}' cannot be found.", status_code=404, param="lora_name",
                              code="lora_adapter_not_found")
        self.engine.remove_lora(request.lora_int_id)
