"""Prefill/decode disaggregation over NixlConnector between two processes on one host,
NIXL's UCX backend over loopback TCP: the prefill process computes each prompt and
keeps its blocks, the decode process (this one) reads them and computes only the last
prompt token. The reference is an engine of this process with no connector."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from accord import LLM
from accord.core.sampling_params import SamplingParams

pytest.importorskip("nixl_cu12", reason="NixlConnector needs NIXL: pip install --no-deps nixl-cu12")

from nixl_prefill_process import serve_prefill  # noqa: E402 (this directory is on sys.path)
from pipe_process import PipeProcess  # noqa: E402

ENGINE_ARGS = dict(backend="cpu", max_model_len=256, num_gpu_blocks_override=48, max_num_batched_tokens=256,
                   block_size=16)
PROMPTS = [
    "The history of the harbour town begins with a fishing village on the north shore",
    "Write a list of colours: red, green, blue, yellow, purple, orange, brown, black, white",
]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _connector(role: str, port: int) -> dict:
    # A timeout far past the test's length: only the decode side's notification frees blocks.
    return {"kv_connector": "NixlConnector", "kv_role": role, "kv_ip": "127.0.0.1", "kv_port": port,
            "kv_connector_extra_config": {"abort_timeout_s": 600, "transfer_timeout_s": 10}}


def _greedy(max_tokens: int, kv_transfer_params: dict | None = None) -> SamplingParams:
    extra = None if kv_transfer_params is None else {"kv_transfer_params": kv_transfer_params}
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, extra_args=extra)


def _free_blocks(llm: LLM) -> int:
    return llm.llm_engine.scheduler.block_manager.num_free_blocks


class PrefillProcess(PipeProcess):
    """The prefill instance in its own process, driven over a pipe."""

    def __init__(self, model_dir: str, engine_args: dict) -> None:
        super().__init__(serve_prefill, model_dir, engine_args, _connector("kv_producer", _free_port()))
        self.start_free_blocks: int = self.ready


@pytest.fixture
def prefill_args() -> dict:
    """The prefill process's engine settings (a test overrides it for another KV spec)."""
    return ENGINE_ARGS


@pytest.fixture
def prefill(llama_dir: Path, prefill_args: dict, monkeypatch: pytest.MonkeyPatch) -> Iterator[PrefillProcess]:
    # UCX over loopback TCP in both processes (the spawned one inherits the environment).
    monkeypatch.setenv("UCX_TLS", "tcp")
    monkeypatch.setenv("UCX_NET_DEVICES", "lo")
    process = PrefillProcess(str(llama_dir), prefill_args)
    yield process
    process.stop()


