"""torch.compile (`-O`) against eager, side by side in one run: start-up (cold: an empty
inductor cache; warm: the cache the cold run filled), batch-1 decode 128 -> 128 and
32 x 128 -> 128 on a model, and host overhead per layer on tiny random Llamas (as
benchmarks/host_overhead.py, with one torch thread). Each configuration runs in its own
process, so every start-up is a real one.

    PYTHONPATH=. python benchmarks/compile_speed.py [--model /tmp/accord-bench-llama-152m] [--level 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def measure(model: str, level: int, workloads: list[str]) -> dict[str, float]:
    """Start-up seconds and the asked workloads' figures for one configuration."""
    from accord import LLM, SamplingParams

    start = time.perf_counter()
    llm = LLM(model=model, backend="cpu", max_model_len=512, compilation_config=level)
    figures = {"startup_s": time.perf_counter() - start}

    def decode_rate(batch: int, prompt_len: int, out_len: int) -> float:
        prompts = [{"prompt_token_ids": [3 + (i * 7 + j) % 200 for j in range(prompt_len)]} for i in range(batch)]
        params = SamplingParams(temperature=0.0, max_tokens=out_len, ignore_eos=True)
        llm.generate(prompts, params, use_tqdm=False)  # compiles the shapes still missing
        begin = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        return batch * out_len / (time.perf_counter() - begin)

    def host_step_us(tokens: int = 64) -> float:
        from accord import SamplingParams as Params

        params = Params(temperature=0.0, max_tokens=tokens, ignore_eos=True)
        prompt = {"prompt_token_ids": list(range(3, 19))}
        llm.generate(prompt, params, use_tqdm=False)
        best = float("inf")
        for _ in range(3):
            begin = time.process_time()
            llm.generate(prompt, params, use_tqdm=False)
            best = min(best, (time.process_time() - begin) / tokens)
        return best * 1e6

    for workload in workloads:
        if workload == "batch1":
            figures["batch1_tok_s"] = decode_rate(1, 128, 128)
        elif workload == "batch32":
            figures["batch32_tok_s"] = decode_rate(32, 128, 128)
        elif workload == "host":
            figures["step_us"] = host_step_us()
    return figures


def run(model: str, level: int, workloads: list[str], cache: str, threads: int | None) -> dict[str, float]:
    """`measure` in a fresh process with inductor's cache in `cache`."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
    code = (
        "import json, sys, torch; sys.path.insert(0, 'benchmarks');"
        + (f"torch.set_num_threads({threads});" if threads else "")
        + f"from compile_speed import measure; print(json.dumps(measure({model!r}, {level}, {workloads!r})))"
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="/tmp/accord-bench-llama-152m")
    parser.add_argument("--level", type=int, default=3)
    parser.add_argument("--layers", type=int, nargs=2, default=[2, 10], help="tiny models' depths (host overhead)")
    parser.add_argument("--skip", nargs="*", default=[], choices=["model", "host"])
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        cache = str(Path(scratch) / "inductor")
        configs = [("eager", 0), ("compiled cold", args.level), ("compiled warm", args.level)]
        if "model" not in args.skip:
            for name, level in configs:
                figures = run(args.model, level, ["batch1", "batch32"], cache, None)
                print(f"{Path(args.model).name} {name}: " + ", ".join(f"{k} {v:.2f}" for k, v in figures.items()), flush=True)
        if "host" not in args.skip:
            sys.path.insert(0, str(Path(__file__).parent))
            from host_overhead import build

            shallow, deep = args.layers
            for name, level in (("eager", 0), ("compiled", args.level)):
                steps = {n: run(str(build(Path(scratch) / f"tiny{n}", n)), level, ["host"], cache, 1)["step_us"]
                         for n in (shallow, deep)}
                per_layer = (steps[deep] - steps[shallow]) / (deep - shallow)
                print(f"host overhead {name}: {per_layer:.0f} us per layer per step, "
                      f"{steps[shallow] - shallow * per_layer:.0f} us fixed", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
