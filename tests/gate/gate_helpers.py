"""Shared pieces of the gate's tests: a tiny random model, deploy.yaml files, a small
op conformance report, an earlier run's recorded calls, and installing the test
backend plugin for a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
import yaml

from accord.backends import get_backend
from accord.demo.model import DemoModelShape, write_demo_model
from accord.op_contracts import OpDispatcher
from accord.op_contracts.recording import CallRecorder, rank_directory

#: Small enough to load and generate in well under a second on one core.
TINY_SHAPE = DemoModelShape(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=256,
)
#: Production-like settings scaled down: a step budget smaller than the long prompt
#: (so it prefills in chunks), a few sequences, prefix caching on.
TINY_DEPLOY: dict[str, Any] = {
    "backend": "cpu",
    "max_model_len": 128,
    "max_num_seqs": 4,
    "max_num_batched_tokens": 32,
    "block_size": 16,
    "num_gpu_blocks_override": 64,
    "enable_prefix_caching": True,
    "gate": {"max_tokens": 4},
}
#: Ops a fast report-only test runs (small case lists).
SMALL_OPS = ("rms_norm", "silu_and_mul")


def write_tiny_model(directory: Path) -> Path:
    """A random Llama-architecture model directory (safetensors + tokenizer)."""
    directory.mkdir(parents=True, exist_ok=True)
    write_demo_model(directory, TINY_SHAPE)
    return directory


def write_tiny_moe_model(directory: Path) -> Path:
    """A random Mixtral-architecture model (4 routed experts, top-2) with the demo
    tokenizer, in fp32: two expert-parallel ranks hold two experts each."""
    from engine_models import write_tokenizer
    from tiny_models import build_tiny_model

    directory.mkdir(parents=True, exist_ok=True)
    vocab_size, bos_id, eos_id = write_tokenizer(directory)
    model = build_tiny_model("mixtral", vocab_size=vocab_size, bos_token_id=bos_id, eos_token_id=eos_id)
    model.float().save_pretrained(directory)
    return directory


def write_deploy_yaml(path: Path, model_dir: Path, **overrides: Any) -> Path:
    """A deploy.yaml for `model_dir` with TINY_DEPLOY's settings and `overrides`
    (a `gate` override is merged into the gate section)."""
    gate = {**TINY_DEPLOY["gate"], **overrides.pop("gate", {})}
    settings = {**TINY_DEPLOY, "model": str(model_dir), **overrides, "gate": gate}
    path.write_text(yaml.safe_dump(settings))
    return path


def record_an_earlier_run(folder: Path) -> Path:
    """A recording folder holding one rank-0 call, as an earlier gate run leaves it."""
    ops = OpDispatcher(get_backend("cpu"))
    ops.add_hook(CallRecorder(rank_directory(folder, 0)))
    ops.rms_norm(torch.ones(2, 8), torch.ones(8), eps=1e-6)
    return folder


def install_test_plugin(site: Path) -> Path:
    """Make the test backends an installed plugin for processes whose PYTHONPATH holds
    `site` and this folder: a dist-info with an `accord.backends` entry point."""
    dist_info = site / "accord_gate_test_backends-0.1.dist-info"
    dist_info.mkdir(parents=True, exist_ok=True)
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: accord-gate-test-backends\nVersion: 0.1\n")
    (dist_info / "entry_points.txt").write_text("[accord.backends]\ngate = gate_backends\n")
    return site


def gate_in_subprocess(folder: Path, deploy: Path) -> tuple[int, Path]:
    """`accord conformance --deploy` in a fresh process where the test backends are an
    installed plugin, found through their entry point like a vendor package:
    (exit code, report folder)."""
    site = install_test_plugin(folder / "site")
    path = os.pathsep.join([str(site), str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])
    command = [sys.executable, "-m", "accord", "conformance",
               "--deploy", str(deploy), "--report-dir", str(folder / "reports")]
    done = subprocess.run(command, env={**os.environ, "PYTHONPATH": path}, capture_output=True, text=True, timeout=900)
    assert (folder / "reports" / "report.json").exists(), done.stderr
    return done.returncode, folder / "reports"
