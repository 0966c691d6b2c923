"""The tokenizer loader: tokenizer.json, special tokens from the config files, and the
chat template rendered in a sandbox exactly as transformers renders it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import transformers
from jinja2.exceptions import SecurityError, TemplateError
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, pre_tokenizers, processors

from accord.core.model_loader.hf_checkpoint import CheckpointError
from accord.core.model_loader.source import load_tokenizer

WORDS = ["<unk>", "<s>", "</s>", "<|end|>", "hello", "world", "how", "are", "you", "user:", "assistant:"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}{{ eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def write_tokenizer(directory: Path, chat_template: str = CHAT_TEMPLATE) -> Path:
    """A word-level tokenizer.json that prepends <s>, with a chat template and eos tokens."""
    tokenizer = HFTokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tokenizer.add_special_tokens(["<s>", "</s>", "<|end|>"])
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {
        "bos_token": "<s>",
        "eos_token": {"__type": "AddedToken", "content": "</s>", "special": True},
        "chat_template": chat_template,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 3]}))
    return directory


@pytest.fixture
def tokenizer_dir(tmp_path: Path) -> Path:
    return write_tokenizer(tmp_path)


def test_encode_adds_the_post_processors_bos(tokenizer_dir):
    assert load_tokenizer(tokenizer_dir).encode("hello world") == [1, 4, 5]


def test_encode_without_special_tokens_adds_no_bos(tokenizer_dir):
    assert load_tokenizer(tokenizer_dir).encode("hello world", add_special_tokens=False) == [4, 5]


def test_decode_skips_special_tokens_unless_asked(tokenizer_dir):
    tokenizer = load_tokenizer(tokenizer_dir)
    assert tokenizer.decode([1, 4, 5, 2]) == "hello world"
    assert tokenizer.decode([1, 4, 5, 2], skip_special_tokens=False) == "<s> hello world </s>"


def test_eos_ids_merge_tokenizer_config_and_generation_config(tokenizer_dir):
    tokenizer = load_tokenizer(tokenizer_dir)
    assert tokenizer.eos_token_ids == (2, 3)
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id) == (1, 2)


def test_chat_template_renders_as_transformers_renders_it(tokenizer_dir):
    messages = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "world"}]
    expected = transformers.AutoTokenizer.from_pretrained(tokenizer_dir).apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False
    )
    assert load_tokenizer(tokenizer_dir).apply_chat_template(messages) == expected


def test_chat_template_tokenized_adds_no_second_bos(tokenizer_dir):
    ids = load_tokenizer(tokenizer_dir).apply_chat_template([{"role": "user", "content": "hello"}], tokenize=True)
    assert ids[:2] == [1, WORDS.index("user:")]


def test_chat_template_file_takes_precedence_over_tokenizer_config(tokenizer_dir):
    (tokenizer_dir / "chat_template.jinja").write_text("{{ messages[0]['content'] }}!")
    assert load_tokenizer(tokenizer_dir).apply_chat_template([{"role": "user", "content": "hi"}]) == "hi!"


def test_chat_template_cannot_reach_python_internals(tmp_path):
    tokenizer = load_tokenizer(write_tokenizer(tmp_path, "{{ messages.__class__.__mro__ }}"))
    with pytest.raises(SecurityError):
        tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])


def test_chat_template_cannot_mutate_the_messages(tmp_path):
    tokenizer = load_tokenizer(write_tokenizer(tmp_path, "{{ messages.append(1) }}"))
    with pytest.raises(SecurityError):
        tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])


def test_chat_template_raise_exception_surfaces_its_message(tmp_path):
    tokenizer = load_tokenizer(write_tokenizer(tmp_path, "{{ raise_exception('roles must alternate') }}"))
    with pytest.raises(TemplateError, match="roles must alternate"):
        tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])


def test_missing_tokenizer_json_is_a_clear_error(tmp_path):
    with pytest.raises(CheckpointError, match="tokenizer.json is missing"):
        load_tokenizer(tmp_path)
