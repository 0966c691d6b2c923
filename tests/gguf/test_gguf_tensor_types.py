"""Every supported GGUF tensor type, in a tiny llama file written by the test: accord's
dequantised tensors equal transformers' GGUF loader's (both read with gguf's reference
dequantisation) and, where gguf-py can quantise, sit within the type's rounding bound
of the float weights that were written; and the model generates as transformers' does."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from gguf_files import Q, build_model, transformers_from_gguf, write_gguf

from accord import LLM, SamplingParams
from accord.core.model_loader.gguf import SUPPORTED_TYPES, open_gguf_model

#: max |dequantised - written| / max |written| per tensor: half a quantisation step
#: (Q4_0 and Q5_0 clip the side opposite their largest value at 7/8 and 15/16 of it:
#: up to one step, 1/8 and 1/16; Q4_1 and Q5_1 span at most 2 max in 15 and 31 steps).
ROUNDING_BOUND = {
    Q.F32: 0.0, Q.F16: 1e-3, Q.BF16: 5e-3, Q.Q8_0: 1e-2, Q.Q4_0: 0.13, Q.Q4_1: 0.07, Q.Q5_0: 0.065, Q.Q5_1: 0.035,
}
PROMPT = [256, 257, 10, 70, 71, 72, 73, 100, 101, 3, 4, 5]
NEW_TOKENS = 8
LOGPROB_TOLERANCE = 1e-3


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory):
    """`written(type)`: (the written transformers model, the GGUF path), once per type."""
    model = build_model("llama")
    files: dict[Q, Path] = {}

    def get(tensor_type: Q) -> tuple[torch.nn.Module, Path]:
        if tensor_type not in files:
            path = tmp_path_factory.mktemp("gguf") / f"tiny-{tensor_type.name}.gguf"
            files[tensor_type] = write_gguf(path, model, "llama", tensor_type)
        return model, files[tensor_type]

    return get


def test_the_supported_types_are_the_issue_list() -> None:
    # Issue 26: what llama-quantize writes for Q2_K, Q3_K_M, Q4_K_S/M, Q5_K_S/M, Q6_K,
    # Q8_0, IQ4_NL and IQ4_XS, with its fallbacks for rows that are not whole K-blocks.
    assert sorted(t.name for t in SUPPORTED_TYPES) == sorted(
        ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
         "IQ4_NL", "IQ4_XS"]
    )


@pytest.mark.parametrize("tensor_type", SUPPORTED_TYPES, ids=lambda t: t.name)
def test_tensors_equal_transformers_gguf_dequantisation(tensor_type: Q, written) -> None:
    _, path = written(tensor_type)
    checkpoint = open_gguf_model(path).checkpoint
    reference = transformers_from_gguf(path).state_dict()
    assert checkpoint.names() == sorted(reference)
    for name in checkpoint.names():
        assert torch.equal(checkpoint.read(name), reference[name]), name


@pytest.mark.parametrize("tensor_type", list(ROUNDING_BOUND), ids=lambda t: t.name)
def test_tensors_are_within_rounding_of_the_written_weights(tensor_type: Q, written) -> None:
    model, path = written(tensor_type)
    checkpoint = open_gguf_model(path).checkpoint
    for name, original in model.state_dict().items():
        error = (checkpoint.read(name) - original).abs().max() / original.abs().max()
        assert float(error) <= ROUNDING_BOUND[tensor_type], name


@pytest.mark.slow
@pytest.mark.parametrize("tensor_type", SUPPORTED_TYPES, ids=lambda t: t.name)
def test_greedy_generation_matches_transformers_on_the_same_file(tensor_type: Q, written, monkeypatch) -> None:
    # The dequantised path, which computes what transformers does; the packed one
    # (int8 activations, as llama.cpp's) is held to this one in tests/quant.
    monkeypatch.setenv("ACCORD_GGUF_PACKED", "0")
    _, path = written(tensor_type)
    llm = LLM(str(path), dtype="float32", max_model_len=64, max_num_seqs=2, max_num_batched_tokens=64,
              kv_cache_memory=4 << 20)
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=0)
    output = llm.generate({"prompt_token_ids": PROMPT}, params, use_tqdm=False)[0].outputs[0]
    reference = transformers_from_gguf(path).eval()
    with torch.inference_mode():
        ids = torch.tensor([PROMPT])
        generated = reference.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                                       min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
        logprobs = torch.log_softmax(reference(generated).logits[0].float(), dim=-1)
    expected = generated[0, len(PROMPT):].tolist()
    assert list(output.token_ids) == expected
    for step, (token, sampled) in enumerate(zip(expected, output.logprobs)):
        assert sampled[token].logprob == pytest.approx(float(logprobs[len(PROMPT) - 1 + step, token]),
                                                       abs=LOGPROB_TOLERANCE)
