"""Checks a deploy config against the backend before anything is loaded or generated:
the backend serves the configured KV cache dtype and block size, and a kept recording
folder is empty. A config that fails here fails the gate with the reason, at once.
(A model that cannot be read stops the gate earlier, as a bad config: deploy_model.)"""

from __future__ import annotations

import torch

from ..backends import Backend
from ..core.model_loader.model_config import ModelConfig
from ..op_contracts import CONTRACTS, ContractError, OpDispatcher, dtype_name
from ..op_contracts.recording import read_recordings
from ..conformance.case import Case
from ..conformance.cases import cases_for
from .deploy_config import DeployConfig
from .reports import Check, CheckStatus

GROUP = "preflight"
#: The ops that write and read the KV cache, by attention kind.
CACHE_OPS = {"mla": ("concat_and_cache_mla", "mla_attention"), "gqa": ("reshape_and_cache", "paged_attention")}
#: The engine's index width (the contracts pin the model runner's tensors to int32).
ENGINE_INDEX_DTYPE = torch.int32


def preflight_checks(config: DeployConfig, backend: Backend, model: ModelConfig) -> list[Check]:
    """Every preflight check of `config` for its model's parsed config, in order; the
    gate stops if any fails."""
    return [
        _block_size(config, backend),
        _recording_folder(config),
        _kv_cache_dtype(config, backend, "mla" if model.mla is not None else "gqa"),
    ]


def _recording_folder(config: DeployConfig) -> Check:
    """A kept recording folder must not hold an earlier run's calls (they would be
    replayed as this run's)."""
    folder = config.engine.record_op_calls
    if folder is None:
        return Check("record_op_calls", GROUP, CheckStatus.PASS, "recorded into a scratch folder")
    if read_recordings(folder):
        return Check("record_op_calls", GROUP, CheckStatus.FAIL,
                     f"{folder} already holds recorded calls of an earlier run; give an empty or new folder")
    return Check("record_op_calls", GROUP, CheckStatus.PASS, f"recorded calls are kept in {folder}")


def _block_size(config: DeployConfig, backend: Backend) -> Check:
    sizes = backend.supported_block_sizes()
    if sizes is None or config.engine.block_size in sizes:
        return Check("block_size", GROUP, CheckStatus.PASS, f"block_size={config.engine.block_size}")
    return Check("block_size", GROUP, CheckStatus.FAIL,
                 f"block_size={config.engine.block_size} but backend '{backend.name}' takes {list(sizes)}")


def _cache_tensors(op: str) -> list[str]:
    return [spec.name for spec in CONTRACTS[op].tensors if spec.name.endswith("cache")]


def _fp8_cache_cases(op: str, cache_dtype: torch.dtype, seed: int) -> list[Case]:
    """Legal cases of `op` with every cache tensor at `cache_dtype` and every index
    tensor at the engine's width."""
    index_args = [spec.name for spec in CONTRACTS[op].tensors if spec.index]
    return [
        case for case in cases_for(op, seed)
        if not case.expect_refusal
        and all(case.args[name].dtype == cache_dtype for name in _cache_tensors(op))
        and all(case.args[name] is None or case.args[name].dtype == ENGINE_INDEX_DTYPE for name in index_args)
    ]


def _refusal(ops: OpDispatcher, op: str, cases: list[Case]) -> str | None:
    """None when the backend accepts any of `cases`, else why it refused the first."""
    refusals = []
    for case in cases:
        try:
            ops.plan_for(op, **case.args)
            return None
        except ContractError as error:
            refusals.append(str(error))
    return refusals[0] if refusals else "no conformance case covers it"


def _kv_cache_dtype(config: DeployConfig, backend: Backend, kind: str) -> Check:
    """With kv_cache_dtype=fp8, each cache op must accept the backend's fp8 format at
    the engine's index width; asked of the dispatcher, so claims and supports count."""
    name = "kv_cache_dtype"
    if config.engine.kv_cache_dtype == "auto":
        return Check(name, GROUP, CheckStatus.PASS, "auto: the cache holds the model dtype")
    cache_dtype, ops = backend.fp8_dtype(), OpDispatcher(backend, strict=True)
    for op in CACHE_OPS[kind]:
        reason = _refusal(ops, op, _fp8_cache_cases(op, cache_dtype, config.gate.seed))
        if reason is not None:
            return Check(name, GROUP, CheckStatus.FAIL,
                         f"kv_cache_dtype=fp8 ({dtype_name(cache_dtype)}) cannot be served by backend "
                         f"'{backend.name}': {op} refuses an {dtype_name(cache_dtype)} cache: {reason}")
    return Check(name, GROUP, CheckStatus.PASS,
                 f"fp8 cache as {dtype_name(cache_dtype)}: {', '.join(CACHE_OPS[kind])} accept it")
