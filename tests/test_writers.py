"""The writers `Cache.apply` hands files to: plain writes, staged files moved in, what is vouched for."""

from __future__ import annotations

from pathlib import Path

import pytest

from sharedmem.cache.cache import Cache, NamespaceInfo
from sharedmem.cache.staged_files import Staging
from sharedmem.cache.writers import FileWriter, PreStagedWriter
from sharedmem.core import CacheError
from sharedmem.hashing import sha256_text

NS = "machines/laptop/notes"
INFO = {NS: NamespaceInfo(NS, "laptop", "notes", "markdown", 1)}


def test_the_plain_writer_writes_in_place(tmp_path: Path) -> None:
    target = tmp_path / "a.md"
    target.write_text("old")
    FileWriter().write(f"{NS}/a.md", "x", "new ü\n", str(target))
    assert target.read_text(encoding="utf-8") == "new ü\n"
    assert [p.name for p in tmp_path.iterdir()] == ["a.md"]  # no temporary file left


def test_nothing_staged_means_the_pre_staged_writer_writes(tmp_path: Path) -> None:
    cache = Cache(tmp_path / "cache")
    text = "# written, not moved\n"
    done = cache.apply([(f"{NS}/a.md", sha256_text(text), text)], [], INFO,
                       writer=PreStagedWriter(Staging(cache.meta)))
    assert done["written"] == 1 and (cache.root / NS / "a.md").read_text() == text


def test_a_text_is_hashed_unless_the_intake_is_told_it_is_the_clients_own(tmp_path: Path) -> None:
    cache = Cache(tmp_path / "cache")
    text, sha = "# mine\n", "ab" * 32  # a sha256 this text does not have
    done = cache.apply([(f"{NS}/a.md", sha, text)], [], INFO)
    assert [s["reason"] for s in done["skipped"]] == ["sha256-mismatch"]
    assert "does not match its sha256" in done["skipped"][0]["message"]
    assert not (cache.root / NS / "a.md").exists()
    intake = cache.intake(PreStagedWriter(Staging(cache.meta)))
    intake.add(f"{NS}/a.md", sha, text, vouched=True)
    cache.commit(intake, [], INFO)
    assert (cache.root / NS / "a.md").read_text() == text


def test_the_pre_staged_writer_stages_what_the_server_sent_at_once(tmp_path: Path) -> None:
    # A pull holds one message of texts, not all of them: each is on disk once taken.
    cache = Cache(tmp_path / "cache")
    staging = Staging(cache.meta)
    (staging.folder / "7.part").parent.mkdir(parents=True)
    (staging.folder / "7.part").write_text("what a killed sync left")
    writer = PreStagedWriter(staging)
    intake = cache.intake(writer, file_bytes=100)
    texts = {f"{NS}/{i}.md": f"text {i}\n" for i in range(3)}
    for path, text in texts.items():
        intake.add(path, sha256_text(text), text)
    staged = sorted(p.name for p in staging.folder.iterdir())
    assert len(staged) == 3 and all(name.endswith(".pull") for name in staged)
    assert sorted(p.read_text() for p in staging.folder.iterdir()) == sorted(texts.values())
    assert writer.taken == {} and intake.own == {}
    assert not (cache.root / NS).exists()  # nothing in the cache before the commit
    done = cache.commit(intake, [], INFO).report
    assert done["written"] == 3 and list(staging.folder.iterdir()) == []
    assert {f"{NS}/{p.name}": p.read_text() for p in (cache.root / NS).iterdir()} == texts
    staging.discard()
    assert not staging.folder.exists()


def test_a_staged_text_gone_before_the_commit_fails_it(tmp_path: Path) -> None:
    cache = Cache(tmp_path / "cache")
    staging = Staging(cache.meta)
    intake = cache.intake(PreStagedWriter(staging))
    intake.add(f"{NS}/a.md", sha256_text("a\n"), "a\n")
    (staged,) = staging.folder.iterdir()
    staged.unlink()
    with pytest.raises(CacheError, match="the staged copy of .* is gone"):
        cache.commit(intake, [], INFO)
    assert not cache.manifest_path.exists()
