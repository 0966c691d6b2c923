"""The fp8 KV cache's per-layer scales: read from the checkpoint under vLLM's and
compressed-tensors' names, used by the cache write and attention (a model whose values
exceed e4m3's range tracks the unquantised cache closer with its scales than with 1.0),
and calibrated at start-up to amax / 448 of the keys and values that
transformers computes from the same tokens."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from accord import LLM
from accord.backends import get_backend
from accord.core.model_loader.load import load_model
from accord.core.models.layers.kv_scales import KVScales
from accord.core.worker import kv_calibration
from accord.demo.tokenizer import build_demo_tokenizer
from accord.op_contracts import OpDispatcher
from single_sequence import SingleSequenceRunner
from tiny_models import build_tiny_model, fixed_prompt, load_transformers

BACKENDS = ("reference", "cpu")
E4M3_MAX = 448.0
#: v_proj scaled so |v| reaches the thousands, far past e4m3's 448. (Keys that large
#: would make each softmax one-hot, so a random model's logits turn chaotic under any
#: rounding of the keys: the values are where saturation shows cleanly.)
V_GAIN = 2000.0
LAYERS = 2


def save_large_kv_llama(directory: Path) -> Path:
    """The tiny Llama in fp32 with its values scaled past the fp8 range."""
    model = build_tiny_model("llama")
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.v_proj.weight.mul_(V_GAIN)
    model.save_pretrained(directory)
    return directory


def transformers_kv_amax(directory: Path, token_ids: list[int]) -> list[tuple[float, float]]:
    """(amax |k| after rotary, amax |v|) per layer, recomputed with transformers' own
    modules from each layer's input hidden states."""
    model = load_transformers(directory, torch.float64)
    ids = torch.tensor([token_ids])
    positions = torch.arange(len(token_ids))[None]
    with torch.no_grad():
        hidden_states = model(ids, output_hidden_states=True).hidden_states
        result = []
        for layer, hidden in zip(model.model.layers, hidden_states):
            attn, normed = layer.self_attn, layer.input_layernorm(hidden)
            shape = (1, len(token_ids), -1, attn.head_dim)
            k = attn.k_proj(normed).view(shape).transpose(1, 2)
            v = attn.v_proj(normed)
            cos, sin = model.model.rotary_emb(hidden, positions)
            _, k = apply_rotary_pos_emb(k, k, cos, sin)
            result.append((k.abs().max().item(), v.abs().max().item()))
    return result


def with_scale_tensors(source: Path, directory: Path, tensors: dict[str, torch.Tensor]) -> Path:
    """A copy of checkpoint `source` with `tensors` added to its safetensors."""
    directory.mkdir(parents=True, exist_ok=True)
    for item in source.iterdir():
        if item.suffix != ".safetensors":
            (directory / item.name).write_bytes(item.read_bytes())
    state = load_file(source / "model.safetensors")
    save_file({**state, **tensors}, directory / "model.safetensors", metadata={"format": "pt"})
    return directory


def layer_scales(model) -> list[KVScales]:
    return [layer.attention.kv_scales for layer in model.layers]


@pytest.fixture(scope="module")
def large_kv(tmp_path_factory) -> Path:
    return save_large_kv_llama(tmp_path_factory.mktemp("large_kv"))


@pytest.fixture(scope="module")
def scaled_checkpoint(large_kv: Path, tmp_path_factory) -> tuple[Path, list[tuple[float, float]]]:
    """The large-K/V model with per-layer k_scale/v_scale tensors (vLLM's names): amax
    over the test's prompt, measured with transformers, over 448 with 25% headroom for
    the decoded tokens."""
    amax = transformers_kv_amax(large_kv, fixed_prompt())
    scales = [(1.25 * k / E4M3_MAX, 1.25 * v / E4M3_MAX) for k, v in amax]
    tensors = {}
    for i, (k, v) in enumerate(scales):
        tensors[f"model.layers.{i}.self_attn.k_scale"] = torch.tensor(k, dtype=torch.float32)
        tensors[f"model.layers.{i}.self_attn.v_scale"] = torch.tensor(v, dtype=torch.float32)
    return with_scale_tensors(large_kv, tmp_path_factory.mktemp("kv_scales"), tensors), scales


