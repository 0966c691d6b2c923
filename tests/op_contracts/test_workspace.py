"""The scratch buffers the cpu kernels and the rejection sampler reuse between calls."""

from __future__ import annotations

import torch

from accord.op_contracts.workspace import Workspace


def test_scratch_buffers_first_taken_in_inference_mode_stay_writable_outside_it():
    """The engine runs under torch.inference_mode and a test runner may not: the reused
    scratch buffers must serve both, in either order."""
    workspace = Workspace()
    source, rows = torch.randn(8), torch.tensor([0, 2, 4, 6])
    with torch.inference_mode():
        torch.index_select(source, 0, rows, out=workspace.take("keys", (4,), torch.float32))
    out = torch.index_select(source, 0, rows, out=workspace.take("keys", (4,), torch.float32))
    assert torch.equal(out, source[rows])


def test_one_name_taken_at_two_dtypes_gives_two_buffers_that_keep_their_contents():
    workspace = Workspace()
    floats = workspace.take("rows", (3,), torch.float32).copy_(torch.tensor([1.5, 2.5, 3.5]))
    workspace.take("rows", (3,), torch.int64).fill_(-1)
    assert torch.equal(floats, torch.tensor([1.5, 2.5, 3.5]))


def test_a_larger_take_grows_the_buffer_to_the_shape_asked_for():
    workspace = Workspace()
    workspace.take("rows", (2,), torch.float32)
    grown = workspace.take("rows", (4, 5), torch.float32)
    assert grown.shape == (4, 5) and grown.is_contiguous()
