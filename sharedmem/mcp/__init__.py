"""The stdio MCP server: the JSON-RPC 2.0 loop and the four tools over the cache."""
