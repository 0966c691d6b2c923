"""Model graphs, one module (or folder) per family, built from contract ops only; the
registry says which graph builds which architecture (`model_loader.load` loads one)."""

from .causal_lm import CausalLM
from .registry import UnsupportedArchitectureError, supported_architectures

__all__ = ["CausalLM", "UnsupportedArchitectureError", "supported_architectures"]
