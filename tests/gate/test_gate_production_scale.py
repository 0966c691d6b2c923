"""The gate on a production-sized KV budget: a deploy YAML reserving 2 GiB of KV cache
on the cpu backend passes, and the gate's peak memory stays within a small margin of
the engine's own (replays use a few generated blocks, never a copy of the production
cache)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from gate_helpers import write_deploy_yaml

from accord.gate.gate_command import EXIT_PASSED

KV_BYTES = 2 << 30
#: The tiny model has 2 layers, each with a key and a value cache: a quarter of the
#: budget per cache tensor.
CACHE_TENSOR_BYTES = KV_BYTES // 4
#: What the gate may hold beyond the engine's own peak: the replayed cases (a few
#: generated blocks, KiB), the reference engine sized for the prompt set (MiB) and
#: allocator noise. Half of one layer's key cache, so a replay that copied any
#: production cache even once would exceed it.
MARGIN_BYTES = CACHE_TENSOR_BYTES // 2

ENGINE_ALONE = """
import sys, yaml
from accord import LLM
from accord.core.sampling_params import SamplingParams
settings = yaml.safe_load(open(sys.argv[1]))
settings.pop("gate")
llm = LLM(**settings)
params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
llm.generate(["the quick brown fox jumps over the lazy dog"] * 4, params, use_tqdm=False)
"""


def peak_rss(command: list[str]) -> tuple[int, int, str]:
    """(exit code, peak resident bytes, output) of `command` run as a child process."""
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = child.stdout.read() if child.stdout else ""
    _pid, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    return child.returncode, usage.ru_maxrss * 1024, output  # ru_maxrss is in KiB on Linux


@pytest.mark.slow
def test_the_gate_on_a_2_gib_kv_deploy_passes_within_the_engines_memory(tiny_model: Path, tmp_path: Path) -> None:
    deploy = write_deploy_yaml(tmp_path / "deploy.yaml", tiny_model, kv_cache_memory=KV_BYTES,
                               num_gpu_blocks_override=None)
    assert yaml.safe_load(deploy.read_text())["num_gpu_blocks_override"] is None
    engine_code, engine_peak, engine_output = peak_rss([sys.executable, "-c", ENGINE_ALONE, str(deploy)])
    assert engine_code == 0, engine_output
    # Host KV caches are allocated untouched (resident only as blocks are written), so
    # a gate that copied one would write all of it: a whole cache tensor, twice the
    # margin, above the engine's own peak.
    gate_code, gate_peak, gate_output = peak_rss(
        [sys.executable, "-m", "accord", "conformance", "--deploy", str(deploy), "--report-dir", str(tmp_path / "r")])
    assert gate_code == EXIT_PASSED, gate_output[-3000:]
    assert gate_peak <= engine_peak + MARGIN_BYTES, (
        f"gate peak {gate_peak / 2**20:.0f} MiB vs engine {engine_peak / 2**20:.0f} MiB + {MARGIN_BYTES / 2**20:.0f}")
