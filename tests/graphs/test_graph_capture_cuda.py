"""The triton GpuBackend's real graph capture on a CUDA device: a replay reads the
persistent buffers as they are when it runs, every bucket shares one memory pool, and
DecodeGraphs over it gives the eager result. Skipped without a CUDA GPU."""

from __future__ import annotations

from typing import Mapping

import pytest
import torch

from accord.core.worker.graph_capture import DecodeGraphs, InputSpec, capture_sizes

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)"
)


def _backend():
    from accord.backends import get_backend

    return get_backend("cuda")


def test_a_captured_graph_replays_over_rewritten_buffers() -> None:
    backend = _backend()
    x = torch.zeros(8, device="cuda")
    replay = backend.graph_capture(lambda: torch.cumsum(x * 2 + 1, 0))
    x.copy_(torch.arange(8.0, device="cuda"))
    out = replay()
    torch.testing.assert_close(out, torch.cumsum(torch.arange(8.0, device="cuda") * 2 + 1, 0))
    assert backend.captures_graphs and backend._graph_pool is not None


def test_decode_graphs_on_cuda_give_the_eager_result() -> None:
    backend = _backend()
    table = torch.randn(32, 16, device="cuda", generator=torch.Generator("cuda").manual_seed(0))

    def step(inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return table[inputs["ids"]] * (1 + inputs["pos"].float()[:, None])

    spec = {"ids": InputSpec((), torch.int64, 0), "pos": InputSpec((), torch.int64, 0)}
    graphs = DecodeGraphs(backend, step, spec, capture_sizes(8), "cuda")
    graphs.capture()
    pool = backend._graph_pool
    for rows in (1, 3, 8):
        batch = {"ids": torch.randint(32, (rows,), device="cuda"), "pos": torch.randint(50, (rows,), device="cuda")}
        torch.testing.assert_close(graphs.run(batch), step(batch), rtol=0, atol=0)
    assert graphs.replays == 3 and backend._graph_pool is pool
