"""The cpu backend's quant_linear on every path it can take, each forced whatever the
host: the int8 row dot and the token-tile GEMM, each in plain C, AVX2 and VNNI (one test
per path; a path this host's compiler cannot target is skipped, saying so), the
dequantised-tile GEMM that many rows take, and gguf-py's dequantisation where no C
compiler is found. Each is held to the fp64 reference: the int8 paths within the
contract's allowance for int8 activations, the GEMM paths at fp32 accuracy. The conformance run covers the shapes,
dtypes and fp16-limit scales of accord/conformance/cases/quant.py."""

from __future__ import annotations

import pytest
import torch

from accord.backends import get_backend
from accord.backends.cpu.kernels import _native_quant, quant
from accord.conformance import ConformanceRunner, Status
from accord.conformance.cases.quant import random_blocks
from accord.op_contracts import GGUF_FORMATS, OpDispatcher
from accord.op_contracts.contracts.quant import QUANTISED_ACTIVATIONS

FORMATS = list(GGUF_FORMATS)


@pytest.fixture(scope="module")
def cpu() -> OpDispatcher:
    return OpDispatcher(get_backend("cpu"))


@pytest.fixture(scope="module")
def reference() -> OpDispatcher:
    return OpDispatcher(get_backend("reference"))


def nmse(got: torch.Tensor, want: torch.Tensor) -> float:
    return float(((got.double() - want.double()) ** 2).sum() / (want.double() ** 2).sum())


