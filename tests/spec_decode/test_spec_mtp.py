"""Speculative decoding with DeepSeek-V3's MTP layer through `LLM`, on a tiny random
DeepSeek-V3 written by transformers plus an MTP layer (`model.layers.2.*`, the
checkpoint's names) written by the test. Greedy outputs equal those without speculation
whatever the MTP weights are (they are random here, so most drafts are rejected), and
the layer really drafts: its first draft after a prompt equals an independent torch
computation of the MTP formula from the checkpoint's tensors (transformers' decoder
layer for the MLA + MoE block)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from accord.core.sampling_params import SamplingParams
from engine_models import build_model_dir
from spec_decode_models import Calls, profile_worker

#: Each test generates through a model (seconds on a 2-core host): the slow tier.
pytestmark = pytest.mark.slow

PROMPTS = [list(range(100 + 7 * i, 124 + 7 * i)) for i in range(3)]
ENGINE = {"max_model_len": 256, "num_gpu_blocks_override": 64}
MTP = {"method": "mtp", "num_speculative_tokens": 2}
#: The MTP layer's index: num_hidden_layers of engine_models' DeepSeek-V3.
LAYER = 2


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def with_mtp_block(model_dir, into):
    """A copy of `model_dir`'s config in `into` with one layer more, and its safetensors
    linked: transformers reads the MTP layer's decoder block as that layer."""
    into.mkdir()
    raw = json.loads((model_dir / "config.json").read_text())
    (into / "config.json").write_text(json.dumps({**raw, "num_hidden_layers": LAYER + 1}))
    (into / "model.safetensors").symlink_to(model_dir / "model.safetensors")
    return into


