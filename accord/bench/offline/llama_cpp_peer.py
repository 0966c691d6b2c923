"""llama.cpp as a peer of `accord bench` (`--llama-cpp-bin DIR`): its own benchmark
tools over the same model, as a GGUF (gguf_export.py; the checkpoint's dtype, bf16 for
the bench model, so it is the same arithmetic load).

A workload llama.cpp's tools can express is one whose requests all have one prompt
length and one output length:
- one request (batch-1 128 -> 128): `llama-bench -pg P,G -r R -o jsonl`, the prompt
  then G generated tokens, R repetitions after its own warm-up; each repetition's time
  (`samples_ns`) is one run, its output tokens/s G / that time (llama-bench's own t/s
  counts prompt and generated tokens together, so it is not read);
- N requests (32 x 128 -> 128): `llama-batched-bench -npp P -ntg G -npl N --output-format
  jsonl`, the N prompts in one batch, then N sequences decoding together; its output
  tokens/s is N*G / `t` (prompt and generation time together).
The mix of uneven lengths is not expressible (both tools run equal lengths); `accord
bench serve` against `llama-server` measures uneven requests. Both tools feed random
token ids and pick the next token at random (logits are computed, nothing is
sampled or detokenised), which accord's and vLLM's figures include. Start-up is not
reported: the tools print no load time."""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from ..._openmp_wait import peer_environment
from .results import EngineRun, Result, Runs
from .workload import TraceRequest

if TYPE_CHECKING:
    from ..gguf_export import GGUFTensorType

#: The tools run, by the workload shape they measure.
BATCH1_TOOL, BATCHED_TOOL = "llama-bench", "llama-batched-bench"
ENGINE = "llama.cpp"


def run_llama_cpp(
    model: Path, loads: dict[str, list[list[TraceRequest]]], args: argparse.Namespace
) -> EngineRun | str:
    """llama.cpp over each workload its tools can express, or why it was skipped."""
    if args.llama_cpp_bin is None:
        return "skipped: no --llama-cpp-bin DIR (llama.cpp's build/bin, with llama-bench and llama-batched-bench)"
    bin_dir = Path(args.llama_cpp_bin)
    missing = [tool for tool in (BATCH1_TOOL, BATCHED_TOOL) if not (bin_dir / tool).exists()]
    if missing:
        return f"skipped: {bin_dir} has no {' or '.join(missing)}"
    # gguf-py loads only here: `accord serve`'s start-up builds this command's parser too.
    from ..gguf_export import export_gguf

    gguf = model if model.suffix == ".gguf" else export_gguf(model, model.with_name(f"{model.name}.{_dtype(model)}.gguf"))
    try:
        return EngineRun(None, _measure(bin_dir, gguf, loads, args.threads))
    except RuntimeError as error:
        return f"failed: {error}"


def _measure(bin_dir: Path, gguf: Path, loads: dict[str, list[list[TraceRequest]]], threads: int) -> dict[str, Runs]:
    results: dict[str, Runs] = {}
    for name, runs in loads.items():
        shape = uniform_shape(runs)
        if shape is None:
            print(f"llama.cpp {name}: skipped (uneven lengths; its tools run equal ones)", flush=True)
            continue
        count, prompt, output = shape
        if count == 1:
            command = [str(bin_dir / BATCH1_TOOL), "-m", str(gguf), "-p", "0", "-n", "0", "-pg", f"{prompt},{output}",
                       "-r", str(len(runs)), "-t", str(threads), "-o", "jsonl"]  # fmt: skip
            results[name] = Runs(tuple(parse_llama_bench(_stdout(command))))
        else:
            command = [str(bin_dir / BATCHED_TOOL), "-m", str(gguf), "-npp", str(prompt), "-ntg", str(output),
                       "-npl", str(count), "-c", str(count * (prompt + output)), "-t", str(threads),
                       "-tb", str(threads), "--output-format", "jsonl"]  # fmt: skip
            results[name] = Runs(tuple(parse_batched_bench(_stdout(command)) for _ in runs))
        print(f"llama.cpp {name}: {results[name].output_tokens_per_s:.1f} out tok/s", flush=True)
    return results


def uniform_shape(runs: list[list[TraceRequest]]) -> tuple[int, int, int] | None:
    """(requests, prompt length, output length) when every run of a workload has that
    one shape, else None."""
    shapes = {(len(trace), len(r.prompt_token_ids), r.output_len) for trace in runs for r in trace}
    return shapes.pop() if len(shapes) == 1 else None


def parse_llama_bench(stdout: str) -> list[Result]:
    """One Result per repetition of llama-bench's `-o jsonl` test line (prompt then
    generation): its generated tokens over that repetition's time."""
    (test,) = _json_lines(stdout)
    return [Result(ENGINE, 1, test["n_gen"], ns / 1e9) for ns in test["samples_ns"]]


def parse_batched_bench(stdout: str) -> Result:
    """The Result of llama-batched-bench's `--output-format jsonl` line: `pl` sequences
    of `tg` generated tokens in `t` seconds (prompt and generation)."""
    (test,) = _json_lines(stdout)
    return Result(ENGINE, test["pl"], test["pl"] * test["tg"], test["t"])


def _json_lines(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def _stdout(command: list[str]) -> str:
    # stderr passes through: llama.cpp's load log shows, and says why when it fails.
    done = subprocess.run(command, stdout=subprocess.PIPE, text=True, env=peer_environment())
    if done.returncode != 0:
        raise RuntimeError(f"{Path(command[0]).name} exited with {done.returncode}; its log is above")
    return done.stdout


def _dtype(model_dir: Path) -> GGUFTensorType:
    """The GGUF tensor type of the checkpoint's dtype (bf16, f16, else f32)."""
    config = json.loads((model_dir / "config.json").read_text())
    dtype = config.get("torch_dtype") or config.get("dtype")
    return {"bfloat16": "bf16", "float16": "f16"}.get(dtype, "f32")  # type: ignore[return-value]
