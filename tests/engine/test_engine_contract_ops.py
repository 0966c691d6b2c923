"""The ops `--backend auto` asks for a model (`worker_contract_ops`) are every op an
engine serving it calls, the sampler's included: a generate on the tiny Llama with
its calls recorded calls exactly those."""

from __future__ import annotations

from pathlib import Path

from accord import SamplingParams
from accord.core.worker.contract_ops import worker_contract_ops
from accord.op_contracts.recording import read_recordings


def test_an_engine_calls_exactly_the_ops_auto_asks_for(llama_dir: Path, make_llm, tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    llm = make_llm(llama_dir, backend="reference", max_model_len=64, num_gpu_blocks_override=16,
                   record_op_calls=str(calls))
    llm.generate({"prompt_token_ids": [5, 9, 13]}, SamplingParams(temperature=0.8, max_tokens=3, seed=1),
                 use_tqdm=False)
    called = {call.op for rank_calls in read_recordings(calls).values() for call in rank_calls}
    assert called == worker_contract_ops(llama_dir)
