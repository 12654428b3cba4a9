"""Codex Shared Memory: share allowlisted Markdown memory across machines and agent harnesses."""

from sharedmem.core import SharedMemoryError

__version__ = "0.1.0"
__all__ = ["SharedMemoryError", "__version__"]
