"""A token embedding table: this rank's rows, looked up by local id. Dense tables gather
rows of a tensor; a GGUF table kept in its blocks (`quantization.QuantEmbedding`)
dequantises only the rows it looks up, so a model whose LM head is tied to it holds the
table once, packed."""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F


class EmbeddingTable(Protocol):
    """Rows of a token embedding: `rows` of them, looked up as `dtype` on `device`."""

    @property
    def rows(self) -> int: ...

    @property
    def dtype(self) -> torch.dtype: ...

    @property
    def device(self) -> torch.device: ...

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [T] (each < rows) -> their rows [T, H]."""
        ...


class DenseEmbedding:
    """An embedding table held as a tensor [V, H] in the model dtype."""

    def __init__(self, weight: torch.Tensor) -> None:
        self.weight = weight

    @property
    def rows(self) -> int:
        """V, the table's rows."""
        return self.weight.shape[0]

    @property
    def dtype(self) -> torch.dtype:
        """The rows' dtype."""
        return self.weight.dtype

    @property
    def device(self) -> torch.device:
        """Where the table lives."""
        return self.weight.device

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [T] -> rows [T, H]."""
        return F.embedding(ids, self.weight)
