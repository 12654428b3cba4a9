"""Tests for sharedmem.core: every error the package defines derives from SharedMemoryError."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import sharedmem
from sharedmem.core import SharedMemoryError


def test_every_error_derives_from_shared_memory_error() -> None:
    modules = [importlib.import_module(m.name)
               for m in pkgutil.walk_packages(sharedmem.__path__, "sharedmem.")]
    errors = [obj for module in modules for _, obj in inspect.getmembers(module, inspect.isclass)
              if issubclass(obj, BaseException) and obj.__module__ == module.__name__]
    names = {e.__name__ for e in errors}
    assert {"ConfigError", "NameRuleError", "PathRuleError", "LimitError", "SourceError",
            "StoreError", "ProtocolError", "TransportError", "NoteError", "InstallError",
            "BackupError", "LockError", "StaleBase"} <= names
    for error in errors:
        assert issubclass(error, SharedMemoryError), error
        assert isinstance(error.exit_code, int)
    assert issubclass(SharedMemoryError, Exception)
