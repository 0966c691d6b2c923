"""The vocabulary a contract is written in: tensors, scalar parameters, outputs, rules.

A contract is data. The dispatcher reads it to validate calls and to allocate outputs,
conformance reads it to generate cases and pick tolerances, and the docs are rendered
from it; nothing here runs a kernel.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch

from .shapes import DimExpr, parse_dim

FLOAT_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.float16, torch.bfloat16)
INDEX_DTYPES: tuple[torch.dtype, ...] = (torch.int32, torch.int64)
FP8_DTYPES: tuple[torch.dtype, ...] = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)

#: Largest finite value of each fp8 flavour (e4m3fnuz has no negative zero and a
#: different exponent bias, so its range is smaller).
FP8_MAX: Mapping[torch.dtype, float] = {
    torch.float8_e4m3fn: 448.0,
    torch.float8_e4m3fnuz: 240.0,
}

REQUIRED: Any = object()


def dtype_name(dtype: torch.dtype | None) -> str:
    """A dtype's short name (`bf16`, `int32`, `fp8e4m3fn`), as tables and errors print it."""
    if dtype is None:
        return "absent"
    return _SHORT.get(dtype, str(dtype).replace("torch.", ""))


def dtype_named(name: str) -> torch.dtype:
    """The dtype `dtype_name` prints as `name` (report files store dtypes by name)."""
    by_name = {short: dtype for dtype, short in _SHORT.items()}
    return by_name[name] if name in by_name else getattr(torch, name)


_SHORT = {
    torch.float32: "fp32",
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
    torch.float64: "fp64",
    torch.float8_e4m3fn: "fp8e4m3fn",
    torch.float8_e4m3fnuz: "fp8e4m3fnuz",
    torch.int32: "int32",
    torch.int64: "int64",
}


@dataclass(frozen=True)
class Switch:
    """A shape that depends on a code-path parameter: `Switch("mode", {"per_token":
    ("T", "1"), ...})` picks the shape by the call's value of `mode`."""

    param: str
    cases: Mapping[Any, tuple[str, ...]]

    def pick(self, params: Mapping[str, Any]) -> tuple[str, ...]:
        return self.cases[params[self.param]]


Shape = tuple[str, ...] | Switch


def shape_dims(shape: Shape, params: Mapping[str, Any]) -> tuple[DimExpr, ...]:
    """The parsed dimensions of `shape` for a call with these parameter values."""
    chosen = shape.pick(params) if isinstance(shape, Switch) else shape
    return tuple(parse_dim(d) for d in chosen)


@dataclass(frozen=True)
class TensorSpec:
    """One tensor argument: its legal dtypes, symbolic shape and layout needs.

    `mutated` marks a tensor the op writes in place (a KV cache); such tensors are
    allocated by the caller, unlike outputs, which the dispatcher allocates.
    """

    name: str
    dtypes: tuple[torch.dtype, ...]
    shape: Shape
    doc: str = ""
    optional: bool = False
    contiguous: bool = True
    mutated: bool = False
    index: bool = False


@dataclass(frozen=True)
class ParamSpec:
    """One scalar parameter. A parameter with `choices` selects a code path, so its
    value is part of the call signature the dispatcher caches on. A parameter whose
    default is None may be left None (an output dtype that follows a tensor's)."""

    name: str
    type: type
    default: Any = REQUIRED
    choices: tuple[Any, ...] | None = None
    doc: str = ""

    @property
    def in_signature(self) -> bool:
        return self.choices is not None


@dataclass(frozen=True)
class OutputSpec:
    """One output the dispatcher allocates before the kernel runs.

    `dtype` is a fixed dtype, `"like:ARG"` (the dtype of tensor ARG), `"param:NAME"`
    (a dtype-valued parameter) or `"param:NAME|like:ARG"` (the parameter, or ARG's dtype
    where the call leaves it None), so the width of every output is chosen by the
    contract and the caller, never inferred by a kernel from a neighbour.
    """

    name: str
    shape: Shape
    dtype: torch.dtype | str
    doc: str = ""
    index: bool = False

    def dtype_sources(self) -> tuple[tuple[str, str], ...]:
        """`dtype` as its (kind, name) sources, "like" or "param", first one first (a
        parameter left None passes to the next); empty for a fixed dtype."""
        if isinstance(self.dtype, torch.dtype):
            return ()
        return tuple(tuple(source.split(":", 1)) for source in self.dtype.split("|"))  # type: ignore[misc]

    def dtype_of(self, call: Mapping[str, Any]) -> torch.dtype:
        """The dtype of this output for a bound call."""
        if isinstance(self.dtype, torch.dtype):
            return self.dtype
        for kind, name in self.dtype_sources():
            value = call[name].dtype if kind == "like" else call[name]
            if value is not None:
                return value
        raise ValueError(f"output {self.name}: every source of {self.dtype!r} is None")


@dataclass(frozen=True)
class Rule:
    """A cross-argument rule: `check(call)` returns None when the call obeys it, else
    `(argument, expected, got)` for the ContractError."""

    doc: str
    check: Callable[[Mapping[str, Any]], tuple[str, str, str] | None]


