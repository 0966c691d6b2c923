"""CUDA-graph bookkeeping on the CPU, with a backend double that behaves like a graph:
the capture runs the step once and keeps its output tensor; a replay re-runs the step
over the same persistent buffers and writes into that same output. A bucket the backend
refuses runs eagerly."""

from __future__ import annotations

from typing import Callable, Mapping

import pytest
import torch

from accord.backends import get_backend
from accord.core.worker.graph_capture import DecodeGraphs, InputSpec, bucket_for, capture_sizes
from accord.op_contracts import ContractError, OpDispatcher


class GraphDouble:
    """Captures by running once; replays write into the captured (static) output."""

    def __init__(self) -> None:
        self.captures = 0
        self.replays = 0

    def graph_capture(self, fn: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
        self.captures += 1
        static = fn()

        def replay() -> torch.Tensor:
            self.replays += 1
            static.copy_(fn())
            return static

        return replay


HIDDEN, VOCAB = 16, 32
# The reference backend computes each row alike whatever the batch size, so a padded
# replay must equal the eager run bit for bit; the cpu GEMM may change with the rows.
OPS = OpDispatcher(get_backend("reference"), strict=True)
TABLE = torch.randn(VOCAB, HIDDEN, generator=torch.Generator().manual_seed(0))
HEAD = torch.randn(VOCAB, HIDDEN, generator=torch.Generator().manual_seed(1))
NORM = torch.ones(HIDDEN)


def decode_step(inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """A miniature decode step through contract ops: embed, scale by position, norm, LM head."""
    hidden = TABLE[inputs["input_ids"]] * (1 + inputs["positions"].float()[:, None])
    return OPS.linear(OPS.rms_norm(hidden, NORM, 1e-6), HEAD, None)


INPUTS = {"input_ids": InputSpec((), torch.int64, 0), "positions": InputSpec((), torch.int64, 0)}


def _batch(rows: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"input_ids": torch.randint(VOCAB, (rows,), generator=g), "positions": torch.randint(50, (rows,), generator=g)}


def test_capture_sizes_follow_the_bucket_schedule() -> None:
    assert capture_sizes(1) == (1,)
    assert capture_sizes(6) == (1, 2, 4, 6)
    assert capture_sizes(20) == (1, 2, 4, 8, 16, 20)
    assert capture_sizes(32) == (1, 2, 4, 8, 16, 24, 32)


@pytest.mark.parametrize("batch, bucket", [(1, 1), (3, 4), (4, 4), (5, 8), (17, 20), (20, 20), (21, None)])
def test_a_batch_goes_to_the_smallest_bucket_that_holds_it(batch, bucket) -> None:
    assert bucket_for(batch, capture_sizes(20)) == bucket


def test_replay_in_a_padded_bucket_gives_the_eager_result() -> None:
    device = GraphDouble()
    graphs = DecodeGraphs(device, decode_step, INPUTS, capture_sizes(8))
    graphs.capture()
    assert graphs.captured == (1, 2, 4, 8) and device.captures == 4
    for rows, seed in ((3, 0), (8, 1), (1, 2), (5, 3)):
        batch = _batch(rows, seed)
        got = graphs.run(batch)
        assert got.shape == (rows, VOCAB)
        torch.testing.assert_close(got, decode_step(batch), rtol=0, atol=0)
    assert graphs.replays == device.replays == 4 and graphs.eager_runs == 0


def test_padding_rows_hold_the_pad_value_not_a_previous_batch() -> None:
    seen: list[torch.Tensor] = []

    def recording_step(inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        seen.append(inputs["slots"].clone())
        return inputs["slots"].float()[:, None]

    graphs = DecodeGraphs(GraphDouble(), recording_step, {"slots": InputSpec((), torch.int64, -1)}, (4,))
    graphs.capture()
    graphs.run({"slots": torch.tensor([7, 8, 9, 10])})
    out = graphs.run({"slots": torch.tensor([3])})
    assert seen[-1].tolist() == [3, -1, -1, -1] and out.tolist() == [[3.0]]


def test_a_batch_beyond_the_largest_bucket_runs_eagerly() -> None:
    device = GraphDouble()
    graphs = DecodeGraphs(device, decode_step, INPUTS, (1, 2))
    graphs.capture()
    batch = _batch(3)
    torch.testing.assert_close(graphs.run(batch), decode_step(batch), rtol=0, atol=0)
    assert graphs.eager_runs == 1 and device.replays == 0


def test_before_capture_every_step_is_eager() -> None:
    graphs = DecodeGraphs(GraphDouble(), decode_step, INPUTS, (4,))
    graphs.run(_batch(2))
    assert graphs.eager_runs == 1 and graphs.replays == 0


def test_replays_reuse_the_static_output_of_their_bucket() -> None:
    graphs = DecodeGraphs(GraphDouble(), decode_step, INPUTS, (4,))
    graphs.capture()
    first = graphs.run(_batch(4, 0))
    first_values = first.clone()
    second = graphs.run(_batch(4, 1))
    assert first.data_ptr() == second.data_ptr()  # one static output per graph
    assert not torch.equal(first_values, second)  # rewritten by the replay, not stale


@pytest.mark.parametrize(
    "inputs, message",
    [
        ({"input_ids": torch.zeros(2, dtype=torch.int64)}, "exactly"),
        ({"input_ids": torch.zeros(2, dtype=torch.int64), "positions": torch.zeros(3, dtype=torch.int64)}, "disagree"),
    ],
)
def test_inputs_that_do_not_fit_the_buffers_are_refused(inputs, message) -> None:
    graphs = DecodeGraphs(GraphDouble(), decode_step, INPUTS, (4,))
    with pytest.raises(ValueError, match=message):
        graphs.run(inputs)


def test_capture_sizes_must_be_ascending_and_positive() -> None:
    with pytest.raises(ValueError, match="ascending"):
        DecodeGraphs(GraphDouble(), decode_step, INPUTS, (4, 2))


class RefusingDouble(GraphDouble):
    """Refuses to capture the buckets of `refused` rows (their step would run something
    the device cannot record), raising `error`."""

    def __init__(self, refused: set[int], error: Exception) -> None:
        super().__init__()
        self.refused, self.error = refused, error

    def graph_capture(self, fn: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
        if fn().shape[0] in self.refused:
            raise self.error
        return super().graph_capture(fn)


def test_a_refused_bucket_runs_eagerly_and_the_others_replay() -> None:
    device = RefusingDouble({2}, RuntimeError("a host sync"))
    graphs = DecodeGraphs(device, decode_step, INPUTS, (1, 2, 4))
    graphs.capture()
    assert graphs.captured == (1, 4) and list(graphs.refused) == [2] and str(graphs.refused[2]) == "a host sync"
    assert not graphs.replays_batch(2) and graphs.replays_batch(3) and graphs.replays_batch(1)
    for rows in (1, 2, 3):
        batch = _batch(rows, rows)
        torch.testing.assert_close(graphs.run(batch), decode_step(batch), rtol=0, atol=0)
    assert graphs.eager_runs == 1 and graphs.replays == 2


def test_a_contract_error_at_capture_is_raised_not_taken_for_a_refusal() -> None:
    device = RefusingDouble({4}, ContractError("linear", "x", "fp32", "fp16"))
    with pytest.raises(ContractError):
        DecodeGraphs(device, decode_step, INPUTS, (1, 4)).capture()


def test_the_cpu_backend_refuses_a_step_with_torch_compute_which_then_runs_eagerly() -> None:
    graphs = DecodeGraphs(get_backend("cpu"), decode_step, INPUTS, (2, 4))
    graphs.capture()
    # The embedding by indexing and the position scaling are aten ops.
    assert graphs.captured == () and set(graphs.refused) == {2, 4}
    assert type(graphs.refused[2]).__name__ == "CaptureRefused"
    assert isinstance(graphs.refused[2], NotImplementedError)  # a refusal, not a failed capture
    batch = _batch(3)
    torch.testing.assert_close(graphs.run(batch), decode_step(batch), rtol=0, atol=0)
