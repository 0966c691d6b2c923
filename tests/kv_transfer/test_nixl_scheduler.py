"""NixlConnector's scheduler half and its kv_transfer_params, without NIXL: what the
prefill side hands on and keeps, when it lets go, and what the decode side loads."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from accord.core.kv_transfer.base import ScheduledChunk, TransferRequest
from accord.core.kv_transfer.config import KVTransferConfig
from accord.core.kv_transfer.nixl import NixlLoad, NixlScheduler
from accord.core.kv_transfer.nixl_layout import NixlKVLayout, RemoteKV, RemoteTensor

LAYOUT = NixlKVLayout("prefill-rank0", "127.0.0.1", 1, 16, "torch.bfloat16",
                      (RemoteTensor(4096, (2, 8)), RemoteTensor(8192, (2, 8))))
PROMPT = list(range(40))  # three blocks of 16


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _scheduler(role: str, clock: Clock | None = None) -> NixlScheduler:
    config = KVTransferConfig.parse({"kv_connector": "NixlConnector", "kv_role": role,
                                     "kv_connector_extra_config": {"abort_timeout_s": 30}})
    scheduler = NixlScheduler(config, 16, 1024, clock=clock or Clock())
    scheduler.set_worker_metadata([LAYOUT])
    return scheduler


def _prefill(scheduler: NixlScheduler, req_id: str, params: dict | None, finish_reason: str = "length") -> dict | None:
    """Run `req_id`'s whole prompt in one step, then finish it for `finish_reason`."""
    request = TransferRequest(req_id, PROMPT, params)
    scheduler.build_connector_meta([ScheduledChunk(request, (7, 3, 9, 11), 0, len(PROMPT))])
    return scheduler.request_finished(TransferRequest(req_id, PROMPT, params, finish_reason=finish_reason))


def test_a_prefilled_request_hands_on_its_prompt_blocks_and_keeps_them_until_read() -> None:
    scheduler = _scheduler("kv_producer")
    params = _prefill(scheduler, "r", {"do_remote_decode": True})
    assert params["do_remote_prefill"] is True and params["do_remote_decode"] is False
    # ceil(40 / 16) = 3 blocks hold the prompt; the fourth was allocated past it.
    assert params["remote_block_ids"] == [7, 3, 9]
    assert (params["remote_engine_id"], params["remote_port"], params["remote_num_tokens"]) == ("prefill-rank0", 1, 40)
    assert params["remote_kv_layout"]["tensors"] == [[4096, [2, 8]], [8192, [2, 8]]]
    assert scheduler.keeps_blocks("r")
    assert scheduler.blocks_to_free(set()) == set()
    assert scheduler.blocks_to_free({"r", "unknown"}) == {"r"}
    assert not scheduler.keeps_blocks("r")


def test_a_request_not_sent_for_remote_decode_hands_nothing_on() -> None:
    scheduler = _scheduler("kv_producer")
    assert _prefill(scheduler, "r", None) is None
    assert not scheduler.keeps_blocks("r")


@pytest.mark.parametrize("reason", ["abort", "error"])
def test_an_aborted_or_failed_prefill_hands_nothing_on_and_keeps_no_block(reason: str) -> None:
    scheduler = _scheduler("kv_producer")
    assert _prefill(scheduler, "r", {"do_remote_decode": True}, reason) is None
    assert not scheduler.keeps_blocks("r")


def test_kept_blocks_no_reader_asks_for_are_freed_after_the_timeout() -> None:
    clock = Clock()
    scheduler = _scheduler("kv_both", clock)
    _prefill(scheduler, "r", {"do_remote_decode": True})
    clock.now = 29.0
    assert scheduler.blocks_to_free(set()) == set()
    clock.now = 30.0
    assert scheduler.blocks_to_free(set()) == {"r"}
    assert not scheduler.keeps_blocks("r")


def test_params_round_trip_and_garbled_ones_are_refused() -> None:
    remote = RemoteKV(LAYOUT, (7, 3, 9), "r", 40)
    assert RemoteKV.from_params(remote.to_params()) == remote
    with pytest.raises(ValueError, match="remote_kv_layout"):
        RemoteKV.from_params({k: v for k, v in remote.to_params().items() if k != "remote_kv_layout"})
    with pytest.raises(ValueError, match="do not fit"):
        RemoteKV.from_params({**remote.to_params(), "remote_num_tokens": 49})
    assert LAYOUT.bytes_per_block(LAYOUT.tensors[0]) == 16 * 2 * 8 * 2


