"""What the rollout gate's report records of each LoRA adapter a deploy serves
(deploy.yaml's `lora_modules`, what `accord serve --lora-modules` takes), once the
engine has accepted it."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ..core.lora.peft import CONFIG_FILE, WEIGHTS_FILE
from ..core.lora.request import LoRARequest
from .reports import ServedAdapter


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
