"""What `--dtype auto` computes a GGUF model in, on either cpu bf16 path: a quantised
file in fp32 (its weights dequantise to fp32 values), a BF16 or F16 file in its own type
where the CPU computes it natively and in fp32 where it does not."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from gguf_files import Q, build_model, write_gguf

from accord.backends import get_backend
from accord.core.model_loader.load import load_model
from accord.op_contracts import OpDispatcher

pytestmark = pytest.mark.isa

#: (tensor type, dtype on the native bf16 path, dtype on the fp32 path).
EXPECTED = (
    (Q.Q4_1, torch.float32, torch.float32),
    (Q.Q8_0, torch.float32, torch.float32),
    (Q.BF16, torch.bfloat16, torch.float32),
    (Q.F32, torch.float32, torch.float32),
)


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory):
    """`written(type)`: a tiny llama GGUF file with its matrices stored as `type`."""
    model = build_model("llama")

    def get(tensor_type: Q) -> Path:
        path = tmp_path_factory.mktemp("gguf") / f"tiny-{tensor_type.name}.gguf"
        return write_gguf(path, model, "llama", tensor_type)

    return get


def auto_dtype(path: Path) -> torch.dtype:
    """The dtype the cpu backend computes `path` in under `--dtype auto`, as a worker loads it."""
    backend = get_backend("cpu")
    return load_model(path, OpDispatcher(backend), dtype="auto", compute_dtype=backend.compute_dtype).config.dtype


@pytest.mark.parametrize(("tensor_type", "native", "fp32"), EXPECTED, ids=lambda v: getattr(v, "name", None))
def test_auto_on_the_native_bf16_path(written, forced_native_bf16, tensor_type: Q, native, fp32) -> None:
    assert auto_dtype(written(tensor_type)) == native


@pytest.mark.parametrize(("tensor_type", "native", "fp32"), EXPECTED, ids=lambda v: getattr(v, "name", None))
def test_auto_on_the_fp32_bf16_path(written, forced_fp32_bf16, tensor_type: Q, native, fp32) -> None:
    assert auto_dtype(written(tensor_type)) == fp32
