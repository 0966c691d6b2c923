"""Typed op contracts and the dispatcher that enforces them. Imports torch only."""

from .contracts import CONTRACTS
from .contracts.group_quant import GROUP_QUANT_BITS, PER_CHANNEL, group_count, pack_codes, packed_words, unpack_codes
from .contracts.quant import GGUF_FORMATS, BlockFormat
from .dispatcher import CallHook, CallPlan, OpDispatcher, empty_allocator, strict_from_env
from .errors import ContractError
from .kernel import CallSignature, CastAdapter, Kernel, KernelSet
from .spec import (
    FLOAT_DTYPES,
    FP8_DTYPES,
    Dequantised,
    FP8_MAX,
    INDEX_DTYPES,
    OpContract,
    OutputSpec,
    ParamSpec,
    Rule,
    Switch,
    TensorSpec,
    UnorderedRows,
    dtype_name,
    dtype_named,
)

__all__ = [
    "CONTRACTS",
    "GGUF_FORMATS",
    "GROUP_QUANT_BITS",
    "PER_CHANNEL",
    "BlockFormat",
    "CallHook",
    "CallPlan",
    "CallSignature",
    "CastAdapter",
    "ContractError",
    "Dequantised",
    "FLOAT_DTYPES",
    "FP8_DTYPES",
    "FP8_MAX",
    "INDEX_DTYPES",
    "Kernel",
    "KernelSet",
    "OpContract",
    "OpDispatcher",
    "OutputSpec",
    "ParamSpec",
    "Rule",
    "Switch",
    "TensorSpec",
    "UnorderedRows",
    "dtype_name",
    "dtype_named",
    "empty_allocator",
    "group_count",
    "pack_codes",
    "packed_words",
    "unpack_codes",
    "strict_from_env",
]
