"""Speculative decoding with EAGLE and EAGLE-3 heads through `LLM`, on an eight-layer
counting Llama (written by transformers) and random heads the test writes in the
public checkpoint layouts: EAGLE-1's pickled `pytorch_model.bin` (`fc`, `layers.0.*`
without an input norm, a copy of the embedding that is not read), EAGLE-3's
safetensors (`fc` over three layers' features, `midlayer.*` with `hidden_norm`,
`norm`, `lm_head` over a draft vocabulary, `d2t`/`t2d`).

Greedy outputs equal those without speculation whatever the heads' weights are, and the
heads really draft: the first draft after a prompt equals an independent plain-torch
computation of the head's formula from the checkpoint's tensors, over the target's
hidden states as transformers computes them."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from accord.core.sampling_params import SamplingParams
from spec_decode_models import Calls, profile_worker, write_counting_llama

#: Each test generates through a model (seconds on a 2-core host): the slow tier.
pytestmark = pytest.mark.slow

PROMPTS = [list(range(100 + 7 * i, 124 + 7 * i)) for i in range(3)]
ENGINE = {"max_model_len": 256, "num_gpu_blocks_override": 64}
#: The target's depth: EAGLE-3's default features are the residual stream entering
#: layers 2, L // 2 and L - 3, three distinct layers from eight on.
LAYERS = 8
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE, EPS, THETA = 64, 4, 2, 16, 128, 1e-6, 10000.0


@pytest.fixture(scope="module")
def eagle_target_dir(tmp_path_factory):
    return write_counting_llama(tmp_path_factory.mktemp("models") / "eagle_target", num_layers=LAYERS, seed=2)


def head_config(target_dir, **extra) -> dict:
    raw = json.loads((target_dir / "config.json").read_text())
    return {"architectures": ["LlamaForCausalLM"], "hidden_size": HIDDEN, "intermediate_size": INTERMEDIATE,
            "num_hidden_layers": 1, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
            "rms_norm_eps": EPS, "rope_theta": THETA, "max_position_embeddings": 512,
            "vocab_size": raw["vocab_size"], **extra}


def random_layer(prefix: str, generator: torch.Generator, qkv_in: int) -> dict[str, torch.Tensor]:
    """A Llama decoder layer's projections and post-attention norm under `prefix`."""
    def weight(rows: int, cols: int) -> torch.Tensor:
        return torch.randn(rows, cols, generator=generator) * cols**-0.5

    return {
        f"{prefix}.self_attn.q_proj.weight": weight(HEADS * HEAD_DIM, qkv_in),
        f"{prefix}.self_attn.k_proj.weight": weight(KV_HEADS * HEAD_DIM, qkv_in),
        f"{prefix}.self_attn.v_proj.weight": weight(KV_HEADS * HEAD_DIM, qkv_in),
        f"{prefix}.self_attn.o_proj.weight": weight(HIDDEN, HEADS * HEAD_DIM),
        f"{prefix}.mlp.gate_proj.weight": weight(INTERMEDIATE, HIDDEN),
        f"{prefix}.mlp.up_proj.weight": weight(INTERMEDIATE, HIDDEN),
        f"{prefix}.mlp.down_proj.weight": weight(HIDDEN, INTERMEDIATE),
        f"{prefix}.post_attention_layernorm.weight": 1.0 + 0.1 * torch.randn(HIDDEN, generator=generator),
    }


@pytest.fixture(scope="module")
def eagle_dir(eagle_target_dir, tmp_path_factory):
    """An EAGLE-1 head as the public ones ship: config.json and a pickled state dict."""
    directory = tmp_path_factory.mktemp("models") / "eagle"
    directory.mkdir()
    generator = torch.Generator().manual_seed(11)
    tensors = random_layer("layers.0", generator, HIDDEN)
    tensors["fc.weight"] = torch.randn(HIDDEN, 2 * HIDDEN, generator=generator) * (2 * HIDDEN) ** -0.5
    tensors["fc.bias"] = 0.5 * torch.randn(HIDDEN, generator=generator)
    tensors["embed_tokens.weight"] = load_file(eagle_target_dir / "model.safetensors")["model.embed_tokens.weight"]
    torch.save(tensors, directory / "pytorch_model.bin")
    (directory / "config.json").write_text(json.dumps(head_config(eagle_target_dir)))
    return directory


