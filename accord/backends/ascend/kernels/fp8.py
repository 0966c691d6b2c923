"""quantize_fp8 and scaled_mm: declared unsupported on the chips torch-npu documents.
torch-npu 2.13 documents no fp8 output for npu_dynamic_quant / npu_dynamic_block_quant
(int8 and int4 only on Atlas A2/A3) and no fp8 operands for npu_quant_matmul (int8 and
int4), so every fp8 signature is refused with that reason rather than run elsewhere."""

from __future__ import annotations

from typing import Any

from ....op_contracts import CallSignature, ContractError, KernelSet

REASON = (
    "torch-npu documents no fp8 {what} on Atlas A2/A3 ({operator} takes int8/int4 only); "
    "use a bf16/fp16 checkpoint on this backend"
)
OPERATORS = {"quantize_fp8": ("quantisation", "npu_dynamic_quant"), "scaled_mm": ("matmul", "npu_quant_matmul")}


def _refusal(op: str) -> str:
    what, operator = OPERATORS[op]
    return REASON.format(what=what, operator=operator)


def _never_run(op: str) -> Any:
    """The kernel body of a refused op: the dispatcher never reaches it (its `supports`
    refuses every signature); called directly, it refuses the same way."""

    def refuse(**_: Any) -> None:
        raise ContractError(op, "op", "a signature the backend claims", _refusal(op), "ascend")

    return refuse


def register(kernels: KernelSet) -> None:
    """Declare both fp8 ops, each refusing every signature with its reason."""
    for op in OPERATORS:
        def supports(signature: CallSignature, op: str = op) -> str:
            return _refusal(op)

        kernels.register(op, supports=supports)(_never_run(op))
