"""The speculative proposers that draft with a model on the runner's device (a draft
model, DeepSeek's MTP layer): their KV cache in the target's blocks, fed the target's
step (accord.core.worker.drafting.base)."""

from __future__ import annotations

import random

from ...models import CausalLM
from ...models.deepseek_mtp import MtpLayer
from ...spec_decode.config import SpeculativeConfig
from ..step_inputs import StepInputs
from .base import ModelDrafter
from .draft_model import DraftModelProposer
from .mtp import MtpProposer

#: speculative_config methods that draft with a model -> the drafter over what the worker loads.
DRAFTERS = {"draft_model": DraftModelProposer, "mtp": MtpProposer}


def make_drafter(config: SpeculativeConfig, model: CausalLM | MtpLayer, step_inputs: StepInputs,
                 rng: random.Random) -> ModelDrafter:
    """The drafter `config.method` names, over `model` (the draft CausalLM, or the
    checkpoint's MTP layer)."""
    return DRAFTERS[config.method](model, config.num_speculative_tokens, step_inputs, rng)  # type: ignore[arg-type]
