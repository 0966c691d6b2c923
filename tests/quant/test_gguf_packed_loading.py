"""GGUF linear weights load packed: every decoder-layer projection of a tiny llama file
(written by the test with gguf-py's writer) is a QuantLinear over the file's own blocks,
holding exactly the file's bytes for them; a rank's shard is whole rows of blocks, or
columns where they fall on block edges; and the packed model generates the dequantised
path's greedy tokens, with logprobs within LOGPROB_BOUND of it, up to the first step
where the dequantised path's choice is a near tie (its top two within TIE_MARGIN)."""

from __future__ import annotations

from pathlib import Path

import gguf
import gguf_files
import numpy as np
import pytest
import torch
from gguf_files import Q, build_model, write_gguf
from test_gguf_read_slice import COLS, DOWN, HEADS, KV_HEADS, Q_PROJ, write_matrices

from accord import LLM, SamplingParams
from accord.backends import get_backend
from accord.core.model_loader.gguf.checkpoint import GgufCheckpoint
from accord.core.model_loader.gguf.reader import open_gguf
from accord.core.model_loader.gguf.source import PACKED_ENV
from accord.core.model_loader.load import load_model
from accord.core.quantization import ConcatenatedLinear, QuantEmbedding, QuantLinear
from accord.core.worker.contract_ops import worker_contract_ops
from accord.op_contracts import OpDispatcher
from accord.op_contracts.contracts.quant import QUANTISED_ACTIVATIONS

PROMPT = [256, 257, 10, 70, 71, 72, 73, 100, 101, 3, 4, 5]
NEW_TOKENS = 8
#: |packed - dequantised| per sampled token's logprob: the packed kernels quantise
#: activations to int8 per 32 (ggml's Q8), prefill's 12 rows included (the token tile),
#: which the dequantised fp32 path does not (measured up to 0.06 on Q8_0).
LOGPROB_BOUND = 0.1
#: A dequantised step whose top two logprobs are this close is a tie that int8
#: activations may break either way: the tiny random model's next-token distribution is
#: nearly flat (top logprobs near -2.3), and on Q4_0 its second token's top two are 0.007
#: apart. The comparison ends at the first such step.
TIE_MARGIN = 2 * LOGPROB_BOUND


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    """`tiny(type, mixed)`: a tiny llama GGUF with its matrices in `type`; `mixed` stores
    v and down projections in Q6_K instead, as llama.cpp's Q4_K_M does for some layers."""
    files: dict[tuple[Q, bool], Path] = {}

    def get(tensor_type: Q, mixed: bool = False) -> Path:
        key = (tensor_type, mixed)
        if key not in files:
            path = tmp_path_factory.mktemp("packed") / f"tiny-{tensor_type.name}{'-mixed' * mixed}.gguf"
            with pytest.MonkeyPatch.context() as patch:
                if mixed:
                    patch.setattr(gguf_files, "add_matrix", _q6_k_for_v_and_down(gguf_files.add_matrix))
                files[key] = write_gguf(path, build_model("llama"), "llama", tensor_type)
        return files[key]

    return get


def _q6_k_for_v_and_down(add_matrix):
    def add(writer, name, data, tensor_type, rng):
        wanted = Q.Q6_K if name.endswith(("attn_v.weight", "ffn_down.weight")) else tensor_type
        add_matrix(writer, name, data, wanted, rng)

    return add


def projections(model) -> list:
    return [linear for layer in model.layers for linear in (
        layer.attention.qkv, layer.attention.o_proj, layer.feed_forward.gate_up, layer.feed_forward.down)]


def test_every_layer_projection_holds_the_file_s_blocks(tiny) -> None:
    path = tiny(Q.Q4_K)
    model = load_model(path, OpDispatcher(get_backend("cpu")), dtype="float32").model
    linears = projections(model)
    assert all(isinstance(linear, QuantLinear) and linear.weight.quant_type == "Q4_K" for linear in linears)
    assert all(linear.weight.qweight.dtype == torch.uint8 for linear in linears)
    file_bytes = sum(t.n_bytes for t in open_gguf(path).tensors() if t.name.startswith("blk.") and len(t.shape) == 2)
    assert sum(linear.weight.qweight.numel() for linear in linears) == file_bytes


def test_dequantize_env_loads_dense_weights_and_drops_quant_linear(tiny, monkeypatch) -> None:
    path = tiny(Q.Q8_0)
    assert "quant_linear" in worker_contract_ops(path)
    monkeypatch.setenv(PACKED_ENV, "0")
    assert "quant_linear" not in worker_contract_ops(path)
    model = load_model(path, OpDispatcher(get_backend("cpu")), dtype="float32").model
    assert not any(isinstance(linear, QuantLinear) for linear in projections(model))


def test_a_fused_projection_of_two_formats_keeps_each_part_packed(tiny) -> None:
    model = load_model(tiny(Q.Q4_K, mixed=True), OpDispatcher(get_backend("cpu")), dtype="float32").model
    qkv = model.layers[0].attention.qkv
    assert isinstance(qkv, ConcatenatedLinear)
    assert [part.weight.quant_type for part in qkv.parts] == ["Q4_K", "Q4_K", "Q6_K"]
    assert model.layers[0].feed_forward.down.weight.quant_type == "Q6_K"


def greedy(path: Path) -> tuple[list[int], list[float], list[float]]:
    """Greedy tokens, their logprobs, and per step the margin between the top two."""
    llm = LLM(str(path), dtype="float32", max_model_len=64, max_num_seqs=2, max_num_batched_tokens=64,
              kv_cache_memory=4 << 20)
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=2)
    output = llm.generate({"prompt_token_ids": PROMPT}, params, use_tqdm=False)[0].outputs[0]
    margins = []
    for step in output.logprobs:
        top = sorted((entry.logprob for entry in step.values()), reverse=True)
        margins.append(top[0] - top[1])
    return list(output.token_ids), [step[token].logprob for token, step in zip(output.token_ids, output.logprobs)], margins


