"""cpu linear against the reference: on plain weights and on weights the backend
prepacked at load, with and without bias, over row counts a packed layout must serve
(one decode row through a prefill chunk), and strided activations."""

from __future__ import annotations

import pytest
import torch

from accord.backends import get_backend
from accord.backends.cpu import cpu_has_native_bf16
from accord.backends.cpu.kernels import _native_gemm
from accord.backends.cpu.kernels.linear import BF16_COPY, BF16_WEIGHT_MAX_ROWS, streams_bf16_weights
from accord.op_contracts import CONTRACTS, ContractError

#: Decides by the CPU's ISA: `.ci/run` reruns it as on each kind of CPU (tests/conftest.py).
pytestmark = pytest.mark.isa

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
TOLERANCE = CONTRACTS["linear"].tolerance


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_linear_plain_weight_matches_reference(assert_matches_reference, dtype, with_bias) -> None:
    x, weight = torch.randn(9, 72).to(dtype), (torch.randn(40, 72) / 8).to(dtype)
    bias = torch.randn(40).to(dtype) if with_bias else None
    assert_matches_reference("linear", x, weight, bias)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 3, 64, 300])
@pytest.mark.parametrize("with_bias", [False, True])
def test_linear_prepacked_weight_matches_reference(cpu_ops, reference_ops, nmse_of, dtype, rows, with_bias) -> None:
    weight = (torch.randn(96, 128) / 11).to(dtype)
    bias = torch.randn(96).to(dtype) if with_bias else None
    packed = get_backend("cpu").prepare_linear_weight(weight)
    x = torch.randn(rows, 128).to(dtype)
    got = cpu_ops.linear(x, packed, bias)
    want = reference_ops.linear(x, weight, bias)
    assert got.dtype == dtype and got.shape == (rows, 96)
    assert nmse_of(got, want) <= TOLERANCE[dtype]


def test_fp32_weights_are_prepacked_and_half_types_only_with_native_bf16() -> None:
    backend = get_backend("cpu")
    if not torch.backends.mkldnn.is_available():
        pytest.skip("this torch build has no oneDNN: weights stay plain")
    assert backend.prepare_linear_weight(torch.randn(8, 16)).is_mkldnn
    packed_bf16 = backend.prepare_linear_weight(torch.randn(8, 16).bfloat16()).is_mkldnn
    assert packed_bf16 == cpu_has_native_bf16()


def test_linear_takes_strided_activations(cpu_ops, reference_ops, nmse_of) -> None:
    weight = torch.randn(24, 32)
    packed = get_backend("cpu").prepare_linear_weight(weight)
    x = torch.randn(5, 64)[:, ::2]
    assert not x.is_contiguous()
    assert nmse_of(cpu_ops.linear(x, packed), reference_ops.linear(x, weight)) <= TOLERANCE[torch.float32]


def test_linear_refuses_a_width_mismatch_on_a_prepacked_weight(cpu_ops) -> None:
    packed = get_backend("cpu").prepare_linear_weight(torch.randn(24, 32))
    with pytest.raises(ContractError, match="linear"):
        cpu_ops.linear(torch.randn(2, 31), packed)


needs_native_gemm = pytest.mark.skipif(
    not _native_gemm.available(),
    reason="the bf16-weight GEMM needs a C compiler",
)


needs_bf16_copies = pytest.mark.skipif(
    not streams_bf16_weights(),
    reason="bf16 copies are made only on AVX512 CPUs computing bf16 in fp32, with oneDNN and a C compiler",
)


@needs_bf16_copies
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("with_bias", [False, True])
def test_bf16_valued_weight_matches_reference_at_fp32_tolerance(cpu_ops, reference_ops, nmse_of, rows, with_bias) -> None:
    # N not a multiple of the kernel's 4-row blocks, K not one of its 16 lanes.
    weight = (torch.randn(90, 200) / 14).bfloat16().float()
    bias = torch.randn(90) if with_bias else None
    prepared = get_backend("cpu").prepare_linear_weight(weight)
    assert isinstance(getattr(prepared, BF16_COPY), _native_gemm.Bf16Weight)
    x = torch.randn(rows, 200)
    got = cpu_ops.linear(x, prepared, bias)
    want = reference_ops.linear(x, weight, bias)
    assert got.dtype == torch.float32 and nmse_of(got, want) <= TOLERANCE[torch.float32]


