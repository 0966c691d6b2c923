"""The LoRA adapters a deploy serves (deploy.yaml's `lora_modules`, what `accord serve
--lora-modules` takes): the requests the gate generates under, numbered as the server
numbers them, and what the report records of each adapter the engine accepted."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Sequence

from ..core.lora.peft import CONFIG_FILE, WEIGHTS_FILE
from ..core.lora.request import LoRARequest
from ..server.lora_modules import LoRAModulePath
from .reports import ServedAdapter


def lora_requests(modules: Sequence[LoRAModulePath]) -> tuple[LoRARequest, ...]:
    """One request per adapter, ids 1, 2, ... in the config's order (as the server
    gives them to its `--lora-modules`)."""
    return tuple(LoRARequest(m.name, index, m.path, m.base_model_name) for index, m in enumerate(modules, start=1))


def served_adapter(request: LoRARequest) -> ServedAdapter:
    """What the report names of an adapter the engine has checked: its PEFT config's
    rank and target modules (PEFT writes a list, or one regex string), and the sha256
    of its weights file."""
    folder = Path(request.lora_path)
    config = json.loads((folder / CONFIG_FILE).read_text())
    targets = config.get("target_modules") or ()
    digest = hashlib.sha256()
    with (folder / WEIGHTS_FILE).open("rb") as weights:
        for chunk in iter(lambda: weights.read(1 << 20), b""):
            digest.update(chunk)
    return ServedAdapter(
        request.lora_name, str(folder), request.base_model_name, int(config["r"]),
        (targets,) if isinstance(targets, str) else tuple(sorted(targets)), f"sha256:{digest.hexdigest()}",
    )
