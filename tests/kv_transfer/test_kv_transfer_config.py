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
        ({"kv_connector": "LMCacheConnectorV1"}, "Unsupported kv_connector: LMCacheConnectorV1. Supported: ['NixlConnector', 'OffloadingConnector', 'SharedStorageConnector']"),
        ({"kv_conector": "x"}, "unknown key(s) kv_conector"),
        ({"kv_role": None}, "needs 'kv_role'"),
    ],
)
def test_a_bad_config_is_refused_naming_what_is_wrong(change: dict, message: str) -> None:
    with pytest.raises(ValueError) as error:
        EngineConfig(model="m", kv_transfer_config={**SHARED, **change})
    assert message in str(error.value)


def test_the_cpu_tier_is_the_offloading_connector_and_refuses_what_it_cannot_serve() -> None:
    tier = EngineConfig(model="m", kv_offloading_size=2).kv_transfer
    assert tier is not None and (tier.kv_connector, tier.kv_role) == ("OffloadingConnector", "kv_both")
    assert tier.kv_connector_extra_config == {"cpu_bytes_to_use": 2 << 30}
    with pytest.raises(ValueError, match="needs enable_prefix_caching"):
        EngineConfig(model="m", kv_offloading_size=2, enable_prefix_caching=False)
    with pytest.raises(ValueError, match="with a kv_transfer_config is not supported yet"):
        EngineConfig(model="m", kv_offloading_size=2, kv_transfer_config=SHARED)


def test_shared_storage_needs_its_path(tmp_path) -> None:
    from accord.core.kv_transfer.factory import make_scheduler_connector

    config = KVTransferConfig.parse({"kv_connector": "SharedStorageConnector", "kv_role": "kv_producer"})
    with pytest.raises(ValueError, match="shared_storage_path"):
        make_scheduler_connector(config, block_size=16, bytes_per_block=1024)


def test_the_nixl_connector_refuses_more_than_one_rank() -> None:
    nixl = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
    with pytest.raises(ValueError, match="NixlConnector runs one rank per instance"):
        EngineConfig(model="m", kv_transfer_config=nixl, tensor_parallel_size=2, distributed_executor_backend="mp")


@pytest.mark.parametrize("interval", [-1, "soon", None])
def test_the_disk_tier_refuses_a_reclaim_interval_that_is_not_seconds(tmp_path, interval) -> None:
    from accord.core.kv_transfer.factory import make_scheduler_connector

    config = KVTransferConfig.parse({"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                                     "kv_connector_extra_config": {
                                         "cpu_bytes_to_use": 1024, "disk_path": str(tmp_path),
                                         "disk_bytes_to_use": 1024, "disk_reclaim_interval_s": interval}})
    with pytest.raises(ValueError, match="disk_reclaim_interval_s must be a number of seconds >= 0"):
        make_scheduler_connector(config, block_size=16, bytes_per_block=1024)
