"""Codex Shared Memory: share allowlisted Markdown memory across machines and agent harnesses.

`SharedMemoryError` is loaded on first use, so the MCP server starts without the rest.
"""

__version__ = "0.1.0"
__all__ = ["SharedMemoryError", "__version__"]


def __getattr__(name: str) -> object:
    if name == "SharedMemoryError":
        from sharedmem.core import SharedMemoryError
        return SharedMemoryError
    raise AttributeError(f"module 'sharedmem' has no attribute {name!r}")
