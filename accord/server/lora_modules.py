"""`--lora-modules` entries as vLLM writes them, parsed without importing the engine
(the command line reads them before anything loads)."""

from __future__ import annotations

import json
from dataclasses import dataclass

#: vLLM's switch for the load/unload endpoints (an environment variable there).
RUNTIME_UPDATING_VARIABLE = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"


@dataclass(frozen=True)
class LoRAModulePath:
    """One `--lora-modules` entry: the name requests use, the PEFT directory, and
    optionally the base model's name."""

    name: str
    path: str
    base_model_name: str | None = None


def parse_lora_module(text: str) -> LoRAModulePath:
    """vLLM's two forms: `name=path`, or JSON `{"name": .., "path": .., "base_model_name": ..}`."""
    if text.lstrip().startswith("{"):
        try:
            entry = json.loads(text)
            return LoRAModulePath(entry["name"], entry["path"], entry.get("base_model_name"))
        except (json.JSONDecodeError, KeyError, TypeError) as error:
            raise ValueError(f"--lora-modules {text!r}: JSON needs string keys name and path ({error})") from error
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise ValueError(f"--lora-modules {text!r}: give name=path or a JSON object")
    return LoRAModulePath(name, path)
