"""The ops `--backend auto` asks for a model (`worker_contract_ops`) are every op an
engine serving it calls, the sampler's included (and the rejection sampler's when
decoding speculatively): a generate on the tiny Llama with its calls recorded calls
exactly those."""

from __future__ import annotations

from pathlib import Path

import pytest

from accord import SamplingParams
from accord.core.worker.contract_ops import worker_contract_ops
from accord.op_contracts.recording import read_recordings


#: n-gram speculation that drafts from a single matching token: the prompt below holds
#: every token id, so whichever token the first step samples is drafted from.
NGRAM = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 1, "prompt_lookup_max": 1}


@pytest.mark.parametrize("speculative_config", [None, NGRAM], ids=["plain", "ngram"])
def test_an_engine_calls_exactly_the_ops_auto_asks_for(
    speculative_config: dict | None, llama_dir: Path, make_llm, tmp_path: Path
) -> None:
    calls = tmp_path / "calls"
    llm = make_llm(llama_dir, backend="reference", max_model_len=1024, num_gpu_blocks_override=64,
                   record_op_calls=str(calls), speculative_config=speculative_config)
    every_token = list(range(llm.llm_engine.model_config.vocab_size))
    llm.generate({"prompt_token_ids": every_token}, SamplingParams(temperature=0.8, max_tokens=3, seed=1),
                 use_tqdm=False)
    called = {call.op for rank_calls in read_recordings(calls).values() for call in rank_calls}
    assert called == worker_contract_ops(llama_dir, speculative=speculative_config is not None)
