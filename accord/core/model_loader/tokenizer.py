"""The model's tokenizer: tokenizer.json through the `tokenizers` library, special
tokens from tokenizer_config.json / generation_config.json, and the chat template
rendered by a sandboxed jinja2 environment (a template is data, never trusted code)."""

from __future__ import annotations

import functools
import json
from datetime import datetime
from pathlib import Path
from typing import Any, Mapping, Sequence

import tokenizers
from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .hf_checkpoint import CheckpointError, read_json

TEMPLATE_FILE = "chat_template.jinja"


class Tokenizer:
    """Encode/decode with a Hugging Face fast tokenizer, plus the model's chat template."""

    def __init__(
        self,
        tokenizer: tokenizers.Tokenizer,
        chat_template: str | None = None,
        bos_token: str | None = None,
        eos_token: str | None = None,
        extra_eos_token_ids: Sequence[int] = (),
    ) -> None:
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.bos_token_id = tokenizer.token_to_id(bos_token) if bos_token else None
        eos_ids = [tokenizer.token_to_id(eos_token)] if eos_token else []
        self.eos_token_ids = tuple(dict.fromkeys(i for i in [*eos_ids, *extra_eos_token_ids] if i is not None))
        self._template = None if chat_template is None else _environment().from_string(chat_template)

    @property
    def eos_token_id(self) -> int | None:
        """The first end-of-sequence id (the tokenizer's own eos token when it has one)."""
        return self.eos_token_ids[0] if self.eos_token_ids else None

    @property
    def vocab_size(self) -> int:
        """Vocabulary size, added tokens included."""
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def added_tokens(self, special_only: bool = False) -> dict[str, int]:
        """The tokenizer's added tokens (markers such as `[TOOL_CALLS]`), text to id;
        `special_only`: those marked special (the ones decoding may skip)."""
        added = self.tokenizer.get_added_tokens_decoder().items()
        return {token.content: token_id for token_id, token in added if token.special or not special_only}

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; `add_special_tokens` applies the tokenizer's post-processor
        (a BOS, say)."""
        return self.tokenize(text, add_special_tokens).ids

    def tokenize(self, text: str, add_special_tokens: bool = True) -> tokenizers.Encoding:
        """`text`'s tokens as the tokenizers library holds them: `len()` counts them for
        free, `.ids` builds the Python list (which holds the GIL, ~75 ns a token).

        The batch call releases the GIL while it encodes; the plain `encode` holds it
        throughout (a 10 MB prompt: 19-25 s on a loaded 2-core Sapphire Rapids, every other
        thread of the process stopped). Its `_fast` form leaves out the character
        offsets, which nothing here reads."""
        return self.tokenizer.encode_batch_fast([text], add_special_tokens=add_special_tokens)[0]

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """The text of `token_ids`. The batch call releases the GIL while it decodes (the
        plain `decode` holds it: 0.18 s for 250,000 ids) and costs the same on a few ids."""
        return self.tokenizer.decode_batch([list(token_ids)], skip_special_tokens=skip_special_tokens)[0]

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        tokenize: bool = False,
        chat_template: str | None = None,
        **template_kwargs: Any,
    ) -> str | list[int]:
        """The conversation rendered by the model's chat template (or by `chat_template`,
        a template's source, when given); token ids when `tokenize` (encoded without
        adding special tokens: the template writes them)."""
        template = self._template if chat_template is None else _compiled_template(chat_template)
        if template is None:
            raise ValueError("this model has no chat template (none in tokenizer_config.json or chat_template.jinja)")
        text = template.render(
            messages=list(messages),
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "",
            eos_token=self.eos_token or "",
            **template_kwargs,
        )
        return self.encode(text, add_special_tokens=False) if tokenize else text


@functools.lru_cache(maxsize=16)
def _compiled_template(source: str) -> Any:
    # A server given one template (--chat-template) compiles it once, not per request.
    return _environment().from_string(source)


def load_hf_tokenizer(model_dir: str | Path) -> Tokenizer:
    """The tokenizer of a Hugging Face model directory (tokenizer.json is required);
    `model_source.load_tokenizer` takes a GGUF file too."""
    model_dir = Path(model_dir)
    path = model_dir / "tokenizer.json"
    if not path.is_file():
        raise CheckpointError(f"{model_dir}: tokenizer.json is missing (only fast tokenizers are supported)")
    config = read_json(model_dir, "tokenizer_config.json", required=False)
    generation = read_json(model_dir, "generation_config.json", required=False)
    extra_eos = generation.get("eos_token_id")
    return Tokenizer(
        tokenizers.Tokenizer.from_file(str(path)),
        chat_template=_chat_template(model_dir, config),
        bos_token=_token_text(config.get("bos_token")),
        eos_token=_token_text(config.get("eos_token")),
        extra_eos_token_ids=[extra_eos] if isinstance(extra_eos, int) else extra_eos or (),
    )


def _token_text(entry: str | Mapping[str, Any] | None) -> str | None:
    # tokenizer_config.json writes a special token as its text or as an AddedToken dict.
    return entry.get("content") if isinstance(entry, Mapping) else entry


def _chat_template(model_dir: Path, config: Mapping[str, Any]) -> str | None:
    template_file = model_dir / TEMPLATE_FILE
    if template_file.is_file():
        return template_file.read_text()
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: the 'default' one is the chat template
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    return template


def _environment() -> ImmutableSandboxedEnvironment:
    # The settings and helpers transformers gives chat templates, so templates written
    # for it render identically here.
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message: str) -> None:
    raise TemplateError(message)
