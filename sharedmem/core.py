"""The one base error and its kinds: every error this project raises derives from SharedMemoryError.

Each message names the thing at fault (file, path, host, tool, argument) and says how to fix it;
`cli.main` turns the error into one line on stderr and the class's exit code.
"""

from __future__ import annotations


class SharedMemoryError(Exception):
    """Base of every error this project raises; the CLI turns it into a message and an exit code."""

    exit_code = 2


class ConfigError(SharedMemoryError):
    """A configuration file or command-line value is invalid."""


class NameRuleError(SharedMemoryError):
    """A machine or source name breaks the name rule."""


class PathRuleError(SharedMemoryError):
    """A published path breaks the path rule."""


class LimitError(SharedMemoryError):
    """A file, namespace or message is over a configured limit."""


class SourceError(SharedMemoryError):
    """A memory source cannot be read."""


class StoreError(SharedMemoryError):
    """The server's SQLite store refused or failed an operation."""


class ProtocolError(SharedMemoryError):
    """A peer broke the sync protocol."""


class ToolArgumentError(SharedMemoryError):
    """An MCP tool (or resources request) was called with an argument it does not take."""


class TransportError(SharedMemoryError):
    """The server cannot be reached, or the transport failed."""


class NoteError(SharedMemoryError):
    """An ad-hoc note is invalid."""


class InstallError(SharedMemoryError):
    """An installer step failed."""


class BackupError(SharedMemoryError):
    """A backup could not be made, verified or restored."""


class LockError(SharedMemoryError):
    """Another process holds a lock this one needs."""


class CacheError(SharedMemoryError):
    """The client's cache, or the search index derived from it, cannot be used."""


class JSONError(SharedMemoryError):
    """A text is not JSON, or a value has no JSON form."""
