"""The rollout gate on a deploy that serves LoRA adapters (deploy.yaml's `lora_modules`):
the prompt set runs under the base model and under each adapter in one batch, each is
compared with the reference on its own, the recorded lora_linear calls are replayed, and
every report names the adapters with their rank, targets and weights' sha256. A kernel
that gets the adapter deltas wrong fails the gate; an adapter the engine refuses fails
it, named."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from gate_backends import LORA_BUGGY_BACKEND
from gate_helpers import gate_in_subprocess, write_deploy_yaml
from lora_helpers import ADAPTER_A, ADAPTER_B, make_adapter

from accord.gate.gate_command import EXIT_FAILED, EXIT_PASSED, run_deploy
from accord.gate.reports import load_report

pytestmark = pytest.mark.slow
#: The prompts of the gate's set (smoke.prompt_set) and TINY_DEPLOY's tokens per prompt.
PROMPTS, TOKENS = 5, 4


@pytest.fixture(scope="module")
def adapters(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two PEFT adapters of the tiny model with random non-zero A and B (ranks 8 and 16)."""
    root = tmp_path_factory.mktemp("gate-adapters")
    return {"sql": make_adapter(tiny_model, root / "sql", seed=1, **ADAPTER_A),
            "chat": make_adapter(tiny_model, root / "chat", seed=2, **ADAPTER_B)}


def _lora_deploy(folder: Path, tiny_model: Path, adapters: dict[str, Path], **overrides) -> Path:
    modules = ["sql=" + str(adapters["sql"]), {"name": "chat", "path": str(adapters["chat"]), "base_model_name": "tiny"}]
    return write_deploy_yaml(folder / "deploy.yaml", tiny_model, enable_lora=True, max_loras=2,
                             lora_modules=modules, **overrides)


@pytest.fixture(scope="module")
def lora_gate(tiny_model: Path, adapters: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> tuple[int, Path]:
    folder = tmp_path_factory.mktemp("lora-gate")
    deploy = _lora_deploy(folder, tiny_model, adapters, gate={"standard_cases": False})
    return run_deploy(deploy, report_dir=folder / "reports"), folder / "reports"


def _sha256(path: Path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_sound_lora_deploy_passes_with_each_adapter_compared_with_the_reference(lora_gate: tuple[int, Path]) -> None:
    exit_code, reports = lora_gate
    checks = {c.name: c for c in load_report(reports / "report.json").checks}
    assert exit_code == EXIT_PASSED
    assert checks["lora adapters"].message == "serving 'sql' (rank 8), 'chat' (rank 16)"
    for name in ("greedy comparison with the reference", "greedy comparison with the reference under adapter 'sql'",
                 "greedy comparison with the reference under adapter 'chat'"):
        assert checks[name].status.value == "pass", checks[name]
        assert checks[name].figures["token_agreement"] == 1.0
        assert checks[name].figures["tokens_compared"] == PROMPTS * TOKENS


def test_the_report_names_each_adapter_with_its_rank_targets_and_weights_hash(
    lora_gate: tuple[int, Path], adapters: dict[str, Path]
) -> None:
    report = load_report(lora_gate[1] / "report.json")  # validated against the schema
    by_name = {adapter.name: adapter for adapter in report.adapters}
    assert list(by_name) == ["sql", "chat"]
    for name, settings, base in (("sql", ADAPTER_A, None), ("chat", ADAPTER_B, "tiny")):
        adapter = by_name[name]
        assert adapter.rank == settings["r"]
        assert adapter.target_modules == tuple(sorted(settings["target_modules"]))
        assert adapter.base_model_name == base
        assert adapter.path == str(adapters[name])
        assert adapter.weights_sha256 == _sha256(adapters[name] / "adapter_model.safetensors")
    html = (lora_gate[1] / "report.html").read_text()
    assert "LoRA adapters served" in html and by_name["chat"].weights_sha256 in html
    deploy_config = json.loads((lora_gate[1] / "report.json").read_text())["environment"]["deploy_config"]
    assert [module["name"] for module in deploy_config["lora_modules"]] == ["sql", "chat"]


def test_the_lora_linear_calls_recorded_while_generating_are_replayed(lora_gate: tuple[int, Path]) -> None:
    report = load_report(lora_gate[1] / "report.json")
    replayed = [r for r in report.results if r.op == "lora_linear" and r.case.startswith("recorded ")]
    assert replayed and all(r.status.value == "pass" for r in replayed)
    assert "lora_linear" in {signature.op for signature in report.recorded}


def test_a_kernel_getting_the_adapter_deltas_wrong_fails_the_gate_on_the_adapters_only(
    tiny_model: Path, adapters: dict[str, Path], tmp_path: Path
) -> None:
    deploy = _lora_deploy(tmp_path, tiny_model, adapters, backend=LORA_BUGGY_BACKEND,
                          gate={"standard_cases": False, "server_checks": False})
    exit_code, reports = gate_in_subprocess(tmp_path, deploy)
    report = load_report(reports / "report.json")
    checks = {c.name: c for c in report.checks}
    assert exit_code == EXIT_FAILED
    assert {r.op for r in report.results if r.status.value == "fail"} == {"lora_linear"}
    # The buggy backend is the reference's kernels but for the deltas: the base model's
    # streams are the reference's to the bit, each adapter's are measurably off.
    assert checks["greedy comparison with the reference"].figures["max_logprob_diff"] == 0.0
    for name in ("sql", "chat"):
        assert checks[f"greedy comparison with the reference under adapter '{name}'"].figures["max_logprob_diff"] > 0.0


def test_an_adapter_the_engine_refuses_fails_the_gate_naming_it(
    tiny_model: Path, adapters: dict[str, Path], tmp_path: Path
) -> None:
    deploy = _lora_deploy(tmp_path, tiny_model, adapters, max_lora_rank=8, gate={"server_checks": False})
    exit_code = run_deploy(deploy, report_dir=tmp_path / "reports")
    checks = {c.name: c for c in load_report(tmp_path / "reports" / "report.json").checks}
    assert exit_code == EXIT_FAILED
    assert checks["lora adapters"].status.value == "fail"
    assert "adapter 'chat'" in checks["lora adapters"].message and "rank 16" in checks["lora adapters"].message
    assert "greedy comparison with the reference" not in checks
