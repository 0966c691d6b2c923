"""The cpu backend's graph of a step (`_native_graph`): the native kernel calls of one
run, replayed from C over whatever the input buffers hold then, give what torch computes
from those values (the aten ops the capture lowers to native kernels included); a step
that computes anything else in torch is refused; a kernel that
would refuse its inputs at replay stops the replay with an error."""

from __future__ import annotations

import threading

import pytest
import torch
import torch.nn.functional as F

from accord.backends.cpu.kernels import _native, _native_elementwise, _native_graph
from accord.backends.cpu.kernels._native_graph import CaptureRefused, capture

pytestmark = pytest.mark.skipif(
    not _native_graph.available() or _native_elementwise._library() is None,
    reason="no C compiler: the cpu backend has no native kernels to record",
)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def test_a_replay_computes_from_the_values_its_buffers_hold_then() -> None:
    torch.manual_seed(0)
    x, weight = torch.randn(3, 64), torch.rand(64) + 0.5

    def step() -> torch.Tensor:
        normed = torch.empty_like(x)
        assert _native_elementwise.rms_norm(x, None, weight, 1e-6, normed, None)
        out = torch.empty(3, 32)
        assert _native_elementwise.silu_and_mul(normed, out)
        return out

    graph, output = capture(step)
    assert len(graph) == 2
    x.copy_(torch.randn(3, 64) * 3)
    graph.replay()
    normed = _rms_norm(x, weight, 1e-6)
    torch.testing.assert_close(output, F.silu(normed[:, :32]) * normed[:, 32:])


def test_an_embedding_lookup_is_replayed_by_the_native_gather() -> None:
    table, ids = torch.randn(10, 8), torch.tensor([1, 2, 3])
    graph, output = capture(lambda: F.embedding(ids, table))
    ids.copy_(torch.tensor([7, 0, 9]))
    graph.replay()
    assert torch.equal(output, table[[7, 0, 9]])
    ids[1] = 10  # outside the table: the gather refuses, and the replay says which call
    with pytest.raises(RuntimeError, match=r"native call 0 \(accord_embedding\) refused its inputs"):
        graph.replay()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_contiguous_copy_of_column_slices_is_replayed_by_the_native_row_copy(dtype) -> None:
    # What a fused QKV projection's split makes at more than one token: column slices
    # of a wider tensor, each made contiguous (3-D: heads of a [T, H, D] view).
    fused = torch.randn(3, 24).to(dtype)

    def step() -> tuple[torch.Tensor, ...]:
        q, k, v = fused.split_with_sizes([12, 8, 4], -1)
        return q.contiguous(), k.view(3, 2, 4).contiguous(), v.contiguous(), fused[:1, 4:].contiguous()

    graph, outputs = capture(step)
    # Three row copies: the one-row slice is contiguous already (a view, nothing to copy).
    assert len(graph) == 3 and all(out.is_contiguous() for out in outputs)
    fused.copy_(torch.randn(3, 24).to(dtype))
    graph.replay()
    q, k, v = fused.split_with_sizes([12, 8, 4], -1)
    for got, want in zip(outputs, (q, k.view(3, 2, 4), v, fused[:1, 4:])):
        assert torch.equal(got, want)


def test_a_contiguous_copy_the_row_copy_cannot_make_refuses_the_capture() -> None:
    x = torch.randn(4, 6)
    with pytest.raises(CaptureRefused, match="strides"):
        capture(lambda: x.t().contiguous())  # its rows are not contiguous


def test_views_pass_but_torch_compute_refuses_the_capture() -> None:
    x = torch.randn(4, 16)
    with pytest.raises(CaptureRefused, match="aten.add"):
        capture(lambda: x.view(2, 32) + 1)
    # A contiguous tensor's contiguous() and reshapes are itself: nothing to replay.
    graph, output = capture(lambda: x.contiguous().view(64).reshape(8, 8))
    assert len(graph) == 0 and output.data_ptr() == x.data_ptr()
    assert _native.recorder is None


def test_a_capture_records_only_its_own_thread() -> None:
    x, weight, out = torch.randn(2, 16), torch.ones(16), torch.empty(2, 16)

    def step() -> torch.Tensor:
        other = threading.Thread(target=_native_elementwise.rms_norm, args=(x, None, weight, 1e-6, out, None))
        other.start()
        other.join()
        return x.view(32)

    graph, _ = capture(step)
    assert len(graph) == 0


@pytest.mark.slow
def test_a_capture_does_not_import_dynamo() -> None:
    # torch wraps a dispatch mode's handler in torch._disable_dynamo unless the mode opts
    # out; its first call imports dynamo, seconds of start-up on a small host.
    import subprocess
    import sys

    code = (
        "import sys, torch\n"
        "from accord.backends.cpu.kernels._native_graph import capture\n"
        "x = torch.randn(4)\n"
        "capture(lambda: x.view(2, 2))\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
