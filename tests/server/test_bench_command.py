"""`accord bench`'s GPU mode on a CPU host: the options pick the GPU model and batch
sizes, a run refuses clearly when torch sees no GPU (before building anything), and the
batch-1 roofline arithmetic on a fake device spec, and the bandwidth it is held to being
measured right around the batch-1 run."""

from __future__ import annotations

import argparse
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

from accord.server.commands import bench

no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible: the refusal cannot be seen here")


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.mark.parametrize("backend, gpu, folder", [
    ("cpu", False, "accord-bench-llama-152m"),
    ("cuda", True, "accord-bench-llama-1b"),
    ("rocm", True, "accord-bench-llama-1b"),
])
def test_the_backend_picks_the_device_and_the_model_size(backend, gpu, folder):
    args = _args("--backend", backend)
    assert bench.on_gpu(args) is gpu
    assert bench.random_model_dir(args).name == folder
    assert bench.random_model_dir(_args("--backend", backend, "--model-dir", "/x/y")) == Path("/x/y")


def test_the_gpu_model_is_about_one_billion_parameters():
    shape = bench.GPU_MODEL_SHAPE
    hidden, layers, vocab = shape["hidden_size"], shape["num_hidden_layers"], shape["vocab_size"]
    kv = hidden * shape["num_key_value_heads"] // shape["num_attention_heads"]
    per_layer = 2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * shape["intermediate_size"] + 2 * hidden
    total = layers * per_layer + 2 * vocab * hidden + hidden
    assert 0.9e9 < total < 1.3e9


@no_gpu
def test_a_gpu_run_refuses_clearly_without_a_gpu_and_builds_nothing(tmp_path, capsys):
    model = tmp_path / "model"
    assert bench.run(_args("--backend", "cuda", "--model-dir", str(model))) == 2
    err = capsys.readouterr().err
    assert "--backend cuda" in err and "torch.cuda.is_available() is False" in err and "--backend cpu" in err
    assert not model.exists()


@pytest.mark.parametrize("name, bandwidth", [
    ("NVIDIA H200", 4.8e12), ("NVIDIA H100 PCIe", 2.0e12), ("NVIDIA H100 80GB HBM3", 3.35e12), ("Tesla T4", None),
])
def test_datasheet_bandwidth_by_device_name(name, bandwidth):
    assert bench.datasheet_bandwidth(name) == bandwidth


def test_the_roofline_streams_every_weight_but_the_gathered_embedding(tmp_path):
    # 60 streamed elements (lm_head 40 + one 4x5 weight); the 10x4 embedding is gathered.
    save_file(
        {"model.embed_tokens.weight": torch.zeros(10, 4), "lm_head.weight": torch.zeros(10, 4), "w": torch.zeros(4, 5)},
        str(tmp_path / "model.safetensors"),
    )
    weights = bench.streamed_weights(tmp_path)
    assert weights == 60
    spec = bench.DeviceSpec("fake GPU", copy_bandwidth=1200.0, peak_bandwidth=2400.0)
    # fp32 weights at 1200 B/s: 240 bytes a token -> 5 tok/s; bf16 -> 10; datasheet fp32 -> 10.
    figures = bench.roofline_figures(4.0, weights, 4, spec)
    assert figures == {
        "decode_tokens_per_s": 4.0,
        "roofline_tokens_per_s": pytest.approx(5.0),
        "roofline_bf16_tokens_per_s": pytest.approx(10.0),
        "roofline_datasheet_tokens_per_s": pytest.approx(10.0),
    }
    text = bench.render_roofline(figures, torch.float32, spec)
    assert "80% of the bandwidth roofline" in text and "40% of the HBM roofline" in text
    cpu = bench.DeviceSpec("fake CPU", copy_bandwidth=1200.0)
    assert "roofline_datasheet_tokens_per_s" not in bench.roofline_figures(4.0, weights, 4, cpu)
    assert "HBM" not in bench.render_roofline(bench.roofline_figures(4.0, weights, 4, cpu), torch.float32, cpu)


def test_the_roofline_bandwidth_is_measured_right_before_and_after_the_batch1_run(monkeypatch):
    events: list[str] = []

    class RecordingLLM:
        def __init__(self, **kwargs):
            pass

        def generate(self, prompts, params, use_tqdm):
            events.append(f"generate {len(prompts)}")
            metrics = SimpleNamespace(first_token_time=1.0, finished_time=2.0)
            return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=[0] * p.max_tokens)], metrics=metrics)
                    for p in params]

    monkeypatch.setattr("accord.LLM", RecordingLLM)
    bandwidths = iter([7e9, 9e9])

    def measure() -> float:
        events.append("measure")
        return next(bandwidths)

    args = _args()
    run = bench.run_accord(Path("unused"), bench.workloads(args, vocab=50), args, measure)
    assert events == ["measure", "generate 1", "measure", "generate 32", f"generate {args.num_requests}"]
    assert run.batch1_bandwidth == (7e9, 9e9)
    assert run.batch1_decode == pytest.approx(127.0)  # 127 tokens after the first, in one second
    assert bench.run_accord(Path("unused"), bench.workloads(args, vocab=50), args).batch1_bandwidth is None


def test_the_table_gives_accords_ratio_to_transformers():
    def engine(rate: float) -> bench.EngineRun:
        return bench.EngineRun(1.0, {"batch-1 128->128": bench.Result("x", 1, int(rate * 10), 10.0)})

    table = bench.render_table({"accord cuda": engine(300.0), "transformers": engine(100.0)})
    assert "3.00x" in table and "300.0 tok/s" in table and "100.0 tok/s" in table
