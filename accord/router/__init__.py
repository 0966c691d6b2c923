"""`accord router`: an OpenAI-compatible front end over several `accord serve` (or
vLLM) instances; it speaks HTTP to them and imports nothing of the engine."""
