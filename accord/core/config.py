"""Engine arguments: one dataclass with vLLM's names and defaults where vLLM has them.

It is also the one typed definition of what each argument may be: the annotation says
the type and, as a Literal, the choices; `setting(...)` adds the help text, vLLM's flag
name where it is not the field's, and numeric bounds. `engine_settings()` reads that
back, and everything that offers the arguments derives from it: `__post_init__`'s
checks (so Python callers and deploy.yaml are checked alike), `accord serve`'s flags and
the deploy YAML's keys. Adding a field here is all it takes to add an engine argument.
"""

from __future__ import annotations

import dataclasses
import types
from dataclasses import MISSING, dataclass, field
from functools import lru_cache
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from .kv_transfer.config import KVTransferConfig, offloading_config
from .kv_transfer.factory import check_connector
from .spec_decode.config import HEAD_METHODS, SpeculativeConfig

#: KV cache bytes on a CPU when `kv_cache_memory` is not given (vLLM-CPU's default
#: VLLM_CPU_KVCACHE_SPACE is 4 GiB too).
DEFAULT_CPU_KV_CACHE_BYTES = 4 << 30

#: The largest decode batch captured as a graph when max_cudagraph_capture_size is not
#: given (vLLM's default cap): every bucket costs capture time at start-up and graph memory.
DEFAULT_MAX_CAPTURE_SIZE = 512

#: The allowed values of the engine's string choices (vLLM's names).
Dtype = Literal["auto", "float32", "bfloat16", "float16", "half", "float"]
#: vLLM's other names for a dtype (its --dtype takes them), read as the canonical one.
DTYPE_ALIASES = {"half": "float16", "float": "float32"}
Quantization = Literal["fp8"]
KVCacheDtype = Literal["auto", "fp8", "fp8_e4m3"]
SchedulingPolicy = Literal["fcfs", "priority", "effort"]
PrefixCachingHashAlgo = Literal["sha256", "builtin"]
ExecutorBackend = Literal["uni", "mp", "ray"]


@dataclass(frozen=True)
class SettingInfo:
    """What a field's annotation cannot say: its help, vLLM's flag when it is not the
    field's name, short aliases, the default as help should describe it, and bounds."""

    help: str
    flag: str | None = None
    aliases: tuple[str, ...] = ()
    default_help: str | None = None
    at_least: float | None = None
    above: float | None = None
    at_most: float | None = None


def setting(default: Any = MISSING, *, help: str, **info: Any) -> Any:
    """A dataclass field carrying its `SettingInfo` (keyword arguments as SettingInfo's)."""
    return field(default=default, metadata={"setting": SettingInfo(help, **info)})


@dataclass(frozen=True)
class EngineSetting:
    """One engine argument as read from EngineConfig: its name, value type, choices
    (from a Literal annotation), whether None is allowed, its default and its info."""

    name: str
    kind: type
    choices: tuple[Any, ...] | None
    nullable: bool
    default: Any
    info: SettingInfo

    @property
    def required(self) -> bool:
        """Whether the argument has no default (the model)."""
        return self.default is MISSING

    @property
    def flag(self) -> str:
        """The command-line flag (vLLM's name): `--max-num-seqs` for max_num_seqs."""
        return self.info.flag or "--" + self.name.replace("_", "-")

    def refusal(self, value: Any) -> str | None:
        """Why `value` is not allowed for this argument, or None when it is."""
        if value is None:
            return None if self.nullable else "a value (not None)"
        if self.choices is not None:
            return None if value in self.choices else "one of " + ", ".join(map(repr, self.choices))
        if self.kind is bool and not isinstance(value, bool):
            return "true or false"
        numeric = {int: (int,), float: (int, float)}.get(self.kind)
        if numeric is not None and (isinstance(value, bool) or not isinstance(value, numeric)):
            return "an integer" if self.kind is int else "a number"
        info = self.info
        if info.at_least is not None and value < info.at_least:
            return f"at least {info.at_least:g}"
        if info.above is not None and value <= info.above:
            return f"greater than {info.above:g}"
        if info.at_most is not None and value > info.at_most:
            return f"at most {info.at_most:g}"
        return None


