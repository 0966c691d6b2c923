"""Multi-LoRA throughput: greedy output tokens/s of one batch of requests on the base
model alone, and with the batch's requests spread over 1, 4 and 16 distinct LoRA
adapters (rank 16 on every projection, made by PEFT with random non-zero B) resident
at once, in one forward per step. The model is a random Llama of SmolLM2-135M's shape
(30 layers, hidden 576, 9 heads / 3 KV heads, intermediate 1536), written by
transformers; prompts are random token ids.

    PYTHONPATH=. python benchmarks/lora_throughput.py [--batch 32] [--tokens 64] [--adapters 1 4 16] [--rounds 3]

Every engine (the base, and one per adapter count) is built first and warmed up with
one batch; then each round runs one `LLM.generate` of the whole batch on each engine in
turn (prefill included), so a shared host's load disturbs them alike. Reported: the
median tok/s over the rounds, and "vs base", its ratio to the base engine's median (the
issue's target: 16 adapters at least 0.7x).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from spec_decode import cpu_name

#: SmolLM2-135M's shape, the demo model's.
MODEL_SHAPE = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                   num_key_value_heads=3, max_position_embeddings=2048, tie_word_embeddings=True)
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def write_model(directory: Path, dtype: str) -> None:
    """A random Llama of MODEL_SHAPE with the demo tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from accord.demo.tokenizer import BOS_TOKEN, EOS_TOKEN, build_demo_tokenizer

    tokenizer = build_demo_tokenizer()
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS_TOKEN, "eos_token": EOS_TOKEN}))
    config = LlamaConfig(vocab_size=tokenizer.get_vocab_size(), bos_token_id=tokenizer.token_to_id(BOS_TOKEN),
                         eos_token_id=tokenizer.token_to_id(EOS_TOKEN), **MODEL_SHAPE)
    torch.manual_seed(0)
    LlamaForCausalLM(config).to(getattr(torch, dtype)).save_pretrained(directory)


def write_adapters(model_dir: Path, root: Path, count: int, rank: int) -> list[Path]:
    """`count` PEFT adapters of `rank` on every projection, A and B random."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    paths = []
    for index in range(count):
        torch.manual_seed(100 + index)
        base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        peft_model = get_peft_model(base, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=TARGETS,
                                                     init_lora_weights=False))
        path = root / f"adapter-{index}"
        peft_model.save_pretrained(path)
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=64, help="greedy output tokens per request")
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--adapters", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--rounds", type=int, default=3, help="0: only write the model and adapters (with --keep)")
    parser.add_argument("--keep", type=Path, default=None,
                        help="write the model and adapters here and keep them (for lora_throughput_vllm.py)")
    args = parser.parse_args(argv)

    import torch

    from accord import LLM, LoRARequest, SamplingParams

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as scratch:
        root = args.keep or Path(scratch)
        model_dir = root / "model"
        model_dir.mkdir(parents=True)
        write_model(model_dir, args.dtype)
        paths = write_adapters(model_dir, root, max(args.adapters), args.rank)
        if args.rounds == 0:
            return 0
        generator = torch.Generator().manual_seed(0)
        prompts = [{"prompt_token_ids": torch.randint(3, 800, (args.prompt_len,), generator=generator).tolist()}
                   for _ in range(args.batch)]
        params = SamplingParams(temperature=0.0, max_tokens=args.tokens, ignore_eos=True)
        print(f"random Llama of SmolLM2-135M's shape ({args.dtype}); {cpu_name()}, {torch.get_num_threads()} torch "
              f"thread(s); batch {args.batch}, {args.prompt_len} prompt + {args.tokens} output tokens each, rank "
              f"{args.rank}")
        engines = {}
        for count in [0, *args.adapters]:
            llm = LLM(str(model_dir), backend="cpu", dtype=args.dtype, max_num_seqs=args.batch, max_model_len=512,
                      enable_lora=count > 0, max_loras=max(count, 1), max_lora_rank=args.rank,
                      enable_prefix_caching=False, kv_cache_memory=256 << 20)
            loras = [LoRARequest(f"a{i % count}", i % count + 1, str(paths[i % count])) for i in range(args.batch)] if count else None
            llm.generate(prompts, params, use_tqdm=False, lora_request=loras)  # warm-up: reads the adapters too
            engines[count] = (llm, loras)
        speeds: dict[int, list[float]] = {count: [] for count in engines}
        for _ in range(args.rounds):
            for count, (llm, loras) in engines.items():
                start = time.perf_counter()
                outputs = llm.generate(prompts, params, use_tqdm=False, lora_request=loras)
                seconds = time.perf_counter() - start
                speeds[count].append(sum(len(o.outputs[0].token_ids) for o in outputs) / seconds)
        base_speed = statistics.median(speeds[0])
        print(f"{'adapters':>8} {'tok/s':>8} {'vs base':>8}  (median of {args.rounds} rounds; each round's tok/s)")
        for count, values in speeds.items():
            speed = statistics.median(values)
            rounds = " ".join(f"{value:.1f}" for value in values)
            print(f"{count or 'base':>8} {speed:8.1f} {speed / base_speed:7.2f}x  ({rounds})", flush=True)
        for llm, _ in engines.values():
            llm.llm_engine.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
