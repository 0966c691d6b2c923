"""`accord bench`, the offline benchmark (accord/bench/offline/). Its GPU mode on a CPU
host: the options pick the GPU model and batch sizes, a run refuses clearly when torch sees no GPU (before building anything), and the
batch-1 roofline arithmetic on a fake device spec, and the bandwidth it is held to being
measured right around each batch-1 run. The batch-1 repeats: every engine runs the
workload `--batch1-repeats` times on fresh prompts, the table and the JSON carry the
median and the range, and a single run stays possible (a tiny model end to end)."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

from accord.bench.offline import accord_runner, command, model, results, roofline, table, vllm_peer, workload

no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible: the refusal cannot be seen here")


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.mark.parametrize("backend, gpu, folder", [
    ("cpu", False, "accord-bench-llama-152m"),
    ("cuda", True, "accord-bench-llama-1b"),
    ("rocm", True, "accord-bench-llama-1b"),
])
def test_the_backend_picks_the_device_and_the_model_size(backend, gpu, folder):
    args = _args("--backend", backend)
    assert command.on_gpu(args) is gpu
    assert command.random_model_dir(args).name == folder
    assert command.random_model_dir(_args("--backend", backend, "--model-dir", "/x/y")) == Path("/x/y")


def test_the_gpu_model_is_about_one_billion_parameters():
    shape = model.GPU_MODEL_SHAPE
    hidden, layers, vocab = shape["hidden_size"], shape["num_hidden_layers"], shape["vocab_size"]
    kv = hidden * shape["num_key_value_heads"] // shape["num_attention_heads"]
    per_layer = 2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * shape["intermediate_size"] + 2 * hidden
    total = layers * per_layer + 2 * vocab * hidden + hidden
    assert 0.9e9 < total < 1.3e9


@no_gpu
def test_a_gpu_run_refuses_clearly_without_a_gpu_and_builds_nothing(tmp_path, capsys):
    model_dir = tmp_path / "model"
    assert command.run(_args("--backend", "cuda", "--model-dir", str(model_dir))) == 2
    err = capsys.readouterr().err
    assert "--backend cuda" in err and "torch.cuda.is_available() is False" in err and "--backend cpu" in err
    assert not model_dir.exists()


@pytest.mark.parametrize("name, bandwidth", [
    ("NVIDIA H200", 4.8e12), ("NVIDIA H100 PCIe", 2.0e12), ("NVIDIA H100 80GB HBM3", 3.35e12), ("Tesla T4", None),
])
def test_datasheet_bandwidth_by_device_name(name, bandwidth):
    assert roofline.datasheet_bandwidth(name) == bandwidth


def test_the_roofline_streams_every_weight_but_the_gathered_embedding(tmp_path):
    # 60 streamed elements (lm_head 40 + one 4x5 weight); the 10x4 embedding is gathered.
    save_file(
        {"model.embed_tokens.weight": torch.zeros(10, 4), "lm_head.weight": torch.zeros(10, 4), "w": torch.zeros(4, 5)},
        str(tmp_path / "model.safetensors"),
    )
    weights = roofline.streamed_weights(tmp_path)
    assert weights == 60
    spec = roofline.DeviceSpec("fake GPU", copy_bandwidth=1200.0, peak_bandwidth=2400.0)
    # fp32 weights at 1200 B/s: 240 bytes a token -> 5 tok/s; bf16 -> 10; datasheet fp32 -> 10.
    figures = roofline.roofline_figures(4.0, weights, 4, spec)
    assert figures == {
        "decode_tokens_per_s": 4.0,
        "roofline_tokens_per_s": pytest.approx(5.0),
        "roofline_bf16_tokens_per_s": pytest.approx(10.0),
        "roofline_datasheet_tokens_per_s": pytest.approx(10.0),
    }
    text = roofline.render_roofline(figures, torch.float32, spec)
    assert "80% of the bandwidth roofline" in text and "40% of the HBM roofline" in text
    cpu = roofline.DeviceSpec("fake CPU", copy_bandwidth=1200.0)
    assert "roofline_datasheet_tokens_per_s" not in roofline.roofline_figures(4.0, weights, 4, cpu)
    assert "HBM" not in roofline.render_roofline(roofline.roofline_figures(4.0, weights, 4, cpu), torch.float32, cpu)


class RecordingLLM:
    """accord's LLM as the bench drives it: records each generate call in `events` and
    answers every request in full, its decode (first token to last) taking `decode_s`
    seconds per call in turn."""

    events: list[str] = []
    decode_s: list[float] = []

    def __init__(self, **kwargs):
        pass

    def generate(self, prompts, params, use_tqdm):
        self.events.append(f"generate {len(prompts)}")
        metrics = SimpleNamespace(first_token_time=1.0, finished_time=1.0 + self.decode_s.pop(0))
        return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=[0] * p.max_tokens)], metrics=metrics) for p in params]


@pytest.mark.parametrize("repeats", [1, 3])
def test_the_roofline_bandwidth_is_measured_right_before_and_after_each_batch1_run(monkeypatch, repeats):
    monkeypatch.setattr("accord.LLM", RecordingLLM)
    monkeypatch.setattr(RecordingLLM, "events", [])
    monkeypatch.setattr(RecordingLLM, "decode_s", [1.0, 2.0, 0.5][:repeats] + [1.0, 1.0])
    bandwidths = iter([7e9, 9e9, 8e9, 6e9])

    def measure() -> float:
        RecordingLLM.events.append("measure")
        return next(bandwidths)

    args = _args("--batch1-repeats", str(repeats))
    run = accord_runner.run_accord(Path("unused"), workload.workloads(args, vocab=50), args, measure)
    batch1 = ["measure"] + ["generate 1", "measure"] * repeats
    assert RecordingLLM.events == [*batch1, "generate 32", f"generate {args.num_requests}"]
    assert run.batch1_bandwidth == (7e9, 9e9, 8e9, 6e9)[: repeats + 1]
    # 127 tokens after the first, in 1, 2 and 0.5 seconds.
    assert run.batch1_decode == pytest.approx((127.0, 63.5, 254.0)[:repeats])
    assert len(run.results[workload.BATCH1].runs) == repeats
    assert [len(run.results[name].runs) for name in list(run.results)[1:]] == [1, 1]
    monkeypatch.setattr(RecordingLLM, "decode_s", [1.0] * (repeats + 2))
    assert accord_runner.run_accord(Path("unused"), workload.workloads(args, vocab=50), args).batch1_bandwidth == ()


def test_each_batch1_run_gets_fresh_prompts_and_the_other_workloads_do_not_depend_on_the_count():
    three, one = workload.workloads(_args("--batch1-repeats", "3"), vocab=50), workload.workloads(_args(), vocab=50)
    runs = three[workload.BATCH1]
    assert len(runs) == 3 and all(len(trace) == 1 for trace in runs)
    assert all(len(trace[0].prompt_token_ids) == 128 and trace[0].output_len == 128 for trace in runs)
    assert len({tuple(trace[0].prompt_token_ids) for trace in runs}) == 3  # no run hits another's prefix cache
    assert len(one[workload.BATCH1]) == 5  # the default
    assert {name: runs for name, runs in three.items() if name != workload.BATCH1} == {
        name: runs for name, runs in one.items() if name != workload.BATCH1
    }


def test_a_repeat_count_below_one_is_refused(capsys):
    with pytest.raises(SystemExit):
        _args("--batch1-repeats", "0")
    assert "must be at least 1, got 0" in capsys.readouterr().err


def test_the_median_run_with_its_range_goes_into_the_table_and_the_json():
    # 100 tokens in 1, 4 and 2 seconds: 100, 25 and 50 tok/s; median 50.
    accord = results.Runs(tuple(results.Result("accord", 1, 100, s) for s in (1.0, 4.0, 2.0)))
    other = results.Runs(tuple(results.Result("vLLM-CPU", 1, 100, s) for s in (4.0, 5.0, 10.0)))  # 25, 20, 10: median 20
    assert accord.output_tokens_per_s == 50.0 and accord.rate_range == (25.0, 100.0)
    figures = accord.figures()
    assert figures["output_tokens_per_s"] == 50.0 and figures["seconds"] == 2.0 and figures["output_tokens"] == 100
    assert (figures["output_tokens_per_s_min"], figures["output_tokens_per_s_max"]) == (25.0, 100.0)
    assert [run["output_tokens_per_s"] for run in figures["runs"]] == [100.0, 25.0, 50.0]
    once = results.Runs((results.Result("accord", 32, 4096, 8.0),))
    text = table.render_table({
        "accord cpu": results.EngineRun(1.0, {workload.BATCH1: accord, "32 x 128->128": once}),
        "vLLM-CPU": results.EngineRun(2.0, {workload.BATCH1: other, "32 x 128->128": once}),
    })
    assert "50.0 tok/s (25.0-100.0)" in text and "20.0 tok/s (10.0-25.0)" in text
    assert "2.50x" in text  # the ratio of the medians
    assert "512.0 tok/s " in text and "512.0 tok/s (" not in text and "1.00x" in text  # one run: no range
    assert f"{workload.BATCH1}: median of 3 runs per engine" in text
    assert "32 x 128->128: median" not in text


def test_the_batch1_roofline_is_the_median_run_and_each_run_is_held_to_its_own_bandwidth():
    # 60 streamed fp32 elements = 240 bytes a token. Copies before and after each of three
    # runs: 1200 | 600 | 1200 | 2400 B/s, so the runs are held to 1200, 1200 and 2400 B/s
    # (rooflines 5, 5 and 10 tok/s); the median run's bandwidth is 1200 (5 tok/s).
    spec = roofline.DeviceSpec("fake CPU", copy_bandwidth=statistics.median(roofline.run_bandwidths([1200, 600, 1200, 2400])))
    assert spec.copy_bandwidth == 1200
    figures = roofline.batch1_figures([4.0, 2.0, 6.0], [1200.0, 600.0, 1200.0, 2400.0], 60, 4, spec)
    assert figures["decode_tokens_per_s"] == 4.0
    assert figures["roofline_tokens_per_s"] == pytest.approx(5.0)
    assert figures["roofline_bf16_tokens_per_s"] == pytest.approx(10.0)
    runs = figures["runs"]
    assert [run["roofline_share"] for run in runs] == pytest.approx([0.8, 0.4, 0.6])
    assert [run["roofline_bf16_share"] for run in runs] == pytest.approx([0.4, 0.2, 0.3])
    assert [(run["copy_bandwidth_before"], run["copy_bandwidth_after"]) for run in runs] == [
        (1200.0, 600.0), (600.0, 1200.0), (1200.0, 2400.0),
    ]
    # The median run's shares: 0.6 of its roofline (the third run), 0.3 of the bf16 one.
    assert (figures["roofline_share"], figures["roofline_bf16_share"]) == pytest.approx((0.6, 0.3))
    text = roofline.render_roofline(figures, torch.float32, spec)
    assert "4.0 tok/s, the median of 3 runs (2.0-6.0)" in text
    assert "60% (40%-80%) at the torch.float32 weights" in text and "30% (20%-40%) of the bf16 roofline" in text
    assert "the rooflines are 5.0 and 10.0 tok/s" in text
    single = roofline.batch1_figures([4.0], [1200.0, 600.0], 60, 4, spec)
    assert single["roofline_share"] == pytest.approx(0.8)
    text = roofline.render_roofline(single, torch.float32, spec)
    assert "median" not in text and "80% of the bandwidth roofline" in text


FAKE_VLLM = r"""
import json, os


