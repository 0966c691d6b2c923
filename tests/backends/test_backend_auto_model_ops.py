"""`--backend auto` asks each backend only for the ops the model to serve calls: a
plugin lacking an op the model never calls stays eligible (and wins on priority), one
lacking an op the model does call is passed over with the op named, and with no model
given every contract is asked for, as before."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import transformers

from accord.backends import BackendRegistry, hookimpl
from accord.backends import registry as registry_module
from accord.backends.reference import ReferenceBackend
from accord.backends.registry import plugin_manager
from accord.core.worker.contract_ops import worker_contract_ops
from accord.entrypoints import RegistryBackend
from accord.op_contracts import KernelSet

#: The op the plugin leaves out: only routed-expert models call it.
LEFT_OUT = "fused_moe"
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=256)


class NoMoeBackend(ReferenceBackend):
    """A third-party backend with every kernel but fused_moe, above every built-in."""

    name = "no-moe"
    priority = 100

    def load_kernels(self) -> KernelSet:
        kernels = KernelSet(self.name)
        for op, kernel in ReferenceBackend().kernels().as_dict().items():
            if op != LEFT_OUT:
                kernels.add(kernel)
        return kernels


class NoMoePlugin:
    @hookimpl
    def accord_backends(self) -> list[NoMoeBackend]:
        return [NoMoeBackend()]


@pytest.fixture
def registry() -> BackendRegistry:
    manager = plugin_manager(load_entry_points=False)
    manager.register(NoMoePlugin())
    return BackendRegistry(manager)


def config_dir(directory: Path, config: transformers.PretrainedConfig, architecture: str) -> Path:
    """A model directory with only config.json: all the choice reads."""
    config.architectures = [architecture]
    config.save_pretrained(directory)
    return directory


@pytest.fixture
def dense(tmp_path: Path) -> Path:
    return config_dir(tmp_path / "llama", transformers.LlamaConfig(**TINY), "LlamaForCausalLM")


@pytest.fixture
def moe(tmp_path: Path) -> Path:
    return config_dir(tmp_path / "mixtral", transformers.MixtralConfig(num_local_experts=4, **TINY),
                      "MixtralForCausalLM")


def test_a_plugin_lacking_an_op_the_model_never_calls_is_chosen(registry: BackendRegistry, dense: Path) -> None:
    assert LEFT_OUT not in worker_contract_ops(dense)
    assert registry.auto(worker_contract_ops(dense)).name == "no-moe"


def test_a_plugin_lacking_an_op_the_model_calls_is_passed_over_naming_it(
    registry: BackendRegistry, moe: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="accord.backends"):
        chosen = registry.auto(worker_contract_ops(moe))
    assert chosen.name != "no-moe"
    assert f"no-moe (no kernel for {LEFT_OUT})" in caplog.text


def test_without_a_model_every_contract_is_asked_for(registry: BackendRegistry) -> None:
    assert registry.auto().name != "no-moe"


def test_the_engines_backend_factory_asks_for_its_models_ops(
    registry: BackendRegistry, dense: Path, moe: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(registry_module, "default_registry", lambda: registry)
    assert RegistryBackend("auto", str(dense))().name == "no-moe"
    assert RegistryBackend("auto", str(moe))().name != "no-moe"
    assert RegistryBackend("no-moe", str(moe))().name == "no-moe"  # a named backend is the user's choice
