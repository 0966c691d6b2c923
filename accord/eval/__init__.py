"""Model quality measured through the engine's own forward (`accord eval`): perplexity
over a text, computed the way llama.cpp's `llama-perplexity` computes it."""