@pytest.fixture(scope="module")
def deepseek_mtp_dir(tmp_path_factory):
    """engine_models' tiny DeepSeek-V3 with one MTP layer: the MoE decoder block of a
    random three-layer DeepSeek-V3's layer 2 (written by transformers, so the names are
    the checkpoint's), random enorm/hnorm/eh_proj/shared_head.norm, and the copies of
    the embedding and head a DeepSeek checkpoint carries."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    models = tmp_path_factory.mktemp("models")
    directory = build_model_dir(models / "deepseek_mtp", "deepseek_v3")
    raw = json.loads((directory / "config.json").read_text())
    torch.manual_seed(7)
    deeper = DeepseekV3ForCausalLM(DeepseekV3Config(**{**raw, "num_hidden_layers": LAYER + 1})).float()
    with torch.no_grad():
        bias = deeper.model.layers[LAYER].mlp.gate.e_score_correction_bias
        bias.copy_(torch.randn_like(bias) * 0.1)  # transformers starts it at zero
    deeper.save_pretrained(models / "deeper")
    prefix, hidden = f"model.layers.{LAYER}", raw["hidden_size"]
    tensors = load_file(directory / "model.safetensors")
    tensors.update((name, value) for name, value in load_file(models / "deeper" / "model.safetensors").items()
                   if name.startswith(prefix + "."))
    for norm in ("enorm", "hnorm", "shared_head.norm"):
        tensors[f"{prefix}.{norm}.weight"] = 1.0 + 0.1 * torch.randn(hidden)
    tensors[f"{prefix}.eh_proj.weight"] = torch.randn(hidden, 2 * hidden) * (2 * hidden) ** -0.5
    tensors[f"{prefix}.embed_tokens.weight"] = tensors["model.embed_tokens.weight"].clone()
    tensors[f"{prefix}.shared_head.head.weight"] = tensors["lm_head.weight"].clone()
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps({**raw, "num_nextn_predict_layers": 1}))
    return directory


def reference_first_draft(model_dir, prompt: list[int], scratch) -> int:
    """The MTP layer's prediction after `prompt` and the target's greedy next token,
    from the checkpoint's tensors: x_i = eh_proj(concat(enorm(embed(t_{i+1})),
    hnorm(h_i))) with the embedding zeroed at position 0, transformers' decoder layer
    (MLA + MoE, read from the checkpoint as a layer 2) over x, causal, then the head over
    shared_head.norm of its last row."""
    from transformers import DeepseekV3ForCausalLM

    raw = json.loads((model_dir / "config.json").read_text())
    tensors = load_file(model_dir / "model.safetensors")
    target = DeepseekV3ForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    deeper = DeepseekV3ForCausalLM.from_pretrained(with_mtp_block(model_dir, scratch), dtype=torch.float32,
                                                   attn_implementation="eager").eval()
    layer, prefix, eps = deeper.model.layers[LAYER], f"model.layers.{LAYER}.", raw["rms_norm_eps"]
    with torch.inference_mode():
        ids = torch.tensor([prompt])
        hidden = target.model(ids).last_hidden_state[0]  # after the final norm
        next_token = int(target.lm_head(hidden[-1]).argmax())
        embeds = tensors["model.embed_tokens.weight"][torch.tensor(prompt[1:] + [next_token])]
        embeds[0] = 0.0
        x = torch.cat([rms_norm(embeds, tensors[prefix + "enorm.weight"], eps),
                       rms_norm(hidden, tensors[prefix + "hnorm.weight"], eps)], dim=-1)
        x = (x @ tensors[prefix + "eh_proj.weight"].T)[None]
        positions = torch.arange(len(prompt))[None]
        mask = torch.full((len(prompt), len(prompt)), float("-inf")).triu(1)[None, None]
        out = layer(x, attention_mask=mask, position_ids=positions,
                    position_embeddings=deeper.model.rotary_emb(x, positions))
        out = out[0] if isinstance(out, tuple) else out
        last = rms_norm(out[0, -1], tensors[prefix + "shared_head.norm.weight"], eps)
        return int((last @ tensors[prefix + "shared_head.head.weight"].T).argmax())


def token_ids(llm, prompts=PROMPTS, max_tokens: int = 24) -> list[list[int]]:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [output.outputs[0].token_ids for output in outputs]


def test_greedy_outputs_equal_those_without_speculation(deepseek_mtp_dir, make_llm):
    llm = make_llm(deepseek_mtp_dir, speculative_config=MTP, **ENGINE)
    assert token_ids(llm) == token_ids(make_llm(deepseek_mtp_dir, **ENGINE))
    assert llm.llm_engine.stats.spec_decode_num_draft_tokens > 0


def test_greedy_outputs_equal_under_chunked_prefill(deepseek_mtp_dir, make_llm):
    # 16 tokens a step: the layer's KV of each prompt chunk is written after the chunk.
    llm = make_llm(deepseek_mtp_dir, speculative_config=MTP, max_num_batched_tokens=16, **ENGINE)
    assert token_ids(llm) == token_ids(make_llm(deepseek_mtp_dir, **ENGINE))


def test_the_first_draft_is_the_mtp_formula_of_the_checkpoint(deepseek_mtp_dir, make_llm, tmp_path):
    llm = make_llm(deepseek_mtp_dir, speculative_config=MTP, **ENGINE)
    engine, prompt = llm.llm_engine, PROMPTS[0]
    engine.add_request("first-draft", {"prompt_token_ids": prompt}, SamplingParams(max_tokens=8, temperature=0.0))
    engine.step()  # the prompt, its first token, and the drafts after it
    (request,) = engine.scheduler.requests.values()  # its one sample, under the engine's own id
    drafts = request.spec_token_ids
    engine.abort_request("first-draft")
    assert drafts and drafts[0] == reference_first_draft(deepseek_mtp_dir, prompt, tmp_path / "deeper")


def test_mtp_on_a_checkpoint_without_mtp_layers_is_refused(counting_llama_dir):
    from accord import LLM

    with pytest.raises(ValueError, match="'mtp' needs a checkpoint with MTP layers; LlamaForCausalLM"):
        LLM(model=str(counting_llama_dir), backend="cpu", speculative_config=MTP, **ENGINE)


def test_profile_run_runs_the_mtp_layer_over_every_profiled_token(deepseek_mtp_dir):
    # profile_run's batch: 48 tokens over 4 sequences; the layer reads the target's hidden state of each.
    worker = profile_worker(deepseek_mtp_dir, MTP, max_num_seqs=4, token_budget=48)
    calls = Calls(worker.runner.drafter.layer)
    worker.determine_num_blocks(48)
    hidden_size = json.loads((deepseek_mtp_dir / "config.json").read_text())["hidden_size"]
    assert calls.shapes(0) == [(48,)]  # input_ids
    assert calls.shapes(2) == [(48, hidden_size)]  # previous_hidden: the target's


def test_profile_run_routes_the_mtp_layers_experts_by_their_worst_case(deepseek_mtp_dir):
    worker = profile_worker(deepseek_mtp_dir, MTP, max_num_seqs=4, token_budget=48)
    routed = worker.runner.drafter.layer.layer.feed_forward.routed  # the MTP block's routed experts
    routing = []
    local = routed.local

    def recording(*args):
        routing.append(routed.worst_case_load)
        return local(*args)

    routed.local = recording
    worker.determine_num_blocks(48)
    assert routing == [True]
