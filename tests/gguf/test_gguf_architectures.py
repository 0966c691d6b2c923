"""llama (q/k rows permuted by llama.cpp's converter), qwen2 (q/k/v bias, tied
embeddings) and qwen3 (q/k norm, head_dim from attention.key_length) as fp32 GGUF
files: accord generates from the file what transformers generates from the model the
file was written from (an fp32 file is lossless, so no GGUF reader is in the reference)."""

from __future__ import annotations

import pytest
import torch
from gguf_files import build_model, write_gguf

from accord import LLM, SamplingParams

PROMPT = [256, 257, 10, 70, 71, 72, 73, 100, 101, 3, 4, 5, 200, 201, 202, 203]
NEW_TOKENS = 12
LOGPROB_TOLERANCE = 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_greedy_generation_matches_the_written_transformers_model(arch: str, tmp_path) -> None:
    model = build_model(arch, seed=1)
    path = write_gguf(tmp_path / f"{arch}.gguf", model, arch)
    llm = LLM(str(path), dtype="float32", max_model_len=64, max_num_seqs=2, max_num_batched_tokens=64,
              kv_cache_memory=4 << 20)
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=0)
    output = llm.generate({"prompt_token_ids": PROMPT}, params, use_tqdm=False)[0].outputs[0]
    with torch.inference_mode():
        ids = torch.tensor([PROMPT])
        generated = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                                   min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
        logprobs = torch.log_softmax(model(generated).logits[0].float(), dim=-1)
    expected = generated[0, len(PROMPT):].tolist()
    assert list(output.token_ids) == expected
    for step, (token, sampled) in enumerate(zip(expected, output.logprobs)):
        assert sampled[token].logprob == pytest.approx(float(logprobs[len(PROMPT) - 1 + step, token]),
                                                       abs=LOGPROB_TOLERANCE)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_config_follows_the_metadata(arch: str, tmp_path) -> None:
    from accord.core.model_loader.gguf import open_gguf_model

    model = build_model(arch)
    config = open_gguf_model(write_gguf(tmp_path / f"{arch}.gguf", model, arch)).config
    hf = model.config
    assert config["architectures"] == [type(model).__name__]
    assert (config["hidden_size"], config["num_hidden_layers"], config["intermediate_size"]) == (
        hf.hidden_size, hf.num_hidden_layers, hf.intermediate_size
    )
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]) == (
        hf.num_attention_heads, hf.num_key_value_heads, getattr(hf, "head_dim", None) or hf.hidden_size // 4
    )
    assert config["tie_word_embeddings"] == hf.tie_word_embeddings
    assert config["attention_bias"] == (arch == "qwen2")