class SamplingParams:
    def __init__(self, temperature, max_tokens, ignore_eos):
        self.max_tokens = max_tokens


class _Output:
    def __init__(self, count):
        self.outputs = [type("Completion", (), {"token_ids": [0] * count})()]


class LLM:
    def __init__(self, **kwargs):
        pass

    def generate(self, prompts, params, use_tqdm):
        with open(os.environ["FAKE_VLLM_LOG"], "a") as log:
            log.write(json.dumps([p["prompt_token_ids"] for p in prompts]) + "\n")
        return [_Output(p.max_tokens) for p in params]
"""


@pytest.mark.parametrize("repeats", [1, 2])
def test_vllm_runs_batch1_as_often_as_accord_on_the_same_prompts(tmp_path, monkeypatch, repeats):
    # A virtualenv whose python sees a stand-in vllm module: the real script runs in it.
    (tmp_path / "fake").mkdir()
    (tmp_path / "fake" / "vllm.py").write_text(FAKE_VLLM)
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\nPYTHONPATH={tmp_path / "fake"} exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    monkeypatch.setenv("FAKE_VLLM_LOG", str(tmp_path / "log"))
    args = _args("--batch1-repeats", str(repeats), "--num-requests", "3", "--vllm-venv", str(tmp_path / "venv"))
    loads = workload.workloads(args, vocab=50)
    run = vllm_peer.run_vllm(Path("unused"), loads, args)
    assert isinstance(run, results.EngineRun), run
    seen = [json.loads(line) for line in (tmp_path / "log").read_text().splitlines()]
    sent = [[r.prompt_token_ids for r in trace] for runs in loads.values() for trace in runs]
    assert seen == sent
    assert [len(runs.runs) for runs in run.results.values()] == [repeats, 1, 1]
    assert [r.output_tokens for r in run.results[workload.BATCH1].runs] == [128] * repeats
    mixed = list(loads)[-1]
    assert run.results[mixed].runs[0].output_tokens == sum(r.output_len for r in loads[mixed][0])


TINY_LLAMA = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=128,
    vocab_size=512,
    max_position_embeddings=1024,
)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random tiny Llama checkpoint in the bench's own format, built once."""
    return model.build_model(tmp_path_factory.mktemp("bench") / "model", TINY_LLAMA)


