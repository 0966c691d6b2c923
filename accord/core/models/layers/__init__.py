"""Layers shared by the model families; each calls kernels only through op contracts."""

from .attention import GQAAttention
from .linear import DenseLinear, Linear
from .mlp import GatedMLP, SparseMoE
from .norm import RMSNorm
from .rotary import RotaryEmbedding

__all__ = ["DenseLinear", "GQAAttention", "GatedMLP", "Linear", "RMSNorm", "RotaryEmbedding", "SparseMoE"]