def run_prompt(model, cache_dtype: torch.dtype | None) -> tuple[torch.Tensor, list[int]]:
    """Prompt logits and 8 greedy tokens, on a KV cache of `cache_dtype` (None: the model's)."""
    runner = SingleSequenceRunner(model, max_tokens=96)
    if cache_dtype is not None:
        runner.kv_caches = [tuple(torch.zeros_like(c, dtype=cache_dtype) for c in cache) for cache in runner.kv_caches]
    return runner.generate(fixed_prompt(), 8)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_checkpoints_k_and_v_scales_are_the_ones_each_layer_uses(backend: str, scaled_checkpoint) -> None:
    directory, written = scaled_checkpoint
    model = load_model(directory, OpDispatcher(get_backend(backend))).model
    read = [value for s in layer_scales(model) for value in (s.k_scale, s.v_scale)]
    assert read == pytest.approx([value for pair in written for value in pair], rel=1e-6)
    assert {s.source for s in layer_scales(model)} == {"checkpoint"}


def test_an_older_single_kv_scale_serves_keys_and_values(large_kv: Path, tmp_path: Path) -> None:
    tensors = {f"model.layers.{i}.self_attn.kv_scale": torch.tensor([0.5 + i]) for i in range(LAYERS)}
    directory = with_scale_tensors(large_kv, tmp_path / "kv_scale", tensors)
    model = load_model(directory, OpDispatcher(get_backend("reference"))).model
    assert [(s.k_scale, s.v_scale) for s in layer_scales(model)] == [(0.5, 0.5), (1.5, 1.5)]


def test_per_head_kv_scales_are_refused_by_name(large_kv: Path, tmp_path: Path) -> None:
    tensors = {}
    for i in range(LAYERS):  # compressed-tensors' attn_head strategy: one scale per KV head
        tensors[f"model.layers.{i}.self_attn.k_scale"] = torch.ones(2, 1, 1)
        tensors[f"model.layers.{i}.self_attn.v_scale"] = torch.ones(2, 1, 1)
    directory = with_scale_tensors(large_kv, tmp_path / "per_head", tensors)
    with pytest.raises(Exception, match=r"model\.layers\.0\.self_attn\.k_scale.*per-tensor"):
        load_model(directory, OpDispatcher(get_backend("reference")))


def test_a_checkpoint_with_only_k_scale_is_refused(large_kv: Path, tmp_path: Path) -> None:
    tensors = {f"model.layers.{i}.self_attn.k_scale": torch.tensor(1.0) for i in range(LAYERS)}
    directory = with_scale_tensors(large_kv, tmp_path / "k_only", tensors)
    with pytest.raises(ValueError, match="only one of k_scale and v_scale"):
        load_model(directory, OpDispatcher(get_backend("reference")))


@pytest.mark.parametrize("backend", BACKENDS)
def test_checkpoint_scales_keep_an_fp8_cache_closer_to_the_fp32_cache_than_scale_one(
    backend: str, scaled_checkpoint
) -> None:
    directory, _ = scaled_checkpoint
    ops = OpDispatcher(get_backend(backend))
    fp8 = ops.backend.fp8_dtype()
    model = load_model(directory, ops, dtype=torch.float32).model
    exact_logits, exact_tokens = run_prompt(model, None)
    scaled_logits, scaled_tokens = run_prompt(model, fp8)
    for layer in model.layers:
        layer.attention.kv_scales = KVScales()
    unit_logits, _ = run_prompt(model, fp8)
    scaled_error = (scaled_logits - exact_logits).abs().mean()
    unit_error = (unit_logits - exact_logits).abs().mean()
    # Scale 1.0 saturates every |v| > 448; with the checkpoint's scales only e4m3's
    # rounding is left (3 mantissa bits). Measured: ~0.02 against ~0.4.
    assert scaled_error < unit_error / 4, (scaled_error, unit_error)
    assert scaled_tokens == exact_tokens


@pytest.mark.parametrize("backend", BACKENDS)
def test_calibrated_scales_are_amax_over_448_of_the_calibration_batchs_keys_and_values(
    backend: str, large_kv: Path, tmp_path: Path
) -> None:
    max_model_len = 256
    build_demo_tokenizer().save(str(tmp_path / "tokenizer.json"))  # the engine needs one; calibration does not
    llm = LLM(
        model=str(large_kv), tokenizer=str(tmp_path), backend=backend, max_model_len=max_model_len, num_gpu_blocks_override=32,
        kv_cache_dtype="fp8", calculate_kv_scales=True, enforce_eager=True,
    )
    try:
        model = llm.llm_engine.executor.driver_worker.runner.model
        tokens = kv_calibration.calibration_tokens(model.config.vocab_size, max_model_len)[0].tolist()
        expected = [amax / E4M3_MAX for pair in transformers_kv_amax(large_kv, tokens) for amax in pair]
        scales = layer_scales(model)
        assert [value for s in scales for value in (s.k_scale, s.v_scale)] == pytest.approx(expected, rel=1e-4)
        assert {s.source for s in scales} == {"calibrated"}
    finally:
        llm.llm_engine.shutdown()
