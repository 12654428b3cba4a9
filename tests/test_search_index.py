"""The search index's upkeep: a sync's update at once when small, in the background when large."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import pytest
from conftest import cache_of, run_cli, write_config

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


def test_a_large_first_sync_reports_before_its_index_and_a_later_sync_catches_it_up(
        tmp_path: Path) -> None:
    notes = tmp_path / "notes"
    for i in range(search_index.INLINE_FILES + 20):
        (notes / f"d{i % 3}").mkdir(parents=True, exist_ok=True)
        (notes / f"d{i % 3}" / f"n{i:04d}.md").write_text(f"# note {i}\nword{i} café\n")
    cfg = write_config(tmp_path / "client.json", "laptop",
                       {"kind": "local", "store": str(tmp_path / "store.sqlite3")},
                       [{"name": "notes", "kind": "markdown", "path": str(notes)}],
                       tmp_path / "cache")
    done = run_cli("sync", "--config", str(cfg), "--index", "--json")
    assert done.returncode == 0, done.stderr
    found = run_cli("search", "--config", str(cfg), "--json", "word17 ")  # exact meanwhile
    assert [r["path"] for r in json.loads(found.stdout)["results"]] == [
        "machines/laptop/notes/d2/n0017.md"]
    cache = Cache(tmp_path / "cache")
    assert covered(cache)  # the background `index` built it
    # An index behind the cache (as a background build that a later sync overtook leaves
    # it): the next sync, with nothing to pull, has it refreshed.
    conn = sqlite3.connect(search_index.index_path(cache))
    conn.execute("UPDATE meta SET value='' WHERE key='manifest'")
    conn.commit()
    conn.close()
    assert search_index.index_mark(cache) is None
    done = run_cli("sync", "--config", str(cfg), "--json")
    assert done.returncode == 0, done.stderr
    assert covered(cache)
