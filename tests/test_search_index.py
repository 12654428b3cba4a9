"""The search index's upkeep: brought up to date in the background, searches exact meanwhile."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
import unicodedata
from array import array
from itertools import pairwise
from pathlib import Path

import pytest
from conftest import LAUNCHER, cache_of, flip_schema_byte, garbage, index_covers, run_cli, write_config

from sharedmem.cache import search as search_mod
from sharedmem.cache import search_index
from sharedmem.cache.cache import Cache, NamespaceInfo
from sharedmem.cache.folding import normalize
from sharedmem.hashing import sha256_text
from sharedmem.mcp import tools

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import corpus  # noqa: E402

NS = "machines/lab/notes"
INFO = NamespaceInfo(NS, "lab", "notes", "markdown", 2, "2026-01-03T00:00:00Z")
FILES = {f"f{i:02d}.md": f"alpha {i}\nbeta\n" for i in range(10)}


def cache_of_ns(root: Path, files: dict[str, str]) -> Cache:
    return cache_of(root, NS, files)


@pytest.fixture(autouse=True)
def no_background_refresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """Searches here start no `index --background` unless a test asks for one (see
    test_search.py)."""
    monkeypatch.setattr(search_mod, "BACKGROUND_REFRESH", False)


def refreshed_after_a_process(cache: Cache) -> None:
    """The background refresh started as a sync starts it: by a process that then ends."""
    code = ("import os, sys; from pathlib import Path; "
            "from sharedmem.cache import search_index; from sharedmem.cache.cache import Cache; "
            "assert search_index.refresh_in_background(Cache(Path(sys.argv[1])), os.getpid())")
    subprocess.run([sys.executable, "-c", code, str(cache.root)], check=True, timeout=120,
                   cwd=Path(__file__).resolve().parent.parent)


def test_an_update_goes_to_the_background_and_searches_meanwhile_scan(tmp_path: Path) -> None:
    cache = cache_of(tmp_path, NS, {f"f{i:02d}.md": f"alpha {i}\n" for i in range(20)})
    refreshed_after_a_process(cache)
    assert index_covers(cache)
    new = {f"{NS}/n{i}.md": f"beta {i}\n" for i in range(6)}
    cache.apply([(p, sha256_text(t), t) for p, t in new.items()], [], {NS: INFO})
    refreshed_after_a_process(cache)
    got = tools.search(cache, ["beta"], max_results=200)["results"]  # exact, never waiting
    assert sorted(r["path"] for r in got) == sorted(new)
    assert index_covers(cache)
    assert search_index.refresh_index(cache)["changed"] == 0  # the background did it all
    search_mod._SEARCHERS.clear()
    got = tools.search(cache, ["beta"], max_results=200)["results"]
    assert sorted(r["path"] for r in got) == sorted(new)
    assert search_mod.searcher(cache)._view.manifest is None  # the index vouched for all


def test_a_background_refresh_waits_while_another_writer_holds_the_index(tmp_path: Path) -> None:
    cache = cache_of(tmp_path, NS, {f"f{i:02d}.md": f"alpha {i}\n" for i in range(20)})
    search_index.refresh_index(cache)
    cache.apply([(f"{NS}/new.md", sha256_text("beta\n"), "beta\n")], [], {NS: INFO})
    with search_index.writer_lock(cache, 0) as held:
        assert held  # as another background refresh holds it: the sync does not wait for it
        refreshed_after_a_process(cache)
        time.sleep(1.0)  # time enough to have written, were it not waiting
        assert search_index.index_mark(cache) is None
    assert index_covers(cache)
    assert [r["path"] for r in tools.search(cache, ["beta"])["results"]] == [f"{NS}/new.md"]


def test_a_background_refresh_a_sync_started_waits_for_the_sync_to_end(tmp_path: Path) -> None:
    cache = cache_of(tmp_path, NS, {f"f{i:02d}.md": f"alpha {i}\n" for i in range(20)})
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        child = subprocess.Popen([sys.executable, str(LAUNCHER), "index", "--cache",
                                  str(cache.root), "--after", str(sleeper.pid)])
        time.sleep(1.5)  # time enough to start and build, were it not waiting
        assert child.poll() is None and not search_index.index_path(cache).exists()
    finally:
        sleeper.kill()
        sleeper.wait()
    assert child.wait(timeout=120) == 0
    assert search_index.index_mark(cache) is not None


def test_a_large_first_sync_reports_before_its_index_and_a_later_sync_catches_it_up(
        tmp_path: Path) -> None:
    notes = tmp_path / "notes"
    for i in range(60):
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
    assert index_covers(cache)  # the background `index` built it
    # An index behind the cache (as a background build that a later sync overtook leaves
    # it): the next sync, with nothing to pull, has it refreshed.
    conn = sqlite3.connect(search_index.index_path(cache))
    conn.execute("UPDATE meta SET value='' WHERE key='manifest'")
    conn.commit()
    conn.close()
    assert search_index.index_mark(cache) is None
    done = run_cli("sync", "--config", str(cfg), "--json")
    assert done.returncode == 0, done.stderr
    assert index_covers(cache)


def test_refresh_skips_a_file_being_rewritten(tmp_path: Path) -> None:
    cache = cache_of_ns(tmp_path, {"a.md": "alpha\n", "b.md": "beta\n"})
    (cache.root / NS / "b.md").write_text("beta rewritten\n", encoding="utf-8")
    assert search_index.refresh_index(cache) == {"changed": 1, "files": 1}
    assert [r["path"] for r in tools.search(cache, ["rewritten"])["results"]] == [f"{NS}/b.md"]
    (cache.root / NS / "b.md").write_text("beta\n", encoding="utf-8")
    assert search_index.refresh_index(cache) == {"changed": 1, "files": 2}
    assert search_index.refresh_index(cache) == {"changed": 0, "files": 2}


def test_a_link_in_place_of_the_index_is_removed_not_written_through(tmp_path: Path) -> None:
    cache = cache_of_ns(tmp_path / "cache", FILES)
    other = tmp_path / "someone-elses.sqlite3"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE files(id INTEGER PRIMARY KEY, path TEXT, sha256 TEXT)")
    conn.execute("INSERT INTO files VALUES (1, 'keep', 'me')")
    conn.commit()
    conn.close()
    before = other.read_bytes()
    path = search_index.index_path(cache)
    path.parent.mkdir(parents=True)
    path.symlink_to(other)
    assert len(tools.search(cache, ["alpha"])["results"]) == 10
    assert search_index.refresh_index(cache) == {"changed": 10, "files": 10}
    assert other.read_bytes() == before and not path.is_symlink()
    (tmp_path / "elsewhere").mkdir()
    for name in list(path.parent.iterdir()):
        name.unlink()
    path.parent.rmdir()
    path.parent.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    assert search_index.refresh_index(cache) == {"changed": 10, "files": 10}
    assert list((tmp_path / "elsewhere").iterdir()) == [] and not path.parent.is_symlink()
    lock = cache.meta / search_index.LOCK_FILE  # nor is the writers' lock followed
    lock.unlink()
    lock.symlink_to(other)
    assert search_index.refresh_index(cache) == {"changed": 0, "files": 10}
    assert other.read_bytes() == before and not lock.is_symlink()


def index_files(cache: Cache) -> int | None:
    """How many files the index holds; None when there is none to read."""
    try:
        conn = sqlite3.connect(f"file:{search_index.index_path(cache)}?mode=ro", uri=True)
        try:
            return conn.execute("SELECT count(*) FROM files").fetchone()[0]
        finally:
            conn.close()
    except sqlite3.Error:
        return None


def test_one_writer_at_a_time_a_refresh_waits_for_the_writer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A background `index` that a search started (or a sync's update) while another writer
    # holds the index waits for it: none writes into the folder while another deletes it.
    cache = cache_of_ns(tmp_path / "cache", FILES)
    path = search_index.index_path(cache)
    monkeypatch.setattr(search_mod, "BACKGROUND_REFRESH", True)
    with search_index.writer_lock(cache, 0) as held:
        assert held
        child = subprocess.Popen([sys.executable, str(LAUNCHER), "index", "--cache",
                                  str(cache.root)], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        try:
            assert len(tools.search(cache, ["alpha"])["results"]) == 10  # starts one more
            started = time.monotonic()
            while time.monotonic() - started < 1.5:  # time enough to start and write, alone
                assert child.poll() is None and not path.parent.exists()
                time.sleep(0.1)
        except BaseException:
            child.kill()
            raise
    out, err = child.communicate(timeout=120)
    assert child.returncode == 0, err
    assert index_files(cache) == 10 and search_index.index_mark(cache) is not None


def test_the_index_command_rebuilds_a_damaged_index(tmp_path: Path) -> None:
    cache = cache_of_ns(tmp_path / "cache", FILES)
    for damage in (None, flip_schema_byte, garbage):
        if damage is not None:
            damage(search_index.index_path(cache))
        for _ in range(2):
            done = run_cli("index", "--cache", str(cache.root), "--json")
            assert done.returncode == 0, done.stderr
            assert json.loads(done.stdout)["files"] == 10 and done.stderr == ""
    assert [r["line"] for r in tools.search(cache, ["alpha 3"])["results"]] == ["alpha 3"]


def index_bytes(cache: Cache) -> int:
    return sum(p.stat().st_size for p in search_index.index_path(cache).parent.iterdir())


def text_bytes(cache: Cache) -> int:
    return sum(m.size for m in cache.load().files.values())


def test_an_index_of_an_older_version_is_rebuilt_in_place_and_shrinks(tmp_path: Path) -> None:
    cache = cache_of_ns(tmp_path, {f"f{i:02d}.md": f"alpha {i}\n" * 2000 for i in range(20)})
    path = search_index.index_path(cache)
    path.parent.mkdir(parents=True)
    conn = sqlite3.connect(path)  # what version 1 wrote: FTS5 kept its own copy of each text
    conn.execute("CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    conn.execute("CREATE TABLE files(id INTEGER PRIMARY KEY, path TEXT UNIQUE NOT NULL,"
                 " sha256 TEXT NOT NULL)")
    conn.execute("CREATE VIRTUAL TABLE grams USING fts5(body,"
                 " tokenize='trigram case_sensitive 1', detail=none)")
    conn.executemany("INSERT INTO meta VALUES (?, ?)", [("version", "1"), ("generation", "1")])
    conn.executemany("INSERT INTO grams(rowid, body) VALUES (?, ?)",
                     [(i, "old text " * 5000) for i in range(1, 40)])
    conn.commit()
    conn.close()
    assert search_index.refresh_index(cache) == {"changed": 20, "files": 20}
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT value FROM meta WHERE key='version'").fetchone()[0] == \
        f"{search_index.INDEX_VERSION}/{unicodedata.unidata_version}/{search_index.SEGMENT_BYTES}"
    conn.close()
    assert index_bytes(cache) <= text_bytes(cache)
    assert [r["path"] for r in tools.search(cache, ["alpha 7"])["results"][:1]] == [
        f"{NS}/f07.md"]


def test_a_file_of_several_parts_keeps_where_each_begins(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A search reads a large file's parts from the bounds the index keeps; a file of one part
    # keeps none. A changed file's bounds change with it.
    monkeypatch.setattr(search_index, "SEGMENT_BYTES", 40)
    big = "".join(f"line {i}\n" for i in range(30))
    cache = cache_of_ns(tmp_path, {"big.md": big, "small.md": "short\n"})
    search_index.refresh_index(cache)

    def kept() -> dict[str, list[int] | None]:
        conn = sqlite3.connect(search_index.index_path(cache))
        rows = conn.execute("SELECT path, parts, bounds FROM files").fetchall()
        conn.close()
        assert all(parts + 1 == len(bounds) // 8 for _, parts, bounds in rows if bounds)
        return {path.rsplit("/", 1)[1]: bounds and array("q", bounds).tolist()
                for path, _, bounds in rows}

    assert kept() == {"big.md": search_index.segments(big.encode()), "small.md": None}
    assert len(kept()["big.md"]) > 5
    grown = "x" * 100 + "\n" + big
    info = NamespaceInfo(NS, "lab", "notes", "markdown", 2, "2026-01-03T00:00:00Z")
    cache.apply([(f"{NS}/big.md", sha256_text(grown), grown)], [], {NS: info})
    search_index.refresh_index(cache)
    assert kept()["big.md"] == search_index.segments(grown.encode()) != search_index.segments(
        big.encode())


def test_refresh_re_reads_only_the_files_that_changed(tmp_path: Path) -> None:
    cache = cache_of_ns(tmp_path, {f"f{i:02d}.md": f"alpha {i}\n" for i in range(30)})
    search_index.refresh_index(cache)
    mark = search_index.index_mark(cache)
    assert mark == cache.files_mark() and mark
    info = NamespaceInfo(NS, "lab", "notes", "markdown", 2, "2026-01-03T00:00:00Z")
    cache.apply([(f"{NS}/f00.md", sha256_text("beta\n"), "beta\n"),
                 (f"{NS}/new.md", sha256_text("beta new\n"), "beta new\n")],
                [f"{NS}/f01.md"], {NS: info})
    assert search_index.index_mark(cache) is None  # the index no longer covers the manifest
    assert search_index.refresh_index(cache) == {"changed": 3, "files": 30}
    assert search_index.index_mark(cache) is not None  # it covers the new manifest whole
    assert [r["path"] for r in tools.search(cache, ["beta"])["results"]] == [
        f"{NS}/f00.md", f"{NS}/new.md"]
    assert search_mod.searcher(cache)._view.manifest is None


def segment_pages(cache: Cache) -> dict[str, list[int]]:
    """Each table's segments, as the leaf pages each holds, largest first."""
    conn = sqlite3.connect(search_index.index_path(cache))
    try:
        return {table: sorted((conn.execute(
            f"SELECT count(*) FROM {table}_data WHERE id BETWEEN ? AND ?",
            (segid << 37, (segid << 37) + (1 << 31) - 1)).fetchone()[0] for (segid,) in
            conn.execute(f"SELECT DISTINCT segid FROM {table}_idx")), reverse=True)
            for table in ("grams", "words", "pairs")}
    finally:
        conn.close()


