"""accord: one OpenAI-compatible LLM serving engine for NVIDIA, AMD, Ascend and CPUs."""

__version__ = "0.1.0"
