"""PEFT adapters made for the tests and transformers + PEFT's merged model as the
independent reference (a uniquely named module, importable from any test directory)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

#: Adapter A: every projection PEFT targets on Llama, rank 8, alpha 16.
ADAPTER_A = dict(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
#: Adapter B: some projections only (k, gate and up stay base), rank 16, rsLoRA scaling.
ADAPTER_B = dict(r=16, lora_alpha=8, use_rslora=True, target_modules=["q_proj", "v_proj", "o_proj", "down_proj"])


def make_adapter(model_dir: Path, out_dir: Path, seed: int, **lora_config: Any) -> Path:
    """A PEFT LoRA adapter of the model at `model_dir` saved to `out_dir`, with A and B
    random (PEFT's init_lora_weights=False: B non-zero, so the adapter changes the model)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = get_peft_model(base, LoraConfig(init_lora_weights=False, **lora_config))
    model.save_pretrained(out_dir)
    return out_dir


def merged_greedy(model_dir: Path, adapter_dir: Path | None, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Greedy continuations by transformers on the base model, with the adapter merged
    into it by PEFT (`merge_and_unload`) when one is given; a full forward per token."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if adapter_dir is not None:
        model = PeftModel.from_pretrained(model, adapter_dir).merge_and_unload()
    model.eval()
    results = []
    with torch.inference_mode():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            for _ in range(max_new_tokens):
                ids = torch.cat([ids, model(ids).logits[0, -1].argmax().view(1, 1)], dim=1)
            results.append(ids[0, len(prompt) :].tolist())
    return results