def numbered_words(seed: int, words: int) -> str:
    """A line of `words` numbered words, spread so that each table fills many pages."""
    return " ".join(f"w{(seed * 7919 + j * 104729) % 99991:05d}" for j in range(words)) + "\n"


def test_a_refresh_that_writes_a_quarter_or_more_merges_each_table_into_one_segment(
        tmp_path: Path) -> None:
    # Every segment is read by each question: a refresh that wrote much merges them (and
    # frees their pages).
    cache = cache_of_ns(tmp_path, {f"f{i:02d}.md": f"alpha {i}\n" for i in range(40)})
    search_index.refresh_index(cache)
    cache.apply([(f"{NS}/f{i:02d}.md", sha256_text(f"gamma {i}"), f"gamma {i}")
                 for i in range(10)], [], {NS: INFO})
    assert search_index.refresh_index(cache) == {"changed": 10, "files": 40}  # a quarter
    assert [len(pages) for pages in segment_pages(cache).values()] == [1, 1, 1]
    assert [r["path"] for r in tools.search(cache, ["gamma 7"])["results"]] == [f"{NS}/f07.md"]
    assert [r["path"] for r in tools.search(cache, ["alpha 12"])["results"]] == [f"{NS}/f12.md"]


def test_small_refreshes_leave_their_segments_until_they_hold_a_sixteenth_of_a_table(
        tmp_path: Path) -> None:
    # A refresh of few files adds a segment, which FTS5 merges only with others of its size:
    # merged with the build's once the small ones hold over a sixteenth of the table's pages.
    cache = cache_of_ns(tmp_path, {f"f{i:03d}.md": numbered_words(i, 600) for i in range(120)})
    search_index.refresh_index(cache)
    counts = []
    for i in range(1, 9):  # each file grown to two parts: about 1/60 of the pages each time
        body = numbered_words(1000 + i, 1600)
        cache.apply([(f"{NS}/f{i:03d}.md", sha256_text(body), body)], [], {NS: INFO})
        assert search_index.refresh_index(cache) == {"changed": 1, "files": 120}
        pages = segment_pages(cache)
        for sizes in pages.values():  # never over a sixteenth beside the largest
            assert 16 * (sum(sizes) - sizes[0]) <= sum(sizes)
        counts.append(len(pages["grams"]))
    assert max(counts) > 1  # left to FTS5 until then
    assert 1 in counts[counts.index(max(counts)):]  # then merged into one
    word = numbered_words(1008, 1600).split()[1500]
    assert [r["path"] for r in tools.search(cache, [word])["results"]] == [f"{NS}/f008.md"]


