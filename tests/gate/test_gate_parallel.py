"""The rollout gate on parallel deploy configs (gloo, two ranks, a tiny random Mixtral):
the deploy YAML's parallel layout is the engine's, profile_run gives every rank its own
worst case (every token reaching its experts), each rank records its op signatures
through its dispatcher hook and the report lists them per rank; a backend whose
fused_moe mishandles an int32 companion only on the expert-parallel path fails the
gate at TP=2+EP and passes it at TP=1."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import pytest
import torch
from gate_backends import EP_INDEX_BACKEND
from gate_helpers import gate_in_subprocess, write_deploy_yaml

from accord.backends import get_backend
from accord.core.config import EngineConfig
from accord.core.distributed import ParallelContext
from accord.core.worker.model_runner import ModelRunner
from accord.core.model_loader.load import load_model
from accord.core.models.layers.mlp import worst_case_ids
from accord.gate.gate_command import EXIT_FAILED, EXIT_PASSED, run_deploy
from accord.gate.reports import load_report, validate_document
from accord.op_contracts import OpDispatcher
from accord.op_contracts.recording import CallRecorder, read_recordings

TP2_EP = {"tensor_parallel_size": 2, "enable_expert_parallel": True, "distributed_executor_backend": "mp"}
#: The broken-backend runs replay the recorded signatures only: the standard fused_moe
#: cases hold expert_map cases and would catch the bug at any layout; what is tested
#: here is that the deploy's own calls catch it exactly where the deploy takes the path.
RECORDED_ONLY = {"standard_cases": False, "server_checks": False}


@pytest.fixture(scope="module")
def tp2_ep_gate(tiny_moe_model: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[int, Path]:
    """The gate once on the cpu backend at TP=2 + expert parallel (standard cases are
    the single-rank gate's, so only the recorded ones run here)."""
    folder = tmp_path_factory.mktemp("tp2-ep-gate")
    deploy = write_deploy_yaml(folder / "deploy.yaml", tiny_moe_model, **TP2_EP, record_op_calls="calls",
                               gate={"standard_cases": False})
    return run_deploy(deploy, report_dir=folder / "reports"), folder / "reports"


@pytest.mark.slow
def test_a_tp2_ep_deploy_passes_the_gate(tp2_ep_gate: tuple[int, Path]) -> None:
    exit_code, reports = tp2_ep_gate
    document = json.loads((reports / "report.json").read_text())
    validate_document(document)
    assert exit_code == EXIT_PASSED, [c for c in document["checks"] if c["status"] != "pass"]
    checks = {c["name"]: c["status"] for c in document["checks"]}
    assert checks["profile_run"] == checks["greedy comparison with the reference"] == "pass"
    assert document["environment"]["deploy_config"]["tensor_parallel_size"] == 2


@pytest.mark.slow
def test_the_report_lists_every_rank_s_signatures_and_they_are_replayed(tp2_ep_gate: tuple[int, Path]) -> None:
    report = load_report(tp2_ep_gate[1] / "report.json")
    assert report.ranks == (0, 1)
    for rank in (0, 1):
        ops = {s.op for s in report.recorded if s.rank == rank}
        assert {"moe_route", "fused_moe", "paged_attention", "rms_norm"} <= ops
        # Each rank's fused_moe carries its expert_map: the expert-parallel path.
        assert any(s.op == "fused_moe" and "expert_map=[4]" in s.case for s in report.recorded if s.rank == rank)
    replayed = {(r.op, r.case) for r in report.results}
    assert {(s.op, s.case) for s in report.recorded} <= replayed
    assert "Op signatures recorded per rank" in (tp2_ep_gate[1] / "report.html").read_text()


@pytest.mark.slow
def test_each_rank_s_calls_are_kept_in_the_deploy_s_recording_folder(tp2_ep_gate: tuple[int, Path]) -> None:
    """Rank r's fused_moe calls carry rank r's expert_map (experts 2r and 2r+1 here)."""
    kept = read_recordings(tp2_ep_gate[1].parent / "calls")
    assert sorted(kept) == [0, 1]
    for rank, calls in kept.items():
        maps = {tuple(c.args["expert_map"].tolist()) for c in calls if c.op == "fused_moe" and c.args is not None}
        assert maps == {tuple(0 if e == 2 * rank else 1 if e == 2 * rank + 1 else -1 for e in range(4))}


class Loopback:
    """Rank 0 of 2 on its own: every collective gives the shape the group would, with
    this rank's part in its place (profile_run's outputs are never read)."""

    name, rank, world_size = "loopback", 0, 2

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def all_gather(self, x: torch.Tensor, dim: int = 0, sizes: Sequence[int] | None = None) -> torch.Tensor:
        sizes = list(sizes or [x.shape[dim]] * self.world_size)
        shape = list(x.shape)
        shape[dim] = sum(sizes)
        out = x.new_zeros(shape)
        out.narrow(dim, sum(sizes[: self.rank]), sizes[self.rank]).copy_(x)
        return out


def test_profile_run_routes_every_token_to_this_rank_s_own_experts(tiny_moe_model: Path) -> None:
    """Expert-parallel rank 0 of 2 (experts 0 and 1 of 4): profile_run's fused_moe takes
    the whole step budget, and every pick lands on this rank's experts, each of them
    getting tokens, though the router sends the profile batch elsewhere."""
    backend = get_backend("cpu")
    ops, recorder = OpDispatcher(backend), CallRecorder()
    ops.add_hook(recorder)
    parallel = ParallelContext(rank=0, world_size=2, tp_rank=0, tp_size=2, communicator=Loopback(),
                               expert_parallel=True)
    loaded = load_model(tiny_moe_model, ops, dtype=torch.float32, parallel=parallel)
    config = EngineConfig(model=str(tiny_moe_model), max_model_len=128, max_num_seqs=4, max_num_batched_tokens=32)
    runner = ModelRunner(config, backend, ops, loaded.model, loaded.config.dtype, 128)
    runner.profile_run(config.max_num_seqs, config.max_num_batched_tokens)
    profile = [call.args for call in recorder.calls if call.op == "fused_moe"]
    assert profile, "profile_run made no fused_moe call"
    for args in profile:
        assert args["hidden"].shape[0] == 32
        assert torch.nonzero(args["expert_map"] >= 0).flatten().tolist() == [0, 1]
        # top-2 over two local experts: every token reaches both.
        assert all(sorted(row) == [0, 1] for row in args["topk_ids"].tolist())
    # What the router itself made of the batch: not that (so this test can tell).
    ops.remove_hook(recorder)
    for args in (call.args for call in recorder.calls if call.op == "moe_route"):
        assert not all(sorted(row) == [0, 1] for row in ops.moe_route(**args)[1].tolist())


def test_worst_case_ids_fill_top_k_with_local_experts_first() -> None:
    # Rank 1 of 4 over 8 experts holds experts 2 and 3; top-3 needs one pick elsewhere.
    expert_map = torch.tensor([-1, -1, 0, 1, -1, -1, -1, -1], dtype=torch.int32)
    ids = worst_case_ids(torch.zeros(5, 3, dtype=torch.int32), 8, expert_map)
    assert ids.dtype == torch.int32
    for row in ids.tolist():
        assert len(set(row)) == 3 and {2, 3} <= set(row)
    # Without an expert_map (every expert here), picks spread over all experts.
    whole = worst_case_ids(torch.zeros(4, 2, dtype=torch.int64), 4, None)
    assert whole.dtype == torch.int64 and set(whole.flatten().tolist()) == {0, 1, 2, 3}
    assert all(len(set(row)) == 2 for row in whole.tolist())


@pytest.fixture(scope="module")
def broken_ep_gates(tiny_moe_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, Path]]:
    """The EP-index backend's gate at TP=2+EP and at TP=1, each in a fresh process
    where the test backends are an installed plugin (so spawned ranks find them too)."""
    runs = {}
    for name, layout in (("tp2-ep", TP2_EP), ("tp1", {})):
        folder = tmp_path_factory.mktemp(f"broken-{name}")
        deploy = write_deploy_yaml(folder / "deploy.yaml", tiny_moe_model, backend=EP_INDEX_BACKEND,
                                   gate=RECORDED_ONLY, **layout)
        runs[name] = gate_in_subprocess(folder, deploy)
    return runs


@pytest.mark.slow
def test_an_ep_only_index_width_bug_fails_the_gate_at_tp2_ep(broken_ep_gates: dict[str, tuple[int, Path]]) -> None:
    exit_code, reports = broken_ep_gates["tp2-ep"]
    report = load_report(reports / "report.json")
    failed = {(r.op, r.case) for r in report.results if r.status.value == "fail"}
    assert exit_code == EXIT_FAILED
    assert {op for op, _ in failed} == {"fused_moe"}
    assert all("expert_map=[4]" in case for _, case in failed)
    # The failing signature is named with the ranks that called it.
    assert all(case.endswith("on ranks 0,1") for _, case in failed)


@pytest.mark.slow
def test_the_same_bug_passes_the_gate_at_tp1(broken_ep_gates: dict[str, tuple[int, Path]]) -> None:
    exit_code, reports = broken_ep_gates["tp1"]
    report = load_report(reports / "report.json")
    fused = [r for r in report.results if r.op == "fused_moe"]
    assert exit_code == EXIT_PASSED, report.failures()
    assert fused and all(r.status.value == "pass" for r in fused)
    assert report.ranks == (0,)
