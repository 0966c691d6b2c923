"""llama.cpp as a peer of `accord bench` (accord/bench/offline/llama_cpp_peer.py), with
a fake `--llama-cpp-bin` folder: two tiny scripts that log their arguments and print
real output of llama-bench (`-o jsonl`) and llama-batched-bench (`--output-format
jsonl`). The workloads map to the tools, the figures are read from that output, the
mix is skipped, and a folder without the tools skips llama.cpp with a clear line."""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path

import pytest

from accord.bench.offline import command, llama_cpp_peer, results, table, workload

#: A real `llama-bench -o jsonl` test line (llama.cpp's tools/llama-bench/README.md,
#: the 128-token generation test of a run on a Ryzen 7 7800X3D with an RTX 4080).
LLAMA_BENCH_LINE = (
    '{"build_commit": "8cf427ff", "build_number": 5163, "cpu_info": "AMD Ryzen 7 7800X3D 8-Core Processor", '
    '"gpu_info": "NVIDIA GeForce RTX 4080", "backends": "CUDA", "model_filename": "models/Qwen2.5-7B-Instruct-Q4_K_M.gguf", '
    '"model_type": "qwen2 7B Q4_K - Medium", "model_size": 4677120000, "model_n_params": 7615616512, "n_batch": 2048, '
    '"n_ubatch": 512, "n_threads": 8, "cpu_mask": "0x0", "cpu_strict": false, "poll": 50, "type_k": "f16", '
    '"type_v": "f16", "n_gpu_layers": -1, "n_cpu_moe": 0, "split_mode": "layer", "main_gpu": 0, "no_kv_offload": false, '
    '"flash_attn": -1, "devices": "auto", "tensor_split": "0.00", "tensor_buft_overrides": "none", "use_mmap": true, '
    '"use_direct_io": false, "embeddings": false, "no_op_offload": 0, "no_host": false, "repack": true, "fit_target": 0, '
    '"fit_min_ctx": 0, "n_prompt": 0, "n_gen": 128, "n_depth": 0, "test_time": "2025-04-24T11:59:33Z", '
    '"avg_ns": 1068078400, "stddev_ns": 6279455, "avg_ts": 119.844681, "stddev_ts": 0.699739, '
    '"samples_ns": [ 1066331700, 1064864900, 1079042600, 1063328400, 1066824400 ],'
    '"samples_ts": [ 120.038, 120.203, 118.624, 120.377, 119.982 ]}'
)
#: A real `llama-batched-bench --output-format jsonl` line (tools/batched-bench/README.md).
BATCHED_BENCH_LINE = (
    '{"n_kv_max": 2048, "n_batch": 2048, "n_ubatch": 512, "flash_attn": 0, "is_pp_shared": 0, "n_gpu_layers": 99, '
    '"n_threads": 8, "n_threads_batch": 8, "pp": 128, "tg": 128, "pl": 2, "n_kv": 512, "t_pp": 0.422602, '
    '"speed_pp": 605.770935, "t_tg": 11.106112, "speed_tg": 23.050371, "t": 11.528713, "speed": 44.410854}'
)
#: The tools' load log goes to stderr, as theirs does; stdout carries the JSON lines.
FAKE_TOOL = """#!/bin/sh
echo "$0 $*" >> {log}
echo "llama_model_loader: loaded meta data" >&2
cat <<'EOF'
{line}
EOF
"""


def fake_bin(folder: Path, log: Path) -> Path:
    folder.mkdir()
    for tool, line in (("llama-bench", LLAMA_BENCH_LINE), ("llama-batched-bench", BATCHED_BENCH_LINE)):
        (folder / tool).write_text(FAKE_TOOL.format(log=log, line=line))
        (folder / tool).chmod(0o755)
    return folder


def bench_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    return parser.parse_args(list(argv))


