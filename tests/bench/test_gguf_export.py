"""The benchmarks' GGUF export (accord/bench/gguf_export.py), read back by transformers'
own GGUF loader (gguf-py's reader and de-permutation, independent of the writer): the
logits equal the Hugging Face checkpoint's, for the bench model (bf16, word-level
tokenizer) and the demo model (f32, byte-level BPE, whose tokens decode the same)."""

from __future__ import annotations

import functools
from pathlib import Path

import gguf
import pytest
import torch
import transformers

from accord.bench.gguf_export import export_gguf
from accord.bench.offline.model import build_model
from accord.demo.model import DemoModelShape, write_demo_model

TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=128, vocab_size=256, max_position_embeddings=256)  # fmt: skip
IDS = [[1, 17, 99, 3, 250, 42, 7, 8]]


def logits(model_dir: Path, gguf_file: str | None = None) -> torch.Tensor:
    folder = model_dir if gguf_file is None else model_dir.parent
    with pytest.MonkeyPatch.context() as patch:
        # transformers builds gguf-py's read-only name map again per submodule: once is enough.
        patch.setattr(gguf, "get_tensor_name_map", functools.cache(gguf.get_tensor_name_map))
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf_file, dtype=torch.float32)
    with torch.no_grad():
        return model.eval()(torch.tensor(IDS)).logits


def test_the_bench_model_in_bf16_gives_the_checkpoints_logits(tmp_path: Path) -> None:
    model_dir = build_model(tmp_path / "bench", TINY)
    path = export_gguf(model_dir, tmp_path / "bench.bf16.gguf", "bf16")
    # bf16 weights read back exactly: only the q/k row order could differ, and would show.
    torch.testing.assert_close(logits(path, path.name), logits(model_dir), rtol=1e-5, atol=1e-5)


def test_the_demo_model_in_f32_gives_the_checkpoints_logits_and_tokens(tmp_path: Path) -> None:
    model_dir = tmp_path / "demo"
    model_dir.mkdir()
    write_demo_model(model_dir, DemoModelShape(hidden_size=64, intermediate_size=128, num_hidden_layers=2))
    path = export_gguf(model_dir, tmp_path / "demo.f32.gguf", "f32")
    torch.testing.assert_close(logits(path, path.name), logits(model_dir), rtol=1e-5, atol=1e-5)
    ours = transformers.AutoTokenizer.from_pretrained(model_dir)
    theirs = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    text = "The scheduler builds each step under a token budget."
    ids = ours.encode(text, add_special_tokens=False)
    assert theirs.decode(ids) == ours.decode(ids) == text


def test_a_model_that_is_no_llama_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "mixtral"}')
    with pytest.raises(ValueError, match="Llama models only, this one is 'mixtral'"):
        export_gguf(tmp_path, tmp_path / "out.gguf")
