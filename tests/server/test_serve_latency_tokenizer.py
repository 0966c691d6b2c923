"""benchmarks/serve_latency.py serves the bench model beside a tokenizer that reads the
bench client's prompt text back as the same token ids in accord and in transformers
(which vLLM and its client use): with the bench tokenizer they disagree, so the two
servers would compute prompts of different lengths."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoTokenizer

from accord.core.model_loader.source import load_tokenizer

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "serve_latency.py"


def bench_tokenizer_dir(folder: Path) -> Path:
    """A model folder with a tokenizer built as `accord bench` builds its own."""
    folder.mkdir()
    tokenizer = Tokenizer(models.WordLevel({f"<{i}>": i for i in range(64)}, unk_token="<0>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<1>", "eos_token": "<2>", "unk_token": "<0>"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    return folder


def test_the_served_tokenizer_reads_the_clients_text_alike_in_accord_and_transformers(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("serve_latency", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    bench = bench_tokenizer_dir(tmp_path / "bench")
    ids = [5, 0, 17, 2, 63]
    text = AutoTokenizer.from_pretrained(bench).decode(ids)
    # The bench tokenizer: transformers and accord read the client's text differently.
    assert AutoTokenizer.from_pretrained(bench).encode(text, add_special_tokens=False) != load_tokenizer(
        str(bench)
    ).encode(text)
    served = module.serving_model(bench)
    assert AutoTokenizer.from_pretrained(served).encode(text, add_special_tokens=False) == ids
    assert load_tokenizer(str(served)).encode(text) == ids
    assert (served / "config.json").resolve() == (bench / "config.json").resolve()
