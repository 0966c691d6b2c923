"""How OpenMP's spin-wait decides accord's speed on an idle and on a shared host.

    PYTHONPATH=. python benchmarks/openmp_spin.py [--spins 300000 0 20000] [--hogs 0 2]
        [--batch 1 32] [--tokens 32] [--rounds 2]

Each (hogs, batch, spin) point runs `LLM.generate` on the 152M bench model (bf16, the
`accord bench` model) in a fresh process whose environment sets GOMP_SPINCOUNT to the
value (300,000 is libgomp's own default, what torch runs with where nobody sets it), with
`--hogs` busy-looping processes beside it: a controlled stand-in for the other tenants of
a shared host. The points run interleaved round by round, so the host's own drift hits
every spin value alike; the table gives each point's median output tok/s over the rounds
and its median ratio to the first spin value's in the same rounds.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

#: Runs in the measured process: warm up, then time one generate of `batch` prompts.
MEASURE = r"""
import json, sys, time, torch
from pathlib import Path
from accord import LLM, SamplingParams
from accord.bench.offline.model import build_model
batch, tokens, seed = map(int, sys.argv[1:4])
llm = LLM(str(build_model(Path(sys.argv[4]))), max_num_seqs=max(batch, 1))
generator = torch.Generator().manual_seed(seed)
prompts = [{"prompt_token_ids": torch.randint(10, 8000, (128,), generator=generator).tolist()} for _ in range(batch)]
llm.generate(prompts[:2], SamplingParams(max_tokens=4, ignore_eos=True))
params = SamplingParams(max_tokens=tokens, ignore_eos=True, temperature=0)
start = time.perf_counter()
llm.generate(prompts, params)
print(json.dumps({"tok_s": batch * tokens / (time.perf_counter() - start)}))
"""


def _hog() -> None:
    """Busy-loop forever: one core's worth of another tenant."""
    while True:
        pass


def _measure(spin: str, batch: int, tokens: int, seed: int, model_dir: Path) -> float:
    """Output tok/s of one generate in a fresh process with GOMP_SPINCOUNT = `spin`."""
    env = dict(os.environ, GOMP_SPINCOUNT=spin)
    env.pop("OMP_WAIT_POLICY", None)
    result = subprocess.run(
        [sys.executable, "-c", MEASURE, str(batch), str(tokens), str(seed), str(model_dir)],
        env=env, capture_output=True, text=True, check=True,
    )
    return json.loads(result.stdout.strip().splitlines()[-1])["tok_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spins", nargs="+", default=["300000", "0", "20000"],
                        help="GOMP_SPINCOUNT values; ratios are to the first")
    parser.add_argument("--hogs", nargs="+", type=int, default=[0, 2])
    parser.add_argument("--batch", nargs="+", type=int, default=[1, 32])
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    opts = parser.parse_args()
    model_dir = Path(tempfile.gettempdir()) / "accord-bench-llama-152m"
    print(f"{'hogs':>4} {'batch':>5} {'GOMP_SPINCOUNT':>14} {'tok/s':>8} {'vs first':>10}  rounds")
    for hogs in opts.hogs:
        processes = [multiprocessing.Process(target=_hog, daemon=True) for _ in range(hogs)]
        for process in processes:
            process.start()
        try:
            for batch in opts.batch:
                runs = {spin: [] for spin in opts.spins}
                for round_ in range(opts.rounds):
                    for spin in opts.spins:
                        runs[spin].append(_measure(spin, batch, opts.tokens, round_, model_dir))
                for spin, values in runs.items():
                    ratios = [v / d for v, d in zip(values, runs[opts.spins[0]])]
                    print(f"{hogs:>4} {batch:>5} {spin:>14} {statistics.median(values):8.1f} "
                          f"{statistics.median(ratios):9.2f}x  {' '.join(f'{v:.1f}' for v in values)}", flush=True)
        finally:
            for process in processes:
                process.terminate()


if __name__ == "__main__":
    main()
