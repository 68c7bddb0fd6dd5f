"""The HTTP server: OpenAI-compatible completions and audio endpoints, and `/v1/summarize`."""
