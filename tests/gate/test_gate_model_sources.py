"""The gate takes every model source `accord serve` takes, through serve's own resolver
(accord.entrypoints.model_choice): a Hugging Face directory, a GGUF file and the demo
model by its name; a model that cannot be read is a bad config. The GGUF file is
written here with gguf-py's writer (the GGUF tests' helper)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from gate_helpers import write_deploy_yaml

from accord.demo.model import DEMO_KV_CACHE_BYTES, DEMO_MODEL_NAME
from accord.gate.deploy_config import DeployConfigError, load_deploy_config, parse_deploy_config
from accord.gate.deploy_model import open_deploy_model
from accord.gate.gate_command import EXIT_PASSED, run_deploy

GGUF_TESTS = Path(__file__).resolve().parents[1] / "gguf"


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama model as an fp32 GGUF file, written as llama.cpp's converter does."""
    sys.path.insert(0, str(GGUF_TESTS))
    try:
        from gguf_files import build_model, write_gguf
    finally:
        sys.path.remove(str(GGUF_TESTS))
    return write_gguf(tmp_path_factory.mktemp("gate-gguf") / "tiny.gguf", build_model("llama"), "llama")


def test_a_model_directory_is_read_as_given(tiny_model: Path) -> None:
    opened = open_deploy_model(parse_deploy_config({"model": str(tiny_model)}, tiny_model))
    assert opened.config.engine.model == str(tiny_model)
    assert opened.model.architecture == json.loads((tiny_model / "config.json").read_text())["architectures"][0]


def test_a_gguf_file_is_read_as_given(tiny_gguf: Path) -> None:
    import gguf

    opened = open_deploy_model(parse_deploy_config({"model": str(tiny_gguf)}, tiny_gguf.parent))
    assert opened.config.engine.model == str(tiny_gguf)
    fields = gguf.GGUFReader(str(tiny_gguf)).fields
    assert opened.model.hidden_size == fields["llama.embedding_length"].contents()
    assert opened.model.num_kv_heads == fields["llama.attention.head_count_kv"].contents()


def test_the_demo_model_is_taken_by_its_name_not_as_a_path(tmp_path: Path) -> None:
    (tmp_path / "deploy.yaml").write_text(f"model: {DEMO_MODEL_NAME}\nbackend: cpu\n")
    config = load_deploy_config(tmp_path / "deploy.yaml")
    assert config.engine.model == DEMO_MODEL_NAME
    opened = open_deploy_model(config)
    assert (Path(opened.config.engine.model) / "config.json").is_file()
    assert opened.config.engine.kv_cache_memory == DEMO_KV_CACHE_BYTES  # serve's budget for it, not 4 GiB


def test_a_configured_kv_cache_budget_is_kept_for_the_demo_model() -> None:
    config = parse_deploy_config({"model": DEMO_MODEL_NAME, "kv_cache_memory": 1 << 20}, Path("."))
    assert open_deploy_model(config).config.engine.kv_cache_memory == 1 << 20


def test_a_missing_model_is_a_bad_config_naming_it(tmp_path: Path) -> None:
    with pytest.raises(DeployConfigError, match=f"model '{tmp_path / 'absent'}'.*not a directory"):
        open_deploy_model(parse_deploy_config({"model": str(tmp_path / "absent")}, tmp_path))


def test_a_missing_gguf_file_is_a_bad_config_naming_it(tmp_path: Path) -> None:
    with pytest.raises(DeployConfigError, match="absent.gguf: no such GGUF file"):
        open_deploy_model(parse_deploy_config({"model": str(tmp_path / "absent.gguf")}, tmp_path))


def test_the_gate_passes_on_a_gguf_file(tiny_gguf: Path, tmp_path: Path) -> None:
    deploy = write_deploy_yaml(tmp_path / "deploy.yaml", tiny_gguf, gate={"standard_cases": False})
    assert run_deploy(deploy, report_dir=tmp_path / "reports") == EXIT_PASSED
    document = json.loads((tmp_path / "reports" / "report.json").read_text())
    assert document["environment"]["deploy_config"]["model"] == str(tiny_gguf)
    assert {"linear", "paged_attention"} <= {result["op"] for result in document["conformance"]["results"]}