@pytest.mark.parametrize("repeats", [1, 2])
def test_a_bench_run_on_a_tiny_model_reports_every_batch1_run(tiny_model, tmp_path, monkeypatch, capsys, repeats):
    # The copy bandwidth is a stand-in (the real copy takes seconds per call): a rising
    # series, so that each run's bandwidth is the copy after it.
    copies = iter([1e9 * (n + 1) for n in range(repeats + 1)])
    monkeypatch.setattr(command, "device_copy_bandwidth", lambda device: next(copies))
    # Batches cut to 4 requests: 32 x 128 -> 128 takes ~10 s under TRITON_INTERPRET.
    workloads = workload.workloads
    monkeypatch.setattr(command, "workloads", lambda *a: {n: [t[:4] for t in runs] for n, runs in workloads(*a).items()})
    out = tmp_path / "bench.json"
    argv = ["--model", str(tiny_model), "--skip", "vllm", "transformers", "--num-requests", "2", "--batch1-repeats",
            str(repeats), "--output-json", str(out), "--threads", str(torch.get_num_threads())]
    assert command.run(_args(*argv)) == 0
    text = capsys.readouterr().out
    figures = json.loads(out.read_text())
    batch1 = figures["accord cpu"][workload.BATCH1]
    assert len(batch1["runs"]) == repeats and all(run["output_tokens"] == 128 for run in batch1["runs"])
    rates = [run["output_tokens_per_s"] for run in batch1["runs"]]
    assert batch1["output_tokens_per_s"] == pytest.approx(statistics.median(rates))
    assert (batch1["output_tokens_per_s_min"], batch1["output_tokens_per_s_max"]) == (min(rates), max(rates))
    assert len(figures["accord cpu"]["32 x 128->128"]["runs"]) == 1
    decode = [run["decode_tokens_per_s"] for run in figures["batch1"]["runs"]]
    assert len(decode) == repeats and figures["batch1"]["decode_tokens_per_s"] == pytest.approx(statistics.median(decode))
    held = [1e9 * (n + 2) for n in range(repeats)]
    assert figures["device"]["copy_bandwidth"] == pytest.approx(statistics.median(held))
    weights = roofline.streamed_weights(tiny_model)
    shares = [rate * weights * 2 / bandwidth for rate, bandwidth in zip(decode, held)]
    assert [run["roofline_bf16_share"] for run in figures["batch1"]["runs"]] == pytest.approx(shares)
    assert ("the median of 2 runs" in text) is (repeats == 2)
    assert figures["batch1"]["roofline_bf16_share"] == pytest.approx(statistics.median(shares))
    assert f"{batch1['output_tokens_per_s']:.1f} tok/s" in text


def test_the_table_gives_accords_ratio_to_transformers():
    def engine(rate: float) -> results.EngineRun:
        return results.EngineRun(1.0, {workload.BATCH1: results.Runs((results.Result("x", 1, int(rate * 10), 10.0),))})

    text = table.render_table({"accord cuda": engine(300.0), "transformers": engine(100.0)})
    assert "3.00x" in text and "300.0 tok/s" in text and "100.0 tok/s" in text


def test_accord_bench_is_the_offline_benchmark_and_serve_and_plot_are_its_subcommands():
    from accord.bench import plot
    from accord.bench.serve import command as serve
    from accord.cli.main import build_parser

    parser = build_parser()
    offline = parser.parse_args(["bench", "--num-requests", "3", "--skip", "vllm"])
    assert offline.func is command.run and offline.num_requests == 3 and offline.bench_command is None
    online = parser.parse_args(["bench", "serve", "--request-rate", "1,inf", "--model", "m"])
    assert online.func is serve.run and online.request_rate == "1,inf"
    assert parser.parse_args(["bench", "plot", "a.json"]).func is plot.run