def test_a_refresh_writes_its_rows_in_one_segment_though_a_file_goes_past_all_others(
        tmp_path: Path) -> None:
    # FTS5 starts a segment whenever a row comes below the one written before it: a file added
    # past all others between two changed in place would cut the refresh's rows in three.
    cache = cache_of_ns(tmp_path, {f"f{i:03d}.md": numbered_words(i, 600) for i in range(200)})
    search_index.refresh_index(cache)
    before = segment_pages(cache)
    # f100a.md: three parts, more than the two rows left free after f100.md's
    changed = {"f005.md": numbered_words(1005, 600) + "zeta\n",
               "f150.md": numbered_words(1150, 600) + "zeta\n",
               "f100a.md": "\n".join([numbered_words(1100, 600)] * 6) + "zeta\n"}
    cache.apply([(f"{NS}/{p}", sha256_text(t), t) for p, t in changed.items()], [], {NS: INFO})
    assert search_index.refresh_index(cache) == {"changed": 3, "files": 201}
    conn = sqlite3.connect(search_index.index_path(cache))
    rows = {path.rpartition("/")[2]: first
            for path, first in conn.execute("SELECT path, first FROM files")}
    conn.close()
    assert rows["f005.md"] < rows["f150.md"] < rows["f100a.md"]  # in path order: 005, 100a, 150
    after = segment_pages(cache)
    # (`grams`: the trigrams of these few digits fill so few pages that three files more hold
    # a sixteenth of them, and the table is merged whole)
    for table in ("words", "pairs"):
        assert len(after[table]) == len(before[table]) + 1
    assert [r["path"] for r in tools.search(cache, ["zeta"])["results"]] == [
        f"{NS}/f005.md", f"{NS}/f100a.md", f"{NS}/f150.md"]


