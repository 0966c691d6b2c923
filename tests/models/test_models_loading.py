"""load_model on Hugging Face directories: what it accepts (shards, dtypes, tied heads,
cache layouts) and the clear errors for what it refuses."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from accord.backends import get_backend
from accord.core.worker.attention import KVCacheSpec
from accord.core.model_loader.hf_checkpoint import CheckpointError
from accord.core.model_loader.load import load_model
from accord.core.models import UnsupportedArchitectureError, supported_architectures
from accord.op_contracts import OpDispatcher
from tiny_models import build_tiny_model, fixed_prompt
from single_sequence import SingleSequenceRunner


@pytest.fixture(scope="module")
def ops() -> OpDispatcher:
    return OpDispatcher(get_backend("reference"), strict=True)


@pytest.fixture
def llama_copy(checkpoint, tmp_path: Path) -> Path:
    """A private copy of the tiny Llama checkpoint that a test may edit."""
    return Path(shutil.copytree(checkpoint("llama"), tmp_path / "llama"))


def edit_config(directory: Path, **changes) -> None:
    path = directory / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def edit_tensors(directory: Path, edit) -> None:
    path = directory / "model.safetensors"
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


def test_unsupported_architecture_is_refused_with_the_supported_list(llama_copy, ops):
    edit_config(llama_copy, architectures=["GPT2LMHeadModel"])
    with pytest.raises(UnsupportedArchitectureError, match="GPT2LMHeadModel") as error:
        load_model(llama_copy, ops)
    assert all(name in str(error.value) for name in supported_architectures())


def test_remote_code_architecture_is_refused_without_running_it(llama_copy, ops):
    edit_config(llama_copy, architectures=["MyModelForCausalLM"], auto_map={"AutoModelForCausalLM": "m.MyModel"})
    with pytest.raises(UnsupportedArchitectureError, match="never run"):
        load_model(llama_copy, ops)


def test_missing_tensor_is_named(llama_copy, ops):
    edit_tensors(llama_copy, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(CheckpointError, match=r"'model\.layers\.1\.mlp\.up_proj\.weight'.*missing"):
        load_model(llama_copy, ops)


def test_unexpected_tensor_is_named(llama_copy, ops):
    edit_tensors(llama_copy, lambda t: t.update({"model.layers.0.extra.weight": torch.zeros(2)}))
    with pytest.raises(CheckpointError, match=r"unexpected tensors.*model\.layers\.0\.extra\.weight"):
        load_model(llama_copy, ops)


def test_shape_mismatch_names_the_tensor_and_both_shapes(llama_copy, ops):
    edit_tensors(llama_copy, lambda t: t.update({"model.norm.weight": torch.ones(65)}))
    with pytest.raises(CheckpointError, match=r"'model\.norm\.weight' has shape \(65,\).*\(64,\)"):
        load_model(llama_copy, ops)


class _Tripwire:
    """Unpickling this touches a file: proof that a loader ran pickle."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (Path.touch, (self.path,))


def test_pickle_checkpoint_is_refused_and_never_unpickled(llama_copy, ops, tmp_path):
    tripwire = tmp_path / "unpickled"
    (llama_copy / "model.safetensors").unlink()
    (llama_copy / "pytorch_model.bin").write_bytes(pickle.dumps(_Tripwire(tripwire)))
    with pytest.raises(CheckpointError, match=r"pytorch_model\.bin.*refused"):
        load_model(llama_copy, ops)
    assert not tripwire.exists()


def test_missing_config_is_a_clear_error(llama_copy, ops):
    (llama_copy / "config.json").unlink()
    with pytest.raises(CheckpointError, match="config.json is missing"):
        load_model(llama_copy, ops)


def test_missing_shard_is_named(tmp_path, ops):
    build_tiny_model("llama").save_pretrained(tmp_path, max_shard_size="100KB")
    shard = sorted(tmp_path.glob("model-*.safetensors"))[-1]
    shard.unlink()
    with pytest.raises(CheckpointError, match=shard.name):
        load_model(tmp_path, ops)


def test_sharded_checkpoint_gives_the_single_file_logits(checkpoint, tmp_path, ops):
    build_tiny_model("llama").save_pretrained(tmp_path, max_shard_size="100KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    logits = [
        SingleSequenceRunner(load_model(d, ops).model, 64).step(fixed_prompt()) for d in (tmp_path, checkpoint("llama"))
    ]
    torch.testing.assert_close(logits[0], logits[1], rtol=0, atol=0)


def test_auto_dtype_follows_config_then_compute_dtype(llama_copy, ops):
    edit_config(llama_copy, dtype="bfloat16")
    assert load_model(llama_copy, ops).config.dtype == torch.bfloat16
    loaded = load_model(llama_copy, ops, compute_dtype=lambda d: torch.float32)
    assert loaded.config.dtype == torch.float32
    assert loaded.model.embedding.table.dtype == torch.float32


def test_tied_embeddings_share_the_embedding_as_head(checkpoint, ops):
    model = load_model(checkpoint("qwen2"), ops).model
    # The head keeps only the backend's form of its rows: compare what it computes.
    table = model.embedding.table.weight
    hidden = torch.randn(3, table.shape[1], dtype=table.dtype)
    torch.testing.assert_close(model.head.local(hidden), torch.nn.functional.linear(hidden, table))


def test_gqa_models_ask_for_key_and_value_caches_per_layer(checkpoint, ops):
    assert load_model(checkpoint("llama"), ops).model.kv_cache_specs() == [KVCacheSpec("gqa", 2, 16)] * 2


def test_deepseek_asks_for_one_latent_cache_per_layer(checkpoint, ops):
    # kv_lora_rank 32 + qk_rope_head_dim 8 per token, no separate value cache.
    assert load_model(checkpoint("deepseek_v3"), ops).model.kv_cache_specs() == [KVCacheSpec("mla", 1, 40)] * 2


def test_unknown_dtype_is_refused(checkpoint, ops):
    with pytest.raises(ValueError, match="float64"):
        load_model(checkpoint("llama"), ops, dtype="float64")


def test_deepseek_next_token_prediction_layers_are_left_unread(checkpoint, tmp_path, ops):
    directory = Path(shutil.copytree(checkpoint("deepseek_v3"), tmp_path / "deepseek"))
    # Real DeepSeek-V3 checkpoints carry an MTP layer numbered num_hidden_layers.
    edit_tensors(directory, lambda t: t.update({"model.layers.2.eh_proj.weight": torch.zeros(64, 128)}))
    assert load_model(directory, ops).config.num_layers == 2
