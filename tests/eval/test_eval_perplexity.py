"""`accord eval perplexity` against transformers on the same random Llama: the same
llama-perplexity chunking (n_ctx-token chunks, BOS in place of each chunk's first token
when the tokenizer adds one, the second half scored) computed here from the words of the
text, and the NLLs from transformers' forward in fp64; and its refusals of texts too
short to score."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers, processors

from accord.cli.main import main
from accord.eval.perplexity import chunk_windows

VOCAB = 256
BOS = 1
CTX = 32
#: Whole chunks in the text; a partial one follows them, which nothing scores.
TEXT_CHUNKS = 5
SCORED_CHUNKS = 3


def write_model(directory: Path, adds_bos: bool) -> Path:
    """A seeded random fp32 Llama with a word-level tokenizer (word `tN` is id N, `t1`
    the BOS), its post-processor putting BOS first when `adds_bos`."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=VOCAB, max_position_embeddings=256, initializer_range=0.1, bos_token_id=BOS, eos_token_id=2,
    )
    transformers.LlamaForCausalLM(config).save_pretrained(directory, safe_serialization=True)
    tokenizer = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if adds_bos:
        tokenizer.post_processor = processors.TemplateProcessing(single="t1 $A", special_tokens=[("t1", BOS)])
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "t1", "eos_token": "t2"})
    )
    return directory


def text_ids() -> list[int]:
    """The text's words as ids: TEXT_CHUNKS chunks and half a chunk more (BOS excluded,
    so that only the engine's tokenizer can put it in)."""
    generator = torch.Generator().manual_seed(7)
    return torch.randint(3, VOCAB, (TEXT_CHUNKS * CTX + CTX // 2,), generator=generator).tolist()


def reference_perplexity(model_dir: Path, ids: list[int], adds_bos: bool) -> tuple[float, float]:
    """(PPL, its standard error) of the first SCORED_CHUNKS chunks, with transformers."""
    tokens = [BOS, *ids] if adds_bos else ids
    model = transformers.LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    nlls = []
    for chunk in range(SCORED_CHUNKS):
        window = tokens[chunk * CTX : (chunk + 1) * CTX]
        if adds_bos:
            window[0] = BOS
        with torch.no_grad():
            logits = model(torch.tensor([window])).logits[0].double()
        logprobs = torch.log_softmax(logits, dim=-1)
        # Rows CTX/2 .. CTX-2 predict the tokens after them.
        for row in range(CTX // 2, CTX - 1):
            nlls.append(-logprobs[row, window[row + 1]].item())
    values = torch.tensor(nlls, dtype=torch.float64)
    ppl = math.exp(values.mean().item())
    return ppl, ppl * values.std(unbiased=False).item() / math.sqrt(len(nlls) - 1)


def run_eval(model_dir: Path, text: Path, *extra: str) -> int:
    return main([
        "eval", "perplexity", "--model", str(model_dir), "--text", str(text), "--ctx-size", str(CTX),
        "--backend", "cpu", "--dtype", "float32", "--kv-cache-memory-bytes", str(8 << 20), *extra,
    ])


@pytest.mark.parametrize("adds_bos", [False, True], ids=["no-bos", "bos"])
def test_the_perplexity_is_transformers_on_the_same_chunks(tmp_path: Path, capsys, adds_bos: bool) -> None:
    model_dir = write_model(tmp_path / "model", adds_bos)
    ids = text_ids()
    text = tmp_path / "text.txt"
    text.write_text(" ".join(f"t{i}" for i in ids))
    assert run_eval(model_dir, text, "--chunks", str(SCORED_CHUNKS), "--json") == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    ppl, stderr = reference_perplexity(model_dir, ids, adds_bos)
    assert result["chunks"] == SCORED_CHUNKS
    assert result["scored_tokens"] == SCORED_CHUNKS * (CTX - CTX // 2 - 1)
    assert result["text_tokens"] == len(ids) + adds_bos
    assert result["ppl"] == pytest.approx(ppl, rel=1e-5)
    assert result["stderr"] == pytest.approx(stderr, rel=1e-4)


def test_chunks_are_whole_windows_with_bos_in_front() -> None:
    tokens = list(range(10, 21))  # 11 tokens: two chunks of 4 and 3 left over
    assert chunk_windows(tokens, 4, None, BOS) == [[BOS, 11, 12, 13], [BOS, 15, 16, 17]]
    assert chunk_windows(tokens, 4, 1, None) == [[10, 11, 12, 13]]


def test_an_empty_text_is_refused_before_any_model_loads(tmp_path: Path, capsys) -> None:
    text = tmp_path / "empty.txt"
    text.write_text(" \n")
    assert run_eval(tmp_path / "no-such-model", text) == 2
    assert "is empty" in capsys.readouterr().err


@pytest.mark.parametrize(("flags", "message"), [
    (("--ctx-size", "7"), "even number of at least 4 tokens, got 7"),
    (("--chunks", "0"), "number of chunks must be at least 1, got 0"),
])
def test_bad_window_settings_are_refused_before_any_model_loads(tmp_path: Path, capsys, flags, message) -> None:
    text = tmp_path / "text.txt"
    text.write_text("some words to score")
    # No model exists at the path: loading it would exit 1, not 2.
    assert run_eval(tmp_path / "no-such-model", text, *flags) == 2
    assert message in capsys.readouterr().err


def test_a_text_shorter_than_one_chunk_is_refused(tmp_path: Path, capsys) -> None:
    model_dir = write_model(tmp_path / "model", adds_bos=False)
    text = tmp_path / "short.txt"
    text.write_text(" ".join(f"t{i}" for i in range(3, 3 + CTX - 1)))
    assert run_eval(model_dir, text) == 2
    assert f"tokenises to {CTX - 1} tokens, fewer than one chunk of {CTX}" in capsys.readouterr().err
