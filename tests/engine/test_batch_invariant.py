"""`--batch-invariant`: identical prompts give identical greedy text, token ids and
logprobs (bit for bit) whatever batch they run in, on the cpu backend in bf16 with the
native-bf16 path forced (so the test runs as on an AVX512-BF16/AMX host everywhere);
and start-up refuses, naming the ops, where the backend has no batch-invariant kernel."""

from __future__ import annotations

from pathlib import Path

import pytest
from engine_models import build_model_dir

from accord import LLM, SamplingParams
from accord.backends import get_backend
from accord.core.worker.contract_ops import refuse_batch_variant_ops

#: The three prompts, and the batches they run in: alone, and among 11 others
#: (repeats of each, in another order), so each stream's batch mates and row change.
PROMPTS = ["The capital of France is", "One two three four", "Batch invariance means"]
MIXED = [PROMPTS[i % 3] for i in (0, 1, 2, 2, 1, 0, 1, 0, 2, 0, 2, 1)]
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=1)


def _streams(llm: LLM, prompts: list[str]) -> list[tuple[str, tuple[int, ...], tuple[float, ...]]]:
    outputs = llm.generate(prompts, GREEDY, use_tqdm=False)
    return [
        (o.outputs[0].text, tuple(o.outputs[0].token_ids),
         tuple(entry[token].logprob for entry, token in zip(o.outputs[0].logprobs, o.outputs[0].token_ids)))
        for o in outputs
    ]


@pytest.mark.slow
def test_identical_prompts_give_identical_bits_across_batch_compositions(
    tmp_path: Path, forced_native_bf16: None
) -> None:
    model_dir = build_model_dir(tmp_path / "deepseek_v3", "deepseek_v3")  # linear, moe_route, fused_moe
    llm = LLM(str(model_dir), backend="cpu", dtype="bfloat16", batch_invariant=True, max_num_seqs=16)
    try:
        alone = [_streams(llm, [prompt])[0] for prompt in PROMPTS]
        mixed = _streams(llm, MIXED)
    finally:
        llm.llm_engine.shutdown()
    for prompt, stream in zip(MIXED, mixed):
        assert stream == alone[PROMPTS.index(prompt)], prompt


class WithoutInvariantRouting(type(get_backend("cpu"))):  # type: ignore[misc]
    """The cpu backend without its batch-invariant moe_route and fused_moe variants."""

    name = "cpu-no-invariant-moe"

    def kernel_for(self, op: str, batch_invariant: bool = False):  # type: ignore[no-untyped-def]
        if batch_invariant and op in ("moe_route", "fused_moe"):
            return None
        return super().kernel_for(op, batch_invariant)


def test_start_up_refuses_naming_the_ops_without_a_batch_invariant_kernel() -> None:
    with pytest.raises(ValueError, match=r"--batch-invariant: backend 'cpu-no-invariant-moe' has no batch-invariant "
                                         r"kernel for fused_moe, moe_route"):
        refuse_batch_variant_ops(WithoutInvariantRouting(), {"linear", "moe_route", "fused_moe", "rms_norm"})


def test_the_cpu_backend_has_a_batch_invariant_kernel_for_every_op() -> None:
    refuse_batch_variant_ops(get_backend("cpu"), get_backend("cpu").kernels().ops())
