"""Tokenising prompts without stalling the server.

A prompt of ordinary size is tokenised on a thread: `Tokenizer.tokenize` releases the
GIL while it encodes. A prompt of megabytes goes to a tokenizer process instead,
because what is left around the encoding holds the GIL for long in proportion to its
tokens: building the Python list of ids (0.26 s for 2.2 million on a loaded 2-core
Sapphire Rapids) and freeing the library's encoding (0.13 s), each of them stopping
every other request and stream. The process sends its ids back packed (uint32), so the
server holds a flat array: `len()` counts it, and a slice turns into ints only as it
is needed (none, for a prompt too long for the context).

The process imports only the tokenizers library, starts on the first large prompt,
and is stopped with the server. It is a plain spawned process on a pipe of its own,
which one server thread writes and reads, a prompt at a time, under a deadline: a
ProcessPoolExecutor once left a request waiting forever, its worker blocked writing
an 8.9 MB result that the pool's own reader thread no longer read, and that worker,
holding its pool's pipe ends, outlived the server. Here a process that dies or
overruns its deadline fails its request (the server answers 503) and the next large
prompt starts another; and since the process holds only its own end of the pipe, it sees the end of
the pipe and exits when the server goes, however the server ends.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import sys
import threading
from array import array
from collections.abc import Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING

import tokenizers

if TYPE_CHECKING:  # the tokenizer process imports this module: it must stay light
    from ..core.model_loader.tokenizer import Tokenizer

#: Characters from which a prompt is tokenised in the process: below, its ids' list
#: and its encoding's release take a few milliseconds at most.
LARGE_PROMPT_CHARS = 1 << 18
#: The ids' packed type: unsigned 32-bit, room for any vocabulary.
PACKED_ID = "I"
#: How much lower the tokenizer threads' and process's scheduling priority is than the
#: server's: a prompt of megabytes keeps a core busy for seconds, and on a host with
#: few cores the engine's step thread and the event loop, whose delays every client
#: sees, should come first.
TOKENIZER_NICENESS = 10
#: The tokenizer process's deadline for one prompt: a fixed allowance plus time at a
#: rate about a hundred times slower than the library's (10 MB in about 2 s on a 2-core
#: host), so only a stuck process overruns it.
DEADLINE_BASE_S = 60.0
DEADLINE_CHARS_PER_S = 50_000


class TokenizerProcessError(RuntimeError):
    """The tokenizer process died, or overran its deadline, before answering."""


class TokenizerProcess:
    """A spawned process holding the tokenizer, answering one prompt at a time over its
    pipe. `encode` blocks: call it from one thread at a time."""

    def __init__(self, tokenizer_json: str) -> None:
        # Spawned, not forked: the server's threads hold locks a fork would copy.
        context = multiprocessing.get_context("spawn")
        self._pipe, child_end = context.Pipe()
        self._process = context.Process(target=_serve, args=(child_end, tokenizer_json), name="accord-tokenizer",
                                        daemon=True)
        self._process.start()
        child_end.close()  # the child's end lives in the child alone: its end of the pipe is the server's end

    @property
    def pid(self) -> int | None:
        """The process's id."""
        return self._process.pid

    def encode(self, text: str, add_special_tokens: bool, deadline_s: float) -> bytes:
        """`text`'s ids packed as PACKED_ID; TokenizerProcessError (and the process
        stopped) when it dies or takes longer than `deadline_s`."""
        try:
            self._pipe.send((text, add_special_tokens))
            if not self._pipe.poll(deadline_s):
                self.stop()
                raise TokenizerProcessError(f"the tokenizer process took longer than {deadline_s:.0f} s")
            return self._pipe.recv_bytes()
        except (EOFError, OSError) as error:
            self.stop()
            raise TokenizerProcessError(f"the tokenizer process died (exit code {self._process.exitcode})") from error

    def stop(self) -> None:
        """End the process: closing the pipe ends its loop; one that does not end at
        once (in the middle of a prompt) is killed."""
        self._pipe.close()
        self._process.join(timeout=1.0)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()


class PromptTokenizer:
    """A prompt's token ids: on `threads` for ordinary prompts, in a tokenizer process
    for those of LARGE_PROMPT_CHARS or more (a list or a packed array: both sized and
    sliceable)."""

    def __init__(self, tokenizer: Tokenizer, threads: Executor, large_prompt_chars: int = LARGE_PROMPT_CHARS) -> None:
        self.tokenizer = tokenizer
        self.threads = threads
        self.large_prompt_chars = large_prompt_chars
        self._process: TokenizerProcess | None = None
        # The one thread that talks to the process: large prompts queue here, leaving
        # `threads` to the ordinary ones.
        self._process_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="accord-tokenizer-process")

    @property
    def process_id(self) -> int | None:
        """The tokenizer process's id (None before the first large prompt, or after one failed)."""
        return None if self._process is None else self._process.pid

    async def encode(self, text: str, add_special_tokens: bool = True) -> Sequence[int]:
        """`text`'s token ids (with the tokenizer's special tokens unless told not to);
        TokenizerProcessError when the tokenizer process fails on it."""
        loop = asyncio.get_running_loop()
        if len(text) < self.large_prompt_chars:
            return await loop.run_in_executor(self.threads, self._encode_here, text, add_special_tokens)
        packed = await loop.run_in_executor(self._process_thread, self._encode_in_process, text, add_special_tokens)
        ids = array(PACKED_ID)
        ids.frombytes(packed)
        return ids

    def _encode_in_process(self, text: str, add_special_tokens: bool) -> bytes:
        """On the process thread: the ids from the process, started first if there is
        none (or the last one failed)."""
        if self._process is None:
            self._process = TokenizerProcess(self.tokenizer.tokenizer.to_str())
        deadline = DEADLINE_BASE_S + len(text) / DEADLINE_CHARS_PER_S
        try:
            return self._process.encode(text, add_special_tokens, deadline)
        except TokenizerProcessError:
            self._process = None
            raise

    def _encode_here(self, text: str, add_special_tokens: bool) -> list[int]:
        return self.tokenizer.tokenize(text, add_special_tokens).ids

    def close(self) -> None:
        """Stop the tokenizer process, if one started (after the prompt it is on, if any)."""
        self._process_thread.submit(self._stop_process)
        self._process_thread.shutdown(wait=False, cancel_futures=False)

    def _stop_process(self) -> None:
        if self._process is not None:
            self._process.stop()
            self._process = None


def yield_the_cpu_to_serving() -> None:
    """Lower the calling (tokenizer pool) thread's CPU priority by TOKENIZER_NICENESS.
    Linux schedules each thread by its own niceness; elsewhere setpriority on a thread
    id could reach another process, so the thread keeps its priority there."""
    if sys.platform == "linux":
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), TOKENIZER_NICENESS)


def _serve(pipe: Connection, tokenizer_json: str) -> None:
    """The tokenizer process: load the tokenizer, then answer each (text,
    add_special_tokens) with its packed ids until the server's end of the pipe closes."""
    os.nice(TOKENIZER_NICENESS)
    tokenizer = tokenizers.Tokenizer.from_str(tokenizer_json)
    while True:
        try:
            text, add_special_tokens = pipe.recv()
        except (EOFError, OSError):
            return  # the server has gone, or stopped this process
        # The batch call, as Tokenizer.tokenize makes it: the same ids, without offsets.
        encoding = tokenizer.encode_batch_fast([text], add_special_tokens=add_special_tokens)[0]
        try:
            pipe.send_bytes(array(PACKED_ID, encoding.ids).tobytes())
        except OSError:
            return
