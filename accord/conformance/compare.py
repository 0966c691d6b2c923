"""Compares a backend's outputs with the reference's as the contracts define equality:
normalised MSE within tolerance for values, or ulps of the output dtype for ops
computed in fp32 and rounded once (`OpContract.ulps`); exact for indices, ids whose
order is free sorted per row first (`OpContract.unordered_rows`), quantised outputs by
their dequantised value under NMSE (`OpContract.dequantised`); NaN always fails, Inf
must match. No rule here is keyed by op name: each contract declares its own."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch

from ..op_contracts import OpContract

#: The units an error figure and its bound are in.
NMSE, ULPS = "nmse", "ulps"


@dataclass(frozen=True)
class OutputCheck:
    """How one output (or mutated tensor) compared: the error figure (NMSE or ulps, as
    `unit` says, or the fraction of mismatched elements for exact outputs), its bound,
    and why it failed."""

    name: str
    error: float
    tolerance: float
    failure: str | None = None
    exact: bool = False
    unit: str = NMSE


@dataclass(frozen=True)
class Comparison:
    """Every output's check for one run."""

    checks: tuple[OutputCheck, ...]

    @property
    def failures(self) -> list[str]:
        return [f"{c.name}: {c.failure}" for c in self.checks if c.failure]

    @property
    def worst(self) -> OutputCheck | None:
        """The value output closest to (or furthest past) its bound; None when there is
        no figure (exact outputs report by message, NaN has no figure)."""
        measured = [c for c in self.checks if not c.exact and c.error == c.error]
        return max(measured, key=lambda c: c.error / c.tolerance if c.tolerance else c.error * float("inf"),
                   default=None)


def nmse(got: torch.Tensor, want: torch.Tensor) -> float:
    """sum((got - want)^2) / sum(want^2) over finite reference elements, in fp64 (the
    plain squared error when the reference is all zeros)."""
    got64, want64 = got.double(), want.double()
    finite = torch.isfinite(want64)
    got64, want64 = got64[finite], want64[finite]
    error = float(((got64 - want64) ** 2).sum())
    scale = float((want64**2).sum())
    return error / scale if scale > 0 else error


