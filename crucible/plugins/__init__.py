"""Lua plugin tools (lupa): the person's scripts as tools beside the kiln tools, sandboxed and
timed like every other tool.

Here rather than in `mcp_bridge`: finding plugins (the config, XDG folders, the plugins shipped
with Crucible), their settings and `cru plugins` are the application's business; what the bridge
needs is only a source of `mcp_bridge.dispatch.Tool`s (`PluginHost`), and the host API reaches
the kiln through the same `KilnBackend` the MCP tools use. mcp_bridge stays free of Lua.

The package re-exports nothing (a submodule importing its package must not import it back):
`crucible.plugins.host` holds `PluginHost`, `load_all` and the rest.
"""
