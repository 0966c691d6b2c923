"""Every op contract, by name. Adding an op means adding its contract here, a reference
kernel (the registry-completeness test fails otherwise) and conformance cases."""

from __future__ import annotations

from ..spec import OpContract
from . import attention, compressed, elementwise, fp8, group_quant, linear, lora, moe, quant, sampling, transfer

CONTRACTS: dict[str, OpContract] = {
    contract.name: contract
    for family in (elementwise, linear, lora, quant, group_quant, attention, compressed, moe, fp8, sampling, transfer)
    for contract in family.CONTRACTS
}

__all__ = ["CONTRACTS"]