@needs_bf16_copies
def test_bf16_weight_gemm_keeps_fp32_activations() -> None:
    # Activations with more mantissa than bf16 holds: rounding them to bf16 (what
    # oneDNN's bf16 GEMM does) would move the result by ~1e-3 relative.
    weight = torch.randn(64, 48).bfloat16()
    x = torch.randn(3, 48) * (1 + 2**-12)
    out = torch.empty(3, 64)
    _native_gemm.bf16_weight(weight)(x, None, out)
    want = (x.double() @ weight.double().t()).float()
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


@needs_bf16_copies
def test_few_row_path_takes_strided_activations(cpu_ops, reference_ops, nmse_of) -> None:
    weight = torch.randn(24, 32).bfloat16().float()
    prepared = get_backend("cpu").prepare_linear_weight(weight)
    x = torch.randn(2, 64)[:, ::2]
    assert nmse_of(cpu_ops.linear(x, prepared), reference_ops.linear(x, weight)) <= TOLERANCE[torch.float32]


def test_no_bf16_copy_of_a_weight_that_is_not_exactly_bf16() -> None:
    weight = torch.randn(16, 32)
    weight[3, 5] = 1 + 2**-12  # one value bf16 cannot hold
    assert not hasattr(get_backend("cpu").prepare_linear_weight(weight), BF16_COPY)


@pytest.mark.parametrize("native", [False, True])
def test_no_bf16_copy_on_a_cpu_the_bf16_weight_gemm_does_not_pay_on(monkeypatch, request, native) -> None:
    # AVX2-only CPUs keep oneDNN's path, whether they compute bf16 in fp32 or natively.
    if native:
        request.getfixturevalue("forced_native_bf16")
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    weight = torch.randn(8, 16).bfloat16()
    assert not hasattr(get_backend("cpu").prepare_linear_weight(weight if native else weight.float()), BF16_COPY)


