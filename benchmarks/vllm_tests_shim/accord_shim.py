"""A pytest plugin that runs vLLM's own OpenAI entrypoint tests against `accord serve`.

vLLM's tests start their server through `tests.utils.RemoteOpenAIServer`, which runs
`vllm serve MODEL FLAGS`. This plugin makes it run `accord serve` with the same flags
instead, serving accord's offline demo model (random weights, accord's demo tokenizer, its context raised to 32k)
under the test's model name, and skips the Hugging Face download vLLM's helper does
first. Tests that load the model's tokenizer themselves get the demo tokenizer, so an
expected token count or text is the demo model's, not the real model's (README.md in
this folder says how to run it and docs/vllm_compat.md what it found).

Load it with `-p accord_shim` and this folder on PYTHONPATH; ACCORD_REPO names the
accord checkout to serve from (default: this file's repository).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import sys
from pathlib import Path

import pytest

ACCORD_REPO = Path(os.environ.get("ACCORD_REPO", Path(__file__).resolve().parents[2]))
#: The python that runs accord (not vLLM's virtual environment).
ACCORD_PYTHON = os.environ.get("ACCORD_PYTHON", "python3")


#: The context the tests' models have (Qwen2/2.5 and Llama-3.2: 32k), which their
#: --max-model-len values (up to 8192 here) assume.
CONTEXT = 32768


def demo_model_dir() -> str:
    """accord's demo model, copied with the tests' models' context length (its rotary
    embedding takes any position; the demo model itself declares 2048)."""
    script = "from accord.demo.model import demo_model_dir; print(demo_model_dir())"
    out = subprocess.run([ACCORD_PYTHON, "-c", script], check=True, capture_output=True, text=True,
                         cwd=ACCORD_REPO, env={**os.environ, "PYTHONPATH": str(ACCORD_REPO)})
    source = Path(out.stdout.strip().splitlines()[-1])
    copy = Path(tempfile.gettempdir()) / f"accord-shim-{source.name}"
    if not copy.exists():
        shutil.copytree(source, copy)
        config = json.loads((copy / "config.json").read_text())
        config["max_position_embeddings"] = CONTEXT
        (copy / "config.json").write_text(json.dumps(config))
    return str(copy)


def accord_command(model: str, flags: list[str], demo: str) -> list[str]:
    """`vllm serve model flags` as an `accord serve` command serving the demo model as `model`."""
    named = "--served-model-name" in flags
    return [ACCORD_PYTHON, "-m", "accord", "serve", "--model", demo,
            *([] if named else ["--served-model-name", model]), *flags]


def pytest_configure(config: pytest.Config) -> None:
    """Patch vLLM's test server helper and tokenizer loader before any test module imports them."""
    demo = demo_model_dir()
    from tests import utils

    def start_server(self, model: str, vllm_serve_args: list[str], env_dict: dict[str, str] | None) -> None:
        env = {**os.environ, **(env_dict or {}), "PYTHONPATH": str(ACCORD_REPO)}
        command = accord_command(model, vllm_serve_args, demo)
        print("accord shim:", " ".join(command), file=sys.stderr)
        # A session of its own, as vLLM's helper starts it: its teardown kills the server's
        # process group, which would otherwise be pytest's.
        self.proc = subprocess.Popen(command, env=env, cwd=ACCORD_REPO, stdout=sys.stdout, stderr=sys.stderr,
                                     start_new_session=True)

    utils.RemoteOpenAIServer._start_server = start_server
    utils.RemoteVLLMServer._pre_download_model = lambda self, model, args: None

    import vllm.tokenizers

    original = vllm.tokenizers.get_tokenizer

    def demo_tokenizer(tokenizer_name, *args, **kwargs):
        # Every model name is the demo model here: its tokenizer is the one served.
        return original(demo, *args, **kwargs)

    vllm.tokenizers.get_tokenizer = demo_tokenizer


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Append each test's outcome, with the last line of its failure, to $SHIM_REPORT
    as it happens (a file killed by a timeout keeps what it had)."""
    path = os.environ.get("SHIM_REPORT")
    if not path or not (report.when == "call" or report.outcome != "passed"):
        return
    reason = ""
    if report.outcome != "passed":
        lines = [line for line in str(report.longrepr).splitlines() if line.strip()]
        errors = [line for line in lines if line.startswith("E ")]
        reason = (errors or lines or [""])[-1].strip()[:300]
    with open(path, "a") as out:
        out.write(f"{report.nodeid}\t{report.when}\t{report.outcome}\t{reason}\n")