def _listening_port() -> tuple[socket.socket, int]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    return listener, listener.getsockname()[1]


@pytest.fixture
def listening_params() -> Iterator[dict]:
    """kv_transfer_params naming prefill request p-1's blocks (7, 3, 9) on an instance
    whose listener answers (for the test's length)."""
    listener, port = _listening_port()
    with listener:
        layout = NixlKVLayout("prefill-rank0", "127.0.0.1", port, 16, "torch.bfloat16", LAYOUT.tensors)
        yield RemoteKV(layout, (7, 3, 9), "p-1", 40).to_params()


def test_the_decode_side_loads_all_prompt_tokens_but_the_last_from_a_listening_prefill(listening_params: dict) -> None:
    scheduler = _scheduler("kv_consumer")
    request = TransferRequest("d-1", PROMPT, listening_params)
    assert scheduler.get_num_new_matched_tokens(request, 16) == (39 - 16, False)  # read in the step
    scheduler.update_state_after_alloc(request, (1, 2, 4), 16, 23)
    (load,) = scheduler.build_connector_meta([]).loads
    assert isinstance(load, NixlLoad)
    assert (load.req_id, load.block_ids, load.start, load.end) == ("d-1", (1, 2, 4), 16, 39)
    assert load.remote.request_id == "p-1" and load.remote.block_ids == (7, 3, 9)


def test_the_decode_side_computes_the_prompt_when_the_prefill_listener_is_gone_or_the_prompt_differs() -> None:
    listener, port = _listening_port()
    listener.close()  # nothing listens there now
    layout = NixlKVLayout("prefill-rank0", "127.0.0.1", port, 16, "torch.bfloat16", LAYOUT.tensors)
    scheduler = _scheduler("kv_consumer")
    gone = RemoteKV(layout, (7, 3, 9), "p-1", 40).to_params()
    assert scheduler.get_num_new_matched_tokens(TransferRequest("d-1", PROMPT, gone), 0) == (0, False)
    other_prompt = RemoteKV(LAYOUT, (7, 3), "p-2", 20).to_params()
    assert scheduler.get_num_new_matched_tokens(TransferRequest("d-2", PROMPT, other_prompt), 0) == (0, False)


def test_a_decode_request_that_ends_unread_queues_the_release_of_its_remote_blocks() -> None:
    remote = RemoteKV(LAYOUT, (7, 3, 9), "p-1", 40)
    scheduler = _scheduler("kv_consumer")
    assert not scheduler.has_pending_metadata()
    # Aborted while it waited: never allocated, so never read.
    scheduler.request_finished(TransferRequest("d-1", PROMPT, remote.to_params(), finish_reason="abort"))
    assert scheduler.has_pending_metadata()
    metadata = scheduler.build_connector_meta([])
    assert metadata and metadata.releases == [remote] and not metadata.loads
    assert not scheduler.has_pending_metadata()
    assert not scheduler.build_connector_meta([]).releases


def test_a_read_request_releases_nothing_and_is_not_read_again_after_a_preemption(listening_params: dict) -> None:
    scheduler = _scheduler("kv_consumer")
    request = TransferRequest("d-1", PROMPT, listening_params)
    assert scheduler.get_num_new_matched_tokens(request, 0) == (39, False)
    scheduler.update_state_after_alloc(request, (1, 2, 4), 0, 39)
    assert len(scheduler.build_connector_meta([]).loads) == 1
    # Readmitted after a preemption: the prefill side freed the blocks after the read.
    assert scheduler.get_num_new_matched_tokens(request, 0) == (0, False)
    scheduler.request_finished(TransferRequest("d-1", PROMPT, listening_params, finish_reason="abort"))
    assert not scheduler.has_pending_metadata()
    assert not scheduler.build_connector_meta([])


def test_the_prefill_side_queues_no_release() -> None:
    scheduler = _scheduler("kv_producer")
    _prefill(scheduler, "r", {"do_remote_decode": True}, "abort")
    assert not scheduler.has_pending_metadata()
