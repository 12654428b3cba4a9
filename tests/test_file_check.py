"""The cache's files compared with the manifest by their stat: real files, real SQLite."""

from __future__ import annotations

import os
from pathlib import Path

from sharedmem.cache import file_check
from sharedmem.cache.cache import Cache, NamespaceInfo
from sharedmem.cache.update import CacheUpdate
from sharedmem.hashing import sha256_text

A = "machines/laptop/notes"


def filled(root: Path, count: int) -> Cache:
    """A cache whose manifest lists `count` files of namespace A, as a pull wrote them."""
    cache = Cache(root)
    texts = [(f"{A}/d{i % 7}/f{i:04}.md", f"file {i}\n") for i in range(count)]
    cache.apply([(p, sha256_text(t), t) for p, t in texts], [],
                {A: NamespaceInfo(A, "laptop", "notes", "markdown", 1)})
    return cache


def tamper(cache: Cache) -> set[str]:
    """Change four files four ways; the paths a check must name."""
    root = cache.root
    (root / A / "d1" / "f0001.md").write_text("file 1, edited by hand\n")  # size
    moved = root / A / "d2" / "f0002.md"
    os.utime(moved, ns=(0, moved.stat().st_mtime_ns + 10**9))  # time alone
    (root / A / "d3" / "f0003.md").unlink()  # gone
    linked = root / A / "d4" / "f0004.md"
    linked.unlink()
    linked.symlink_to(root / A / "d5" / "f0005.md")  # a link, never followed
    return {f"{A}/d1/f0001.md", f"{A}/d2/f0002.md", f"{A}/d3/f0003.md", f"{A}/d4/f0004.md"}


def rows_of(cache: Cache) -> list[tuple[str, int, int | None, str]]:
    return list(cache.store.stats())


def test_differing_names_what_is_not_as_recorded(tmp_path: Path) -> None:
    cache = filled(tmp_path / "cache", 40)
    assert list(file_check.differing(str(cache.root), rows_of(cache))) == []
    expected = tamper(cache)
    rows = rows_of(cache)
    assert set(file_check.differing(str(cache.root), rows)) == expected
    unknown = [(p, z, None, sha) for p, z, _, sha in rows[:3]]  # no time recorded
    assert list(file_check.differing(str(cache.root), unknown)) == [p for p, *_ in unknown]
    folder = cache.root / A / "d6" / "f0006.md"
    folder.unlink()
    folder.mkdir()
    assert f"{A}/d6/f0006.md" in set(file_check.differing(str(cache.root), rows_of(cache)))


def test_the_check_before_a_pull_asks_again_for_what_is_not_as_written(tmp_path: Path) -> None:
    """The damaged files named, their namespace asked for whole; a file whose time alone moved
    is hashed and found as written."""
    cache = filled(tmp_path / "cache", 40)
    expected = tamper(cache)
    update = CacheUpdate(cache.root)
    update.open()
    update.check()
    assert update.checked is not None
    assert update.checked.stale == {A}
    assert update.checked.damaged == expected - {f"{A}/d2/f0002.md"}
    assert update.known[A] == 0
    update.discard()
