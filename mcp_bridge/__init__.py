"""MCP servers and clients for the kiln tools. Knows the kiln interface, not ACP."""
