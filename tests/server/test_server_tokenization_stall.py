"""A 10 MB prompt is tokenised off the event loop and off the GIL: while the server
tokenises it (its tokenizing gauge says so), /health still answers within 100 ms and
the streams already running keep their gaps under 200 ms (issue 26's acceptance
bounds), on completions, chat and /tokenize alike. The GIL-free calls give what the
library's plain `encode` and `decode` give, on a thread and in the tokenizer process
(which stops with the server, and ends when the server is killed), and /tokenize writes
long lists whole. A tokenizer process that dies or stops answering fails its prompt
and the next prompt gets a new one."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import tokenizers
from server_harness import ENGINE_FLAGS, ServerProcess, scrape_metrics

from accord.core.model_loader.source import load_tokenizer
from accord.server import prompt_tokenizer
from accord.server.prompt_tokenizer import LARGE_PROMPT_CHARS, PromptTokenizer, TokenizerProcessError
from accord.server.token_list_response import PIECE_LENGTH

#: Byte-level BPE across scripts, emoji, whitespace runs and the demo vocabulary's specials.
MIXED_TEXT = "Hello, wörld! 東京 🙂\n\n  tabs\tand <s> spaces   " * 50


@pytest.mark.parametrize("add_special_tokens", [True, False])
def test_tokenize_gives_the_ids_of_the_librarys_plain_encode(demo_model, add_special_tokens: bool) -> None:
    reference = tokenizers.Tokenizer.from_file(str(demo_model / "tokenizer.json"))
    tokens = load_tokenizer(demo_model).tokenize(MIXED_TEXT, add_special_tokens=add_special_tokens)
    expected = reference.encode(MIXED_TEXT, add_special_tokens=add_special_tokens).ids
    assert len(tokens) == len(expected) and tokens.ids == expected


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_decode_gives_the_text_of_the_librarys_plain_decode(demo_model, skip_special_tokens: bool) -> None:
    reference = tokenizers.Tokenizer.from_file(str(demo_model / "tokenizer.json"))
    ids = reference.encode(MIXED_TEXT).ids
    expected = reference.decode(ids, skip_special_tokens=skip_special_tokens)
    assert load_tokenizer(demo_model).decode(ids, skip_special_tokens=skip_special_tokens) == expected


@pytest.mark.parametrize("large_prompt_chars", [len(MIXED_TEXT) + 1, len(MIXED_TEXT)], ids=["thread", "process"])
def test_prompts_get_the_librarys_ids_on_a_thread_and_in_the_tokenizer_process(
    demo_model, large_prompt_chars: int
) -> None:
    reference = tokenizers.Tokenizer.from_file(str(demo_model / "tokenizer.json"))

    async def encode_both_ways() -> list[list[int]]:
        with ThreadPoolExecutor(1) as threads:
            prompts = PromptTokenizer(load_tokenizer(demo_model), threads, large_prompt_chars)
            try:
                return [list(await prompts.encode(MIXED_TEXT, special)) for special in (True, False)]
            finally:
                prompts.close()

    expected = [reference.encode(MIXED_TEXT, add_special_tokens=special).ids for special in (True, False)]
    assert asyncio.run(encode_both_ways()) == expected


def test_tokenize_of_a_prompt_longer_than_a_piece_returns_every_id_in_order(http: httpx.Client, demo_model) -> None:
    reference = tokenizers.Tokenizer.from_file(str(demo_model / "tokenizer.json"))
    text = MIXED_TEXT * (LARGE_PROMPT_CHARS // len(MIXED_TEXT) + 1)  # tokenised in the process: its ids come packed
    expected = reference.encode(text).ids
    assert len(expected) > 2 * PIECE_LENGTH  # several pieces, the last one partial
    body = http.post("/tokenize", json={"prompt": text}).json()
    assert body["tokens"] == expected and body["count"] == len(expected)


async def _encode_after(prompts: PromptTokenizer, harm, text: str) -> tuple[Exception | None, list[int]]:
    """Start the tokenizer process, `harm` its pid, then encode `text` twice: (what the
    first call raised, the second call's ids)."""
    await prompts.encode(text)
    harm(prompts.process_id)
    try:
        await prompts.encode(text)
        failure = None
    except TokenizerProcessError as error:
        failure = error
    return failure, list(await prompts.encode(text))


@pytest.mark.parametrize("harm", ["killed", "stopped"])
def test_a_tokenizer_process_that_dies_or_hangs_fails_its_prompt_and_the_next_starts_another(
    demo_model, monkeypatch: pytest.MonkeyPatch, harm: str
) -> None:
    # A stopped process never answers: its prompt's deadline is made short, and it ends there.
    monkeypatch.setattr(prompt_tokenizer, "DEADLINE_BASE_S", 0.5)
    reference = tokenizers.Tokenizer.from_file(str(demo_model / "tokenizer.json"))
    harmed: list[int] = []

    def hurt(pid: int) -> None:
        harmed.append(pid)
        os.kill(pid, signal.SIGKILL if harm == "killed" else signal.SIGSTOP)

    async def run() -> tuple[Exception | None, list[int], int | None]:
        with ThreadPoolExecutor(1) as threads:
            prompts = PromptTokenizer(load_tokenizer(demo_model), threads, len(MIXED_TEXT))
            try:
                failure, ids = await _encode_after(prompts, hurt, MIXED_TEXT)
                return failure, ids, prompts.process_id
            finally:
                prompts.close()

    failure, ids, replacement = asyncio.run(run())
    assert isinstance(failure, TokenizerProcessError)
    assert ("died" if harm == "killed" else "took longer than") in str(failure)
    assert ids == reference.encode(MIXED_TEXT).ids  # a new process answered the next prompt
    assert replacement is not None and replacement != harmed[0]
    wait_for(lambda: not running(harmed[0]), "the harmed tokenizer process to be gone")


def children(pid: int) -> set[int]:
    """The child processes of `pid`."""
    tasks = Path(f"/proc/{pid}/task").iterdir()
    return {int(child) for task in tasks for child in (task / "children").read_text().split()}


def running(pid: int) -> bool:
    """Whether `pid` is a live process (not gone, not a zombie)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] not in ("Z", "X")
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.parametrize("ending", ["stopped", "killed"])
def test_the_tokenizer_process_starts_for_a_large_prompt_and_ends_with_the_server(cache_dir: Path, ending: str) -> None:
    server = ServerProcess(*ENGINE_FLAGS, cache_dir=cache_dir)
    try:
        before = children(server.process.pid)
        body = {"prompt": "x " * LARGE_PROMPT_CHARS}
        assert httpx.post(f"{server.url}/tokenize", json=body, timeout=DEADLINE_S).json()["count"] >= LARGE_PROMPT_CHARS
        started = children(server.process.pid) - before  # the process (and multiprocessing's resource tracker)
        assert started
    finally:
        if ending == "killed":
            server.process.kill()  # no shutdown: nothing of the server stops the process, it must see the pipe end
        exit_code = server.stop()
    assert exit_code == (0 if ending == "stopped" else -9)
    wait_for(lambda: not any(running(pid) for pid in started), "the tokenizer process to end")


#: 10 MB of ordinary text: under the 16 MiB body limit, millions of tokens.
BIG_PROMPT = ("The quick brown fox jumps over the lazy dog. " * 250_000)[:10_000_000]
BIG_BODIES = {
    "/v1/completions": {"prompt": BIG_PROMPT, "max_tokens": 1},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": BIG_PROMPT}], "max_tokens": 1},
    "/tokenize": {"prompt": BIG_PROMPT},
}
TOKENIZING = "accord:num_prompts_tokenizing"
HEALTH_BOUND_S, STREAM_GAP_BOUND_S = 0.100, 0.200
#: Long enough for a 10 MB prompt on a slow, shared CI machine; what the test waits for
#: is the gauge, never this.
DEADLINE_S = 300


@dataclass
class Streams:
    """Streamed completions run back to back in a thread; each one's chunk arrival times."""

    http: httpx.Client
    arrivals: list[list[float]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        body = {"prompt": "A long story:", "max_tokens": 200, "ignore_eos": True, "stream": True}
        while not self.stop.is_set():
            times: list[float] = []
            self.arrivals.append(times)
            with self.http.stream("POST", "/v1/completions", json=body) as response:
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        times.append(time.monotonic())
                    if self.stop.is_set():
                        break

    def gaps_ending_in(self, start: float, end: float) -> list[float]:
        """Every gap between two chunks of one stream whose later chunk came in [start, end]."""
        return [b - a for times in self.arrivals for a, b in zip(times, times[1:]) if start <= b <= end]


def tokenizing(http: httpx.Client) -> float:
    return scrape_metrics(http).get(TOKENIZING, 0.0)


def wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


@pytest.mark.slow
@pytest.mark.alone  # it bounds the server's response times: another test's CPU use beside it would count
@pytest.mark.parametrize("route", list(BIG_BODIES))
def test_a_10mb_prompt_being_tokenised_stalls_neither_health_nor_running_streams(
    http: httpx.Client, route: str
) -> None:
    assert tokenizing(http) == 0
    streams = Streams(httpx.Client(base_url=str(http.base_url), headers=dict(http.headers), timeout=DEADLINE_S))
    stream_thread = threading.Thread(target=streams.run, daemon=True)
    stream_thread.start()
    wait_for(lambda: streams.arrivals and len(streams.arrivals[0]) >= 2, "the stream to start")

    big_response: list[httpx.Response] = []
    body = json.dumps(BIG_BODIES[route]).encode()
    big = threading.Thread(
        target=lambda: big_response.append(
            http.post(route, content=body, headers={"Content-Type": "application/json"}, timeout=DEADLINE_S)
        ),
        daemon=True,
    )
    big.start()
    wait_for(lambda: tokenizing(http) == 1, "the server to start tokenising the big prompt")
    window_start = time.monotonic()
    health_latencies = []
    while tokenizing(http) == 1:
        sent = time.monotonic()
        assert http.get("/health").status_code == 200
        health_latencies.append(time.monotonic() - sent)
        assert time.monotonic() - window_start < DEADLINE_S, "the big prompt was never tokenised"
        time.sleep(0.02)
    window_end = time.monotonic()
    big.join(DEADLINE_S)
    streams.stop.set()
    stream_thread.join(DEADLINE_S)

    assert len(health_latencies) >= 5, "the window was too short to probe: tokenising took under a tenth of a second"
    assert max(health_latencies) < HEALTH_BOUND_S, sorted(health_latencies)[-5:]
    gaps = streams.gaps_ending_in(window_start, window_end)
    assert len(gaps) >= 5, "the streams delivered (almost) nothing while the prompt was tokenised"
    assert max(gaps) < STREAM_GAP_BOUND_S, sorted(gaps)[-5:]
    # The big request itself was answered: too long for the context, or tokenised whole.
    assert big_response, f"the big request got no response {DEADLINE_S} s after its tokenising ended"
    response = big_response[0]
    if route == "/tokenize":
        assert response.status_code == 200 and response.json()["count"] > 1_000_000
    else:
        assert response.status_code == 400 and response.json()["error"]["code"] == "context_length_exceeded"
