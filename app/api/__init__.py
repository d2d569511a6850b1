"""The OpenAI-compatible HTTP API under /v1."""
