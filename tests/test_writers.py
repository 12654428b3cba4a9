"""The writers `Cache.apply` hands files to: plain writes, staged files moved in, what is vouched for."""

from __future__ import annotations

from pathlib import Path

import pytest

from sharedmem.cache.cache import Cache, NamespaceInfo
from sharedmem.cache.staged_files import Staging
from sharedmem.cache.writers import FileWriter, PreStagedWriter
from sharedmem.core import ProtocolError
from sharedmem.hashing import sha256_text

NS = "machines/laptop/notes"
INFO = {NS: NamespaceInfo(NS, "laptop", "notes", "markdown", 1)}


def test_the_plain_writer_writes_in_place_and_vouches_for_nothing(tmp_path: Path) -> None:
    target = tmp_path / "a.md"
    target.write_text("old")
    assert FileWriter().write(f"{NS}/a.md", "x", "new ü\n", str(target)) == 7
    assert target.read_text(encoding="utf-8") == "new ü\n"
    assert [p.name for p in tmp_path.iterdir()] == ["a.md"]  # no temporary file left
    assert "x" not in FileWriter().own_texts and f"{NS}/a.md" not in FileWriter().own_paths


def test_nothing_staged_means_the_pre_staged_writer_writes(tmp_path: Path) -> None:
    cache = Cache(tmp_path / "cache")
    text = "# written, not moved\n"
    done = cache.apply([(f"{NS}/a.md", sha256_text(text), text)], [], INFO,
                       writer=PreStagedWriter(Staging(cache.meta)))
    assert done["written"] == 1 and (cache.root / NS / "a.md").read_text() == text


def test_a_text_is_hashed_unless_the_writer_vouches_for_it(tmp_path: Path) -> None:
    cache = Cache(tmp_path / "cache")
    text, sha = "# mine\n", "ab" * 32  # a sha256 this text does not have
    with pytest.raises(ProtocolError, match="does not match its sha256"):
        cache.apply([(f"{NS}/a.md", sha, text)], [], INFO)
    cache.apply([(f"{NS}/a.md", sha, text)], [], INFO,
                writer=PreStagedWriter(Staging(cache.meta), own_texts={sha}))
    assert (cache.root / NS / "a.md").read_text() == text
