"""`vllm serve`'s flags that `accord serve` does not define itself, so that a vLLM
command line starts accord unchanged or says exactly why it cannot.

The full list of vLLM's flags is data (vllm_serve_flags.json, produced from vLLM's own
parser by ci/generate_vllm_serve_flags.py). accord defines the flags it implements
(engine flags from EngineConfig, server flags in commands/serve.py); every other vLLM
flag is classified here, by its argparse destination (or by one option string, where
the two forms of a boolean differ):

- NOTED: tuning of vLLM's internals, or what accord always does: accepted, with a
  one-line note saying it has no effect;
- REFUSED: a feature accord does not have: `accord serve` exits with status 2 and an
  error naming the feature.

A vLLM flag in neither table, nor defined by accord, fails tests/cli/test_vllm_serve_flags.py.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

FLAGS_FILE = Path(__file__).with_name("vllm_serve_flags.json")
#: Prefix of the namespace attributes the accepted vLLM flags are parsed into.
DEST_PREFIX = "vllm_flag_"


@dataclass(frozen=True)
class VllmFlag:
    """One flag of `vllm serve`: its destination, option strings, argparse group and
    how many values it takes ("0", "1", "?" or "+")."""

    dest: str
    options: tuple[str, ...]
    group: str
    values: str


@lru_cache(maxsize=1)
def vllm_serve_flags() -> tuple[VllmFlag, ...]:
    """Every flag of the vLLM version vllm_serve_flags.json was generated from."""
    document = json.loads(FLAGS_FILE.read_text())
    return tuple(VllmFlag(f["dest"], tuple(f["options"]), f["group"], f["values"]) for f in document["flags"])


def vllm_version() -> str:
    """The vLLM version whose flags vllm_serve_flags.json lists."""
    return json.loads(FLAGS_FILE.read_text())["vllm_version"]


def _table(groups: dict[str, tuple[str, ...]]) -> dict[str, str]:
    return {key: reason for reason, keys in groups.items() for key in keys}


#: Accepted with a note: (why it has no effect in accord) -> destinations or options.
NOTED = _table({
    "accord always chunks long prefills": ("--enable-chunked-prefill", "long_prefill_token_threshold",
                                           "long_prefill_token_threshold_adaptive"),
    "accord's scheduler has no such knob": (
        "max_num_scheduled_tokens", "max_num_active_seqs", "max_num_queued_reqs", "max_num_queued_tokens",
        "scheduler_reserve_full_isl", "watermark", "prefill_schedule_interval", "disable_hybrid_kv_cache_manager",
        "stream_interval", "disable_chunked_mm_input", "prefix_cache_retention_interval", "prefix_match_unit",
        "kv_sharing_fast_prefill", "swa_bounded_replay", "max_parallel_loading_workers",
    ),
    "accord picks its kernels per backend (`accord backends`)": (
        "attention_backend", "moe_backend", "linear_backend", "sparse_indexer_topk_backend", "ir_op_priority",
        "enable_flashinfer_autotune", "monokernel", "gdn_prefill_backend", "kda_prefill_backend",
        "kda_decode_backend", "attention_config", "kernel_config", "all2all_backend", "use_fp64_gumbel",
        "disable_custom_all_reduce", "enable_dbo", "ubatch_size", "dbo_decode_token_threshold",
        "dbo_prefill_token_threshold", "enable_shm_tensor_arena", "disable_nccl_for_dp_synchronization",
        "dp_sync_interval", "enable_batch_sharded_sampling", "enable_ep_weight_filter", "enable_hc_sp",
        "numa_bind", "numa_bind_nodes", "numa_bind_cpus", "disable_sliding_window", "disable_cascade_attn",
        "enable_cumem_allocator", "enable_nccl_comm_suspend", "model_impl", "optimization_level",
        "performance_mode", "additional_config", "cudagraph_capture_sizes", "enable_flash_late_interaction",
        "ray_workers_use_nsight", "distributed_timeout_seconds", "cpu_distributed_timeout_seconds",
        "expert_placement_strategy", "device_ids", "renderer_num_workers",
    ),
    "accord has no Mamba models": (
        "mamba_backend", "mamba_ssu_algorithm", "enable_mamba_cache_stochastic_rounding", "mamba_cache_philox_rounds",
        "mamba_cache_dtype", "mamba_ssm_cache_dtype", "mamba_block_size", "mamba_cache_mode",
        "enable_mamba_shared_prefix_checkpoint", "replayssm_buffer_len", "use_replayssm",
    ),
    "accord loads local model directories and GGUF files (no Hub download)": (
        "revision", "code_revision", "tokenizer_revision", "hf_token", "download_dir", "load_format",
        "safetensors_load_strategy", "safetensors_prefetch_num_threads", "safetensors_prefetch_block_size",
        "model_loader_extra_config", "ignore_patterns", "use_tqdm_on_load", "pt_load_map_location", "config_format",
        "hf_config_path", "allow_deprecated_quantization",
    ),
    "accord never runs a model's own code": ("trust_remote_code",),
    "accord reads tokenizer.json with the tokenizers library": ("tokenizer_mode",),
    "accord logs and measures through its own logging and /metrics": (
        "disable_log_stats", "aggregate_engine_logging", "enable_log_requests", "enable_log_outputs",
        "enable_log_deltas", "max_log_len", "log_error_stack", "logging_config", "log_level", "log_config_file",
        "show_hidden_metrics_for_version", "kv_cache_metrics", "kv_cache_metrics_sample", "custom_histogram_buckets",
        "cudagraph_metrics", "enable_layerwise_nvtx_tracing", "enable_mfu_metrics", "enable_logging_iteration_details",
        "jit_monitor_mode", "jit_monitor_verbose", "enable_server_load_tracking", "enable_per_request_metrics",
        "disable_uvicorn_access_log", "disable_access_log_for_endpoints", "per_request_spec_decode_metrics",
        "profiler_config", "watchdog_config", "fail_on_environ_validation", "enable_trace_replay",
    ),
    "accord serves from one API server process": (
        "api_server_count", "data_parallel_supervisor_port", "dp_supervisor_probe_interval_s",
        "dp_supervisor_probe_timeout_s", "dp_supervisor_probe_failure_threshold",
    ),
    "accord's HTTP server has no such setting": (
        "h11_max_incomplete_event_size", "h11_max_header_count", "enable_offline_docs", "sse_keep_alive_interval",
        "enable_request_id_headers", "fingerprint_mode", "fingerprint_value", "response_role",
    ),
    "accord's tool calling has no such setting": ("tool_strict_level",),
    "the model is one of accord's text-generation families": ("runner", "convert", "generation_config"),
    "accord serves no Cohere or Anthropic endpoints": (
        "cohere_is_reasoning_model", "cohere_format", "anthropic_disabled_thinking_effort",
    ),
})

#: Refused (exit 2): the feature accord does not have -> destinations or options.
REFUSED = _table({
    "these LoRA settings (accord serves LoRA in the model dtype, sharded by nothing, on text models)": (
        "lora_dtype", "enable_tower_connector_lora", "fully_sharded_loras", "lora_target_modules", "default_mm_loras",
        "specialize_active_lora", "enable_mixed_moe_lora_format", "enable_moe_shared_loras", "max_lora_cls_labels",
    ),
    "multimodal inputs": (
        "language_model_only", "limit_mm_per_prompt", "enable_mm_embeds", "media_io_kwargs", "mm_processor_kwargs",
        "mm_processor_cache_gb", "mm_processor_cache_type", "mm_hasher_algorithm", "mm_shm_cache_max_object_size_mb",
        "mm_encoder_only", "mm_encoder_tp_mode", "mm_encoder_attn_backend", "mm_encoder_attn_dtype",
        "mm_encoder_fp8_scale_path", "mm_encoder_fp8_scale_save_path", "mm_encoder_fp8_scale_save_margin",
        "interleave_mm_strings", "skip_mm_profiling", "video_pruning_rate", "video_pruning_method", "mm_tensor_ipc",
        "mm_processor_device", "mm_ipc_gpu_memory_gb", "mm_device_do_normalize", "allowed_local_media_path",
        "allowed_media_domains", "trust_request_mm_kwargs",
    ),
    "the --spec-* shorthands of speculative decoding (give --speculative-config)": (
        "spec_method", "spec_model", "spec_tokens",
    ),
    "reasoning-parser plugins and vLLM's reasoning config (accord's budgets: --reasoning-budgets)": (
        "reasoning_parser_plugin", "reasoning_config", "reasoning_effort_map",
    ),
    "pipeline parallelism": ("pipeline_parallel_size",),
    "context parallelism": (
        "decode_context_parallel_size", "dcp_comm_backend", "dcp_q_replicate", "dcp_kv_cache_interleave_size",
        "cp_kv_cache_interleave_size", "prefill_context_parallel_size",
    ),
    "vLLM's multi-node launch (accord spans hosts with --distributed-executor-backend ray; docs/multi-node.md)": (
        "master_addr", "master_port", "nnodes", "node_rank", "headless",
    ),
    "externally launched data-parallel ranks": (
        "data_parallel_rank", "data_parallel_start_rank", "data_parallel_size_local", "data_parallel_address",
        "data_parallel_rpc_port", "data_parallel_backend", "data_parallel_hybrid_lb", "data_parallel_external_lb",
        "data_parallel_multi_port_external_lb",
    ),
    "expert load balancing (EPLB) and elastic expert parallelism": (
        "enable_eplb", "eplb_config", "enable_elastic_ep", "elastic_ep_max_dp_size",
    ),
    "fault tolerance": ("enable_fault_tolerance", "fault_tolerance_config"),
    "custom worker, scheduler and logits-processor classes": (
        "worker_cls", "worker_extension_cls", "scheduler_cls", "logits_processors", "io_processor_plugin",
        "middleware", "tool_parser_plugin",
    ),
    "KV cache events, encoder-cache transfer and KV offloading": (
        "kv_events_config", "ec_transfer_config", "ec_manager_config",
        "kv_offloading_backend", "kv_cache_dtype_skip_layers",
    ),
    "weight offloading": (
        "offload_backend", "cpu_offload_gb", "cpu_offload_params", "offload_group_size", "offload_num_in_group",
        "offload_prefetch_step", "offload_params",
    ),
    "pooling models": ("pooler_config",),
    "prompt embeddings": ("enable_prompt_embeds",),
    "running without a tokenizer": ("skip_tokenizer_init",),
    "sleep mode": ("enable_sleep_mode", "sleep_mode_backend", "sleep_mode_offload_cudagraph",
                   "sleep_preserve_parameter_names"),
    "Hugging Face config, quantization and generation-config overrides": (
        "hf_overrides", "model_class_overrides", "quantization_config", "override_generation_config",
    ),
    "logprobs modes other than raw logprobs": ("logprobs_mode",),
    "returning routed experts or sampling masks": ("enable_return_routed_experts", "return_sampling_mask"),
    "prefill without chunking": ("--disable-chunked-prefill",),
    "weight transfer, watermarking, diffusion and engram models": (
        "weight_transfer_config", "watermark_config", "diffusion_config", "engram_config",
    ),
    "the structured-outputs backends' settings (accord always uses llguidance)": ("structured_outputs_config",),
    "auxiliary model outputs": ("aux_output_config",),
    "OpenTelemetry tracing": ("otlp_traces_endpoint", "collect_detailed_traces"),
    "a gRPC server": ("grpc", "grpc_port"),
    "serving on a Unix domain socket": ("uds",),
    "TLS (terminate TLS in a proxy in front of accord)": (
        "ssl_keyfile", "ssl_certfile", "ssl_ca_certs", "enable_ssl_refresh", "ssl_cert_reqs", "ssl_ciphers",
    ),
    "CORS settings": ("allow_credentials", "allowed_origins", "allowed_methods", "allowed_headers"),
    "vLLM's YAML config files": ("config",),
    "the /tokenizer_info endpoint": ("enable_tokenizer_info_endpoint",),
    "the tokens-only, scale-out and demo tool-server endpoints": ("tokens_only", "enable_scale_out", "tool_server"),
})


def accepted_flags(defined: set[str]) -> Iterator[VllmFlag]:
    """vLLM's flags none of whose option strings accord's parser `defined` already."""
    for flag in vllm_serve_flags():
        if not defined.intersection(flag.options):
            yield flag


class _RecordOption(argparse.Action):
    """Records which option string was given (and its value): whether a vLLM flag is
    noted or refused may depend on the form (`--enable-x` or `--disable-x`)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:  # type: ignore[no-untyped-def]
        setattr(namespace, self.dest, option_string)


