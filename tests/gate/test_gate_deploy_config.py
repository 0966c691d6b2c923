"""deploy.yaml: EngineConfig's fields under their own names plus a `gate:` section;
unknown keys are refused by name, relative paths are the YAML file's, and every
threshold has a default."""

from __future__ import annotations

from pathlib import Path

import pytest

from accord.gate.deploy_config import DeployConfigError, GateSettings, load_deploy_config, parse_deploy_config


def test_a_misspelt_engine_setting_is_refused_by_name() -> None:
    with pytest.raises(DeployConfigError, match="unknown key.*blocksize"):
        parse_deploy_config({"model": "m", "blocksize": 16}, Path("."))


def test_a_misspelt_gate_setting_is_refused_by_name() -> None:
    with pytest.raises(DeployConfigError, match="gate: unknown key.*min_agreement"):
        parse_deploy_config({"model": "m", "gate": {"min_agreement": 1.0}}, Path("."))


def test_the_model_directory_is_required() -> None:
    with pytest.raises(DeployConfigError, match="'model'"):
        parse_deploy_config({"backend": "cpu"}, Path("."))


def test_an_invalid_engine_value_is_refused_with_the_engines_reason() -> None:
    with pytest.raises(DeployConfigError, match="kv_cache_dtype must be"):
        parse_deploy_config({"model": "m", "kv_cache_dtype": "int4"}, Path("."))


def test_an_out_of_range_threshold_is_refused() -> None:
    with pytest.raises(DeployConfigError, match="min_token_agreement"):
        parse_deploy_config({"model": "m", "gate": {"min_token_agreement": 1.5}}, Path("."))


def test_a_relative_model_path_is_taken_from_the_yaml_files_folder(tmp_path: Path) -> None:
    (tmp_path / "deploy.yaml").write_text("model: models/llama\nbackend: cpu\n")
    config = load_deploy_config(tmp_path / "deploy.yaml")
    assert config.engine.model == str(tmp_path / "models" / "llama")


def test_thresholds_default_when_the_gate_section_is_absent() -> None:
    config = parse_deploy_config({"model": "m"}, Path("."))
    assert config.gate == GateSettings()
    assert not config.gate.require_determinism and not config.gate.require_batch_invariance


def test_the_recorded_config_includes_every_default() -> None:
    recorded = parse_deploy_config({"model": "m"}, Path("/")).as_dict()
    assert "max_num_batched_tokens" in recorded and recorded["max_num_batched_tokens"] is None  # measured at start-up
    assert recorded["gate"]["max_tokens"] == GateSettings().max_tokens


def test_a_yaml_file_that_is_not_a_mapping_is_refused(tmp_path: Path) -> None:
    (tmp_path / "deploy.yaml").write_text("- model\n- backend\n")
    with pytest.raises(DeployConfigError, match="expected a mapping"):
        load_deploy_config(tmp_path / "deploy.yaml")


def test_the_parallel_layout_is_taken_from_the_yaml(tmp_path: Path) -> None:
    (tmp_path / "deploy.yaml").write_text(
        "model: m\ntensor_parallel_size: 2\ndata_parallel_size: 1\nenable_expert_parallel: true\n"
        "distributed_executor_backend: mp\n"
    )
    engine = load_deploy_config(tmp_path / "deploy.yaml").engine
    assert (engine.tensor_parallel_size, engine.data_parallel_size, engine.enable_expert_parallel,
            engine.executor_backend) == (2, 1, True, "mp")


@pytest.mark.parametrize("key,value,reason", [
    ("tensor_parallel_size", 0, "tensor_parallel_size must be at least 1"),
    ("tensor_parallel_size", True, "tensor_parallel_size must be an integer, got True"),
    ("tensor_parallel_size", "2", "tensor_parallel_size must be an integer, got '2'"),
    ("data_parallel_size", 1.5, "data_parallel_size must be an integer"),
    ("data_parallel_size", 0, "data_parallel_size must be at least 1"),
    ("enable_expert_parallel", "yes", "enable_expert_parallel must be true or false, got 'yes'"),
    ("distributed_executor_backend", "slurm", "distributed_executor_backend must be one of 'uni', 'mp', 'ray'"),
])
def test_a_bad_parallel_setting_is_refused_by_name(key: str, value: object, reason: str) -> None:
    with pytest.raises(DeployConfigError, match=reason):
        parse_deploy_config({"model": "m", key: value}, Path("."))


def test_a_relative_recording_folder_is_taken_from_the_yaml_files_folder(tmp_path: Path) -> None:
    (tmp_path / "deploy.yaml").write_text("model: m\nrecord_op_calls: calls\n")
    assert load_deploy_config(tmp_path / "deploy.yaml").engine.record_op_calls == str(tmp_path / "calls")


def test_lora_modules_take_serves_forms_with_paths_from_the_yaml_files_folder(tmp_path: Path) -> None:
    (tmp_path / "deploy.yaml").write_text(
        "model: m\nenable_lora: true\nlora_modules:\n  - sql=adapters/sql\n"
        "  - {name: chat, path: /abs/chat, base_model_name: base}\n"
    )
    config = load_deploy_config(tmp_path / "deploy.yaml")
    (sql, chat) = config.lora_modules
    assert (sql.name, sql.path, sql.base_model_name) == ("sql", str(tmp_path / "adapters" / "sql"), None)
    assert (chat.name, chat.path, chat.base_model_name) == ("chat", "/abs/chat", "base")
    # The adapters are part of what rolls out, so the hashed config holds them.
    assert config.as_dict()["lora_modules"][0] == {"name": "sql", "path": sql.path, "base_model_name": None}


@pytest.mark.parametrize(("settings", "message"), [
    ({"lora_modules": ["a=x"]}, "lora_modules needs enable_lora: true"),
    ({"enable_lora": True, "lora_modules": "a=x"}, "must be a list"),
    ({"enable_lora": True, "lora_modules": ["a"]}, "give name=path"),
    ({"enable_lora": True, "lora_modules": [{"name": "a"}]}, "needs name and path"),
    ({"enable_lora": True, "lora_modules": [{"name": "a", "path": "x", "rank": 8}]}, "unknown key.*rank"),
    ({"enable_lora": True, "lora_modules": ["a=x", "a=y"]}, "names a more than once"),
])
def test_a_bad_lora_modules_entry_is_refused_saying_what_is_wrong(settings: dict, message: str) -> None:
    with pytest.raises(DeployConfigError, match=message):
        parse_deploy_config({"model": "m", **settings}, Path("."))
