"""Tests for sharedmem.files: atomic writes."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from sharedmem.files import atomic_write


def test_atomic_write_creates_and_replaces(tmp_path: Path) -> None:
    target = tmp_path / "deep" / "er" / "file.md"
    atomic_write(target, b"old")
    assert target.read_bytes() == b"old"
    atomic_write(target, b"new", mode=0o600)
    assert target.read_bytes() == b"new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    atomic_write(target, b"newer", durable=False)
    assert target.read_bytes() == b"newer"
    assert sorted(p.name for p in target.parent.iterdir()) == ["file.md"]


def test_atomic_write_failure_leaves_old_file_and_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "file.md"
    target.write_bytes(b"old")
    with pytest.raises(TypeError):
        atomic_write(target, "not bytes")  # type: ignore[arg-type]  # fails mid-write
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.md"]
    # A failure at the very last step (replacing a folder) also cleans up.
    folder = tmp_path / "folder.md"
    folder.mkdir()
    (folder / "inside").write_bytes(b"keep")
    with pytest.raises(OSError):
        atomic_write(folder, b"data")
    assert (folder / "inside").read_bytes() == b"keep"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.md", "folder.md"]