_NARGS = {"0": 0, "1": None, "?": "?", "+": "+"}


def add_vllm_flags(parser: argparse.ArgumentParser) -> None:
    """Accept every vLLM flag `parser` does not define (hidden from --help: see
    `check_vllm_flags` for what becomes of them)."""
    defined = set(parser._option_string_actions)
    for flag in accepted_flags(defined):
        nargs = _NARGS[flag.values]
        parser.add_argument(
            *flag.options, dest=DEST_PREFIX + flag.dest, action=_RecordOption, default=None,
            help=argparse.SUPPRESS, **({} if nargs is None else {"nargs": nargs}),
        )


@dataclass(frozen=True)
class VllmFlagVerdict:
    """What becomes of the vLLM flags on one command line: notes to print, and the
    first refusal (None when the command line can run)."""

    notes: list[str]
    refusal: str | None


def check_vllm_flags(args: argparse.Namespace) -> VllmFlagVerdict:
    """Notes for the given vLLM flags accord accepts without effect, and the error
    for the first one naming a feature accord lacks."""
    notes, refusal = [], None
    for name, option in vars(args).items():
        if not name.startswith(DEST_PREFIX) or option is None:
            continue
        dest = name.removeprefix(DEST_PREFIX)
        refused = REFUSED.get(option) or REFUSED.get(dest)
        if refused is not None and option not in NOTED:
            refusal = refusal or f"{option}: accord does not support {refused}"
        else:
            notes.append(f"{option} has no effect in accord ({NOTED.get(option) or NOTED[dest]})")
    return VllmFlagVerdict(notes, refusal)