def test_the_index_is_under_half_again_the_text_it_indexes(tmp_path: Path) -> None:
    # It keeps no copy of the text: its tables hold which parts hold each trigram, and where
    # each word stands in them, folded, and each pair of words, in its case.
    src = tmp_path / "src"
    corpus.generate(src, files=150, seed=7)
    cache = cache_of_ns(tmp_path / "cache", {p.relative_to(src).as_posix(): p.read_text(
        encoding="utf-8") for p in src.rglob("*.md")})
    search_index.refresh_index(cache)
    assert index_bytes(cache) <= 1.5 * text_bytes(cache)


def test_the_words_tables_hold_each_punctuation_character_as_a_word_of_its_own(
        tmp_path: Path) -> None:
    # As `punctuation_apart` cuts a text for a phrase: words at blanks and at ASCII punctuation,
    # each such character a word; other characters (not ASCII) stay in words (the text folded).
    text = "See: https://docs.Example/x_y?a=1&b=2, (or 'a.b') — naïve{x}[y] ~/z\\q\n"
    cache = cache_of_ns(tmp_path / "cache", {"a.md": text})
    search_index.refresh_index(cache)
    conn = sqlite3.connect(search_index.index_path(cache))
    conn.execute("CREATE VIRTUAL TABLE temp.vocab USING fts5vocab(main, words, 'row')")
    held = {term for (term,) in conn.execute("SELECT term FROM temp.vocab")}
    conn.close()
    expected = set(search_index.punctuation_apart(normalize(text)).split())
    assert held == expected
    assert {"/", "_", "?", "=", "&", ",", "(", "'", ".", ")", "{", "}", "[", "]", "~", "\\",
            "example", "naive", "—"} <= held


