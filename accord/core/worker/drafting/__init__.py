"""The speculative proposers that draft with a model on the runner's device (a draft
model; a head over the target's hidden states: DeepSeek's MTP layer, EAGLE, EAGLE-3):
their KV cache in the target's blocks, fed the target's step
(accord.core.worker.drafting.base)."""

from __future__ import annotations

import random

from ...models import CausalLM
from ...spec_decode.config import SpeculativeConfig
from ..step_inputs import StepInputs
from .base import ModelDrafter
from .draft_model import DraftModelProposer
from .head import DraftHead, HeadProposer

#: speculative_config methods that draft with a model -> the drafter over what the worker loads.
DRAFTERS = {"draft_model": DraftModelProposer, "mtp": HeadProposer, "eagle": HeadProposer, "eagle3": HeadProposer}


def make_drafter(config: SpeculativeConfig, model: CausalLM | DraftHead, step_inputs: StepInputs,
                 rng: random.Random) -> ModelDrafter:
    """The drafter `config.method` names, over `model` (the draft CausalLM, or the
    head: the checkpoint's MTP layer, an EAGLE or EAGLE-3 head)."""
    return DRAFTERS[config.method](model, config.num_speculative_tokens, step_inputs, rng)  # type: ignore[arg-type]
