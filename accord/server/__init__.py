"""The OpenAI-compatible server, the command line and metrics."""
