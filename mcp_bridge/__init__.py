"""MCP servers and clients for the kiln tools. Knows the kiln interface, not ACP."""

# The MCP server name of Crucible's kiln bridge in every session's `mcpServers`; agents build
# tool names from it (`mcp__crucible__read_note`, `crucible_read_note`), and a card's own
# servers may not take it.
BRIDGE_NAME = "crucible"
