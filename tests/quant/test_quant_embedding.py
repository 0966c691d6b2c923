"""quant_embedding, the packed GGUF token embedding's lookup: the cpu backend's native
lookup (fp32 and bf16 rows written by the C kernel, fp16 rounded from fp32) and its
gguf-py fallback where no C compiler is found, each held to gguf-py's own
dequantisation of the looked-up rows (an independent decoder) for every block format;
an id outside the table is refused with nothing written; and a captured decode graph
replays the lookup over new ids. The conformance run covers the shapes, id dtypes and
refusals of accord/conformance/cases/quant.py."""

from __future__ import annotations

import gguf
import pytest
import torch

from accord.backends import get_backend
from accord.backends.cpu.kernels import _native_graph, _native_quant
from accord.conformance.cases.quant import random_blocks
from accord.op_contracts import GGUF_FORMATS, OpDispatcher

#: Rows of the test tables.
ROWS = 29


@pytest.fixture(scope="module")
def cpu() -> OpDispatcher:
    return OpDispatcher(get_backend("cpu"))


def table(name: str) -> tuple[torch.Tensor, int]:
    """A random `name` table of ROWS rows and two blocks a row, and its row width."""
    fmt = GGUF_FORMATS[name]
    return random_blocks(torch.Generator().manual_seed(fmt.block_bytes), fmt, ROWS, 2), 2 * fmt.block_size


def gguf_py_rows(qweight: torch.Tensor, ids: list[int], name: str) -> torch.Tensor:
    """gguf-py's dequantisation of rows `ids`, in fp32."""
    return torch.from_numpy(gguf.quants.dequantize(qweight[ids].numpy(), gguf.GGMLQuantizationType[name]))


def lookup(cpu: OpDispatcher, qweight: torch.Tensor, ids: torch.Tensor, name: str, depth: int,
           dtype: torch.dtype) -> torch.Tensor:
    return cpu.quant_embedding(ids, qweight, quant_type=name, hidden_size=depth, out_dtype=dtype)


def require_library() -> None:
    if not _native_quant.compiled_paths():
        pytest.skip("no C compiler: the cpu backend looks rows up with gguf-py (tested below)")


@pytest.mark.parametrize("name", list(GGUF_FORMATS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_native_lookup_gives_gguf_py_s_rows(name: str, dtype: torch.dtype, cpu) -> None:
    require_library()
    qweight, depth = table(name)
    ids = [ROWS - 1, 0, 11, 11]
    got = lookup(cpu, qweight, torch.tensor(ids, dtype=torch.int32), name, depth, dtype)
    assert got.dtype == dtype
    # One rounding of fp32 values (gguf-py's), to the output's dtype.
    assert torch.equal(got, gguf_py_rows(qweight, ids, name).to(dtype))


@pytest.mark.parametrize("name", list(GGUF_FORMATS))
def test_without_a_c_compiler_gguf_py_looks_the_rows_up(name: str, cpu, monkeypatch) -> None:
    monkeypatch.setattr(_native_quant, "compiled_paths", lambda: ())
    qweight, depth = table(name)
    ids = [3, ROWS - 1]
    got = lookup(cpu, qweight, torch.tensor(ids), name, depth, torch.bfloat16)
    assert torch.equal(got, gguf_py_rows(qweight, ids, name).to(torch.bfloat16))


def test_an_id_outside_the_table_is_refused_with_nothing_written() -> None:
    require_library()
    qweight, depth = table("Q4_K")
    out = torch.full((2, depth), 7.0)
    with pytest.raises(IndexError, match=f"outside the table's {ROWS} rows"):
        _native_quant.embedding(torch.tensor([1, ROWS]), qweight, out, "Q4_K")
    assert torch.equal(out, torch.full((2, depth), 7.0))


def test_a_captured_decode_graph_replays_the_lookup_over_new_ids(cpu) -> None:
    require_library()
    if not _native_graph.available():
        pytest.skip("the native graph replay loop is not built here (no C compiler)")
    qweight, depth = table("Q6_K")
    ids = torch.tensor([4, 9], dtype=torch.int64)
    with torch.inference_mode():
        lookup(cpu, qweight, ids, "Q6_K", depth, torch.float32)  # first sight: validation
        graph, out = _native_graph.capture(lambda: lookup(cpu, qweight, ids, "Q6_K", depth, torch.float32))
        ids.copy_(torch.tensor([ROWS - 1, 0]))
        graph.replay()
        assert torch.equal(out, gguf_py_rows(qweight, [ROWS - 1, 0], "Q6_K"))
        ids[0] = ROWS  # outside the table: the replay stops, naming the call
        with pytest.raises(RuntimeError, match=r"accord_gguf_embedding\) refused its inputs"):
            graph.replay()