def test_changed_files_leave_old_entries_until_over_a_quarter_then_it_is_built_anew(
        tmp_path: Path) -> None:
    cache = cache_of_ns(tmp_path, {f"f{i}.md": f"alpha {i}\n" for i in range(8)})
    search_index.refresh_index(cache)

    def rewrite(paths: list[str], text: str) -> dict[str, str]:
        cache.apply([(f"{NS}/{p}", sha256_text(text), text) for p in paths], [], {NS: INFO})
        search_index.refresh_index(cache)
        conn = sqlite3.connect(search_index.index_path(cache))
        try:
            return dict(conn.execute("SELECT key, value FROM meta").fetchall())
        finally:
            conn.close()

    meta = rewrite(["f0.md", "f1.md"], "beta\n")  # 2 old entries of 8: kept
    assert meta["stale"] == "2"
    assert [r["path"] for r in tools.search(cache, ["alpha 0"])["results"]] == []
    assert [r["path"] for r in tools.search(cache, ["beta"])["results"]] == [
        f"{NS}/f0.md", f"{NS}/f1.md"]
    assert rewrite(["f2.md"], "gamma\n")["stale"] == "3"  # more than a quarter of 8
    meta = rewrite(["f3.md"], "gamma\n")  # the next refresh builds it anew
    assert "stale" not in meta
    assert [r["path"] for r in tools.search(cache, ["gamma"])["results"]] == [
        f"{NS}/f2.md", f"{NS}/f3.md"]


