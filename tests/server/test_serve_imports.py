"""What `accord serve` imports before it listens: the CLI parser (every subcommand's)
and the serve launcher, in a fresh interpreter. The conformance suite, the rollout gate
and the gguf package are not part of serving a Hugging Face directory on the CPU, and
each cost start-up time (about 0.3 s and 0.16 s on a 2-core host); GPU runtimes and
transformers never load on the cpu path."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

#: Module name prefixes serving a Hugging Face directory on the CPU must not import.
NOT_FOR_SERVING = ("accord.conformance", "accord.gate", "gguf", "yaml", "triton", "transformers", "ray")


@pytest.mark.slow
def test_the_serve_path_imports_no_suite_gate_gguf_or_gpu_runtime() -> None:
    script = (
        "import json, sys\n"
        "from accord.cli.main import build_parser\n"
        "build_parser()\n"
        "from accord.cli import launcher\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    loaded = json.loads(done.stdout.splitlines()[-1])
    assert "accord.server.app" in loaded and "accord.core.engine.llm_engine" in loaded  # the serving stack itself did load
    unwanted = [name for name in loaded if any(name == p or name.startswith(p + ".") for p in NOT_FOR_SERVING)]
    assert unwanted == []


@pytest.mark.slow
def test_a_gguf_model_still_loads_its_reader_on_use() -> None:
    script = (
        "import json, sys\n"
        "from accord.core.model_loader import gguf\n"
        "before = 'gguf' in sys.modules\n"
        "gguf.open_gguf_model, gguf.SUPPORTED_TYPES, gguf.GgufError\n"
        "print(json.dumps([before, 'gguf' in sys.modules, gguf.is_gguf('m/x.GGUF'), gguf.is_gguf('m/dir')]))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert json.loads(done.stdout.splitlines()[-1]) == [False, True, True, False]