@dataclass
class EngineConfig:
    """Everything the engine needs besides the model's own config.json."""

    model: str = setting(help="Hugging Face model directory, GGUF file, or accord-demo-random")
    tokenizer: str | None = setting(None, help="tokenizer directory", default_help="the model directory")
    backend: str = setting(
        "auto", help="kernel backend: auto, cpu, reference, cuda, rocm, ascend or a plugin's (see `accord backends`)"
    )
    dtype: Dtype = setting("auto", help="compute dtype; auto follows config.json and the device")
    quantization: Quantization | None = setting(None, help="weight quantization", aliases=("-q",))
    max_model_len: int | None = setting(None, help="context length", default_help="the model's", at_least=1)
    block_size: int = setting(16, help="tokens per KV cache block", at_least=1)
    max_num_seqs: int = setting(256, help="most sequences in one step", at_least=1)
    max_num_batched_tokens: int | None = setting(
        None, help="most tokens in one step", at_least=1,
        default_help="chosen at start-up from measured step times: the largest power of two from max_num_seqs "
        "to 2048 whose step takes at most 5 one-request decode steps (accord.core.engine.token_budget); 4096 for "
        "offline LLM.generate",
    )
    enable_prefix_caching: bool = setting(True, help="reuse KV blocks of shared prompt prefixes")
    kv_cache_memory: int | None = setting(
        None, help="KV cache size in bytes (the budget on CPUs; overrides gpu_memory_utilization elsewhere)",
        flag="--kv-cache-memory-bytes", at_least=1,
        default_help="4 GiB on CPUs (256 MiB for the demo model), else from --gpu-memory-utilization",
    )
    gpu_memory_utilization: float = setting(
        0.9, help="fraction of accelerator memory the engine may use", above=0.0, at_most=1.0,
        aliases=("--device-memory-utilization",),
    )
    num_gpu_blocks_override: int | None = setting(
        None, help="exact KV block count, bypassing the memory budget (tests, reproducible runs)",
        default_help="from the memory budget", at_least=1,
    )
    kv_cache_dtype: KVCacheDtype = setting(
        "auto", help="KV cache dtype: auto (the model's), or fp8 / fp8_e4m3 (the device's e4m3 format)"
    )
    calculate_kv_scales: bool = setting(
        False, help="with an fp8 KV cache, calibrate each layer's k/v scales at start-up (amax / fp8 max over one "
        "forward of random tokens) where the checkpoint has none; off: scales 1.0 unless the checkpoint has them",
    )
    scheduling_policy: SchedulingPolicy = setting(
        "fcfs", help="order of waiting requests: fcfs, priority (the request's), or effort (lanes by expected decode "
        "length, the thinking budget plus max_tokens, each shortest remaining first)"
    )
    effort_lane_bounds: str = setting(
        "512,2048", help="with --scheduling-policy effort: the expected decode lengths (tokens, ascending) that "
        "divide the lanes; lane i and the longer ones hold at most 1/2^i of max_num_seqs while a shorter request waits"
    )
    max_thinking_tokens_per_tenant: int | None = setting(
        None, help="the remaining thinking-budget tokens one tenant's running requests that still think may hold "
        "together; a request past it waits until the tenant's others end their thinking (one request alone is "
        "admitted whatever its budget)", default_help="no cap", at_least=1,
    )
    seed: int = setting(0, help="random seed of unseeded sampling")
    prefix_caching_hash_algo: PrefixCachingHashAlgo = setting(
        "sha256", help="hash of prefix-cache block keys; builtin is faster but not collision-resistant"
    )
    tensor_parallel_size: int = setting(
        1, help="ranks (devices) one model is sharded over; one worker process each under mp", aliases=("-tp",),
        at_least=1,
    )
    data_parallel_size: int = setting(
        1, help="replicas of the model, each with its own scheduler and KV cache over its own requests (the least "
        "loaded takes a new one); with expert parallelism their MoE layers share one EP group", aliases=("-dp",),
        at_least=1,
    )
    distributed_executor_backend: ExecutorBackend | None = setting(
        None, help="how the ranks run: uni (in the server process), mp (a process per rank) or ray",
        default_help="uni for one rank, mp for more",
    )
    enable_expert_parallel: bool = setting(
        False, help="split MoE layers' routed experts across the ranks (EP size = TP size x DP size) instead of "
        "slicing every expert's intermediate dim", aliases=("-ep",),
    )
    async_scheduling: bool = setting(
        False, help="schedule the next step while the current one runs (vLLM v1's async scheduling), hiding "
        "the host time between steps behind the device; pays where the device runs apart from the host "
        "(GPUs); steps run one at a time while a grammar-constrained request is unfinished (docs/performance.md "
        "has the measured figures)",
    )
    batch_invariant: bool = setting(
        False, help="make temperature-0 output independent of the batch it runs in (vLLM's VLLM_BATCH_INVARIANT, "
        "SGLang's deterministic inference): every op runs a kernel conformance checks batch invariant, and start-up "
        "refuses, naming the ops, where the backend has none (docs/batch_invariance.md)",
    )
    enforce_eager: bool = setting(
        False, help="run every step eagerly: capture no graphs of the decode step even where the backend can",
    )
    max_cudagraph_capture_size: int | None = setting(
        None, help="largest decode batch captured as a graph (buckets 1, 2, 4, then multiples of 8 up to it); "
        "only backends whose capture is real capture (CUDA graphs; the cpu backend's native-call graphs, up to "
        "its own limit)", at_least=1,
        default_help=f"min(max_num_seqs, {DEFAULT_MAX_CAPTURE_SIZE})",
    )
    compilation_config: int = setting(
        0, help="torch.compile level of the model forward (vLLM's -O): 0 runs it eagerly, 1-3 compile it with "
        "inductor, the contract ops opaque (accord.core.worker.compilation; measured figures in docs/performance.md)",
        flag="--compilation-config", aliases=("-O", "-cc"), at_least=0, at_most=3,
    )
    speculative_config: dict | None = setting(
        None, help="speculative decoding as JSON, vLLM's keys: {\"method\": \"ngram\" or \"suffix\", "
        "\"num_speculative_tokens\": k, \"prompt_lookup_min\": .., \"prompt_lookup_max\": .., "
        "\"disable_by_batch_size\": ..} (accord.core.spec_decode.config; also \"draft_model\", \"eagle\" and \"eagle3\" with \"model\": DIR, and \"mtp\"; "
        "accord's \"adaptive_num_speculative_tokens\": true checks, each step, only the drafts measured to pay)",
        default_help="off", aliases=("-sc",),
    )
    enable_lora: bool = setting(
        False, help="serve LoRA adapters (PEFT directories) on the resident base model, each token of a batch "
        "with its own adapter (the lora_linear op); requests name one with a LoRARequest or, on the server, "
        "the adapter's name in `model`",
    )
    max_loras: int = setting(1, help="LoRA adapters resident on the device at once (a step uses at most this many)",
                             at_least=1)
    max_lora_rank: int = setting(16, help="the largest LoRA rank served (the device slots' width)", at_least=1)
    max_cpu_loras: int | None = setting(
        None, help="LoRA adapters kept read on the host (least recently used dropped past it, read again when "
        "asked for); at least max_loras", at_least=1, default_help="max_loras",
    )
    kv_transfer_config: dict | None = setting(
        None, help="KV transfer between instances as JSON, vLLM's keys: {\"kv_connector\": \"SharedStorageConnector\", "
        "\"kv_role\": \"kv_producer\", \"kv_consumer\" or \"kv_both\", \"kv_connector_extra_config\": "
        "{\"shared_storage_path\": DIR}} (accord.core.kv_transfer; docs/disaggregation.md)",
        default_help="off",
    )
    kv_offloading_size: float | None = setting(
        None, help="GiB of CPU memory for a KV tier under the device pool (vLLM's): full blocks are copied there "
        "as they are computed, and a prefix found there is copied back instead of recomputed "
        "(accord.core.kv_transfer.offload); needs prefix caching", default_help="no CPU tier", above=0.0,
    )
    record_op_calls: str | None = setting(
        None, help="folder each rank records the first calls of every op signature into, profile_run's "
        "included (what `accord conformance --deploy` replays; it sets this itself)",
        default_help="record nothing",
    )

    def __post_init__(self) -> None:
        for spec in engine_settings():
            value = getattr(self, spec.name)
            expected = spec.refusal(value)
            if expected is not None:
                raise ValueError(f"{spec.name} must be {expected}, got {value!r}")
        self.dtype = DTYPE_ALIASES.get(self.dtype, self.dtype)
        #: The checked speculative decoding setup (None: off).
        self.speculative: SpeculativeConfig | None = (
            None if self.speculative_config is None else SpeculativeConfig.parse(self.speculative_config)
        )
        if self.speculative is not None and self.speculative.method in HEAD_METHODS and self.world_size > 1:
            raise ValueError(
                f"speculative_config.method {self.speculative.method!r} with tensor_parallel_size or "
                "data_parallel_size > 1 is not supported yet (the head runs on the driver rank only)"
            )
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ValueError(f"max_cpu_loras ({self.max_cpu_loras}) must be at least max_loras ({self.max_loras})")
        #: The checked KV transfer setup (None: no connector).
        self.kv_transfer: KVTransferConfig | None = (
            None if self.kv_transfer_config is None else KVTransferConfig.parse(self.kv_transfer_config)
        )
        if self.kv_offloading_size is not None:
            if self.kv_transfer is not None:
                raise ValueError("kv_offloading_size with a kv_transfer_config is not supported yet: give one")
            if not self.enable_prefix_caching:
                raise ValueError("kv_offloading_size needs enable_prefix_caching: the tier is keyed by its block hashes")
            self.kv_transfer = offloading_config(self.kv_offloading_size)
        if self.kv_transfer is not None:
            check_connector(self.kv_transfer)
            if self.kv_transfer.kv_connector == "NixlConnector" and self.world_size != 1:
                # Each rank would read its own share of a remote rank's blocks: not built.
                raise ValueError(
                    f"NixlConnector runs one rank per instance yet; tensor_parallel_size={self.tensor_parallel_size} x "
                    f"data_parallel_size={self.data_parallel_size} is not supported"
                )
        if self.distributed_executor_backend == "uni" and self.world_size != 1:
            raise ValueError(
                f"the uni executor runs one rank; tensor_parallel_size={self.tensor_parallel_size} x "
                f"data_parallel_size={self.data_parallel_size} needs mp (or ray)"
            )

    @property
    def world_size(self) -> int:
        """Ranks in the torch.distributed world: tensor_parallel_size x data_parallel_size."""
        return self.tensor_parallel_size * self.data_parallel_size

    @property
    def lora_cpu_cache_size(self) -> int:
        """Adapters kept on the host (max_cpu_loras, or max_loras when not given)."""
        return self.max_cpu_loras or self.max_loras

    @property
    def cudagraph_capture_size(self) -> int:
        """The largest decode batch captured (the default resolved; never past max_num_seqs)."""
        wanted = self.max_cudagraph_capture_size or DEFAULT_MAX_CAPTURE_SIZE
        return min(wanted, self.max_num_seqs)

    @property
    def executor_backend(self) -> str:
        """The executor that runs the workers (the default resolved)."""
        if self.distributed_executor_backend is not None:
            return self.distributed_executor_backend
        return "uni" if self.world_size == 1 else "mp"

    def verify_with_model(self, num_routed_experts: int | None, device_count: int | None) -> None:
        """Refuse a parallel layout the model or the host cannot hold, before any worker
        starts: an expert-parallel size (TP x DP) past the routed experts (a rank would hold
        none; a size that does not divide them is placed unevenly, as vLLM does), or more
        ranks than devices (`device_count` None: ranks share one device, as on CPUs)."""
        tp, dp = self.tensor_parallel_size, self.data_parallel_size
        if self.enable_expert_parallel and num_routed_experts and num_routed_experts < self.world_size:
            raise ValueError(
                f"{num_routed_experts} routed experts are fewer than the expert-parallel size "
                f"{self.world_size} (tensor_parallel_size {tp} x data_parallel_size {dp}): a rank would hold no expert"
            )
        if device_count is not None and self.world_size > device_count:
            raise ValueError(
                f"tensor_parallel_size {tp} x data_parallel_size {dp} needs {self.world_size} devices, "
                f"but {device_count} are visible"
            )

    def resolve_max_model_len(self, max_position_embeddings: int) -> int:
        """The context length in force: `max_model_len`, or the model's limit."""
        wanted = self.max_model_len or max_position_embeddings
        if wanted > max_position_embeddings:
            raise ValueError(
                f"max_model_len={wanted} exceeds the model's max_position_embeddings={max_position_embeddings}"
            )
        return wanted


@lru_cache(maxsize=1)
def engine_settings() -> tuple[EngineSetting, ...]:
    """Every EngineConfig field as an `EngineSetting`, in field order."""
    hints = get_type_hints(EngineConfig)
    settings = []
    for item in dataclasses.fields(EngineConfig):
        if "setting" not in item.metadata:
            raise TypeError(f"EngineConfig.{item.name} must be declared with setting(default, help=...)")
        kind, nullable = _unwrap_optional(hints[item.name])
        choices = get_args(kind) if get_origin(kind) is Literal else None
        if choices is not None:
            kind = type(choices[0])
        settings.append(EngineSetting(item.name, kind, choices, nullable, item.default, item.metadata["setting"]))
    return tuple(settings)


def _unwrap_optional(annotation: Any) -> tuple[Any, bool]:
    """(`T`, True) for `T | None`, (`T`, False) for `T`."""
    if get_origin(annotation) in (Union, types.UnionType):
        members = [a for a in get_args(annotation) if a is not type(None)]
        if len(members) == 1:
            return members[0], True
    return annotation, False