def rows_after(cache: Cache, added: dict[str, str], gone: tuple[str, ...] = ()) -> tuple[
        dict[str, str], dict[str, tuple[int, int]]]:
    """Apply a sync's changes and refresh: the index's meta, and each file's rows by path."""
    cache.apply([(f"{NS}/{p}", sha256_text(t), t) for p, t in added.items()],
                [f"{NS}/{p}" for p in gone], {NS: INFO})
    search_index.refresh_index(cache)
    conn = sqlite3.connect(search_index.index_path(cache))
    try:
        return dict(conn.execute("SELECT key, value FROM meta").fetchall()), {
            path.removeprefix(f"{NS}/"): (first, parts) for path, first, parts in
            conn.execute("SELECT path, first, parts FROM files")}
    finally:
        conn.close()


def test_files_added_or_grown_take_the_free_rows_beside_their_neighbours(
        tmp_path: Path) -> None:
    # A build leaves two rows free after each file's: a file added between two others takes
    # them while they are enough, and stays in path order; past them, rows past all others.
    cache = cache_of_ns(tmp_path, {f"f{i:02d}.md": f"alpha {i}\n" for i in range(40)})
    search_index.refresh_index(cache)
    meta, rows = rows_after(cache, {})
    assert [rows[f"f{i:02d}.md"] for i in range(40)] == [(1 + 3 * i, 1) for i in range(40)]
    meta, rows = rows_after(cache, {"f00a.md": "beta\n", "f03a.md": "beta\n",
                                    "f03b.md": "beta\n", "z.md": "beta\n"})
    assert meta["strays"] == "0"
    assert (rows["f00a.md"], rows["f03a.md"], rows["f03b.md"]) == ((2, 1), (11, 1), (12, 1))
    meta, rows = rows_after(cache, {"f03c.md": "beta\n"})  # no row left after f03b's
    assert meta["strays"] == "1" and rows["f03c.md"][0] > rows["z.md"][0]
    # f06 grown to two parts, then three, f05 gone: the rows after f04's, f05's among them
    meta, rows = rows_after(cache, {"f06.md": "gamma\n" * 1500}, ("f05.md",))
    assert rows["f06.md"] == (14, 2) and meta["strays"] == "1"
    meta, rows = rows_after(cache, {"f06.md": "gamma\n" * 3000})
    assert rows["f06.md"] == (14, 3) and meta["strays"] == "1"
    meta, rows = rows_after(cache, {"f06.md": "gamma\n" * 12000})  # 9 parts: past f07's row
    assert rows["f06.md"] == (max(first for first, _ in rows.values()), 9)
    assert meta["strays"] == "10"
    assert [r["path"] for r in tools.search(cache, ["beta"])["results"]] == [
        f"{NS}/{p}" for p in ("f00a.md", "f03a.md", "f03b.md", "f03c.md", "z.md")]
    assert [r["path"] for r in tools.search(cache, ["gamma"], max_results=1)["results"]] == [
        f"{NS}/f06.md"]


def test_files_added_one_after_another_at_a_folders_end_take_the_rows_left_free_there(
        tmp_path: Path) -> None:
    # Notes named by their date are added after a folder's last file: a build leaves 16 rows
    # more there, so 18 such files (one part each) stay in path order, and the 19th does not.
    cache = cache_of_ns(tmp_path, {**{f"a/n{i:02d}.md": f"alpha {i}\n" for i in range(1, 6)},
                                   **{f"b/m{i:02d}.md": f"beta {i}\n" for i in range(1, 4)}})
    search_index.refresh_index(cache)
    meta, rows = rows_after(cache, {})
    assert rows["a/n05.md"] == (13, 1) and rows["b/m01.md"] == (32, 1)
    meta, rows = rows_after(cache, {f"a/n{i:02d}.md": "gamma\n" for i in range(6, 24)})
    assert meta["strays"] == "0" and rows["a/n23.md"] == (31, 1)
    meta, rows = rows_after(cache, {"a/n24.md": "gamma\n"})
    assert meta["strays"] == "1"


