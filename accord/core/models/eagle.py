"""EAGLE and EAGLE-3 draft heads for a Llama-family target, loaded from the public
checkpoint layouts (EAGLE, Li et al. 2024; EAGLE-3, 2025; the layouts vLLM's
llama_eagle and llama_eagle3 read). Both run at position i on the target's token
t_{i+1} and a hidden state h_i, the way DeepSeek's MTP layer does, and continue from
their own output when they draft on.

EAGLE-1 (`fc.weight` [H, 2H] (+ `fc.bias`), `layers.{j}.*` Llama decoder layers, the
first without its input norm); the target's embedding and head are used, the
checkpoint's `embed_tokens` is not read:
    x = fc(concat(embed(t_{i+1}), h_i))        h_i: the target's final (normed) hidden state
    h' = layers(x) + residual                  (no final norm)
    logits = lm_head(h')                       (the target's head)

EAGLE-3 (`fc.weight` [H, 3H_target], `midlayer.*` with `hidden_norm` beside
`input_layernorm` and q/k/v over 2H, `norm`, `lm_head` over a draft vocabulary,
`d2t` its offsets into the target's, `t2d` not read; its own `embed_tokens` if it has
one, else the target's):
    g_i = fc(concat(a_i, b_i, c_i))            the target's residual stream entering three layers
    x = concat(input_layernorm(embed(t_{i+1})), hidden_norm(g_i))
    r = g_i + attention(x);  h' = r + mlp(post_attention_layernorm(r))
    logits[d + d2t[d]] = lm_head(norm(h'))[d]  (every other target id: -inf)
Drafts after the first read h' where the first read g_i.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ...op_contracts import OpDispatcher
from ..distributed.sharding import WHOLE
from ..model_loader.hf_checkpoint import CheckpointError, read_json
from ..model_loader.model_config import ModelConfig
from ..model_loader.torch_bin import head_checkpoint
from ..worker.attention import AttentionMetadata, KVCacheSpec, LayerKVCache
from .causal_lm import CausalLM, DecoderLayer, routed_experts
from .layers import DenseLinear, GatedMLP, GQAAttention, Linear, RMSNorm, RotaryEmbedding
from .layers.mlp import RoutedExperts
from .layers.parallel import VocabParallelEmbedding
from .weights import WeightLoader


class _Unnormed:
    """EAGLE-1's first layer has no input norm: fc's output enters attention as it is."""

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> Any:
        return x if residual is None else (x + residual, x + residual)


class EagleHead:
    """An EAGLE-1 head: fc over (embedding, hidden state), then Llama decoder layers."""

    #: The target's layers whose input residual stream the head reads (none: its final hidden states).
    feature_layers: tuple[int, ...] = ()

    def __init__(self, target: CausalLM, fc: Linear, layers: Sequence[DecoderLayer]) -> None:
        self.target = target
        self.fc = fc
        self.layers = list(layers)

    def kv_cache_specs(self) -> list[KVCacheSpec]:
        """One GQA cache per decoder layer."""
        return [layer.attention.kv_cache_spec() for layer in self.layers]

    def target_features(self, hidden: torch.Tensor) -> torch.Tensor:
        """The hidden state h_i the head reads from the target's final hidden states (as they are)."""
        return hidden

    def moe_blocks(self) -> list[RoutedExperts]:
        """The routed experts of its decoder layers (a Llama head's are dense: none)."""
        return routed_experts(self.layers)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, previous_hidden: torch.Tensor,
                attn: AttentionMetadata, kv_caches: Sequence[LayerKVCache]) -> torch.Tensor:
        """h' [T, H] of the tokens `input_ids` (t_{i+1}) after `previous_hidden` (h_i) at `positions` (i)."""
        hidden = self.fc(torch.cat([self.target.embedding(input_ids), previous_hidden], dim=-1))
        residual = None
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            hidden, residual = layer(positions, hidden, residual, attn, kv_cache)
        return hidden + residual

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits [N, V] fp32 of the next draft: the target's head over h' (no norm, as trained)."""
        return self.target.compute_logits(hidden)


class Eagle3Head:
    """An EAGLE-3 head: fc over three of the target's layer features, one decoder layer
    over (normed embedding, normed feature), its own head over a draft vocabulary."""

    def __init__(
        self, embedding: VocabParallelEmbedding, fc: Linear, input_norm: RMSNorm, hidden_norm: RMSNorm,
        attention: GQAAttention, post_attention_norm: RMSNorm, mlp: GatedMLP, norm: RMSNorm, head: DenseLinear,
        draft_to_target: torch.Tensor | None, vocab_size: int, feature_layers: tuple[int, ...],
    ) -> None:
        self.embedding = embedding
        self.fc = fc
        self.input_norm = input_norm
        self.hidden_norm = hidden_norm
        self.attention = attention
        self.post_attention_norm = post_attention_norm
        self.mlp = mlp
        self.norm = norm
        self.head = head
        #: Each draft id's target id (None: the draft vocabulary is the target's).
        self.draft_to_target = draft_to_target
        self.vocab_size = vocab_size
        #: The target's layers whose input residual stream fc reads, in fc's order.
        self.feature_layers = feature_layers

    def kv_cache_specs(self) -> list[KVCacheSpec]:
        """The one layer's GQA cache."""
        return [self.attention.kv_cache_spec()]

    def target_features(self, features: torch.Tensor) -> torch.Tensor:
        """g_i = fc(concat(a_i, b_i, c_i)) from the target's features [T, 3H_target]."""
        return self.fc(features)

    def moe_blocks(self) -> list[RoutedExperts]:
        """None: its one layer's MLP is dense."""
        return []

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, previous_hidden: torch.Tensor,
                attn: AttentionMetadata, kv_caches: Sequence[LayerKVCache]) -> torch.Tensor:
        """h' [T, H] (before the final norm) of `input_ids` (t_{i+1}) after `previous_hidden` at `positions`."""
        x = torch.cat([self.input_norm(self.embedding(input_ids)), self.hidden_norm(previous_hidden)], dim=-1)
        hidden = self.attention(positions, x, attn, kv_caches[0])
        hidden, residual = self.post_attention_norm(hidden, previous_hidden)
        return self.mlp(hidden) + residual

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits [N, V] fp32 over the target's vocabulary: the head's over norm(h') at
        each draft id's target id, -inf at ids outside the draft vocabulary."""
        logits = self.head(self.norm(hidden))
        if self.draft_to_target is None:
            return logits
        full = logits.new_full((logits.shape[0], self.vocab_size), float("-inf"))
        full[:, self.draft_to_target] = logits
        return full


def load_eagle_head(method: str, model_dir: str | Path, ops: OpDispatcher, dtype: torch.dtype,
                    target: CausalLM, target_config: ModelConfig) -> EagleHead | Eagle3Head:
    """The head in `model_dir` (config.json, then model.safetensors or a pickled
    pytorch_model.bin) for speculative_config method `method` ("eagle" or "eagle3"), in
    `dtype` on the target's device, checked against the target's sizes."""
    directory = Path(model_dir)
    if not directory.is_dir():
        raise CheckpointError(f"speculative_config.model {str(model_dir)!r}: not a directory")
    raw = read_json(directory, "config.json")
    # A head's config.json is a Llama config (EAGLE-3's names its own architecture).
    config = ModelConfig.from_hf({**raw, "architectures": ["LlamaForCausalLM"],
                                  "vocab_size": raw.get("vocab_size") or target_config.vocab_size})
    weights = WeightLoader(head_checkpoint(directory), ops, dtype, torch.device(ops.backend.device_type))
    # The head runs at the target's positions, which may pass the head's own limit.
    max_positions = max(config.max_position_embeddings, target_config.max_position_embeddings)
    rotary = RotaryEmbedding(ops, config.rope, max_positions, weights.device)
    if method == "eagle":
        _check_size(directory, "hidden_size", config.hidden_size, target_config.hidden_size)
        head: EagleHead | Eagle3Head = _load_eagle(weights, config, target, rotary)
        ignored = ("embed_tokens.weight",)
    else:
        head = _load_eagle3(weights, config, raw, target, target_config, rotary)
        ignored = ("t2d",)
    weights.finish(lambda name: name in ignored or name.endswith("rotary_emb.inv_freq"))
    return head


def _load_eagle(weights: WeightLoader, config: ModelConfig, target: CausalLM, rotary: RotaryEmbedding) -> EagleHead:
    hidden = config.hidden_size
    fc = weights.linear(["fc"], 2 * hidden, [hidden], bias="fc.bias" in weights.checkpoint)
    layers = []
    for index in range(config.num_layers):
        prefix, eps = f"layers.{index}", config.rms_norm_eps
        input_norm = _Unnormed() if index == 0 else RMSNorm(
            weights.ops, weights.tensor(f"{prefix}.input_layernorm.weight", (hidden,)), eps)
        post_norm = RMSNorm(weights.ops, weights.tensor(f"{prefix}.post_attention_layernorm.weight", (hidden,)), eps)
        attention = GQAAttention.load(weights, f"{prefix}.self_attn", config, index, rotary)
        mlp = GatedMLP.load(weights, f"{prefix}.mlp", hidden, config.intermediate_size)
        layers.append(DecoderLayer(input_norm, attention, post_norm, mlp))  # type: ignore[arg-type]
    return EagleHead(target, fc, layers)


def _load_eagle3(weights: WeightLoader, config: ModelConfig, raw: dict[str, Any], target: CausalLM,
                 target_config: ModelConfig, rotary: RotaryEmbedding) -> Eagle3Head:
    hidden, eps, vocab = config.hidden_size, config.rms_norm_eps, target_config.vocab_size
    directory = weights.checkpoint.model_dir
    _check_size(directory, "target_hidden_size", raw.get("target_hidden_size") or hidden, target_config.hidden_size)
    if "embed_tokens.weight" in weights.checkpoint:
        embedding = VocabParallelEmbedding(weights.embedding("embed_tokens.weight", (vocab, hidden), WHOLE), 0, None)
    else:
        _check_size(directory, "hidden_size", hidden, target_config.hidden_size)
        embedding = target.embedding
    layers = target_config.num_layers
    # vLLM's key for a head's own choice; its default otherwise.
    feature_layers = tuple(raw.get("eagle_aux_hidden_state_layer_ids") or (2, layers // 2, layers - 3))
    if not all(0 <= layer < layers for layer in feature_layers):
        raise CheckpointError(
            f"{directory}: the head reads the target's layers {list(feature_layers)}, but the target has {layers}"
        )
    fc = weights.linear(["fc"], len(feature_layers) * target_config.hidden_size, [hidden])

    def norm(name: str) -> RMSNorm:
        return RMSNorm(weights.ops, weights.tensor(f"{name}.weight", (hidden,)), eps)

    attention = GQAAttention.load(weights, "midlayer.self_attn", config, 0, rotary, input_size=2 * hidden)
    mlp = GatedMLP.load(weights, "midlayer.mlp", hidden, config.intermediate_size)
    draft_vocab = int(raw.get("draft_vocab_size") or vocab)
    head = DenseLinear(weights.ops, weights.tensor("lm_head.weight", (draft_vocab, hidden)), out_dtype=torch.float32)
    draft_to_target = None
    if "d2t" in weights.checkpoint:
        offsets = weights.tensor("d2t", (draft_vocab,), dtype=torch.int64)
        draft_to_target = torch.arange(draft_vocab, device=offsets.device) + offsets
        if int(draft_to_target.max()) >= vocab or int(draft_to_target.min()) < 0:
            raise CheckpointError(f"{directory}: d2t maps a draft id outside the target's {vocab} tokens")
    elif draft_vocab != vocab:
        raise CheckpointError(f"{directory}: a draft vocabulary of {draft_vocab} tokens needs d2t, which is missing")
    return Eagle3Head(embedding, fc, norm("midlayer.input_layernorm"), norm("midlayer.hidden_norm"), attention,
                      norm("midlayer.post_attention_layernorm"), mlp, norm("norm"), head, draft_to_target, vocab,
                      feature_layers)


def _check_size(directory: Path, key: str, head: int, target: int) -> None:
    if head != target:
        raise CheckpointError(
            f"{directory}: the head's {key} is {head} but the target's hidden size is {target}; "
            "is this head trained for the target model?"
        )
