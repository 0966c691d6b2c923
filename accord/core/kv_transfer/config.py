"""`--kv-transfer-config`: which KV connector an engine runs and in which role, with
vLLM's JSON keys (vllm/config/kv_transfer.py). Unknown keys are refused, so a typo is
an error at start-up rather than a connector silently running with its defaults."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Literal, get_args

#: What an engine does with KV it computes and KV it finds elsewhere (vLLM's roles).
KVRole = Literal["kv_producer", "kv_consumer", "kv_both"]


@dataclass(frozen=True)
class KVTransferConfig:
    """A checked `--kv-transfer-config`: the connector's name, the engine's role, and
    the connector's own settings (`kv_connector_extra_config`). The other keys are
    vLLM's, accepted so a vLLM command line works; connectors read what they need."""

    kv_connector: str
    kv_role: KVRole
    kv_connector_extra_config: dict[str, Any] = field(default_factory=dict)
    engine_id: str | None = None
    kv_buffer_device: str | None = None
    kv_buffer_size: float | None = None
    kv_rank: int | None = None
    kv_parallel_size: int = 1
    kv_ip: str = "127.0.0.1"
    kv_port: int = 14579
    kv_connector_module_path: str | None = None

    @classmethod
    def parse(cls, raw: dict[str, Any]) -> KVTransferConfig:
        """The config a `--kv-transfer-config` JSON object describes; ValueError names
        a missing or unknown key and a bad role."""
        known = {item.name for item in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f"kv_transfer_config: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        for key in ("kv_connector", "kv_role"):
            if not raw.get(key):
                raise ValueError(f"kv_transfer_config needs {key!r}")
        if raw["kv_role"] not in get_args(KVRole):
            raise ValueError(f"kv_transfer_config: kv_role must be one of {', '.join(get_args(KVRole))}, got {raw['kv_role']!r}")
        extra = raw.get("kv_connector_extra_config") or {}
        if not isinstance(extra, dict):
            raise ValueError("kv_transfer_config: kv_connector_extra_config must be a JSON object")
        return cls(**{**raw, "kv_connector_extra_config": dict(extra)})

    @property
    def is_producer(self) -> bool:
        """Whether this engine saves the KV it computes for others."""
        return self.kv_role in ("kv_producer", "kv_both")

    @property
    def is_consumer(self) -> bool:
        """Whether this engine loads KV others computed instead of computing it."""
        return self.kv_role in ("kv_consumer", "kv_both")


#: The kv_connector_extra_config key for the tier's size in bytes (vLLM's).
CPU_BYTES_KEY = "cpu_bytes_to_use"


def offloading_config(size_gib: float) -> KVTransferConfig:
    """The connector config `--kv-offloading-size size_gib` stands for."""
    return KVTransferConfig(
        kv_connector="OffloadingConnector", kv_role="kv_both",
        kv_connector_extra_config={CPU_BYTES_KEY: int(size_gib * 2**30)},
    )


#: kv_connector_extra_config keys of the optional local-disk tier under the CPU tier:
#: its directory, and its size in bytes (named like the CPU tier's).
DISK_PATH_KEY = "disk_path"
DISK_BYTES_KEY = "disk_bytes_to_use"
#: How often (seconds) an instance looks for stopped instances' directories on a
#: shared disk tier to reclaim (it also does once at start-up).
DISK_RECLAIM_INTERVAL_KEY = "disk_reclaim_interval_s"


def num_disk_blocks(config: KVTransferConfig, bytes_per_block: int) -> int:
    """Blocks the disk tier holds (0: no disk tier configured)."""
    extra = config.kv_connector_extra_config
    if not extra.get(DISK_PATH_KEY):
        return 0
    size = int(extra.get(DISK_BYTES_KEY, 0))
    blocks = size // bytes_per_block
    if blocks < 1:
        raise ValueError(f"the disk KV tier of {size} bytes ({DISK_BYTES_KEY}) holds no block of {bytes_per_block} bytes")
    return blocks


def disk_reclaim_interval_s(config: KVTransferConfig) -> float:
    """Seconds between two looks for stopped instances' disk directories (60 unless
    set; 0: every step)."""
    raw = config.kv_connector_extra_config.get(DISK_RECLAIM_INTERVAL_KEY, 60)
    try:
        interval = float(raw)
    except (TypeError, ValueError):
        interval = -1.0
    if not interval >= 0:
        raise ValueError(f"{DISK_RECLAIM_INTERVAL_KEY} must be a number of seconds >= 0, got {raw!r}")
    return interval


def num_cpu_blocks(config: KVTransferConfig, bytes_per_block: int) -> int:
    """Blocks the tier holds: its bytes over one block's bytes (at least one)."""
    size = int(config.kv_connector_extra_config.get(CPU_BYTES_KEY, 0))
    blocks = size // bytes_per_block
    if blocks < 1:
        raise ValueError(f"the CPU KV tier of {size} bytes holds no block of {bytes_per_block} bytes")
    return blocks


#: The kv_connector_extra_config key that turns asynchronous loads off (`false`: a
#: connector that can load off the step path loads in the admitting step instead).
ASYNC_LOAD_KEY = "async_load"


def async_load(config: KVTransferConfig) -> bool:
    """Whether loads may run off the step path (on unless `async_load` is false)."""
    raw = config.kv_connector_extra_config.get(ASYNC_LOAD_KEY, True)
    if not isinstance(raw, bool):
        raise ValueError(f"{ASYNC_LOAD_KEY} must be true or false, got {raw!r}")
    return raw
