"""DeepseekV4ForCausalLM: hash-routed and top-k MoE, sliding / compressed-sparse (CSA) /
heavily-compressed (HCA) shared-KV attention over the paged cache, and mHC residual
streams. docs/deepseek_v4.md describes the KV layout and which parts are contracts."""

from .model import DeepseekV4, is_unused_tensor, load

__all__ = ["DeepseekV4", "is_unused_tensor", "load"]
