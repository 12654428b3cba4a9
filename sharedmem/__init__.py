"""Codex Shared Memory: share allowlisted Markdown memory across machines and agent harnesses.

The package is split by side (docs/ARCHITECTURE.md); importing it loads nothing else, so the
MCP server and `serve` start without the rest.
"""

__version__ = "0.1.0"
