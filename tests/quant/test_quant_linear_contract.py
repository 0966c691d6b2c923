"""The quant_linear contract: a legal call reaches the kernel and returns x @ W^T for W
the dequantised blocks; an illegal one (a packed row of the wrong length, K that is not
a whole number of blocks, codes that are not uint8, a format it does not name) is
refused with a ContractError naming the argument, before any kernel runs."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from accord.backends import get_backend
from accord.conformance.cases.quant import random_blocks
from accord.op_contracts import GGUF_FORMATS, ContractError, OpDispatcher


@pytest.fixture(scope="module")
def ops() -> OpDispatcher:
    return OpDispatcher(get_backend("reference"))


def test_a_legal_call_multiplies_by_the_dequantised_weight(ops: OpDispatcher) -> None:
    fmt = GGUF_FORMATS["Q4_K"]
    g = torch.Generator().manual_seed(1)
    qweight = random_blocks(g, fmt, 5, 2)
    x = torch.randn(3, 512, generator=g)
    weight = torch.from_numpy(gguf.quants.dequantize(qweight.numpy(), gguf.GGMLQuantizationType.Q4_K))
    out = ops.quant_linear(x, qweight, None, quant_type="Q4_K")
    np.testing.assert_allclose(out.numpy(), (x.double() @ weight.double().T).numpy(), rtol=1e-5, atol=1e-6)


def call(ops: OpDispatcher, depth: int, row_bytes: int, dtype: torch.dtype = torch.uint8, quant_type: str = "Q8_0"):
    return ops.quant_linear(torch.randn(2, depth), torch.zeros(4, row_bytes, dtype=dtype), None, quant_type=quant_type)


def test_a_packed_row_one_byte_short_is_refused(ops: OpDispatcher) -> None:
    with pytest.raises(ContractError, match=r"qweight.*68 bytes a row \(2 Q8_0 blocks\)"):
        call(ops, 64, 67)


def test_k_that_is_not_whole_blocks_is_refused(ops: OpDispatcher) -> None:
    with pytest.raises(ContractError, match=r"K a multiple of 256 \(Q6_K's block\).*K=300"):
        call(ops, 300, 210, quant_type="Q6_K")


def test_codes_that_are_not_uint8_are_refused(ops: OpDispatcher) -> None:
    with pytest.raises(ContractError, match="qweight"):
        call(ops, 64, 68, dtype=torch.int8)


def test_a_format_outside_the_table_is_refused(ops: OpDispatcher) -> None:
    with pytest.raises(ContractError, match="quant_type"):
        call(ops, 64, 68, quant_type="IQ4_NL")
