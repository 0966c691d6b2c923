"""Seeded conformance cases for every op contract, one module per contract family,
plus the adversarial draws (a fixed budget per op) and the illegal calls derived from
them."""

from __future__ import annotations

from typing import Callable, Iterable

from ..adversarial import adversarial_cases
from ..case import Case
from . import attention, cache, deepseek_v4, elementwise, fp8, group_quant, linear, lora, moe, quant, rejection, sampling
from .illegal import illegal_cases

CaseGenerator = Callable[[int], Iterable[Case]]

#: Each op's legal-case generator, called with the run's seed.
GENERATORS: dict[str, CaseGenerator] = {
    **elementwise.CASES,
    **linear.CASES,
    **lora.CASES,
    **quant.CASES,
    **group_quant.CASES,
    **cache.CASES,
    **attention.CASES,
    **moe.CASES,
    **fp8.CASES,
    **sampling.CASES,
    **rejection.CASES,
    **deepseek_v4.CASES,  # its own ops, and V4's calls added to the MoE ops' cases
}


def cases_for(op: str, seed: int = 0) -> list[Case]:
    """Every case of `op`: its legal cases, its adversarial draws under `seed`, then the
    illegal calls derived from the legal case that passes the most tensors (so optional
    index tensors get broken too). Raises KeyError for an op with no generator."""
    legal = [*GENERATORS[op](seed), *adversarial_cases(op, seed)]
    if not legal:
        return legal
    fullest = max(legal, key=lambda case: sum(v is not None for v in case.args.values()))
    return legal + illegal_cases(fullest)


__all__ = ["GENERATORS", "Case", "CaseGenerator", "cases_for"]
