"""The GGUF block formats decoded two independent ways agree with gguf-py's own
`gguf.quants.dequantize`: the reference backend's fp64 decoders (written from the
format definitions) and the cpu backend's C unpacking, on random blocks (every code
byte, scales at typical size and at fp16's limits) and, where gguf-py can quantise, on
blocks it quantised from Gaussian weights."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from accord.backends.cpu.kernels import _native_quant
from accord.backends.reference.kernels.quant import dequantize
from accord.conformance.cases.quant import FP16_MAX, FP16_TINY, random_blocks
from accord.op_contracts import GGUF_FORMATS

FORMATS = list(GGUF_FORMATS)
#: Formats gguf-py's quantiser writes (the k-quants it only reads).
QUANTISABLE = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1")


def blocks_of(name: str) -> list[torch.Tensor]:
    """Packed rows of `name` to decode: random blocks at three scale magnitudes, and
    gguf-py's own quantisation of Gaussian weights where it has one."""
    fmt = GGUF_FORMATS[name]
    g = torch.Generator().manual_seed(len(name) + fmt.block_bytes)
    rows = [random_blocks(g, fmt, 6, 3, scale) for scale in (1e-3, FP16_MAX, FP16_TINY)]
    if name in QUANTISABLE:
        weights = np.random.default_rng(0).standard_normal((6, 3 * fmt.block_size)).astype(np.float32)
        rows.append(torch.from_numpy(gguf.quants.quantize(weights, gguf.GGMLQuantizationType[name])))
    return rows


def gguf_py(packed: torch.Tensor, name: str) -> np.ndarray:
    return gguf.quants.dequantize(packed.numpy(), gguf.GGMLQuantizationType[name]).astype(np.float64)


@pytest.mark.parametrize("name", FORMATS)
def test_reference_decoding_equals_gguf_py(name: str) -> None:
    for packed in blocks_of(name):
        # gguf-py computes in fp32: its products of fp16 scales and small codes are exact
        # but its scale * code - min rounds once more than fp64 does.
        np.testing.assert_allclose(dequantize(packed, name).numpy(), gguf_py(packed, name), rtol=1e-6, atol=0)


@pytest.mark.parametrize("name", FORMATS)
def test_cpu_unpacking_equals_gguf_py(name: str) -> None:
    if _native_quant.compiled_paths() == ():
        pytest.skip("no C compiler: the cpu backend's GGUF kernels are not built")
    depth = GGUF_FORMATS[name].block_size * 3
    for packed in blocks_of(name):
        out = torch.empty(packed.shape[0], depth)
        _native_quant.dequantize(packed, 0, out, name)
        np.testing.assert_allclose(out.double().numpy(), gguf_py(packed, name), rtol=1e-6, atol=0)
