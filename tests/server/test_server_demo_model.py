"""The embedded demo model: a deterministic, Hugging Face-format Llama directory with
random weights, cached atomically."""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path

import pytest
from safetensors import safe_open
from tokenizers import Tokenizer

from accord.demo import model as demo_model
from accord.demo.model import DemoModelShape, write_demo_model


def digests(directory: Path) -> dict[str, str]:
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in sorted(directory.iterdir())}


def test_two_builds_are_byte_identical(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    for directory in (first, second):
        directory.mkdir()
        write_demo_model(directory)
    assert digests(first) == digests(second)


def test_weights_carry_hugging_face_llama_tensor_names(demo_model: Path) -> None:
    layers = DemoModelShape().num_hidden_layers
    per_layer = (
        "input_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
        "post_attention_layernorm", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
    )
    expected = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"} | {
        f"model.layers.{i}.{name}.weight" for i in range(layers) for name in per_layer
    }
    with safe_open(demo_model / "model.safetensors", framework="pt") as weights:
        assert set(weights.keys()) == expected


def test_config_describes_a_llama_whose_vocabulary_matches_the_tokenizer(demo_model: Path) -> None:
    config = json.loads((demo_model / "config.json").read_text())
    tokenizer = Tokenizer.from_file(str(demo_model / "tokenizer.json"))
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["vocab_size"] == tokenizer.get_vocab_size()
    assert config["eos_token_id"] == tokenizer.token_to_id("<|eot_id|>")


def test_model_card_says_the_weights_are_random(demo_model: Path) -> None:
    assert "random weights" in (demo_model / "README.md").read_text()


def test_tokenizer_round_trips_unicode_text(demo_model: Path) -> None:
    tokenizer = Tokenizer.from_file(str(demo_model / "tokenizer.json"))
    text = "Hello, world! Grüße, 世界 🙂"
    encoding = tokenizer.encode(text)
    assert encoding.tokens[0] == "<|begin_of_text|>"
    assert tokenizer.decode(encoding.ids, skip_special_tokens=True) == text


def test_chat_template_renders_a_generation_prompt(demo_model: Path) -> None:
    from jinja2 import Template

    config = json.loads((demo_model / "tokenizer_config.json").read_text())
    rendered = Template(config["chat_template"]).render(
        messages=[{"role": "user", "content": "hi"}], add_generation_prompt=True, bos_token=config["bos_token"]
    )
    assert rendered == (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )


def test_concurrent_first_use_yields_one_complete_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCORD_CACHE_DIR", str(tmp_path))
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(demo_model.demo_model_dir())) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(results)) == 1
    assert [path.name for path in tmp_path.iterdir()] == [results[0].name]  # no staging leftovers
    assert digests(results[0]) == digests(demo_model.demo_model_dir())


@pytest.mark.slow
def test_transformers_loads_the_directory_and_generates(demo_model: Path) -> None:
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(demo_model)
    tokenizer = transformers.AutoTokenizer.from_pretrained(demo_model)
    prompt = tokenizer("Hello", return_tensors="pt").input_ids
    output = model.generate(prompt, max_new_tokens=4, do_sample=False, min_new_tokens=4)
    assert output.shape[1] == prompt.shape[1] + 4
