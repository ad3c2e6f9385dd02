"""Tools a policy can call during a rollout: a sandboxed Python interpreter, a
documentation-retrieval tool, and any MCP server's tools (AlphaApollo)."""
