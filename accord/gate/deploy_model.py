"""The deploy config's model, found as `accord serve` finds it (a Hugging Face
directory, a GGUF file, or a built-in model's name such as accord-demo-random) and its
config read without the weights. A model that cannot be found or read is a bad config:
the gate stops before anything loads (exit 2), as for an unknown key."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..core.model_loader.load import read_model_config
from ..core.model_loader.model_config import ModelConfig
from ..entrypoints.model_choice import choose_model
from .deploy_config import DeployConfig, DeployConfigError


@dataclass(frozen=True)
class DeployModel:
    """A deploy config whose `engine.model` is the model's path (and its KV cache budget
    the built-in model's when the config sets none), with the model's parsed config."""

    config: DeployConfig
    model: ModelConfig


def open_deploy_model(config: DeployConfig) -> DeployModel:
    """Resolve and read the config's model, or raise DeployConfigError saying why."""
    requested = config.engine.model
    try:
        choice = choose_model(requested)
        model = read_model_config(choice.path)
    except (OSError, ValueError) as error:  # missing, unreadable, or an architecture accord cannot run
        raise DeployConfigError(f"model {requested!r}: {error}") from None
    kv_cache_memory = config.engine.kv_cache_memory
    engine = dataclasses.replace(
        config.engine, model=choice.path,
        kv_cache_memory=choice.kv_cache_memory if kv_cache_memory is None else kv_cache_memory,
    )
    return DeployModel(dataclasses.replace(config, engine=engine), model)
