"""Whether tokenising a long prompt stops the rest of the process: the longest pause a
ticking thread sees (it sleeps 5 ms and wakes) while another thread runs each
tokenizers call on a prompt of --megabytes, and how long each call takes. A pause as
long as the call means the call holds the GIL throughout; a few milliseconds, that it
releases it. Also the pause of building the ids' Python list (`.ids`), and, as the
baseline, the pauses of a busy host when the other thread only sleeps.

    PYTHONPATH=. python benchmarks/tokenizer_gil.py [--model DIR] [--megabytes 10]

The model defaults to the demo model's tokenizer (byte-level BPE, generated locally).
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Callable
from typing import Any


def longest_pause(call: Callable[[], Any]) -> tuple[float, float]:
    """(seconds `call` took in a thread, the longest pause of a 5 ms ticker meanwhile)."""
    worker = threading.Thread(target=call)
    longest, started = 0.0, time.perf_counter()
    last = started
    worker.start()
    while worker.is_alive():
        time.sleep(0.005)
        now = time.perf_counter()
        longest, last = max(longest, now - last), now
    return last - started, longest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a model directory or GGUF file (default: the demo model)")
    parser.add_argument("--megabytes", type=float, default=10.0)
    args = parser.parse_args()
    from accord.core.model_loader.source import load_tokenizer
    from accord.demo.model import demo_model_dir

    tokenizer = load_tokenizer(args.model or demo_model_dir())
    library = tokenizer.tokenizer
    text = ("The quick brown fox jumps over the lazy dog. " * (1 + int(args.megabytes * 1e6) // 45))[
        : int(args.megabytes * 1e6)
    ]
    encoding = tokenizer.tokenize(text)
    ids = encoding.ids
    print(f"{len(text) / 1e6:.1f} MB prompt, {len(ids)} tokens")
    calls = {
        "nothing for 2 s (the host's own pauses)": lambda: time.sleep(2),
        "tokenizers encode": lambda: library.encode(text),
        "tokenizers encode_batch_fast (Tokenizer.tokenize)": lambda: tokenizer.tokenize(text),
        "Encoding.ids (the Python list)": lambda: encoding.ids,
        "tokenizers decode": lambda: library.decode(ids),
        "tokenizers decode_batch (Tokenizer.decode)": lambda: tokenizer.decode(ids),
    }
    for name, call in calls.items():
        took, pause = longest_pause(call)
        print(f"{name:52s} {took:7.2f} s   longest pause {pause * 1e3:7.0f} ms")


if __name__ == "__main__":
    main()