@pytest.fixture(scope="module")
def eagle3_dir(eagle_target_dir, tmp_path_factory):
    """An EAGLE-3 head as the public ones ship: safetensors with the vocabulary maps;
    its draft vocabulary is every other target id from 1."""
    directory = tmp_path_factory.mktemp("models") / "eagle3"
    directory.mkdir()
    config = head_config(eagle_target_dir, architectures=["LlamaForCausalLMEagle3"])
    vocab = config["vocab_size"]
    draft_ids = torch.arange(1, vocab, 2)
    generator = torch.Generator().manual_seed(12)
    tensors = random_layer("midlayer", generator, 2 * HIDDEN)
    for name in ("input_layernorm", "hidden_norm"):
        tensors[f"midlayer.{name}.weight"] = 1.0 + 0.1 * torch.randn(HIDDEN, generator=generator)
    tensors["norm.weight"] = 1.0 + 0.1 * torch.randn(HIDDEN, generator=generator)
    tensors["fc.weight"] = torch.randn(HIDDEN, 3 * HIDDEN, generator=generator) * (3 * HIDDEN) ** -0.5
    tensors["lm_head.weight"] = torch.randn(len(draft_ids), HIDDEN, generator=generator) * HIDDEN**-0.5
    tensors["d2t"] = draft_ids - torch.arange(len(draft_ids))
    tensors["t2d"] = torch.zeros(vocab, dtype=torch.bool).index_fill_(0, draft_ids, True)
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps({**config, "draft_vocab_size": len(draft_ids)}))
    return directory


def rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * weight


def rotate(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Llama's rotary embedding (halves rotated) of x [T, heads, D]."""
    inv_freq = 1.0 / THETA ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float64) / HEAD_DIM)
    angles = positions[:, None].double() * inv_freq[None]
    cos, sin = torch.cat([angles.cos()] * 2, -1)[:, None].float(), torch.cat([angles.sin()] * 2, -1)[:, None].float()
    half = HEAD_DIM // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


