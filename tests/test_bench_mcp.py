"""scripts/bench_mcp.py's own search shapes, its cache built from a copied folder, and the files a
later sync adds."""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

import pytest
from conftest import REPO

sys.path.insert(0, str(REPO / "scripts"))
import bench_mcp  # noqa: E402

from sharedmem.cache import search_index  # noqa: E402
from sharedmem.cache.cache import Cache  # noqa: E402


def test_a_search_shape_is_the_search_tools_arguments_labelled_by_itself() -> None:
    exact = '{"queries": ["stale lock"]}'
    folded = '{"queries": ["Décision"], "normalized": true}'
    assert bench_mcp.searches([exact, folded]) == [
        (exact, {"queries": ["stale lock"]}, []),
        (folded, {"queries": ["Décision"], "normalized": True}, ["-i"])]


@pytest.mark.parametrize("text, says", [
    ("stale lock", "not JSON"), ('["stale lock"]', '"queries" list'),
    ('{"queries": []}', '"queries" list'), ('{"query": "x"}', '"queries" list')])
def test_a_search_shape_that_is_not_the_tools_arguments_is_refused(text: str,
                                                                   says: str) -> None:
    with pytest.raises(SystemExit) as exc:
        bench_mcp.searches([text])
    assert f"--search {text!r}" in str(exc.value) and says in str(exc.value)


def test_a_copied_folder_becomes_the_cache_with_its_paths(tmp_path: Path) -> None:
    source = tmp_path / "notes"
    (source / "deep").mkdir(parents=True)
    (source / "a.md").write_text("alpha\n", encoding="utf-8")
    (source / "deep" / "b.md").write_text("beta\n", encoding="utf-8")
    (source / "c.txt").write_text("not markdown\n", encoding="utf-8")
    config, stats = bench_mcp.build(tmp_path / "work", 10_000, 1, copy_of=str(source))
    assert stats["files"] == 2
    cache = json.loads(config.read_text(encoding="utf-8"))["cache"]
    assert sorted(Cache(Path(cache)).load().files) == [
        f"{bench_mcp.NAMESPACE}/a.md", f"{bench_mcp.NAMESPACE}/deep/b.md"]


def test_files_added_later_stand_spread_through_path_order_their_strays_counted(
        tmp_path: Path) -> None:
    config, _ = bench_mcp.build(tmp_path / "work", 40, 1)
    cache = Cache(Path(json.loads(config.read_text(encoding="utf-8"))["cache"]))
    search_index.refresh_index(cache)
    before = sorted(cache.load().files)
    assert bench_mcp.add_later(cache, 4) == 4
    search_index.refresh_index(cache)
    after = sorted(cache.load().files)
    added = [after.index(p) for p in sorted(set(after) - set(before))]
    assert len(added) == 4 and all(p.endswith("-later.md") for p in set(after) - set(before))
    assert added[0] < len(after) // 4 and added[-1] > len(after) // 2  # spread, not together
    for path in set(after) - set(before):
        twin = path.removesuffix("-later.md") + ".md"
        assert (cache.root / path).read_bytes() == (cache.root / twin).read_bytes()
    rows = sqlite3.connect(search_index.index_path(cache)).execute(
        "SELECT first, parts FROM files ORDER BY path").fetchall()
    ids = [row for first, parts in rows for row in range(first, first + parts)]
    assert bench_mcp.strays(cache) == len(search_index.strays(ids))  # what the bench prints


def test_syncs_that_change_some_files_change_one_percent_each_time_others_each_round(
        tmp_path: Path) -> None:
    config, _ = bench_mcp.build(tmp_path / "work", 300, 1)
    cache = Cache(Path(json.loads(config.read_text(encoding="utf-8"))["cache"]))
    search_index.refresh_index(cache)
    before = {path: (cache.root / path).read_text(encoding="utf-8") for path in cache.load().files}
    changed = []
    for round_ in (1, 2):
        assert bench_mcp.change_some(cache, round_) == 3
        after = {path: (cache.root / path).read_text(encoding="utf-8")
                 for path in cache.load().files}
        assert after.keys() == before.keys()
        changed.append(sorted(p for p in after if after[p] != before[p]))
        for path in changed[-1]:  # each keeps its text and gains a line
            assert after[path] == before[path] + f"\nChanged by sync {round_}.\n"
        before = after
        search_index.refresh_index(cache)
    order = sorted(before)
    assert all(len(paths) == 3 for paths in changed) and set(changed[0]).isdisjoint(changed[1])
    assert order.index(changed[0][-1]) - order.index(changed[0][0]) > len(order) // 2  # spread
    assert all(count >= 1 for count in bench_mcp.segments(cache))
