"""`--kv-transfer-config`: vLLM's keys are taken, anything else is refused at start-up
with a message naming it."""

from __future__ import annotations

import argparse

import pytest

from accord.cli.engine_flags import add_engine_flags, engine_config
from accord.core.config import EngineConfig
from accord.core.kv_transfer.config import KVTransferConfig

SHARED = {"kv_connector": "SharedStorageConnector", "kv_role": "kv_both",
          "kv_connector_extra_config": {"shared_storage_path": "/tmp/kv"}}


def test_the_flag_takes_vllms_json_and_the_engine_checks_it() -> None:
    parser = argparse.ArgumentParser()
    add_engine_flags(parser.add_argument_group())
    args = parser.parse_args([
        "--kv-transfer-config",
        '{"kv_connector": "SharedStorageConnector", "kv_role": "kv_consumer", "kv_buffer_device": "cpu", '
        '"kv_connector_extra_config": {"shared_storage_path": "/tmp/kv"}}',
    ])
    config = engine_config(args, "model-dir").kv_transfer
    assert config is not None
    assert (config.kv_role, config.is_consumer, config.is_producer) == ("kv_consumer", True, False)
    assert config.kv_connector_extra_config == {"shared_storage_path": "/tmp/kv"}


@pytest.mark.parametrize(
    "change, message",
    [
        ({"kv_role": "kv_sender"}, "kv_role must be one of kv_producer, kv_consumer, kv_both"),
        ({"kv_connector": "LMCacheConnectorV1"}, "Unsupported kv_connector: LMCacheConnectorV1. Supported: ['SharedStorageConnector']"),
        ({"kv_conector": "x"}, "unknown key(s) kv_conector"),
        ({"kv_role": None}, "needs 'kv_role'"),
    ],
)
def test_a_bad_config_is_refused_naming_what_is_wrong(change: dict, message: str) -> None:
    with pytest.raises(ValueError) as error:
        EngineConfig(model="m", kv_transfer_config={**SHARED, **change})
    assert message in str(error.value)


def test_shared_storage_needs_its_path(tmp_path) -> None:
    from accord.core.kv_transfer.factory import make_scheduler_connector

    config = KVTransferConfig.parse({"kv_connector": "SharedStorageConnector", "kv_role": "kv_producer"})
    with pytest.raises(ValueError, match="shared_storage_path"):
        make_scheduler_connector(config, block_size=16)
