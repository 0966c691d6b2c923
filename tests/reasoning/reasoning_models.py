"""Tiny random reasoning models for the reasoning tests: a Llama graph written by
transformers, the demo byte-level BPE tokenizer with `<think>` and `</think>` added as
single (non-special) tokens, as Qwen3's and DeepSeek-R1's tokenizers have them, and each
family's chat-template behaviour written into its template:

- Qwen3 (through the 2507 release): ChatML, `<|im_end|>` its end of turn and its EOS;
  the model writes `<think>` itself, and `enable_thinking=False` makes the generation
  prompt end with an empty `<think>\\n\\n</think>\\n\\n`; an assistant turn after the
  last user message (a tool-calling loop's) is written with its `reasoning_content` as
  `<think>\\n...\\n</think>\\n\\n` before its answer, earlier ones keep only their answer;
  tool calls are written `<tool_call>name</tool_call>` and tool results as user turns.
- DeepSeek-R1 (0528): `<｜User｜>`/`<｜Assistant｜>` turns; the generation prompt ends
  with `<think>\\n`, so the output begins inside the thinking; earlier assistant turns
  keep only their answer.

A uniquely named module, so tests import it whatever else pytest collected."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import AddedToken

from accord.demo.tokenizer import BOS_TOKEN, EOS_TOKEN, build_demo_tokenizer

THINK_START, THINK_END = "<think>", "</think>"

QWEN3_TEMPLATE = (
    "{%- set ns = namespace(last_query=-1) %}"
    "{%- for message in messages %}{%- if message.role == 'user' %}{%- set ns.last_query = loop.index0 %}"
    "{%- endif %}{%- endfor %}"
    "{%- for message in messages %}"
    "{%- set content = message.content or '' %}"
    "{%- if message.role == 'assistant' %}"
    "{%- set reasoning = message.reasoning_content if message.reasoning_content is string else '' %}"
    "{%- if '</think>' in content %}{%- set content = content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}"
    "{%- if loop.index0 > ns.last_query and reasoning %}"
    "{%- set content = '<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n' + content %}{%- endif %}"
    "<|im_start|>assistant\n{{ content }}"
    "{%- for call in message.tool_calls or [] %}<tool_call>{{ call.function.name }}</tool_call>{%- endfor %}"
    "<|im_end|>\n"
    "{%- elif message.role == 'tool' %}<|im_start|>user\n<tool_response>{{ content }}</tool_response><|im_end|>\n"
    "{%- else %}<|im_start|>{{ message.role }}\n{{ content }}<|im_end|>\n{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{%- if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}"
    "{%- endif %}"
)

DEEPSEEK_R1_TEMPLATE = (
    "{{ bos_token }}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'user' %}<｜User｜>{{ message['content'] }}"
    "{%- elif message['role'] == 'assistant' %}"
    "{%- set content = message['content'] %}"
    "{%- if '</think>' in content %}{%- set content = content.split('</think>')[-1] %}{%- endif %}"
    "<｜Assistant｜>{{ content }}<｜end▁of▁sentence｜>"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<｜Assistant｜><think>\n{% endif %}"
)

TEMPLATES = {"qwen3": QWEN3_TEMPLATE, "deepseek_r1": DEEPSEEK_R1_TEMPLATE}
#: The EOS of a family whose checkpoints end generation at the end of a turn (else the demo's).
END_OF_TURN = {"qwen3": "<|im_end|>"}
ROLE_TOKENS = ("<|im_start|>", "<|im_end|>", "<｜User｜>", "<｜Assistant｜>", "<｜end▁of▁sentence｜>")


def write_reasoning_model(directory: Path, family: str) -> Path:
    """A tiny random Llama with `family`'s chat template ("qwen3" or "deepseek_r1")."""
    from transformers import LlamaConfig, LlamaForCausalLM

    directory.mkdir(parents=True)
    tokenizer = build_demo_tokenizer()
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ROLE_TOKENS])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in (THINK_START, THINK_END)])
    tokenizer.save(str(directory / "tokenizer.json"))
    eos_token = END_OF_TURN.get(family, EOS_TOKEN)
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS_TOKEN, "eos_token": eos_token,
              "chat_template": TEMPLATES[family]}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    model_config = LlamaConfig(
        vocab_size=tokenizer.get_vocab_size(), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        bos_token_id=tokenizer.token_to_id(BOS_TOKEN), eos_token_id=tokenizer.token_to_id(eos_token),
        initializer_range=0.2, tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(model_config).float().eval().save_pretrained(directory)
    return directory


def hf_greedy_with_budget(
    model_dir: Path, prompt: list[int], logit_bias: dict[int, float], end_id: int, budget: int | None, length: int
) -> list[int]:
    """Greedy continuation by transformers (full forward each step, the bias added to the
    logits), with the end marker put in at position `budget`: the independent reference."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids, output = torch.tensor([prompt]), []
    with torch.inference_mode():
        while len(output) < length:
            logits = model(ids).logits[0, -1].clone()
            for token, bias in logit_bias.items():
                logits[token] += bias
            token = end_id if len(output) == budget else int(logits.argmax())
            output.append(token)
            ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
    return output
