"""Hugging Face transformers' `generate` as a peer of `accord bench` (left-padded batches)."""

from __future__ import annotations

import time
from pathlib import Path

from .results import EngineRun, Result, Runs, run_label
from .workload import TraceRequest


def run_transformers(
    model_dir: Path, loads: dict[str, list[list[TraceRequest]]], batch_size: int, device: str = "cpu"
) -> EngineRun:
    """Throughput of transformers' generate over each run of each workload (fp32 on the
    CPU, bf16 on a GPU; left-padded batches, each run to its longest output; only the
    requested tokens count). Start-up is the model's load onto the device."""
    import torch
    from tqdm.auto import tqdm
    from transformers import AutoModelForCausalLM

    from ...core.model_loader.gguf import is_gguf

    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    started = time.perf_counter()
    if is_gguf(model_dir):
        model = AutoModelForCausalLM.from_pretrained(model_dir.parent, gguf_file=model_dir.name, dtype=dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    model.to(device).eval()
    startup = time.perf_counter() - started
    results = {}
    for name, runs in loads.items():
        measured = []
        for index, trace in enumerate(runs):
            label = run_label(index, len(runs))
            start = time.perf_counter()
            for first in tqdm(range(0, len(trace), batch_size), desc=f"transformers {name}{label}", unit="batch"):
                batch = trace[first : first + batch_size]
                width = max(len(r.prompt_token_ids) for r in batch)
                pad = [[0] * (width - len(r.prompt_token_ids)) for r in batch]
                ids = torch.tensor([p + r.prompt_token_ids for p, r in zip(pad, batch)], device=device)
                mask = [[0] * len(p) + [1] * len(r.prompt_token_ids) for p, r in zip(pad, batch)]
                mask = torch.tensor(mask, device=device)
                longest = max(r.output_len for r in batch)
                with torch.inference_mode():
                    model.generate(
                        input_ids=ids,
                        attention_mask=mask,
                        max_new_tokens=longest,
                        min_new_tokens=longest,
                        do_sample=False,
                        pad_token_id=0,
                    )
            if device != "cpu":
                torch.cuda.synchronize()
            seconds = time.perf_counter() - start
            measured.append(Result("transformers generate", len(trace), sum(r.output_len for r in trace), seconds))
            print(f"transformers {name}{label}: {measured[-1].output_tokens_per_s:.1f} out tok/s", flush=True)
        results[name] = Runs(tuple(measured))
    return EngineRun(startup, results)