def test_a_decode_process_reads_the_prefill_processes_kv_over_nixl_with_the_same_greedy_text(
    prefill: PrefillProcess, llama_dir: Path
) -> None:
    decode = LLM(str(llama_dir), kv_transfer_config=_connector("kv_consumer", _free_port()), **ENGINE_ARGS)
    expected = [out.outputs[0].token_ids for out in LLM(str(llama_dir), **ENGINE_ARGS).generate(PROMPTS, _greedy(12))]
    decode_start = _free_blocks(decode)

    params = prefill.call("prefill", PROMPTS)
    assert all(p is not None and p["do_remote_prefill"] for p in params)
    # Each request's prompt blocks stay allocated until the decode side has read them.
    kept = sum(len(p["remote_block_ids"]) for p in params)
    assert kept == sum(-(-p["remote_num_tokens"] // 16) for p in params) > 0
    assert prefill.call("free_blocks") == prefill.start_free_blocks - kept

    before = decode.llm_engine.stats.computed_prompt_tokens
    decoded = [decode.generate([prompt], _greedy(12, p))[0] for prompt, p in zip(PROMPTS, params)]
    assert [out.outputs[0].token_ids for out in decoded] == expected
    # Only the last prompt token of each request computed here; the rest was read.
    assert decode.llm_engine.stats.computed_prompt_tokens - before == len(PROMPTS)
    assert _free_blocks(decode) == decode_start
    # The notifications reach the prefill process, which frees the kept blocks.
    deadline = time.monotonic() + 20
    while prefill.call("free_blocks") != prefill.start_free_blocks and time.monotonic() < deadline:
        time.sleep(0.05)
    assert prefill.call("free_blocks") == prefill.start_free_blocks


def test_a_decode_process_computes_the_prompt_itself_when_the_prefill_process_is_gone(
    prefill: PrefillProcess, llama_dir: Path
) -> None:
    decode = LLM(str(llama_dir), kv_transfer_config=_connector("kv_consumer", _free_port()), **ENGINE_ARGS)
    expected = LLM(str(llama_dir), **ENGINE_ARGS).generate(PROMPTS[:1], _greedy(6))[0].outputs[0].token_ids
    decode_start = _free_blocks(decode)
    params = prefill.call("prefill", PROMPTS[:1])[0]
    prefill.stop()

    before = decode.llm_engine.stats.computed_prompt_tokens
    out = decode.generate(PROMPTS[:1], _greedy(6, params))[0]
    assert out.outputs[0].token_ids == expected
    assert decode.llm_engine.stats.computed_prompt_tokens - before == len(out.prompt_token_ids)
    assert _free_blocks(decode) == decode_start


@pytest.mark.slow
@pytest.mark.parametrize("prefill_args", [{**ENGINE_ARGS, "dtype": "bfloat16"}])
def test_a_decode_process_of_another_kv_spec_continues_through_kv_convert_with_its_own_greedy_text(
    prefill: PrefillProcess, llama_dir: Path
) -> None:
    # The prefill side: cpu, bf16 cache, blocks of 16; this side: reference, fp32, blocks of 8.
    decode_args = {**ENGINE_ARGS, "backend": "reference", "block_size": 8}
    decode = LLM(str(llama_dir), kv_transfer_config=_connector("kv_consumer", _free_port()), **decode_args)
    expected = [out.outputs[0].token_ids for out in LLM(str(llama_dir), **decode_args).generate(PROMPTS, _greedy(12))]
    params = prefill.call("prefill", PROMPTS)
    assert all(p["remote_kv_layout"]["dtype"] == "torch.bfloat16" for p in params)
    before = decode.llm_engine.stats.computed_prompt_tokens
    decoded = [decode.generate([prompt], _greedy(12, p))[0] for prompt, p in zip(PROMPTS, params)]
    assert [out.outputs[0].token_ids for out in decoded] == expected
    assert decode.llm_engine.stats.computed_prompt_tokens - before == len(PROMPTS)


def test_a_decode_request_aborted_before_its_read_frees_the_prefill_processes_blocks_before_the_timeout(
    prefill: PrefillProcess, llama_dir: Path
) -> None:
    decode = LLM(str(llama_dir), kv_transfer_config=_connector("kv_consumer", _free_port()), **ENGINE_ARGS)
    engine = decode.llm_engine
    params = prefill.call("prefill", PROMPTS[:1])[0]
    assert prefill.call("free_blocks") == prefill.start_free_blocks - len(params["remote_block_ids"])

    before = engine.stats.computed_prompt_tokens
    engine.add_request("d-aborted", PROMPTS[0], _greedy(12, params))
    engine.abort_request("d-aborted")  # no step ran: nothing was read
    # The server's loop steps while the engine awaits transfers (the release to send).
    assert engine.awaits_transfers()
    for _ in range(10):
        if not engine.awaits_transfers():
            break
        engine.step()
    assert not engine.awaits_transfers()
    assert engine.stats.computed_prompt_tokens == before
    # abort_timeout_s is 600: only the release notification can free the blocks in time.
    deadline = time.monotonic() + 20
    while prefill.call("free_blocks") != prefill.start_free_blocks and time.monotonic() < deadline:
        time.sleep(0.05)
    assert prefill.call("free_blocks") == prefill.start_free_blocks
