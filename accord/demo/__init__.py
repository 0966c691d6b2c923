"""The demo model: a seeded random Llama checkpoint and its tokenizer, what `accord
serve` runs with no `--model`, and what tests build tiny models from."""
