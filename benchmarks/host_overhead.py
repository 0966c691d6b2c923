"""Host overhead per decode step, per layer: batch-1 decode on tiny random Llamas
(hidden 64, so every GEMM costs next to nothing) that differ only in depth; the step
time difference divided by the layer difference is the host cost of one layer (op
dispatch, small aten ops, Python), the shallow model's step time is the fixed cost.

    PYTHONPATH=. python benchmarks/host_overhead.py [--layers 2 10] [--tokens 64] [--enforce-eager]

CPU time of this process (`time.process_time`) with one torch thread, so the load
other processes put on a shared machine inflates it less than wall time would.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

TINY = dict(
    hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
    max_position_embeddings=512,
)


def build(directory: Path, layers: int, dtype: torch.dtype) -> Path:
    """A random tiny Llama with `layers` layers in `dtype` and a word-level tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM

    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.WordLevel({f"<{i}>": i for i in range(TINY["vocab_size"])}, unk_token="<0>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(directory / "tokenizer.json"))
    torch.manual_seed(0)
    config = LlamaConfig(num_hidden_layers=layers, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False, **TINY)
    LlamaForCausalLM(config).to(dtype).save_pretrained(directory)
    return directory


def step_cpu_seconds(model_dir: Path, backend: str, tokens: int, repeats: int, enforce_eager: bool) -> float:
    """Best CPU seconds per decode step of one greedy request."""
    from accord import LLM, SamplingParams

    llm = LLM(
        model=str(model_dir), backend=backend, max_model_len=512, max_num_seqs=1, max_num_batched_tokens=256,
        enforce_eager=enforce_eager,
    )
    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    prompt = {"prompt_token_ids": list(range(3, 19))}
    llm.generate(prompt, params, use_tqdm=False)
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        llm.generate(prompt, params, use_tqdm=False)
        best = min(best, (time.process_time() - start) / tokens)
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, nargs=2, default=[2, 10])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--backend", default="cpu")
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16",
                        help="checkpoint dtype (bf16 weights take the cpu backend's native path and its decode graph)")
    parser.add_argument("--enforce-eager", action="store_true", help="capture no decode graph")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    shallow, deep = args.layers
    with tempfile.TemporaryDirectory() as scratch:
        times = {
            n: step_cpu_seconds(build(Path(scratch) / str(n), n, getattr(torch, args.dtype)), args.backend,
                                args.tokens, args.repeats, args.enforce_eager)
            for n in (shallow, deep)
        }
    per_layer = (times[deep] - times[shallow]) / (deep - shallow)
    fixed = times[shallow] - shallow * per_layer
    print(f"decode step: {times[shallow] * 1e6:.0f} us at {shallow} layers, {times[deep] * 1e6:.0f} us at {deep} layers")
    print(f"host overhead: {per_layer * 1e6:.0f} us per layer per step; {fixed * 1e6:.0f} us fixed per step")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