def operands(name: str, tokens: int, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    fmt = GGUF_FORMATS[name]
    g = torch.Generator().manual_seed(tokens * 1000 + fmt.block_bytes)
    blocks = 2 if fmt.block_size == 256 else 9
    x = torch.randn(tokens, blocks * fmt.block_size, generator=g).to(dtype)
    return x, random_blocks(g, fmt, 37, blocks), torch.randn(37, generator=g).to(dtype)


def require_path(path: str) -> None:
    if path not in _native_quant.compiled_paths():
        pytest.skip(f"this host's build has no {path} dot path (built: {list(_native_quant.compiled_paths())})")


@pytest.fixture
def token_tile_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every call up to TILE_MAX_ROWS rows takes the token-tile GEMM, one row included."""
    monkeypatch.setattr(quant, "ROW_DOT_MAX_ROWS", {})
    monkeypatch.setattr(quant, "DEFAULT_ROW_DOT_MAX_ROWS", 0)


@pytest.mark.parametrize("path", ["plain", "avx2", "vnni"])
def test_each_row_dot_path_is_within_the_int8_activation_bound(path: str, cpu, reference, monkeypatch) -> None:
    require_path(path)
    monkeypatch.setenv(quant.PATH_ENV, path)
    monkeypatch.setattr(quant, "DEFAULT_ROW_DOT_MAX_ROWS", 8)  # the k-quants' row dot at 8 rows too
    for name in FORMATS:
        for tokens in (1, 8):
            x, qweight, bias = operands(name, tokens)
            got = cpu.quant_linear(x, qweight, bias, quant_type=name)
            assert nmse(got, reference.quant_linear(x, qweight, bias, quant_type=name)) < QUANTISED_ACTIVATIONS[
                torch.float32
            ], (name, tokens)


@pytest.mark.parametrize("path", ["plain", "avx2", "vnni"])
def test_each_token_tile_path_is_within_the_int8_activation_bound(path: str, cpu, reference, token_tile_only,
                                                                   monkeypatch) -> None:
    # 37 output rows: two full panels of 16 and a partial one; 7 and 100 tokens end in a
    # partial register tile.
    require_path(path)
    monkeypatch.setenv(quant.PATH_ENV, path)
    for name in FORMATS:
        for tokens in (1, 7, 32, 100):
            x, qweight, bias = operands(name, tokens)
            got = cpu.quant_linear(x, qweight, bias, quant_type=name)
            assert nmse(got, reference.quant_linear(x, qweight, bias, quant_type=name)) < QUANTISED_ACTIVATIONS[
                torch.float32
            ], (name, tokens)


def test_the_avx2_and_vnni_row_dots_give_the_same_bits(cpu, monkeypatch) -> None:
    # Both sum the same exact int32 products of one block into the same float lanes.
    require_path("vnni")
    for name in FORMATS:
        x, qweight, bias = operands(name, 3)
        monkeypatch.setenv(quant.PATH_ENV, "avx2")
        avx2 = cpu.quant_linear(x, qweight, bias, quant_type=name)
        monkeypatch.setenv(quant.PATH_ENV, "vnni")
        assert torch.equal(cpu.quant_linear(x, qweight, bias, quant_type=name), avx2), name


def test_the_three_token_tile_paths_give_the_same_bits(cpu, token_tile_only, monkeypatch) -> None:
    # Each group's int32 sum is exact on every path, and the fp32 steps after it are the
    # same operations in the same order.
    require_path("vnni")
    for name in FORMATS:
        x, qweight, bias = operands(name, 7)
        results = {}
        for path in ("plain", "avx2", "vnni"):
            monkeypatch.setenv(quant.PATH_ENV, path)
            results[path] = cpu.quant_linear(x, qweight, bias, quant_type=name)
        assert torch.equal(results["plain"], results["vnni"]) and torch.equal(results["avx2"], results["vnni"]), name


def test_the_token_tile_computes_each_token_as_it_does_alone(cpu, token_tile_only) -> None:
    # A token in a full register tile and the same token in a one-token call.
    x, qweight, bias = operands("Q6_K", 9)
    batch = cpu.quant_linear(x, qweight, bias, quant_type="Q6_K")
    assert all(torch.equal(batch[t], cpu.quant_linear(x[t : t + 1], qweight, bias, quant_type="Q6_K")[0])
               for t in (0, 5, 8))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_many_half_rows_take_dequantised_tiles_at_the_gemm_s_accuracy(dtype, cpu, reference, monkeypatch) -> None:
    # Tiles of 16 or 28 rows, smaller than the 37-row weight, so the last one is partial.
    monkeypatch.setattr(quant, "TILE_ELEMENTS", 16 * 512)
    monkeypatch.setattr(quant, "TILE_MAX_ROWS", 8)
    for name in FORMATS:
        x, qweight, bias = operands(name, 9, dtype)
        got = cpu.quant_linear(x, qweight, bias, quant_type=name)
        # The GEMM's accuracy in x's dtype: far inside the int8-activation allowance.
        assert nmse(got, reference.quant_linear(x, qweight, bias, quant_type=name)) < 1e-4, name


def test_many_fp32_rows_take_the_token_tile(cpu, monkeypatch) -> None:
    # Past TILE_MAX_ROWS an fp32 call still computes each token as the token tile does
    # alone (its int8 activations), not through a dequantised GEMM.
    x, qweight, bias = operands("Q4_1", 9)
    monkeypatch.setattr(quant, "ROW_DOT_MAX_ROWS", {})
    monkeypatch.setattr(quant, "DEFAULT_ROW_DOT_MAX_ROWS", 0)
    alone = [cpu.quant_linear(x[t : t + 1], qweight, bias, quant_type="Q4_1")[0] for t in range(9)]
    monkeypatch.setattr(quant, "TILE_MAX_ROWS", 8)
    batch = cpu.quant_linear(x, qweight, bias, quant_type="Q4_1")
    assert all(torch.equal(batch[t], alone[t]) for t in range(9))


def test_without_a_c_compiler_gguf_py_dequantises_for_the_gemm(cpu, reference, monkeypatch) -> None:
    monkeypatch.setattr(_native_quant, "compiled_paths", lambda: ())
    for name in FORMATS:
        x, qweight, bias = operands(name, 1)
        got = cpu.quant_linear(x, qweight, bias, quant_type=name)
        assert nmse(got, reference.quant_linear(x, qweight, bias, quant_type=name)) < 1e-10, name


def test_naming_a_path_the_build_lacks_is_an_error(monkeypatch) -> None:
    monkeypatch.setattr(_native_quant, "compiled_paths", lambda: ("plain",))
    monkeypatch.setenv(quant.PATH_ENV, "vnni")
    with pytest.raises(ValueError, match=r"ACCORD_CPU_QUANT_PATH='vnni': this host's build has only \['plain'\]"):
        quant.dot_path()


@pytest.mark.slow
def test_cpu_quant_linear_passes_conformance() -> None:
    results = ConformanceRunner(get_backend("cpu"), get_backend("reference")).run_op("quant_linear")
    legal = [r for r in results if r.combo != "illegal calls"]
    assert legal and {r.status for r in legal} == {Status.PASS}, [(r.case, r.message) for r in legal if r.status != Status.PASS]
    assert {r.status for r in results if r.combo == "illegal calls"} == {Status.REFUSED}


@pytest.mark.parametrize("tokens", [2, 12], ids=["row dot", "token tile"])
def test_a_captured_decode_graph_replays_the_packed_kernel_on_new_activations(tokens: int, cpu) -> None:
    from accord.backends.cpu.kernels import _native_graph

    if not _native_graph.available():
        pytest.skip("the native graph replay loop is not built here (no C compiler)")
    x, qweight, _ = operands("Q4_K", tokens)
    with torch.inference_mode():
        cpu.quant_linear(x, qweight, None, quant_type="Q4_K")  # first sight: validation
        graph, out = _native_graph.capture(lambda: cpu.quant_linear(x, qweight, None, quant_type="Q4_K"))
        x.copy_(torch.randn(x.shape, generator=torch.Generator().manual_seed(7)))
        graph.replay()
        assert torch.equal(out, cpu.quant_linear(x, qweight, None, quant_type="Q4_K"))