@dataclass(frozen=True)
class UnorderedRows:
    """An index output whose order within a row is not part of the contract (top-k ids
    where ties allow any order): conformance sorts each row of `ids` on both sides, the
    outputs in `companions` (each id's weight, say) travelling with their ids, before
    comparing."""

    ids: str
    companions: tuple[str, ...] = ()


@dataclass(frozen=True)
class Dequantised:
    """A quantised output judged by the value it stands for: conformance compares
    `values` * `scales` (one scale per row where `scales` has one column, else per
    `group_param` consecutive columns) under the NMSE bound, not the stored codes."""

    values: str
    scales: str
    group_param: str


@dataclass(frozen=True)
class OpContract:
    """Everything a call to one op must satisfy, and what it returns.

    `dtype_groups` name tensors that must share one dtype (`("block_tables", "seq_lens",
    "query_start_loc")`); `tolerance` is the normalised-MSE bound conformance allows
    against the reference, keyed by the dtype of `tolerance_key` (a tensor, an output
    or a dtype-valued parameter; default the `primary` tensor). `fp8_tolerance`, when
    given, replaces it for calls with fp8 operands: fp8 values are exact, so the bound
    is the output's at the op's own accumulation accuracy, not a quantisation allowance.
    `ulps` marks an op computed in fp32 and rounded once: every floating output must
    lie within that many ulps of its dtype (keyed by the output's dtype) of the
    reference, which computes in fp64 and rounds once; it replaces the NMSE bound.
    `unordered_rows` and `dequantised` say how conformance puts outputs in the form it
    compares under NMSE (rows sorted by id; quantised codes dequantised). `rounding_bias`
    caps, per output dtype judged in ulps, the mean signed error (and the mean error
    away from zero) in ulps: the per-element bound admits a neighbour at a midpoint,
    never a systematic rounding direction (round-toward-zero moves half the codes).
    """

    name: str
    doc: str
    tensors: tuple[TensorSpec, ...]
    params: tuple[ParamSpec, ...]
    outputs: tuple[OutputSpec, ...]
    primary: str
    tolerance: Mapping[torch.dtype, float]
    dtype_groups: tuple[tuple[str, ...], ...] = ()
    rules: tuple[Rule, ...] = ()
    tolerance_key: str | None = None
    fp8_tolerance: Mapping[torch.dtype, float] | None = None
    ulps: Mapping[torch.dtype, int] | None = None
    unordered_rows: UnorderedRows | None = None
    dequantised: Dequantised | None = None
    rounding_bias: Mapping[torch.dtype, float] | None = None
    arg_names: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        names = tuple(t.name for t in self.tensors) + tuple(p.name for p in self.params)
        object.__setattr__(self, "arg_names", names)
        if len(set(names)) != len(names):
            raise ValueError(f"{self.name}: duplicate argument names")
        if self.primary not in names:
            raise ValueError(f"{self.name}: primary {self.primary!r} is not an argument")
        outputs = {o.name for o in self.outputs}
        compared = [*self._unordered_names(), *self._dequantised_names()]
        unknown = [name for name in compared if name not in outputs]
        if unknown:
            raise ValueError(f"{self.name}: comparison rules name {unknown}, which are not outputs")
        if self.dequantised is not None and self.dequantised.group_param not in names:
            raise ValueError(f"{self.name}: dequantised's group_param {self.dequantised.group_param!r} is not a parameter")

    def _unordered_names(self) -> tuple[str, ...]:
        rows = self.unordered_rows
        return () if rows is None else (rows.ids, *rows.companions)

    def _dequantised_names(self) -> tuple[str, ...]:
        rule = self.dequantised
        return () if rule is None else (rule.values, rule.scales)

    def tolerance_for(self, dtypes: Mapping[str, torch.dtype | None]) -> float:
        """The NMSE bound for a call with these dtypes (of its tensors, outputs and
        dtype-valued parameters): with fp8 operands `fp8_tolerance`, or the fp8 entry
        of `tolerance` where the op quantises (its error is the quantisation's); else
        the entry of `tolerance_key`'s dtype."""
        key = dtypes[self.tolerance_key or self.primary]
        if any(d in FP8_DTYPES for d in dtypes.values()):
            if self.fp8_tolerance is not None:
                return self.fp8_tolerance[key]  # type: ignore[index]
            if FP8_DTYPES[0] in self.tolerance:
                return self.tolerance[FP8_DTYPES[0]]
        return self.tolerance[key]  # type: ignore[index]

    def ulps_for(self, dtype: torch.dtype) -> int | None:
        """The bound in ulps for an output of `dtype`, or None (judged by NMSE)."""
        return None if self.ulps is None else self.ulps[dtype]

    def tensor(self, name: str) -> TensorSpec:
        """The spec of tensor argument `name`."""
        for spec in self.tensors:
            if spec.name == name:
                return spec
        raise KeyError(name)

    def param(self, name: str) -> ParamSpec:
        """The spec of scalar parameter `name`."""
        for spec in self.params:
            if spec.name == name:
                return spec
        raise KeyError(name)
