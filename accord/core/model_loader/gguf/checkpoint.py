"""A GGUF file's tensors under Hugging Face names, dequantised on read with the `gguf`
package's own dequantisation: the same interface as SafetensorsCheckpoint, so the
model graphs and WeightLoader load GGUF files unchanged. Matrices in a block format
quant_linear computes can also be read packed (`read_packed`): their blocks as stored,
which WeightLoader keeps for the linear layers."""

from __future__ import annotations


import gguf
import numpy as np
import torch

from ....op_contracts import GGUF_FORMATS
from ...quantization import GgufWeight
from ..hf_checkpoint import TrackedTensorNames
from .reader import GgufError, GgufFile

#: llama.cpp's tensor names -> Hugging Face's, for the tensors outside the layers.
GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
#: ... and inside layer N (`blk.N.<gguf>` -> `model.layers.N.<hf>`).
LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def hf_name(gguf_name: str) -> str | None:
    """The Hugging Face name of a llama.cpp tensor name (None when it has none here)."""
    stem, _, kind = gguf_name.rpartition(".")
    if stem.startswith("blk."):
        _, layer, part = stem.split(".", 2)
        hf = LAYER_NAMES.get(part)
        return None if hf is None else f"model.layers.{layer}.{hf}.{kind}"
    hf = GLOBAL_NAMES.get(stem)
    return None if hf is None else f"{hf}.{kind}"


class GgufCheckpoint(TrackedTensorNames):
    """The tensors of one GGUF file, read one at a time by Hugging Face name.

    llama.cpp's converter permutes the q/k projections of `llama` models for its
    interleaved rotary layout; reading undoes that, so the weights match the
    Hugging Face (rotate-half) graph. A tensor with no Hugging Face name keeps its GGUF
    name, so an unexpected tensor is reported as the file spells it.
    """

    def __init__(self, file: GgufFile, num_heads: int, num_kv_heads: int, keep_packed: bool = True) -> None:
        #: Whether `read_packed` hands out blocks (False: every tensor is dequantised).
        self.keep_packed = keep_packed
        self._tensors = {hf_name(t.name) or t.name: t for t in file.tensors()}
        super().__init__(file.path, self._tensors.keys())
        self._heads = {}
        if file.architecture == "llama":
            self._heads = {"q_proj": num_heads, "k_proj": num_kv_heads}

    def shape(self, name: str) -> tuple[int, ...]:
        """A tensor's shape in PyTorch's order (GGUF lists dims fastest-first)."""
        return tuple(int(d) for d in reversed(self._tensor(name).shape))

    def read(self, name: str) -> torch.Tensor:
        """A tensor dequantised to fp32 (F16/BF16 exactly), marked as used."""
        return self.read_slice(name, 0, 0, self.shape(name)[0])

    def read_slice(self, name: str, dim: int, start: int, stop: int) -> torch.Tensor:
        """Rows [start, stop) of a tensor along `dim`, dequantised to fp32 from only the
        blocks that hold them (a tensor-parallel rank's shard), marked as used."""
        tensor = self._tensor(name)
        shape = self.shape(name)
        if not (0 <= dim < len(shape) and 0 <= start < stop <= shape[dim]):
            raise GgufError(
                f"{self.model_dir}: slice [{start}:{stop}] of dim {dim} is empty or outside tensor {name!r} {shape}"
            )
        self._mark_read(name)
        stored, offset = _covering_blocks(tensor, dim, start, stop)
        values = torch.from_numpy(np.array(gguf.quants.dequantize(stored, tensor.tensor_type), dtype=np.float32))
        index = (slice(None),) * dim + (slice(offset, offset + stop - start),)
        values = values.reshape(*shape[:dim], -1, *shape[dim + 1 :])[index]
        return self._hf_rows(name, values, dim, start, stop)

    def read_packed(self, name: str, dim: int, start: int, stop: int) -> GgufWeight | None:
        """Rows [start, stop) of a matrix along `dim` as its packed blocks, marked as used;
        None (nothing read) where the tensor is not in a format quant_linear computes,
        packing is off, or a slice of the columns does not fall on block edges (the
        caller then reads it dequantised)."""
        tensor = self._tensor(name)
        fmt = GGUF_FORMATS.get(tensor.tensor_type.name)
        shape = self.shape(name)
        if fmt is None or not self.keep_packed or len(shape) != 2:
            return None
        if dim == 1 and (start % fmt.block_size or stop % fmt.block_size):
            return None
        self._mark_read(name)
        data = tensor.data
        if dim == 0:
            data = data[start:stop]
        else:
            data = data[:, start // fmt.block_size * fmt.block_bytes : stop // fmt.block_size * fmt.block_bytes]
        # A copy: the blocks leave the file's memory map (their bytes, no more).
        packed = torch.from_numpy(np.array(data, dtype=np.uint8))
        return GgufWeight(self._hf_rows(name, packed, dim, start, stop), fmt.name, stop - start if dim == 1 else shape[1])

    def _hf_rows(self, name: str, rows: torch.Tensor, dim: int, start: int, stop: int) -> torch.Tensor:
        """`rows` of tensor `name` in Hugging Face's row order: llama's q/k rows
        un-permuted per head (values or packed blocks alike, since whole rows move)."""
        shape = self.shape(name)
        heads = self._heads.get(name.rsplit(".", 2)[-2]) if name.startswith("model.layers.") else None
        if not heads:
            return rows.contiguous()
        head_rows = shape[0] // heads
        if dim == 0 and (start % head_rows or stop % head_rows):
            raise GgufError(
                f"{self.model_dir}: rows [{start}:{stop}] of {name!r} do not hold whole heads of {head_rows} rows"
            )
        return _unpermute_rotary(rows, rows.shape[0] // head_rows)

    def _tensor(self, name: str) -> gguf.ReaderTensor:
        if name not in self._tensors:
            raise GgufError(f"{self.model_dir}: tensor {name!r} is missing from the GGUF file")
        return self._tensors[name]


def _covering_blocks(tensor: gguf.ReaderTensor, dim: int, start: int, stop: int) -> tuple[np.ndarray, int]:
    """The stored blocks that hold elements [start, stop) of `dim` (PyTorch's order),
    and where `start` falls in the first of them. Rows are whole blocks, so a slice of
    any dim but the last is exact; along the last it is widened to block edges."""
    data = tensor.data
    if dim < data.ndim - 1:
        return data[(slice(None),) * dim + (slice(start, stop),)], 0
    block_size, block_bytes = gguf.GGML_QUANT_SIZES[tensor.tensor_type]
    # Storage units per block: elements for F32/F16 arrays, bytes for uint8 ones.
    units = block_bytes // data.itemsize
    first, end = start // block_size, -(-stop // block_size)
    return np.ascontiguousarray(data[..., first * units : end * units]), start - first * block_size


def _unpermute_rotary(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    # llama.cpp stores each head's rows as (pairs, 2) interleaved; Hugging Face keeps the
    # two halves of the rotated dims apart. Rows are [heads * head_dim] (weight or bias).
    rows = weight.shape[0]
    half = rows // num_heads // 2
    return weight.reshape(num_heads, half, 2, *weight.shape[1:]).transpose(1, 2).reshape(weight.shape).contiguous()