@pytest.mark.slow
@pytest.mark.parametrize("tensor_type,mixed", [(Q.Q8_0, False), (Q.Q4_0, False), (Q.Q4_K, True)],
                         ids=["Q8_0", "Q4_0", "Q4_K+Q6_K"])
def test_packed_greedy_tokens_equal_the_dequantised_path(tensor_type: Q, mixed: bool, tiny, monkeypatch) -> None:
    path = tiny(tensor_type, mixed)
    tokens, logprobs, _ = greedy(path)
    monkeypatch.setenv(PACKED_ENV, "0")
    want_tokens, want_logprobs, margins = greedy(path)
    # Up to and including the first near tie: its token may differ, its logprob may not.
    compared = next((i + 1 for i, margin in enumerate(margins) if margin < TIE_MARGIN), NEW_TOKENS)
    assert tokens[: compared - 1] == want_tokens[: compared - 1]
    assert max(abs(a - b) for a, b in zip(logprobs[:compared], want_logprobs[:compared])) < LOGPROB_BOUND


@pytest.fixture(scope="module")
def matrices_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_matrices(tmp_path_factory.mktemp("packed-slices") / "Q4_K.gguf", Q.Q4_K)


@pytest.fixture
def matrices(matrices_file: Path) -> GgufCheckpoint:
    return GgufCheckpoint(open_gguf(matrices_file), HEADS, KV_HEADS)


@pytest.mark.parametrize("name,dim,start,stop", [(Q_PROJ, 0, 128, 256), (DOWN, 0, 0, 128), (DOWN, 1, 256, 512)])
def test_a_packed_shard_dequantises_to_the_same_slice(matrices: GgufCheckpoint, name, dim, start, stop) -> None:
    shard = matrices.read_packed(f"{name}.weight", dim, start, stop)
    assert shard is not None and shard.in_features == (stop - start if dim == 1 else COLS)
    values = gguf.quants.dequantize(shard.qweight.numpy(), gguf.GGMLQuantizationType.Q4_K)
    assert torch.equal(torch.from_numpy(values), matrices.read_slice(f"{name}.weight", dim, start, stop))


def test_a_column_shard_off_the_block_edges_is_left_to_dequantisation(matrices: GgufCheckpoint) -> None:
    # Q4_K's blocks are 256 wide: a 128-column shard cuts one.
    assert matrices.read_packed(f"{DOWN}.weight", 1, 128, 256) is None
    assert f"{DOWN}.weight" in matrices.unread()


@pytest.mark.parametrize("arch,table", [("llama", "output.weight"), ("qwen2", "token_embd.weight")],
                         ids=["own-head", "tied-head"])
def test_the_lm_head_computes_the_file_s_blocks(arch: str, table: str, tmp_path: Path) -> None:
    # The head streams every vocabulary row each decode step: kept packed (a tied head
    # over the embedding's table), its bytes are the file's, and its fp32 logits are
    # the table gguf-py dequantises, times the hidden states, within the int8
    # activations' error.
    path = write_gguf(tmp_path / f"{arch}.gguf", build_model(arch), arch, Q.Q8_0)
    model = load_model(path, OpDispatcher(get_backend("cpu")), dtype="float32").model
    head = model.head.local
    stored = next(t for t in open_gguf(path).tensors() if t.name == table)
    assert isinstance(head, QuantLinear) and head.weight.quant_type == "Q8_0"
    assert torch.equal(head.weight.qweight, torch.from_numpy(np.array(stored.data, dtype=np.uint8)))
    rows = torch.from_numpy(gguf.quants.dequantize(np.array(stored.data), Q.Q8_0))
    hidden = torch.randn(3, rows.shape[1], generator=torch.Generator().manual_seed(0))
    logits = head(hidden)
    want = hidden.double() @ rows.double().T
    assert logits.dtype == torch.float32
    nmse = (logits.double() - want).square().mean() / want.square().mean()
    assert nmse.item() < QUANTISED_ACTIVATIONS[torch.float32]


@pytest.mark.parametrize("arch", ["llama", "qwen2"], ids=["own-head", "tied-head"])
def test_the_embedding_looks_up_the_file_s_blocks(arch: str, tmp_path: Path) -> None:
    # The table stays in the file's blocks: each looked-up row is gguf-py's dequantised
    # row, and a head tied to the table computes those same blocks (held once).
    path = write_gguf(tmp_path / f"{arch}.gguf", build_model(arch), arch, Q.Q8_0)
    assert "quant_embedding" in worker_contract_ops(path)
    model = load_model(path, OpDispatcher(get_backend("cpu")), dtype="float32").model
    table = model.embedding.table
    stored = next(t for t in open_gguf(path).tensors() if t.name == "token_embd.weight")
    assert isinstance(table, QuantEmbedding) and table.weight.quant_type == "Q8_0"
    assert torch.equal(table.weight.qweight, torch.from_numpy(np.array(stored.data, dtype=np.uint8)))
    rows = torch.from_numpy(gguf.quants.dequantize(np.array(stored.data), Q.Q8_0))
    ids = torch.tensor([0, rows.shape[0] - 1, 5, 5])
    torch.testing.assert_close(model.embedding(ids), rows[ids], rtol=0, atol=0)
    tied = arch == "qwen2"
    assert (model.head.local.weight.qweight.data_ptr() == table.weight.qweight.data_ptr()) == tied
