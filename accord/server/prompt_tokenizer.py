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
and is stopped with the server.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import sys
import threading
from array import array
from collections.abc import Sequence
from concurrent.futures import Executor, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
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

#: The process's tokenizer, set up once by `_load`.
_process_tokenizer: tokenizers.Tokenizer | None = None


class PromptTokenizer:
    """A prompt's token ids: on `threads` for ordinary prompts, in a tokenizer process
    for those of LARGE_PROMPT_CHARS or more (a list or a packed array: both sized and
    sliceable)."""

    def __init__(self, tokenizer: Tokenizer, threads: Executor, large_prompt_chars: int = LARGE_PROMPT_CHARS) -> None:
        self.tokenizer = tokenizer
        self.threads = threads
        self.large_prompt_chars = large_prompt_chars
        self._process: ProcessPoolExecutor | None = None
        self._starting = asyncio.Lock()

    async def encode(self, text: str, add_special_tokens: bool = True) -> Sequence[int]:
        """`text`'s token ids (with the tokenizer's special tokens unless told not to)."""
        loop = asyncio.get_running_loop()
        if len(text) < self.large_prompt_chars:
            return await loop.run_in_executor(self.threads, self._encode_here, text, add_special_tokens)
        async with self._starting:  # concurrent first large prompts start one process
            if self._process is None:
                self._process = await loop.run_in_executor(self.threads, self._start_process)
        try:
            packed = await loop.run_in_executor(self._process, _encode_packed, text, add_special_tokens)
        except BrokenProcessPool:
            self._process = None  # it died (out of memory, say): the next large prompt starts another
            raise
        ids = array(PACKED_ID)
        ids.frombytes(packed)
        return ids

    def _start_process(self) -> ProcessPoolExecutor:
        """The tokenizer process, started and ready (on a thread: starting it takes the
        event loop's time otherwise). Spawned, not forked: the server's threads hold
        locks a fork would copy."""
        process = ProcessPoolExecutor(
            max_workers=1, mp_context=multiprocessing.get_context("spawn"),
            initializer=_load, initargs=(self.tokenizer.tokenizer.to_str(),),
        )
        process.submit(_encode_packed, "", False).result()
        return process

    def _encode_here(self, text: str, add_special_tokens: bool) -> list[int]:
        return self.tokenizer.tokenize(text, add_special_tokens).ids

    def close(self) -> None:
        """Stop the tokenizer process, if one started."""
        if self._process is not None:
            self._process.shutdown(wait=False, cancel_futures=True)


def yield_the_cpu_to_serving() -> None:
    """Lower the calling (tokenizer pool) thread's CPU priority by TOKENIZER_NICENESS.
    Linux schedules each thread by its own niceness; elsewhere setpriority on a thread
    id could reach another process, so the thread keeps its priority there."""
    if sys.platform == "linux":
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), TOKENIZER_NICENESS)


def _load(tokenizer_json: str) -> None:
    global _process_tokenizer
    os.nice(TOKENIZER_NICENESS)
    _process_tokenizer = tokenizers.Tokenizer.from_str(tokenizer_json)


def _encode_packed(text: str, add_special_tokens: bool) -> bytes:
    assert _process_tokenizer is not None, "the tokenizer process was started without its tokenizer"
    # The batch call, as Tokenizer.tokenize makes it: the same ids, without offsets.
    encoding = _process_tokenizer.encode_batch_fast([text], add_special_tokens=add_special_tokens)[0]
    return array(PACKED_ID, encoding.ids).tobytes()
