"""`collab serve`: the vLLM launcher and the embedded OpenAI-compatible server."""
