"""Time to first token of a long prompt whose KV blocks the device pool has evicted:
recomputed (no tier) against copied back from the CPU tier (--kv-offloading-size),
and loaded by the decode side of PD: a SharedStorageConnector consumer, and a
NixlConnector consumer READing from a producer engine of this process over UCX
(loopback TCP unless UCX_TLS says otherwise; skipped without NIXL) — one engine per
setting, the demo model on the cpu backend, side by side in one run.

Then an agent-session trace: two sessions take turns, each turn appending
`--turn-tokens` new tokens (a tool's output, the user's next message) to its whole
context and asking for its next token, on a device pool that holds one session's final
context: once the two contexts together outgrow the pool, each turn evicts the other
session's prefix. Printed per turn: the time to first token without a tier (the evicted
prefix recomputed) and with the CPU tier, on the same seeded sessions.

    PYTHONPATH=$PWD python3 benchmarks/kv_offload.py [--prompt-tokens 1536] [--rounds 3]
        [--turns 8] [--turn-tokens 192]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import random
import statistics
import tempfile
import time

from accord import LLM
from accord.core.sampling_params import SamplingParams
from accord.demo.model import demo_model_dir

BLOCK = 16
FIRST_TOKEN = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)


def _prompts(count: int, length: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    return [{"prompt_token_ids": [rng.randrange(3, 800) for _ in range(length)]} for _ in range(count)]


def _small_pool(max_tokens: int, pool_blocks: int) -> dict:
    """Engine arguments for one request of up to `max_tokens` at a time, on a device pool
    of `pool_blocks` blocks: the demo model on the cpu backend, one step per prompt."""
    return dict(backend="cpu", max_model_len=max_tokens + 16, num_gpu_blocks_override=pool_blocks,
                max_num_batched_tokens=max_tokens + 16, block_size=BLOCK, max_num_seqs=1)


def _seconds(llm: LLM, prompt: dict) -> float:
    start = time.perf_counter()
    llm.generate([prompt], FIRST_TOKEN, use_tqdm=False)
    return time.perf_counter() - start


def evicted_prefix_ttft(engine_args: dict, prompt_tokens: int, rounds: int) -> float:
    """Median seconds to the first token of a prompt just evicted from the device pool
    by two others of the same length."""
    llm = LLM(str(demo_model_dir()), **engine_args)
    times = []
    for round_ in range(rounds):
        target, *others = _prompts(3, prompt_tokens, seed=round_)
        _seconds(llm, target)
        for prompt in others:
            _seconds(llm, prompt)
        times.append(_seconds(llm, target))
    return statistics.median(times)


def agent_session_ttfts(engine_args: dict, turns: int, turn_tokens: int) -> list[float]:
    """Seconds to the first token of each turn, both sessions' turns averaged, for two
    sessions taking turns on one engine (see the module's docstring)."""
    llm = LLM(str(demo_model_dir()), **engine_args)
    rng = random.Random(7)
    contexts: list[list[int]] = [[], []]
    ttfts = []
    for _ in range(turns):
        turn = []
        for context in contexts:
            context.extend(rng.randrange(3, 800) for _ in range(turn_tokens))
            start = time.perf_counter()
            (output,) = llm.generate([{"prompt_token_ids": list(context)}], FIRST_TOKEN, use_tqdm=False)
            turn.append(time.perf_counter() - start)
            context.extend(output.outputs[0].token_ids)
        ttfts.append(statistics.mean(turn))
    return ttfts


def shared_storage_ttft(engine_args: dict, prompt_tokens: int, rounds: int) -> float:
    """Median seconds to the first token on a consumer whose producer saved the prompt."""
    with tempfile.TemporaryDirectory() as store:
        def connector(role: str) -> dict:
            return {"kv_connector": "SharedStorageConnector", "kv_role": role,
                    "kv_connector_extra_config": {"shared_storage_path": store}}

        producer = LLM(str(demo_model_dir()), kv_transfer_config=connector("kv_producer"), **engine_args)
        consumer = LLM(str(demo_model_dir()), kv_transfer_config=connector("kv_consumer"), **engine_args)
        times = []
        for round_ in range(rounds):
            (prompt,) = _prompts(1, prompt_tokens, seed=100 + round_)
            _seconds(producer, prompt)
            times.append(_seconds(consumer, prompt))
        return statistics.median(times)


def nixl_ttft(engine_args: dict, prompt_tokens: int, rounds: int) -> float:
    """Median seconds to the first token on a NixlConnector consumer reading the prompt
    a producer engine (in this process, its own NIXL agent) just computed."""
    os.environ.setdefault("UCX_TLS", "tcp")
    os.environ.setdefault("UCX_NET_DEVICES", "lo")

    def connector(role: str, port: int) -> dict:
        return {"kv_connector": "NixlConnector", "kv_role": role, "kv_port": port}

    producer = LLM(str(demo_model_dir()), kv_transfer_config=connector("kv_producer", 15701), **engine_args)
    consumer = LLM(str(demo_model_dir()), kv_transfer_config=connector("kv_consumer", 15702), **engine_args)
    times = []
    for round_ in range(rounds):
        (prompt,) = _prompts(1, prompt_tokens, seed=200 + round_)
        handover = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True,
                                  extra_args={"kv_transfer_params": {"do_remote_decode": True}})
        params = producer.generate([prompt], handover, use_tqdm=False)[0].kv_transfer_params
        start = time.perf_counter()
        consumer.generate([prompt], SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True,
                                                   extra_args={"kv_transfer_params": params}), use_tqdm=False)
        times.append(time.perf_counter() - start)
        while producer.llm_engine.awaits_transfers():  # the read's notification frees the blocks
            producer.llm_engine.step()
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt-tokens", type=int, default=1536)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--turn-tokens", type=int, default=192)
    args = parser.parse_args()
    blocks = -(-(args.prompt_tokens + 1) // BLOCK)
    # Room for one request and a bit: each new prompt evicts the previous one's blocks.
    engine_args = _small_pool(args.prompt_tokens, blocks + 8)
    recomputed = evicted_prefix_ttft(engine_args, args.prompt_tokens, args.rounds)
    tiered = evicted_prefix_ttft({**engine_args, "kv_offloading_size": 0.25}, args.prompt_tokens, args.rounds)
    loaded = shared_storage_ttft(engine_args, args.prompt_tokens, args.rounds)
    print(f"prompt of {args.prompt_tokens} tokens, demo model, cpu backend, median of {args.rounds}")
    print(f"{'evicted prefix, recomputed':<40} {recomputed * 1e3:8.1f} ms")
    print(f"{'evicted prefix, from the CPU tier':<40} {tiered * 1e3:8.1f} ms")
    print(f"{'PD consumer, SharedStorage load':<40} {loaded * 1e3:8.1f} ms")
    if importlib.util.find_spec("nixl_cu12") or importlib.util.find_spec("nixl"):
        read = nixl_ttft(engine_args, args.prompt_tokens, args.rounds)
        print(f"{'PD consumer, NIXL read (UCX ' + os.environ['UCX_TLS'] + ')':<40} {read * 1e3:8.1f} ms")
    agent_session(args)


def agent_session(args: argparse.Namespace) -> None:
    """Print the agent-session trace's time to first token per turn, without and with the CPU tier."""
    final = args.turns * (args.turn_tokens + 1)
    # The pool holds one session's final context: two outgrow it halfway through.
    engine_args = _small_pool(final, -(-final // BLOCK) + 4)  # prefix caching is on by default
    recomputed = agent_session_ttfts(engine_args, args.turns, args.turn_tokens)
    tiered = agent_session_ttfts({**engine_args, "kv_offloading_size": 0.25}, args.turns, args.turn_tokens)
    print(f"\nagent sessions: 2 taking turns, {args.turn_tokens} new tokens a turn, a device pool of "
          f"{engine_args['num_gpu_blocks_override']} blocks ({engine_args['num_gpu_blocks_override'] * BLOCK} tokens)")
    print(f"{'turn':>4} {'context':>8} {'no tier ms':>11} {'CPU tier ms':>12}")
    for turn, (plain, tier) in enumerate(zip(recomputed, tiered), start=1):
        print(f"{turn:>4} {turn * (args.turn_tokens + 1):>8} {plain * 1e3:11.1f} {tier * 1e3:12.1f}")


if __name__ == "__main__":
    main()
