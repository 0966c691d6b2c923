"""What accord does not load is refused by name: another architecture, another tensor
type, another tokenizer model, each with a message that names it; and `accord serve`
says so in one line."""

from __future__ import annotations

import subprocess
import sys

import pytest
from gguf_files import Q, build_model, write_gguf

from accord.backends import get_backend
from accord.core.model_loader.gguf import GgufError
from accord.core.model_loader.load import load_model
from accord.core.model_loader.source import load_tokenizer
from accord.op_contracts import OpDispatcher


@pytest.fixture(scope="module")
def llama():
    return build_model("llama")


def load(path):
    return load_model(path, OpDispatcher(get_backend("reference")), dtype="float32")


def test_an_unsupported_architecture_is_refused_by_name(llama, tmp_path) -> None:
    path = write_gguf(tmp_path / "gemma.gguf", llama, "llama", architecture="gemma2")
    with pytest.raises(GgufError, match=r"architecture 'gemma2' is not supported; supported: \['llama', 'qwen2', 'qwen3'\]"):
        load(path)


def test_an_unsupported_tensor_type_is_refused_by_name(llama, tmp_path) -> None:
    # TQ2_0 (BitNet's ternary type) is no llama-quantize preset's, and gguf-py can write it.
    path = write_gguf(tmp_path / "tq2.gguf", llama, "llama", Q.TQ2_0)
    with pytest.raises(GgufError, match=r"tensor token_embd.weight is stored as TQ2_0.*supported: F32, F16, BF16, Q8_0"):
        load(path)


def test_an_unsupported_tokenizer_model_is_refused_by_name(llama, tmp_path) -> None:
    path = write_gguf(tmp_path / "spm.gguf", llama, "llama", tokenizer_model="bert")
    with pytest.raises(GgufError, match=r"tokenizer model 'bert' is not supported"):
        load_tokenizer(path)


def test_an_unknown_pre_tokenizer_is_refused_by_name(llama, tmp_path) -> None:
    path = write_gguf(tmp_path / "pre.gguf", llama, "llama", pre="made-up")
    with pytest.raises(GgufError, match=r"pre-tokenizer 'made-up' is not supported"):
        load_tokenizer(path)


def test_a_file_that_is_not_gguf_is_refused(tmp_path) -> None:
    path = tmp_path / "fake.gguf"
    path.write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(GgufError, match="not a readable GGUF file"):
        load(path)


@pytest.mark.slow
def test_serve_reports_an_unsupported_file_in_one_line(llama, tmp_path) -> None:
    path = write_gguf(tmp_path / "gemma.gguf", llama, "llama", architecture="gemma2")
    result = subprocess.run(
        [sys.executable, "-m", "accord", "serve", "--model", str(path), "--backend", "reference"],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 1
    assert result.stderr.startswith("accord serve: error:") and "'gemma2' is not supported" in result.stderr
    assert "Traceback" not in result.stderr
