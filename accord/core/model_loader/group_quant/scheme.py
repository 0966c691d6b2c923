"""config.json's `quantization_config`, read into the one group-quantised scheme accord
computes (int4/int8 weights, 16-bit activations), or refused by name.

Accepted: compressed-tensors with format `pack-quantized` and weight-only int schemes
(W4A16 / W8A16, group or channel strategy); AWQ's GEMM layout (4-bit, zero points);
GPTQ (4- or 8-bit, sym or not, act-order, checkpoint_format gptq or gptq_v2). The fp8
block format is read elsewhere (model_config); any other method, format or option is
refused with its name, never loaded as something it is not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ....op_contracts import GROUP_QUANT_BITS, PER_CHANNEL

#: The quant_method values read here, by format name.
COMPRESSED_TENSORS, AWQ, GPTQ = "compressed-tensors", "awq", "gptq"
GROUP_QUANT_METHODS = (COMPRESSED_TENSORS, AWQ, GPTQ)
#: Every method accord loads, as refusals list them.
SUPPORTED_METHODS = "fp8 (block [128, 128]), compressed-tensors (pack-quantized W4A16/W8A16), awq (GEMM), gptq"


class QuantizationConfigError(ValueError):
    """A quantization_config accord does not load; names what it does not take."""


@dataclass(frozen=True)
class GroupQuantScheme:
    """How a checkpoint's quantised linears are stored: `method` (a GROUP_QUANT_METHODS
    name), code width, group size (-1 per channel), whether zero points are stored,
    and for GPTQ whether its zero points carry v1's offset of one (`zero_offset`)."""

    method: str
    bits: int
    group_size: int
    symmetric: bool
    zero_offset: int = 0


def group_quant_scheme(quant: Mapping[str, Any] | None) -> GroupQuantScheme | None:
    """The scheme of an int group-quantised checkpoint; None for none or for fp8 (read
    elsewhere); QuantizationConfigError, naming it, for anything else."""
    if not quant:
        return None
    method = quant.get("quant_method")
    if method == "fp8":
        return None
    if method == COMPRESSED_TENSORS:
        return _compressed_tensors(quant)
    if method == AWQ:
        return _awq(quant)
    if method == GPTQ:
        return _gptq(quant)
    raise QuantizationConfigError(
        f"config.json: quantization_config quant_method {method!r} is not supported; accord loads {SUPPORTED_METHODS}"
    )


def _refuse(method: str, what: str) -> QuantizationConfigError:
    return QuantizationConfigError(f"config.json: {method} quantization_config: {what} is not supported")


def _bits(method: str, bits: Any) -> int:
    if bits not in GROUP_QUANT_BITS:
        raise _refuse(method, f"{bits}-bit weights (only {' and '.join(map(str, GROUP_QUANT_BITS))}-bit are)")
    return int(bits)


def _group_size(method: str, group_size: Any) -> int:
    if group_size is None or group_size == PER_CHANNEL:
        return PER_CHANNEL
    if not isinstance(group_size, int) or group_size < 1:
        raise _refuse(method, f"group_size {group_size!r}")
    return group_size


def _compressed_tensors(quant: Mapping[str, Any]) -> GroupQuantScheme:
    method = COMPRESSED_TENSORS
    if quant.get("kv_cache_scheme"):
        raise _refuse(method, "a kv_cache_scheme (a quantised KV cache)")
    groups = quant.get("config_groups") or {}
    if not groups:
        raise _refuse(method, "a config without config_groups")
    schemes = []
    for name, group in groups.items():
        form = group.get("format") or quant.get("format")
        if form != "pack-quantized":
            raise _refuse(method, f"format {form!r} (config group {name!r}; only pack-quantized is)")
        if group.get("input_activations") or group.get("output_activations"):
            raise _refuse(method, f"quantised activations (config group {name!r}; only weight-only W4A16/W8A16 is)")
        weights = group.get("weights") or {}
        if weights.get("type", "int") != "int" or weights.get("dynamic"):
            raise _refuse(method, f"weights {dict(weights)} (config group {name!r}; only static int weights are)")
        strategy = weights.get("strategy")
        if strategy not in ("group", "channel"):
            raise _refuse(method, f"weight strategy {strategy!r} (only group and channel are)")
        if weights.get("actorder") not in (None, "weight", "group"):
            raise _refuse(method, f"actorder {weights.get('actorder')!r}")
        group_size = _group_size(method, weights.get("group_size") if strategy == "group" else None)
        schemes.append(
            GroupQuantScheme(method, _bits(method, weights.get("num_bits")), group_size, bool(weights.get("symmetric", True)))
        )
    if len(set(schemes)) > 1:
        raise _refuse(method, f"config groups with different weight schemes ({sorted(groups)})")
    return schemes[0]


def _awq(quant: Mapping[str, Any]) -> GroupQuantScheme:
    version = str(quant.get("version", "gemm")).lower()
    if version != "gemm":
        raise _refuse(AWQ, f"version {version!r} (only the GEMM layout is)")
    if not quant.get("zero_point", True):
        raise _refuse(AWQ, "zero_point false")
    bits = _bits(AWQ, quant.get("bits", quant.get("w_bit")))
    if bits != 4:
        raise _refuse(AWQ, f"{bits}-bit weights (AWQ's GEMM layout is 4-bit)")
    return GroupQuantScheme(AWQ, bits, _group_size(AWQ, quant.get("group_size", quant.get("q_group_size"))), False)


def _gptq(quant: Mapping[str, Any]) -> GroupQuantScheme:
    form = quant.get("checkpoint_format", "gptq")
    if form not in ("gptq", "gptq_v2"):
        raise _refuse(GPTQ, f"checkpoint_format {form!r} (only gptq and gptq_v2 are)")
    # v1 checkpoints (AutoGPTQ's, the default) store each zero point minus one.
    return GroupQuantScheme(
        GPTQ, _bits(GPTQ, quant.get("bits")), _group_size(GPTQ, quant.get("group_size")), False,
        zero_offset=1 if form == "gptq" else 0,
    )
