"""The tensor-parallel pieces that need a collective: a row-parallel linear (partial
products summed over the ranks) and the vocabulary-parallel embedding and LM head.
Column-parallel linears need none (their output stays split by heads or channels), so
they are plain local linears over this rank's rows.

Each wraps whatever local computation this rank does (a dense, fp8 or packed linear
over its weight shard, a dense or packed embedding table) and adds only the collective; at one rank the graphs build none of these.
"""

from __future__ import annotations

import torch

from ...distributed.communicator import Communicator
from .embedding import EmbeddingTable
from .linear import Linear


class RowParallelLinear:
    """y = sum over ranks of local(x_rank): `local` holds this rank's input columns of the
    weight, and `x` is this rank's slice of the activations (as a column-parallel layer
    or split heads leave it)."""

    def __init__(self, local: Linear, comm: Communicator) -> None:
        self.local = local
        self.comm = comm
        self.out_features = local.out_features

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.comm.all_reduce(self.local(x))


class VocabParallelEmbedding:
    """Embedding rows [start, stop) of the vocabulary on this rank, held by `table`: a
    token outside the range looks up nothing here (zeros), and the sum over the ranks is
    every token's row."""

    def __init__(self, table: EmbeddingTable, start: int, comm: Communicator | None) -> None:
        self.table = table
        self.start = start
        self.stop = start + table.rows
        self.comm = comm

    def __call__(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.comm is None:
            return self.table(input_ids)
        outside = (input_ids < self.start) | (input_ids >= self.stop)
        local_ids = (input_ids - self.start).masked_fill(outside, 0)
        rows = self.table(local_ids).masked_fill(outside.unsqueeze(-1), 0)
        return self.comm.all_reduce(rows)


class ParallelLMHead:
    """Logits for this rank's vocabulary rows, gathered along the vocabulary so every rank
    (the sampling one included) holds the full fp32 logits; `vocab_sizes` are the ranks'
    row counts in rank order. `local` computes this rank's logits (a dense linear over
    its rows with an fp32 output, so the backend's GEMM serves the head as it serves every
    projection, on the form its load prepared, and a bf16 model's logits are never
    rounded to bf16, which ties tokens that differ by less than its ulp; the head keeps
    no other copy of the rows)."""

    def __init__(self, local: Linear, vocab_sizes: list[int], comm: Communicator | None) -> None:
        self.local = local
        self.vocab_sizes = vocab_sizes
        self.comm = comm

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.local(hidden)
        if self.comm is None:
            return logits
        return self.comm.all_gather(logits, dim=-1, sizes=self.vocab_sizes)