def _bf16_gemm_bound(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact product of bf16 x, weight (and bias) in float64, and how far a result
    with fp32 accumulation rounded once to bf16 may lie from it: half a bf16 ulp (2^-8
    relative) plus the fp32 summation's error bound over K terms."""
    exact = x.double() @ weight.double().t() + (0 if bias is None else bias.double())
    magnitude = x.double().abs() @ weight.double().abs().t() + (0 if bias is None else bias.double().abs())
    return exact, exact.abs() * 2**-8 + magnitude * (x.shape[1] + 1) * 2**-23


@needs_native_gemm
@pytest.mark.parametrize("rows", [1, 2, 3, 4])
@pytest.mark.parametrize(("width", "depth"), [(42, 72), (13, 37), (96, 128), (5, 9)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_bf16_activation_gemm_rounds_the_fp32_sum_once(rows, width, depth, with_bias) -> None:
    # bf16 in and out, as on a CPU with native bf16: N off the kernel's 4-row blocks, K
    # off its 16 lanes, x rows strided (a view into wider rows).
    weight = (torch.randn(width, depth) / depth**0.5).bfloat16()
    x = torch.randn(rows, depth + 11).bfloat16()[:, :depth]
    bias = torch.randn(width).bfloat16() if with_bias else None
    gemm = _native_gemm.bf16_weight(weight)
    out = torch.full((rows, width), float("nan"), dtype=torch.bfloat16)
    gemm(x, bias, out)
    exact, bound = _bf16_gemm_bound(x, weight, bias)
    assert ((out.double() - exact).abs() <= bound).all()
    # One rounding: the same sums kept in fp32 (the kernel's fp32 form on the widened
    # inputs), rounded by torch, give the very same bits.
    wide = torch.empty(rows, width)
    gemm(x.float(), None if bias is None else bias.float(), wide)
    assert torch.equal(out, wide.bfloat16())


@needs_native_gemm
def test_bf16_activation_gemm_rounds_to_nearest_even() -> None:
    # A sum exactly halfway between two bf16 values: 1 + 2^-8 lies between 1 and
    # 1 + 2^-7 and goes to the even one, 1; 1 + 3 * 2^-8 goes up to 1 + 2^-6.
    weight = torch.ones(2, 2).bfloat16()
    x = torch.tensor([[1.0, 2**-8], [1.0, 3 * 2**-8]]).bfloat16()
    out = torch.empty(2, 2, dtype=torch.bfloat16)
    _native_gemm.bf16_weight(weight)(x, None, out)
    assert out[0].tolist() == [1.0, 1.0] and out[1].tolist() == [1 + 2**-6, 1 + 2**-6]


@needs_native_gemm
def test_bf16_activation_gemm_says_so_when_it_cannot_widen_x() -> None:
    # bf16 x is widened into a per-thread fp32 buffer first: one it cannot allocate (a
    # depth no memory holds) computes nothing and raises, instead of writing garbage.
    packed = _native_gemm.bf16_weight(torch.ones(4, 16).bfloat16()).packed
    huge = _native_gemm.Bf16Weight(packed, 4, 2**60)
    out = torch.zeros(1, 4, dtype=torch.bfloat16)
    with pytest.raises(MemoryError, match="widen"):
        huge(torch.ones(1, 16).bfloat16(), None, out)
    assert not out.any()


@needs_bf16_copies
@pytest.mark.parametrize("rows", [1, 2, 4, 5])
@pytest.mark.parametrize("with_bias", [False, True])
def test_bf16_weights_stream_for_few_rows_on_the_native_bf16_path(
    forced_native_bf16, cpu_ops, reference_ops, nmse_of, rows, with_bias
) -> None:
    # Computed in bf16 (oneDNN's bf16 path for more rows, emulated on this host): the
    # weight keeps its bf16 copy, which serves up to 4 rows with bf16 in and out.
    weight = (torch.randn(30, 40) / 6).bfloat16()
    bias = torch.randn(30).bfloat16() if with_bias else None
    prepared = get_backend("cpu").prepare_linear_weight(weight)
    assert prepared.is_mkldnn and prepared.dtype == torch.bfloat16
    copy, calls = getattr(prepared, BF16_COPY), []

    def recorded(*args):
        calls.append(args[0].dtype)
        copy(*args)

    setattr(prepared, BF16_COPY, recorded)
    x = torch.randn(rows, 80).bfloat16()[:, ::2]
    got = cpu_ops.linear(x, prepared, bias)
    assert got.dtype == torch.bfloat16
    assert nmse_of(got, reference_ops.linear(x, weight, bias)) <= TOLERANCE[torch.bfloat16]
    assert calls == ([torch.bfloat16] if rows <= BF16_WEIGHT_MAX_ROWS else [])


def _streamed_values(streamed: _native_gemm.Bf16Weight, depth: int) -> torch.Tensor:
    """The weight [N, K] a streamed GEMM holds, read back through the GEMM itself: row k
    of the identity picks column k of W, exactly (one nonzero product per output)."""
    out = torch.empty(depth, streamed.packed.numel() // depth)
    streamed(torch.eye(depth), None, out)
    return out.t()


@needs_bf16_copies
@pytest.mark.parametrize("shape", [(1, 1), (3, 15), (4, 16), (5, 17), (33, 70), (8, 64)])
def test_exact_bf16_copy_is_the_values_and_refuses_a_value_bf16_cannot_hold(shape) -> None:
    # Shapes on and off the kernel's 4-row blocks and 16-column slices of its layout.
    weight = torch.randn(shape).bfloat16().float()
    streamed = _native_gemm.exact_bf16(weight)
    assert streamed is not None and streamed.packed.dtype == torch.bfloat16
    assert torch.equal(_streamed_values(streamed, shape[1]), weight)
    weight[-1, -1] += weight[-1, -1].abs() * 2**-12
    assert _native_gemm.exact_bf16(weight) is None


@needs_bf16_copies
def test_a_bf16_weight_streams_its_own_values_and_an_fp32_one_is_refused() -> None:
    weight = torch.randn(13, 37).bfloat16()
    assert torch.equal(_streamed_values(_native_gemm.bf16_weight(weight), 37), weight.float())
    with pytest.raises(TypeError, match="bfloat16"):
        _native_gemm.bf16_weight(weight.float())


def test_without_a_c_compiler_the_bf16_valued_weight_takes_the_torch_path(monkeypatch, cpu_ops, reference_ops, nmse_of) -> None:
    monkeypatch.setattr(_native_gemm, "_library", lambda: None)
    weight = torch.randn(40, 72).bfloat16().float()
    prepared = get_backend("cpu").prepare_linear_weight(weight)
    assert not hasattr(prepared, BF16_COPY)
    x = torch.randn(1, 72)
    assert nmse_of(cpu_ops.linear(x, prepared), reference_ops.linear(x, weight)) <= TOLERANCE[torch.float32]


@needs_bf16_copies
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("depth", [1000, 2400])
def test_streamed_rows_do_not_depend_on_the_batch_or_the_thread_count(reference_ops, nmse_of, dtype, depth) -> None:
    # Large enough for many of the kernel's work chunks (taken by whichever thread is
    # free), with N off its 4-row blocks and K off its 16 lanes; activations fp32 (a CPU
    # computing bf16 in fp32) or bf16 (one computing it natively). One and two rows read
    # a chunk's blocks in pairs, three and four one by one; at K 2400 a chunk holds an odd
    # number of blocks (three), so one of them is read alone.
    weight = (torch.randn(1203, depth) / 32).bfloat16().to(dtype)
    streamed = _native_gemm.bf16_weight(weight.bfloat16())
    bias = torch.randn(1203).to(dtype)
    x = torch.randn(4, depth).to(dtype)
    threads = torch.get_num_threads()
    outputs = []
    try:
        for count in (1, 2, 3):  # 3: ranges of unequal chunk counts, more threads than cores
            torch.set_num_threads(count)
            for rows in (1, 2, 3, 4):
                out = torch.empty(rows, 1203, dtype=dtype)
                streamed(x[:rows], bias, out)
                outputs.append(out)
    finally:
        torch.set_num_threads(threads)
    want = reference_ops.linear(x, weight, bias)
    assert nmse_of(outputs[-1], want) <= TOLERANCE[dtype]
    for out in outputs:
        assert torch.equal(out, outputs[-1][: out.shape[0]])


def _gemm_case() -> tuple[_native_gemm.Bf16Weight, torch.Tensor, torch.Tensor]:
    """A bf16-weight GEMM of many work chunks (N off its 4-row blocks, K off its 16 lanes),
    its input, and its result computed on one thread."""
    gemm = _native_gemm.bf16_weight((torch.randn(1203, 1000) / 32).bfloat16())
    x = torch.randn(2, 1000)
    want = torch.empty(2, 1203)
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        gemm(x, None, want)
    finally:
        torch.set_num_threads(previous)
    return gemm, x, want


@needs_native_gemm
def test_concurrent_gemm_calls_from_two_threads_give_the_one_thread_bits() -> None:
    # The GEMM's thread pool serves one caller at a time; a second concurrent caller
    # must still get the right, identical bits.
    import threading

    gemm, x, want = _gemm_case()
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    mismatches = []

    def call_repeatedly() -> None:
        out = torch.empty(2, 1203)
        for _ in range(200):
            gemm(x, None, out)
            if not torch.equal(out, want):
                mismatches.append(out.clone())

    try:
        callers = [threading.Thread(target=call_repeatedly) for _ in range(2)]
        for caller in callers:
            caller.start()
        for caller in callers:
            caller.join(timeout=120)
        assert not any(caller.is_alive() for caller in callers), "a GEMM call hung"
    finally:
        torch.set_num_threads(previous)
    assert not mismatches


@needs_native_gemm
def test_gemm_pool_works_in_a_forked_child() -> None:
    # The parent's pool threads do not exist in a forked child (the mp executor forks):
    # the child must build its own pool rather than wait on the parent's threads.
    import os
    import select

    gemm, x, want = _gemm_case()
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        out = torch.empty(2, 1203)
        gemm(x, None, out)  # the parent's pool exists before the fork
        assert torch.equal(out, want)
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                child_out = torch.empty(2, 1203)
                for _ in range(20):
                    gemm(x, None, child_out)
                os.write(write_end, b"1" if torch.equal(child_out, want) else b"0")
            finally:
                os._exit(0)
        os.close(write_end)
        ready, _, _ = select.select([read_end], [], [], 120)
        verdict = os.read(read_end, 1) if ready else b""
        os.close(read_end)
        if not ready:
            os.kill(pid, 9)
        os.waitpid(pid, 0)
    finally:
        torch.set_num_threads(previous)
    assert verdict == b"1", "the forked child's GEMM hung" if not verdict else "the forked child's GEMM gave other bits"


@pytest.mark.parametrize("native", [False, True])
@pytest.mark.parametrize("capability", ["AVX512", "AVX2"])
def test_decode_steps_are_captured_on_avx512_whether_bf16_is_native_or_not(monkeypatch, request, native, capability) -> None:
    # The graph needs every GEMM of a <= 4-row step in the bf16-weight GEMM: on AVX512
    # it serves bf16 checkpoints computed in fp32 and in bf16 alike; AVX2 CPUs keep
    # oneDNN (it measured slower there), so nothing is captured.
    from accord.backends.cpu import CpuBackend
    from accord.backends.cpu.kernels import _native_graph

    if not (_native_gemm.available() and _native_graph.available() and torch.backends.mkldnn.is_available()):
        pytest.skip("the bf16-weight GEMM and the graph replay need a C compiler, and the copies oneDNN")
    request.getfixturevalue("forced_native_bf16" if native else "forced_fp32_bf16")
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    backend = CpuBackend()
    assert backend.compute_dtype(torch.bfloat16) == (torch.bfloat16 if native else torch.float32)
    captures = capability == "AVX512"
    assert streams_bf16_weights() is captures and backend.captures_graphs is captures
    assert backend.max_graph_batch == (BF16_WEIGHT_MAX_ROWS if captures else 0)