def ulp(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The spacing of `dtype`'s representable numbers at each of `values` (fp64), the
    subnormal spacing at and below the smallest normal."""
    info = torch.finfo(dtype)
    _, exponent = torch.frexp(values.double().abs())
    spacing = torch.ldexp(torch.full(values.shape, info.eps, dtype=torch.float64), exponent - 1)
    return spacing.clamp_min(info.tiny * info.eps)


def ulp_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| in ulps of `want`'s dtype (see ulp_distance)."""
    return ulp_distance(got.double(), want.double(), want.double(), want.dtype)


def ulp_distance(got: torch.Tensor, want: torch.Tensor, reference: torch.Tensor, dtype: torch.dtype) -> float:
    """max |got - want| in ulps of `dtype` at the reference's values, over finite
    reference elements (all fp64). An ulp is never taken finer than fp32's at the
    largest |reference| of the row (the last dimension): the contract's fp32
    arithmetic resolves no finer, so a value that cancels to near zero (a rotation,
    say) is judged at its row's scale."""
    finite = torch.isfinite(reference)
    magnitude = torch.where(finite, reference.abs(), 0.0)
    row_scale = magnitude.amax(-1, keepdim=True) if reference.dim() and reference.shape[-1] else magnitude
    unit = torch.maximum(ulp(reference, dtype), ulp(row_scale, torch.float32).expand_as(reference))
    distance = ((got - want).abs() / unit)[finite]
    return float(distance.max()) if distance.numel() else 0.0


def rounding_bias(got: torch.Tensor, want: torch.Tensor) -> float:
    """The larger of |mean signed error| and |mean error away from zero|, in ulps of
    `want`'s dtype, over finite reference elements: a rounding direction a kernel
    takes systematically (toward -Inf, toward zero) shows here even where each element
    is within one ulp."""
    got64, want64 = got.double(), want.double()
    finite = torch.isfinite(want64)
    if not bool(finite.any()):
        return 0.0
    distance = ((got64 - want64) / ulp(want64, want.dtype))[finite]
    return max(abs(float(distance.mean())), abs(float((distance * want64[finite].sign()).mean())))


def nonfinite_problem(got: torch.Tensor, want: torch.Tensor) -> str | None:
    """Why `got`'s NaN/Inf pattern is wrong (any NaN; Inf where the reference has none
    or of the other sign), or None."""
    got64, want64 = got.double(), want.double()
    if (nans := int(got64.isnan().sum())):
        return f"{nans} NaN (unwritten or broken)"
    if (ref_nans := int(want64.isnan().sum())):
        return f"the reference produced {ref_nans} NaN"
    got_inf, want_inf = got64.isinf(), want64.isinf()
    if not torch.equal(got_inf, want_inf) or not torch.equal(got64[got_inf], want64[want_inf]):
        return "Inf where the reference has none (or the reference's Inf missing)"
    return None


def dequantise(q: torch.Tensor, scales: torch.Tensor, group_size: int) -> torch.Tensor:
    """q * scale in fp64, each scale covering a whole row (one column of scales), or
    `group_size` consecutive columns."""
    group = q.shape[1] if scales.shape[1] == 1 else group_size
    per_element = scales.double().repeat_interleave(group, dim=1)[:, : q.shape[1]]
    return q.double() * per_element.expand(q.shape[0], -1)


def _sorted_rows(outputs: dict[str, torch.Tensor], ids_name: str, companions: tuple[str, ...]) -> None:
    """Sort each row of `ids_name` ascending, permuting its companions alike."""
    order = outputs[ids_name].sort(dim=-1, stable=True).indices
    for name in (ids_name, *companions):
        outputs[name] = outputs[name].gather(-1, order)


def _canonical(
    contract: OpContract, outputs: Mapping[str, torch.Tensor], args: Mapping[str, Any]
) -> dict[str, torch.Tensor]:
    """Outputs in the form the contract compares: rows sorted by id, quantised values
    dequantised, as the contract declares."""
    canonical = dict(outputs)
    rows, quantised = contract.unordered_rows, contract.dequantised
    if rows is not None:
        _sorted_rows(canonical, rows.ids, rows.companions)
    if quantised is not None:
        canonical[quantised.values] = dequantise(
            canonical[quantised.values], canonical[quantised.scales], args[quantised.group_param]
        )
    return canonical


def _is_exact(contract: OpContract, name: str, tensor: torch.Tensor) -> bool:
    declared = [o.index for o in contract.outputs if o.name == name]
    return (declared[0] if declared else False) or not tensor.dtype.is_floating_point


def _check(
    name: str, got: torch.Tensor, want: torch.Tensor, exact: bool, tolerance: float, ulps: int | None = None,
    bias: float | None = None,
) -> OutputCheck:
    if exact:
        mismatched = int((got != want).sum())
        fraction = mismatched / max(want.numel(), 1)
        failure = f"{mismatched} of {want.numel()} elements differ (exact)" if mismatched else None
        return OutputCheck(name, fraction, 0.0, failure, exact=True)
    unit, bound = (NMSE, tolerance) if ulps is None else (ULPS, float(ulps))
    problem = nonfinite_problem(got, want)
    if problem:
        return OutputCheck(name, float("nan"), bound, problem, unit=unit)
    if ulps is not None:
        error = ulp_error(got, want)
        failure = f"{error:.3g} ulps > {ulps}" if error > ulps else None
        if failure is None and bias is not None and (drift := rounding_bias(got, want)) > bias:
            failure = f"a systematic rounding direction: mean error {drift:.3g} ulps > {bias:g}"
        return OutputCheck(name, error, bound, failure, unit=ULPS)
    error = nmse(got, want)
    failure = f"NMSE {error:.3g} > {tolerance:.3g}" if error > tolerance else None
    return OutputCheck(name, error, tolerance, failure)


def compare_outputs(
    contract: OpContract,
    args: Mapping[str, Any],
    got: Mapping[str, torch.Tensor],
    want: Mapping[str, torch.Tensor],
    tolerance: float,
    by_ulps: bool = False,
) -> Comparison:
    """Check every reference output (mutated tensors included) against the backend's:
    by NMSE within `tolerance`, or, `by_ulps`, each value output within the contract's
    ulps for its dtype and without a rounding bias past the contract's (the tensors as
    stored: an op rounded once is not canonicalised)."""
    layout = [
        OutputCheck(name, float("nan"), tolerance, f"is {got[name].dtype}{list(got[name].shape)}, "
                    f"expected {want[name].dtype}{list(want[name].shape)}")
        for name in want
        if got[name].dtype != want[name].dtype or got[name].shape != want[name].shape
    ]
    if layout:
        return Comparison(tuple(layout))
    exact = {name: _is_exact(contract, name, tensor) for name, tensor in want.items()}
    if by_ulps:
        return Comparison(tuple(
            _check(n, got[n], want[n], exact[n], tolerance, contract.ulps_for(want[n].dtype),
                   (contract.rounding_bias or {}).get(want[n].dtype)) for n in want
        ))
    got_c, want_c = _canonical(contract, got, args), _canonical(contract, want, args)
    return Comparison(tuple(_check(n, got_c[n], want_c[n], exact[n], tolerance) for n in want))


def same_bits(first: torch.Tensor, second: torch.Tensor) -> bool:
    """Whether two tensors hold identical bytes (NaN payloads included)."""
    if first.dtype != second.dtype or first.shape != second.shape:
        return False
    return torch.equal(_raw_bytes(first), _raw_bytes(second))


def _raw_bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.contiguous().reshape(-1).view(torch.uint8)