def test_a_file_added_never_takes_rows_another_file_holds(tmp_path: Path) -> None:
    # f10b (three parts) finds too few rows between f10's and f11's: past all others. f10a,
    # between f10 and f10b, would find the rows from f10's to f10b's enough, but f11 holds one
    # of them: past all others too.
    cache = cache_of_ns(tmp_path, {f"f{i:02d}.md": f"alpha {i}\n" for i in range(40)})
    search_index.refresh_index(cache)
    meta, rows = rows_after(cache, {"f10b.md": "gamma\n" * 3000})
    assert rows["f10b.md"] == (119, 3)
    meta, rows = rows_after(cache, {"f10a.md": "gamma\n" * 3000})
    assert rows["f10a.md"] == (122, 3) and rows["f11.md"] == (34, 1)
    spans = sorted((first, first + parts) for first, parts in rows.values())
    assert all(end <= start for (_, end), (start, _) in pairwise(spans))
    assert [r["path"] for r in tools.search(cache, ["alpha 11"])["results"]] == [
        f"{NS}/f11.md"]


def test_files_added_out_of_path_order_past_an_eighth_then_it_is_built_anew(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # With no rows left free after each file's, a file added takes rows past all others: out
    # of path order unless its path is last.
    monkeypatch.setattr(search_index, "_SLACK", 0)
    cache = cache_of_ns(tmp_path, {f"f{i:02d}.md": f"alpha {i}\n" for i in range(16)})
    search_index.refresh_index(cache)

    def add(paths: list[str]) -> tuple[dict[str, str], list[int]]:
        cache.apply([(f"{NS}/{p}", sha256_text("beta\n"), "beta\n") for p in paths], [],
                    {NS: INFO})
        search_index.refresh_index(cache)
        conn = sqlite3.connect(search_index.index_path(cache))
        try:
            return dict(conn.execute("SELECT key, value FROM meta").fetchall()), [
                first for (first,) in conn.execute("SELECT first FROM files ORDER BY path")]
        finally:
            conn.close()

    meta, rows = add(["f00a.md", "f05a.md", "z.md"])  # the last in path order is in it
    assert meta["strays"] == "2" and rows != sorted(rows)
    meta, rows = add(["f10a.md"])  # 3 of 20 parts: more than an eighth
    assert meta["strays"] == "3"
    meta, rows = add(["f12a.md"])  # the next refresh builds it anew
    assert meta["strays"] == "0" and rows == sorted(rows)
    assert [r["path"] for r in tools.search(cache, ["beta"])["results"]] == [
        f"{NS}/{p}" for p in ("f00a.md", "f05a.md", "f10a.md", "f12a.md", "z.md")]


@pytest.mark.parametrize("ids, out", [
    ([], []), ([1, 2, 5], []), ([1, 9, 2, 3], [1]), ([9, 10, 1, 2], [0, 1]),
    ([1, 7, 8, 2, 9, 3, 4], [1, 2, 4]), ([3, 1, 2], [0])])
def test_the_positions_out_of_path_order_are_those_past_a_later_one(
        ids: list[int], out: list[int]) -> None:
    assert search_index.strays(ids) == out


def test_the_pairs_of_a_text_are_its_words_two_by_two_in_their_case_and_folded() -> None:
    # The first two characters of a word, then the last four of the word before it spelt
    # backwards; cut at blanks and ASCII punctuation, so a key's pairs are the text's wherever
    # it starts or ends. Each ASCII capital is a control character the tokenizer keeps, and a
    # pair holding one is there again folded: a search ignoring case asks either.
    assert search_index.pairs_text(search_index.pair_words("Use the file.in\nxNét")) == " ".join([
        "th\x1ees\x16", "fi\x1eeht", "in\x1eelif", "x\x0f\x1eni", "th\x1fesu", "xn\x1fni"])
    assert search_index.pairs_text(search_index.pair_words("solo\n")) == " "
    assert search_index.in_case("AaZ é") == "\x01a\x1b é"
