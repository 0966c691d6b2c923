"""Which model a `--model` value (or a deploy config's `model:`) names: a Hugging Face
directory or a GGUF file as given, the built-in demo model by its name, the default
model by its names, or, when nothing is given, the default model. `accord serve`, `accord.LLM` and the rollout
gate all resolve models here, so the gate takes every model source serve takes."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from ..demo.default_model import (
    DEFAULT_MODEL_DESCRIPTION,
    DEFAULT_MODEL_NAME,
    DEFAULT_MODEL_NAMES,
    DefaultModelUnavailable,
    default_model_path,
)
from ..demo.model import DEMO_KV_CACHE_BYTES, DEMO_MODEL_DESCRIPTION, DEMO_MODEL_NAME, demo_model_dir

#: Names that stand for a built-in model rather than a path.
BUILT_IN_MODEL_NAMES = (DEMO_MODEL_NAME, *DEFAULT_MODEL_NAMES)


@dataclass(frozen=True)
class ModelChoice:
    """The model to load: where it is, the name the API reports, its description, and
    the KV cache budget it runs with when none is configured (None: the engine's)."""

    path: str
    name: str
    description: str | None = None
    kv_cache_memory: int | None = None


def choose_model(requested: str | None) -> ModelChoice:
    """`requested` as given; the default model (SmolLM2, fetched once) when None, or the
    random demo model when the default cannot be fetched; the demo model by its name;
    the default model by one of its names, unless a path of that name exists (then
    the path), reported under the name given. Raises ChecksumMismatch when the fetched
    default model is not the pinned one, and DefaultModelUnavailable when the default
    model is asked for by name and cannot be fetched."""
    if requested is None:
        try:
            return ModelChoice(str(default_model_path()), DEFAULT_MODEL_NAME, DEFAULT_MODEL_DESCRIPTION)
        except DefaultModelUnavailable as why:
            print(
                f"accord: the default model {DEFAULT_MODEL_NAME} is not cached and cannot be downloaded ({why}); "
                f"serving the random-weight demo model {DEMO_MODEL_NAME} instead",
                file=sys.stderr,
                flush=True,
            )
            requested = DEMO_MODEL_NAME
    if requested == DEMO_MODEL_NAME:
        # The engine's CPU default (4 GiB) would dwarf the demo model and slow its start.
        return ModelChoice(str(demo_model_dir()), DEMO_MODEL_NAME, DEMO_MODEL_DESCRIPTION, DEMO_KV_CACHE_BYTES)
    if requested in DEFAULT_MODEL_NAMES and not Path(requested).exists():
        return ModelChoice(str(default_model_path()), requested, DEFAULT_MODEL_DESCRIPTION)
    return ModelChoice(requested, requested)