def loads() -> dict[str, list[list[workload.TraceRequest]]]:
    """Five batch-1 runs of 128 -> 128, one run of 2 x 128 -> 128, and an uneven mix."""
    def same(count: int) -> list[workload.TraceRequest]:
        return [workload.TraceRequest([5] * 128, 128) for _ in range(count)]

    mix = [workload.TraceRequest([5] * 40, 20), workload.TraceRequest([5] * 90, 64)]
    return {workload.BATCH1: [same(1) for _ in range(5)], "2 x 128->128": [same(2)], "2 mixed": [mix]}


def test_each_workload_goes_to_its_tool_and_the_figures_come_from_its_output(tmp_path: Path, capsys) -> None:
    log = tmp_path / "calls"
    args = bench_args("--llama-cpp-bin", str(fake_bin(tmp_path / "bin", log)), "--threads", "2")
    run = llama_cpp_peer.run_llama_cpp(tmp_path / "model.gguf", loads(), args)
    assert isinstance(run, results.EngineRun), run
    calls = [shlex.split(line) for line in log.read_text().splitlines()]
    assert [Path(call[0]).name for call in calls] == ["llama-bench", "llama-batched-bench"]
    bench, batched = calls
    assert bench[bench.index("-pg") + 1] == "128,128" and bench[bench.index("-r") + 1] == "5"
    assert bench[bench.index("-m") + 1] == str(tmp_path / "model.gguf") and bench[bench.index("-t") + 1] == "2"
    assert [batched[batched.index(flag) + 1] for flag in ("-npp", "-ntg", "-npl", "-c")] == ["128", "128", "2", "512"]
    # Batch 1: each repetition's generated tokens over its own time (samples_ns of the line).
    batch1 = run.results[workload.BATCH1]
    samples = [1066331700, 1064864900, 1079042600, 1063328400, 1066824400]
    assert [r.seconds for r in batch1.runs] == pytest.approx([ns / 1e9 for ns in samples])
    assert [r.output_tokens for r in batch1.runs] == [128] * 5
    assert batch1.output_tokens_per_s == pytest.approx(128 / 1.0663317)
    # Batched: pl * tg tokens over t, prompt and generation together.
    (batched_run,) = run.results["2 x 128->128"].runs
    assert (batched_run.requests, batched_run.output_tokens, batched_run.seconds) == (2, 256, pytest.approx(11.528713))
    assert "2 mixed" not in run.results
    assert "llama.cpp 2 mixed: skipped (uneven lengths" in capsys.readouterr().out
    assert run.startup is None
    rendered = table.render_table({"accord cpu": results.EngineRun(5.0, run.results), "llama.cpp": run})
    assert "| start-up to ready | 5.0 s" in rendered and "| -" in rendered


def test_a_folder_without_the_tools_skips_llama_cpp_with_a_reason(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "llama-bench").write_text("")
    skipped = llama_cpp_peer.run_llama_cpp(tmp_path / "m.gguf", loads(), bench_args("--llama-cpp-bin", str(tmp_path / "bin")))
    assert skipped == f"skipped: {tmp_path / 'bin'} has no llama-batched-bench"
    unset = llama_cpp_peer.run_llama_cpp(tmp_path / "m.gguf", loads(), bench_args())
    assert isinstance(unset, str) and unset.startswith("skipped: no --llama-cpp-bin DIR")


def test_a_failing_tool_reports_llama_cpp_as_failed(tmp_path: Path) -> None:
    folder = fake_bin(tmp_path / "bin", tmp_path / "calls")
    (folder / "llama-bench").write_text("#!/bin/sh\nexit 3\n")
    failed = llama_cpp_peer.run_llama_cpp(tmp_path / "m.gguf", loads(), bench_args("--llama-cpp-bin", str(folder)))
    assert failed == "failed: llama-bench exited with 3; its log is above"


def test_the_jsonl_line_is_read_past_log_lines_on_stdout() -> None:
    result = llama_cpp_peer.parse_batched_bench(f"main: n_kv_max = 2048\n\n{BATCHED_BENCH_LINE}\n\nllama_perf ...\n")
    assert result.seconds == pytest.approx(json.loads(BATCHED_BENCH_LINE)["t"])
