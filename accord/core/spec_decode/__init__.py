"""Speculative decoding: the proposers that draft tokens for the target model to check
in one forward (the check itself is the `rejection_sample` op), and their config."""
