"""The scheduler's side of the core-to-worker contract: the plain data it sends each step."""