def layer_after_attention_input(x: torch.Tensor, residual: torch.Tensor, w: dict, prefix: str) -> torch.Tensor:
    """residual + attention(x), then + mlp(post_norm(.)): a Llama layer from its
    attention input, causal over positions 0..T-1, GQA."""
    tokens, positions = x.shape[0], torch.arange(x.shape[0])
    q = rotate((x @ w[f"{prefix}.self_attn.q_proj.weight"].T).view(tokens, HEADS, HEAD_DIM), positions)
    k = rotate((x @ w[f"{prefix}.self_attn.k_proj.weight"].T).view(tokens, KV_HEADS, HEAD_DIM), positions)
    v = (x @ w[f"{prefix}.self_attn.v_proj.weight"].T).view(tokens, KV_HEADS, HEAD_DIM)
    k, v = (t.repeat_interleave(HEADS // KV_HEADS, dim=1) for t in (k, v))
    scores = torch.einsum("qhd,khd->hqk", q, k) / HEAD_DIM**0.5
    scores = scores + torch.full((tokens, tokens), float("-inf")).triu(1)
    attended = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(tokens, HEADS * HEAD_DIM)
    r = residual + attended @ w[f"{prefix}.self_attn.o_proj.weight"].T
    h = rms_norm(r, w[f"{prefix}.post_attention_layernorm.weight"])
    gate, up = h @ w[f"{prefix}.mlp.gate_proj.weight"].T, h @ w[f"{prefix}.mlp.up_proj.weight"].T
    return r + (torch.nn.functional.silu(gate) * up) @ w[f"{prefix}.mlp.down_proj.weight"].T


def target_states(target_dir, prompt: list[int]):
    """transformers' view of the target after `prompt`: (the residual stream entering
    each layer, then the final normed hidden states; the greedy next token; its tensors)."""
    from transformers import LlamaForCausalLM

    target = LlamaForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    with torch.inference_mode():
        states = target.model(torch.tensor([prompt]), output_hidden_states=True).hidden_states
    states = [s[0] for s in states]
    tensors = load_file(target_dir / "model.safetensors")
    next_token = int((states[-1][-1] @ tensors["lm_head.weight"].T).argmax())
    return states, next_token, tensors


def reference_eagle_first_draft(target_dir, head_dir, prompt: list[int]) -> int:
    """EAGLE-1: x = fc(concat(embed(t_{i+1}), h_i)), the layer without an input norm,
    h' = its output plus residual, the target's head over h' of the last row."""
    states, next_token, target = target_states(target_dir, prompt)
    w = torch.load(head_dir / "pytorch_model.bin", weights_only=True)
    embeds = target["model.embed_tokens.weight"][torch.tensor(prompt[1:] + [next_token])]
    x = torch.cat([embeds, states[-1]], -1) @ w["fc.weight"].T + w["fc.bias"]
    out = layer_after_attention_input(x, x, w, "layers.0")
    return int((out[-1] @ target["lm_head.weight"].T).argmax())


def reference_eagle3_first_draft(target_dir, head_dir, prompt: list[int]) -> int:
    """EAGLE-3: g = fc(features entering layers 2, 4, 5), x = concat(input_norm(embed),
    hidden_norm(g)), the layer from x with residual g, the head over norm(h') of the last
    row in the draft vocabulary, mapped to the target's by d2t."""
    states, next_token, target = target_states(target_dir, prompt)
    w = load_file(head_dir / "model.safetensors")
    g = torch.cat([states[2], states[LAYERS // 2], states[LAYERS - 3]], -1) @ w["fc.weight"].T
    embeds = target["model.embed_tokens.weight"][torch.tensor(prompt[1:] + [next_token])]
    x = torch.cat([rms_norm(embeds, w["midlayer.input_layernorm.weight"]), rms_norm(g, w["midlayer.hidden_norm.weight"])], -1)
    out = layer_after_attention_input(x, g, w, "midlayer")
    draft = int((rms_norm(out[-1], w["norm.weight"]) @ w["lm_head.weight"].T).argmax())
    return draft + int(w["d2t"][draft])


def token_ids(llm, prompts=PROMPTS, max_tokens: int = 24) -> list[list[int]]:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [output.outputs[0].token_ids for output in outputs]


def first_draft(llm, prompt: list[int]) -> list[int]:
    """The drafts the engine holds after the step that runs `prompt` and samples its first token."""
    engine = llm.llm_engine
    engine.add_request("first-draft", {"prompt_token_ids": prompt}, SamplingParams(max_tokens=8, temperature=0.0))
    engine.step()
    (request,) = engine.scheduler.requests.values()
    drafts = list(request.spec_token_ids)
    engine.abort_request("first-draft")
    return drafts


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_greedy_outputs_equal_those_without_speculation(method, eagle_target_dir, eagle_dir, eagle3_dir, make_llm):
    head = {"eagle": eagle_dir, "eagle3": eagle3_dir}[method]
    config = {"method": method, "model": str(head), "num_speculative_tokens": 3}
    llm = make_llm(eagle_target_dir, speculative_config=config, **ENGINE)
    assert token_ids(llm) == token_ids(make_llm(eagle_target_dir, **ENGINE))
    assert llm.llm_engine.stats.spec_decode_num_draft_tokens > 0


def test_greedy_outputs_equal_under_chunked_prefill(eagle_target_dir, eagle3_dir, make_llm):
    # 16 tokens a step: the head's KV (and the target's features) of each chunk land after the chunk.
    config = {"method": "eagle3", "model": str(eagle3_dir), "num_speculative_tokens": 3}
    llm = make_llm(eagle_target_dir, speculative_config=config, max_num_batched_tokens=16, **ENGINE)
    assert token_ids(llm) == token_ids(make_llm(eagle_target_dir, **ENGINE))


def test_the_first_eagle_drafts_are_the_formula_of_the_checkpoint(eagle_target_dir, eagle_dir, make_llm):
    llm = make_llm(eagle_target_dir, speculative_config={"method": "eagle", "model": str(eagle_dir),
                                                         "num_speculative_tokens": 3}, **ENGINE)
    drafts = [first_draft(llm, prompt)[0] for prompt in PROMPTS]
    assert drafts == [reference_eagle_first_draft(eagle_target_dir, eagle_dir, prompt) for prompt in PROMPTS]


def test_the_first_eagle3_drafts_are_the_formula_of_the_checkpoint(eagle_target_dir, eagle3_dir, make_llm):
    llm = make_llm(eagle_target_dir, speculative_config={"method": "eagle3", "model": str(eagle3_dir),
                                                         "num_speculative_tokens": 3}, **ENGINE)
    drafts = [first_draft(llm, prompt)[0] for prompt in PROMPTS]
    expected = [reference_eagle3_first_draft(eagle_target_dir, eagle3_dir, prompt) for prompt in PROMPTS]
    # Only ids of the draft vocabulary (odd ones here) can be drafted.
    assert drafts == expected and all(token % 2 == 1 for token in expected)


def test_profile_run_runs_the_eagle3_head_over_every_profiled_tokens_features(eagle_target_dir, eagle3_dir):
    # profile_run's batch: 48 tokens over 4 sequences; the head reads three layers' features of each.
    config = {"method": "eagle3", "model": str(eagle3_dir), "num_speculative_tokens": 3}
    worker = profile_worker(eagle_target_dir, config, max_num_seqs=4, token_budget=48)
    head = worker.runner.drafter.layer
    features, calls = Calls(head, "target_features"), Calls(head)
    worker.determine_num_blocks(48)
    assert features.shapes(0) == [(48, 3 * HIDDEN)]
    assert calls.shapes(0) == [(48,)]  # input_ids


class _NotATensor:
    """An object a state dict has no business holding."""


def test_a_pickled_head_holding_other_objects_is_refused_unopened(eagle_target_dir, eagle_dir, tmp_path):
    from accord import LLM

    directory = tmp_path / "bad_eagle"
    directory.mkdir()
    (directory / "config.json").write_text((eagle_dir / "config.json").read_text())
    torch.save({"fc.weight": _NotATensor()}, directory / "pytorch_model.bin")
    config = {"method": "eagle", "model": str(directory), "num_speculative_tokens": 3}
    with pytest.raises(ValueError, match=r"pytorch_model.bin: not a state dict torch.load\(weights_only=True\) can read"):
        LLM(model=str(eagle_target_dir), backend="cpu", speculative_config=config, **ENGINE)


def test_a_head_of_another_hidden_size_is_refused(eagle_target_dir, eagle_dir, tmp_path):
    from accord import LLM

    directory = tmp_path / "wide_eagle"
    directory.mkdir()
    raw = json.loads((eagle_dir / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**raw, "hidden_size": 2 * HIDDEN}))
    (directory / "pytorch_model.bin").symlink_to(eagle_dir / "pytorch_model.bin")
    config = {"method": "eagle", "model": str(directory), "num_speculative_tokens": 3}
    with pytest.raises(ValueError, match="the head's hidden_size is 128 but the target's hidden size is 64"):
        LLM(model=str(eagle_target_dir), backend="cpu", speculative_config=config, **ENGINE)
