"""The search index's upkeep: a sync's update at once when small, in the background when large."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from conftest import cache_of

from sharedmem.cache import search as search_mod
from sharedmem.cache import search_index
from sharedmem.cache.cache import Cache, NamespaceInfo
from sharedmem.hashing import sha256_text
from sharedmem.mcp import tools

NS = "machines/lab/notes"
INFO = NamespaceInfo(NS, "lab", "notes", "markdown", 2, "2026-01-03T00:00:00Z")


def covered(cache: Cache, seconds: float = 60) -> bool:
    """Wait until the index covers the cache's manifest whole (a background refresh is done)."""
    deadline = time.monotonic() + seconds
    while search_index.index_mark(cache) is None:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    with search_index.writer_lock(cache, seconds) as held:  # and its writer has let go
        return held


def test_a_large_update_goes_to_the_background_and_searches_meanwhile_scan(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(search_index, "INLINE_FILES", 5)
    cache = cache_of(tmp_path, NS, {f"f{i:02d}.md": f"alpha {i}\n" for i in range(20)})
    assert search_index.update_index(cache, [], [], None) == {"background": 1}  # 20 files
    assert covered(cache)
    mark = search_index.index_mark(cache)
    new = {f"{NS}/n{i}.md": f"beta {i}\n" for i in range(6)}
    cache.apply([(p, sha256_text(t), t) for p, t in new.items()], [], {NS: INFO})
    assert search_index.update_index(cache, list(new), [], mark) == {"background": 1}
    got = tools.search(cache, ["beta"], max_results=200)["results"]  # exact, never waiting
    assert sorted(r["path"] for r in got) == sorted(new)
    assert covered(cache)
    assert search_index.refresh_index(cache)["changed"] == 0  # the background did it all
    search_mod._SEARCHERS.clear()
    got = tools.search(cache, ["beta"], max_results=200)["results"]
    assert sorted(r["path"] for r in got) == sorted(new)
    assert search_mod.searcher(cache)._view.manifest is None  # the index vouched for all


def test_a_small_update_is_done_at_once_unless_a_writer_holds_the_index(tmp_path: Path) -> None:
    cache = cache_of(tmp_path, NS, {f"f{i:02d}.md": f"alpha {i}\n" for i in range(20)})
    assert search_index.update_index(cache, [], [], None) == {"changed": 20, "files": 20}
    mark = search_index.index_mark(cache)
    cache.apply([(f"{NS}/new.md", sha256_text("beta\n"), "beta\n")], [], {NS: INFO})
    with search_index.writer_lock(cache, 0) as held:
        assert held  # as a background refresh holds it: the sync does not wait for it
        assert search_index.update_index(cache, [f"{NS}/new.md"], [], mark) == {
            "background": 1}
    assert covered(cache)
    assert [r["path"] for r in tools.search(cache, ["beta"])["results"]] == [f"{NS}/new.md"]
