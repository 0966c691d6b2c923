"""The real SmolLM2-135M-Instruct GGUF (Q4_1 weights, Q8_0 embeddings) through accord
against transformers' own GGUF loader: the same chat prompt tokens and token-identical
greedy answers in fp32."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from gguf_files import transformers_from_gguf

from accord import LLM, SamplingParams

pytestmark = pytest.mark.slow

QUESTIONS = (
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain in one sentence what a CPU does.",
    "Give me three tips for sleeping well.",
    "Translate 'good morning' into Spanish.",
    "Who wrote Romeo and Juliet?",
)
MAX_TOKENS = 40


def conversation(question: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": question}]


@pytest.fixture(scope="module")
def accord_llm(smollm2_gguf: Path) -> LLM:
    # The dequantised path, which computes what transformers does; the packed one
    # (int8 activations, as llama.cpp's) is held to this one in tests/quant.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ACCORD_GGUF_PACKED", "0")
        return LLM(
            str(smollm2_gguf), dtype="float32", max_model_len=512, max_num_seqs=8, max_num_batched_tokens=512,
            kv_cache_memory=32 << 20,
        )


@pytest.fixture(scope="module")
def transformers_gguf(smollm2_gguf: Path):
    transformers = pytest.importorskip("transformers")
    directory, name = smollm2_gguf.parent, smollm2_gguf.name
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory, gguf_file=name)
    model = transformers_from_gguf(smollm2_gguf)
    return tokenizer, model


@pytest.mark.slow
def test_chat_prompts_tokenise_as_transformers_does(accord_llm: LLM, transformers_gguf) -> None:
    tokenizer, _ = transformers_gguf
    for question in QUESTIONS:
        ours = accord_llm.get_tokenizer().apply_chat_template(conversation(question), tokenize=True)
        theirs = tokenizer.apply_chat_template(conversation(question), add_generation_prompt=True, tokenize=True)
        theirs = theirs["input_ids"] if isinstance(theirs, dict) or hasattr(theirs, "keys") else theirs
        assert ours == list(theirs), question


@pytest.mark.slow
def test_greedy_chat_answers_are_token_identical_to_transformers(accord_llm: LLM, transformers_gguf) -> None:
    tokenizer, model = transformers_gguf
    outputs = accord_llm.chat(
        [conversation(q) for q in QUESTIONS], SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS), use_tqdm=False
    )
    for question, output in zip(QUESTIONS, outputs):
        prompt = torch.tensor([output.prompt_token_ids])
        with torch.inference_mode():
            generated = model.generate(
                prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=MAX_TOKENS, do_sample=False,
                eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id,
            )
        expected = generated[0, prompt.shape[1]:].tolist()
        assert list(output.outputs[0].token_ids) == expected, (question, output.outputs[0].text)


def test_answers_the_capital_of_france(accord_llm: LLM) -> None:
    output = accord_llm.chat(conversation(QUESTIONS[0]), SamplingParams(temperature=0.0, max_tokens=16), use_tqdm=False)
    assert "Paris" in output[0].outputs[0].text
