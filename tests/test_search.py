"""Search over a real cache tree: results equal a straightforward scan, with or without the index."""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import sqlite3
import subprocess
import sys
import unicodedata
from array import array
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import cache_of, flip_schema_byte, garbage, run_cli

from sharedmem.cache import index_reader, index_view, search_index
from sharedmem.cache import search as search_mod
from sharedmem.cache.cache import Cache, NamespaceInfo
from sharedmem.cache.folding import normalize
from sharedmem.hashing import sha256_text
from sharedmem.mcp import tools

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
import corpus  # noqa: E402

NS = "machines/lab/notes"


def make_cache(root: Path, files: dict[str, str]) -> Cache:
    return cache_of(root, NS, files)


@pytest.fixture(autouse=True)
def no_background_refresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """Searches here start no `index --background` unless a test asks for one.

    One would write the index beside the test's own refreshes (one at a time, but either may go
    first), so a count a test expects from its refresh could be the other's.
    """
    monkeypatch.setattr(search_mod, "BACKGROUND_REFRESH", False)


@pytest.fixture(scope="module")
def corpus_cache(tmp_path_factory: pytest.TempPathFactory) -> Cache:
    src = tmp_path_factory.mktemp("src")
    corpus.generate(src, files=150, seed=7)
    files = {p.relative_to(src).as_posix(): p.read_text(encoding="utf-8")
             for p in src.rglob("*.md")}
    return make_cache(tmp_path_factory.mktemp("cache"), files)


def ref_fold(text: str, case_sensitive: bool, normalized: bool) -> str:
    """The documented semantics, written out slowly."""
    if normalized:
        text = unicodedata.normalize("NFD", unicodedata.normalize("NFKC", text).casefold())
        text = "".join(c for c in text if not unicodedata.combining(c))
        return re.sub(r"[^\S\n]+", " ", text)
    return text if case_sensitive else text.casefold()


def reference(cache: Cache, queries: list[str], mode: str = "any", case_sensitive: bool = True,
              normalized: bool = False, folder: str | None = None) -> list[tuple[str, int]]:
    """(path, line) of every match in the documented order, by brute force."""
    folded = [ref_fold(q, case_sensitive, normalized) for q in queries]
    per_file = {}
    for path in sorted(cache.load().files):
        if folder and not (path.startswith(folder + "/") or path == folder):
            continue
        lines = (cache.root / path).read_bytes().decode("utf-8").split("\n")  # "\r" kept
        if normalized:  # but for `normalized`, the carriage return of a CRLF line goes first
            lines = [line[:-1] if line.endswith("\r") else line for line in lines[:-1]] + \
                lines[-1:]
        hits = {}
        for number, line in enumerate(lines, 1):
            which = {i for i, q in enumerate(folded) if q in ref_fold(line, case_sensitive,
                                                                      normalized)}
            if which:
                hits[number] = which
        matched = set().union(*hits.values()) if hits else set()
        if hits and (mode == "any" or len(matched) == len(queries)):
            per_file[path] = (hits, matched)
    keyed = []
    for path, (hits, matched) in per_file.items():
        rank = 0 if len(queries) == 1 or mode == "all" else -len(matched)  # more queries first
        keyed.extend((rank, path, n) for n in hits)
    return [(p, n) for _, p, n in sorted(keyed)]


def indexed(cache: Cache) -> tuple[Cache, search_mod.Searcher]:
    """`cache` with its index built, and a new searcher of it (which counts the files read)."""
    search_index.refresh_index(cache)
    search_mod._SEARCHERS.clear()
    return cache, search_mod.searcher(cache)


def all_pages(cache: Cache, **args: object) -> list[dict]:
    out, cursor, pages = [], None, 0
    while True:
        page = tools.search(cache, cursor=cursor, **args)
        out.extend(page["results"])
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            return out
        assert pages < 10_000


CASES = [
    dict(queries=["session"]),
    dict(queries=["Session"], case_sensitive=False),
    dict(queries=["RareIdent0001", "RareIdent0002"]),
    dict(queries=["décision"], normalized=True),
    dict(queries=["cafe"], normalized=True),
    dict(queries=["Привет"]),
    dict(queries=["rotate the signing"]),
    dict(queries=["deploy", "merge"], match_mode="all"),
    dict(queries=["rotate", "signing", "key"], match_mode="all"),
    dict(queries=["deploy", "RareIdent0003", "zzz-nothing"]),
    dict(queries=["ZÜRICH", "crème"], case_sensitive=False),
    dict(queries=["ab"]),
]


@pytest.mark.parametrize("index", ["fresh", "in parts", "missing"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(c["queries"]))
def test_search_equals_reference_scan(corpus_cache: Cache, case: dict, index: str,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    if index == "in parts":  # each file indexed in parts of a few lines
        monkeypatch.setattr(search_index, "SEGMENT_BYTES", 300)
    if index != "missing":
        search_index.refresh_index(corpus_cache)
    else:
        search_index.index_path(corpus_cache).unlink(missing_ok=True)
        search_mod._SEARCHERS.clear()
    got = all_pages(corpus_cache, max_results=7, **case)
    expected = reference(corpus_cache, case["queries"], case.get("match_mode", "any"),
                         case.get("case_sensitive", True), case.get("normalized", False))
    assert [(r["path"], r["line_number"]) for r in got] == expected
    if case["queries"] != ["zzz-nothing"]:
        assert expected or case["queries"] == ["ab"]


def test_same_order_every_time_and_pages_join(corpus_cache: Cache) -> None:
    args = dict(queries=["deploy", "RareIdent0004"], context_lines=2)
    whole = tools.search(corpus_cache, max_results=200, **args)["results"]
    assert whole == tools.search(corpus_cache, max_results=200, **args)["results"]
    assert all_pages(corpus_cache, max_results=3, **args)[:len(whole)] == whole


def test_ranking_more_queries_first_then_path_order(tmp_path: Path) -> None:
    # A file holding both queries comes first though its path is last; the others follow in
    # path order, however rare the query each holds (a rarer one used to go first).
    files = {f"c{i}.md": "common\n" for i in range(4)}
    files.update({"d-rare.md": "rare\n", "zz-both.md": "common rare\n"})
    cache = make_cache(tmp_path, files)
    got = [r["path"].rsplit("/", 1)[1] for r in tools.search(cache, ["common", "rare"])[
        "results"]]
    assert got == ["zz-both.md", "c0.md", "c1.md", "c2.md", "c3.md", "d-rare.md"]


@pytest.mark.parametrize("index", ["fresh", "missing"])
def test_a_first_any_reads_the_files_of_its_page_not_every_candidate(
        tmp_path: Path, index: str) -> None:
    # Both words are in half the files, one of them in all: the page of files holding both is
    # full within the first few files, with or without the index.
    cache = make_cache(tmp_path, {f"f{i:04d}.md": f"alpha {i}\nbeta {i}\n" if i % 2 == 0
                                  else f"alpha {i}\n" for i in range(2000)})
    if index == "fresh":
        search_index.refresh_index(cache)
    got = tools.search(cache, ["alpha", "beta"], max_results=4)
    scanned = search_mod.searcher(cache).scanned
    rest = all_pages(cache, queries=["alpha", "beta"], max_results=150)
    assert [(r["path"][-8:], r["line_number"]) for r in got["results"]] == [
        ("f0000.md", 1), ("f0000.md", 2), ("f0002.md", 1), ("f0002.md", 2)]
    assert scanned <= 5
    assert [(r["path"], r["line_number"]) for r in rest] == reference(cache, ["alpha", "beta"])


def test_context_lines_and_provenance(tmp_path: Path) -> None:
    text = "\n".join(f"line {i}" for i in range(1, 11)) + "\nneedle here\nafter 1\nafter 2\n"
    cache = make_cache(tmp_path, {"a.md": text})
    hit = tools.search(cache, ["needle"], context_lines=3)["results"][0]
    assert hit["line_number"] == 11
    assert hit["context_before"] == ["line 8", "line 9", "line 10"]
    assert hit["context_after"] == ["after 1", "after 2"]
    assert (hit["machine"], hit["source"], hit["synced_at"]) == ("lab", "notes",
                                                                 "2026-01-02T03:04:05Z")
    assert hit["sha256"] == sha256_text(text)


def test_substring_and_case_rules(tmp_path: Path) -> None:
    cache = make_cache(tmp_path, {"a.md": "class SessionManager:\n", "b.md": "no match\n"})
    assert [r["path"] for r in tools.search(cache, ["Session"])["results"]] == [f"{NS}/a.md"]
    assert tools.search(cache, ["session"])["results"] == []
    assert len(tools.search(cache, ["session"], case_sensitive=False)["results"]) == 1


def test_normalization_matches_accents_and_nfd(tmp_path: Path) -> None:
    nfd = unicodedata.normalize("NFD", "café au lait")
    cache = make_cache(tmp_path, {"a.md": "Décision  prise\n", "b.md": nfd + "\n"})
    search_index.refresh_index(cache)
    assert [r["line"] for r in tools.search(cache, ["decision prise"], normalized=True)[
        "results"]] == ["Décision  prise"]
    assert tools.search(cache, ["decision"])["results"] == []
    assert [r["path"] for r in tools.search(cache, ["café"], normalized=True)["results"]] == [
        f"{NS}/b.md"]


@pytest.mark.parametrize("index", ["fresh", "missing"])
def test_normalized_a_crlf_line_matches_as_its_lf_line(tmp_path: Path, index: str) -> None:
    # The carriage return goes before folding, so it is no blank a query could end in.
    cache = make_cache(tmp_path, {"crlf.md": "Deploy Done\r\nnext\r\n",
                                  "lf.md": "Deploy Done\nnext\n"})
    if index == "fresh":
        search_index.refresh_index(cache)
    assert tools.search(cache, ["done "], normalized=True)["results"] == []
    got = tools.search(cache, ["deploy done"], normalized=True)["results"]
    assert [(r["path"], r["line"]) for r in got] == [(f"{NS}/crlf.md", "Deploy Done"),
                                                      (f"{NS}/lf.md", "Deploy Done")]


def test_match_mode_all_is_files_holding_every_query_as_described(tmp_path: Path) -> None:
    # `all` keeps the files that hold every query, each anywhere in the file, and shows each
    # line holding any of them; the tool's description and its schema say so alike.
    cache = make_cache(tmp_path, {"both.md": "alpha\nbeta\nnone\n", "one.md": "alpha\n",
                                  "line.md": "alpha beta\n"})
    got = [(r["path"][-7:], r["line_number"], r["matched_queries"]) for r in tools.search(
        cache, ["alpha", "beta"], match_mode="all")["results"]]
    assert got == [("both.md", 1, ["alpha"]), ("both.md", 2, ["beta"]),
                   ("line.md", 1, ["alpha", "beta"])]
    tool = next(t for t in tools.TOOLS if t["name"] == "search")
    said = tool["description"] + tool["inputSchema"]["properties"]["match_mode"]["description"]
    assert "files that contain every query" in tool["description"]
    assert "files containing every query" in said and "lines containing every" not in said


def test_stale_index_still_correct(tmp_path: Path) -> None:
    cache = make_cache(tmp_path, {"a.md": "alpha\n", "b.md": "beta\n"})
    search_index.refresh_index(cache)
    info = NamespaceInfo(NS, "lab", "notes", "markdown", 2, "2026-01-03T00:00:00Z")
    cache.apply([(f"{NS}/c.md", sha256_text("gamma alpha\n"), "gamma alpha\n"),
                 (f"{NS}/a.md", sha256_text("changed\n"), "changed\n")], [], {NS: info})
    got = [r["path"] for r in tools.search(cache, ["alpha"])["results"]]
    assert got == [f"{NS}/c.md"]
    search_index.refresh_index(cache)
    conn = sqlite3.connect(search_index.index_path(cache))
    assert sorted(p for (p,) in conn.execute("SELECT path FROM files")) == [
        f"{NS}/{n}.md" for n in "abc"]
    conn.close()
    assert [r["path"] for r in tools.search(cache, ["alpha"])["results"]] == [f"{NS}/c.md"]


def garbage_after_header(path: Path) -> None:
    size = path.stat().st_size
    path.write_bytes(path.read_bytes()[:100] + bytes(range(256)) * (size // 256))


def truncated(path: Path) -> None:
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    path.write_bytes(path.read_bytes()[:3000])


def wrong_values(path: Path) -> None:
    """A valid database whose rows are not what the index writes."""
    conn = sqlite3.connect(path)
    conn.execute("UPDATE meta SET value='not a number' WHERE key='generation'")
    conn.execute("UPDATE files SET path=randomblob(4), sha256=7")
    conn.commit()
    conn.close()


def folder_in_its_place(path: Path) -> None:
    for name in [p for p in path.parent.iterdir()]:
        name.unlink()
    (path / "inner").mkdir(parents=True)


def file_in_place_of_its_folder(path: Path) -> None:
    shutil.rmtree(path.parent)
    path.parent.write_bytes(b"not a folder")


# Each kind of damage, and whether a search notices it (all do: an index that covers the
# manifest is trusted for paths, so values of the wrong kind there are damage too).
DAMAGE = [(flip_schema_byte, True), (garbage, True), (garbage_after_header, True),
          (truncated, True), (wrong_values, True), (folder_in_its_place, True),
          (file_in_place_of_its_folder, True)]
FILES = {f"f{i:02d}.md": f"alpha {i}\nbeta\n" for i in range(10)}


@pytest.mark.parametrize("damage, noticed", DAMAGE, ids=[f.__name__ for f, _ in DAMAGE])
def test_a_damaged_index_is_scanned_past_deleted_and_rebuilt(
        tmp_path: Path, damage: Callable[[Path], None], noticed: bool) -> None:
    cache = make_cache(tmp_path / "cache", FILES)
    search_index.refresh_index(cache)
    expected = reference(cache, ["alpha"])
    search_mod._SEARCHERS.clear()
    damage(search_index.index_path(cache))
    for _ in range(2):
        got = all_pages(cache, queries=["alpha"], max_results=3)
        assert [(r["path"], r["line_number"]) for r in got] == expected
    assert search_index.index_path(cache).exists() is not noticed  # the search deleted it
    assert search_index.refresh_index(cache) == {"changed": 10, "files": 10}
    assert search_index.refresh_index(cache) == {"changed": 0, "files": 10}
    conn = sqlite3.connect(search_index.index_path(cache))
    assert conn.execute("SELECT count(*) FROM files").fetchone() == (10,)
    conn.close()
    got = tools.search(cache, ["alpha"], max_results=200)["results"]
    assert [(r["path"], r["line_number"]) for r in got] == expected


def test_a_search_leaves_a_damaged_index_to_the_writer_that_holds_it(tmp_path: Path) -> None:
    cache = make_cache(tmp_path / "cache", FILES)
    search_index.refresh_index(cache)
    path = search_index.index_path(cache)
    garbage(path)
    with search_index.writer_lock(cache, 0) as held:
        assert held  # as a refresh about to rebuild it holds it
        got = all_pages(cache, queries=["alpha"], max_results=3)
        assert [(r["path"], r["line_number"]) for r in got] == reference(cache, ["alpha"])
        assert path.exists()
    search_mod._SEARCHERS.clear()
    got = all_pages(cache, queries=["alpha"], max_results=3)
    assert [(r["path"], r["line_number"]) for r in got] == reference(cache, ["alpha"])
    assert not path.exists()  # no writer holds it now: the search deleted it


@contextlib.contextmanager
def read_only(folder: Path) -> Iterator[None]:
    """`folder` read-only: a read-only bind mount as root (on Linux), else no write permission."""
    if os.geteuid() != 0:
        folders = [folder, *(p for p in folder.rglob("*") if p.is_dir())]
        for each in folders:
            each.chmod(0o555)
        try:
            yield
        finally:
            for each in folders:
                each.chmod(0o755)
        return
    if sys.platform != "linux" or shutil.which("mount") is None:
        pytest.skip("a read-only cache as root needs a read-only bind mount (Linux, mount)")
    done = subprocess.run(["mount", "--bind", str(folder), str(folder)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot bind-mount here: {done.stderr.decode(errors='replace').strip()}")
    try:
        done = subprocess.run(["mount", "-o", "remount,bind,ro", str(folder)],
                              capture_output=True)
        if done.returncode != 0:
            pytest.skip("cannot make a bind mount read-only here")
        yield
    finally:
        if subprocess.run(["umount", str(folder)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(folder)], capture_output=True)


@pytest.mark.parametrize("wal", [False, True], ids=["index as it stands", "a WAL left: scan"])
def test_a_read_only_cache_is_searched_and_says_how(tmp_path: Path, wal: bool) -> None:
    cache = make_cache(tmp_path / "cache", FILES)
    search_index.refresh_index(cache)
    path = search_index.index_path(cache)
    if wal:  # a writer's WAL left beside the index: it may hold what the file lacks
        Path(f"{path}-wal").write_bytes(b"")
    expected = reference(cache, ["alpha"])
    config = tmp_path / "client.json"
    config.write_text(json.dumps({"machine": "lab", "transport": {
        "kind": "local", "store": str(tmp_path / "store.sqlite3")}, "sources": [],
        "cache": str(cache.root), "state": str(tmp_path / "state")}))
    with read_only(cache.root):
        for _ in range(2):  # the connection kept for the next search says so as well
            got = tools.search(cache, ["alpha"], max_results=200)
            assert [(r["path"], r["line_number"]) for r in got["results"]] == expected
            scanned = search_mod.searcher(cache).scanned
            readable = os.geteuid() == 0 and not wal  # a read-only file system, no WAL
            assert got["note"].startswith("the cache is read-only")
            assert ("read as it stands" in got["note"]) is readable
            assert scanned == 10  # every file holds the word: each is read to show its line
        assert search_mod.searcher(cache)._refreshed_for is None  # no refresh started
        done = run_cli("search", "--config", str(config), "alpha 3")
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith(f"{NS}/f03.md:1:alpha 3\n(the cache is read-only")
    assert path.is_file() and search_index.index_mark(cache) is not None  # nothing deleted
    assert tools.search(cache, ["alpha 3"]).get("note") is None  # writable again


def test_links_are_neither_searched_nor_indexed(tmp_path: Path) -> None:
    cache = make_cache(tmp_path / "cache", {"a.md": "alpha\n", "b.md": "beta\n"})
    outside = tmp_path / "outside.md"
    outside.write_text("beta\n")  # even the very text the manifest names is not read there
    target = cache.root / NS / "b.md"
    target.unlink()
    target.symlink_to(outside)
    assert tools.search(cache, ["beta"])["results"] == []
    assert search_index.refresh_index(cache) == {"changed": 1, "files": 1}
    assert tools.search(cache, ["beta"])["results"] == []


@pytest.mark.parametrize("queries", [["needle"], ["needle", "other"]], ids=["ordered", "ranked"])
def test_pages_end_at_the_size_cap_and_join(tmp_path: Path, queries: list[str]) -> None:
    filler = "".join(f"{'f' * 990} {i}\n" for i in range(10))
    files = {f"f{i:03d}.md": f"{filler}needle {'n' * 990}\n{filler}" for i in range(60)}
    files["other.md"] = "other needle\n"
    cache = make_cache(tmp_path, files)
    got, cursor, capped = [], None, []
    while True:
        page = tools.search(cache, queries, context_lines=10, max_results=200, cursor=cursor)
        text = sum(len(t.encode()) for r in page["results"] for t in (
            r["path"], r["line"], *r["context_before"], *r["context_after"],
            *r["matched_queries"]))
        assert text <= tools.RESULT_MAX_BYTES - sum(len(q) for q in queries)
        got += [(r["path"], r["line_number"]) for r in page["results"]]
        capped.append(page["capped"])
        if not (cursor := page["next_cursor"]):
            break
    assert got == reference(cache, queries) and len(got) == 61
    assert len(capped) > 2 and all(capped[:-1]) and not capped[-1]


def test_path_limits_to_subtree(tmp_path: Path) -> None:
    cache = make_cache(tmp_path, {"x/a.md": "word\n", "y/a.md": "word\n"})
    got = tools.search(cache, ["word"], path=f"{NS}/y")["results"]
    assert [r["path"] for r in got] == [f"{NS}/y/a.md"]


# A generated corpus of awkward text, and queries of every shape cut from it --------------------

TOKENS = ["alpha", "Beta", "GAMMA", "café", unicodedata.normalize("NFD", "café"), "Décision",
          "decision", "straße", "STRASSE", "ﬁle", "\u212aelvin", "ΣΊΣΥΦΟΣ", "σίσυφος", "한국어",
          unicodedata.normalize("NFD", "한국어"), "日本語", "Привет", "x\u0301y", "İstanbul",
          "ǰ", "\ufffd", "🙂", "a", "ab", "abc", "RareIdent0001", "Ｆｕｌｌ", "½", "e\u0301"]
SEPARATORS = [" ", " ", " ", "  ", "\t", ", ", "\u00a0", " \u2003"]
FOLDERS = ["x", "x/y", "x-y", "z"]


def generated_files(rng: random.Random, count: int) -> dict[str, str]:
    files = {}
    for n in range(count):
        lines = []
        for _ in range(rng.randint(1, 14)):
            words = [rng.choice(TOKENS) for _ in range(rng.randint(0, 9))]
            line = "".join(w + rng.choice(SEPARATORS) for w in words).rstrip(" ")
            lines.append(line + ("\r" if rng.random() < 0.1 else ""))
        files[f"{rng.choice(FOLDERS)}/f{n:03d}.md"] = "\n".join(lines) + "\n"
    return files


def generated_queries(rng: random.Random, texts: list[str], count: int) -> list[dict]:
    def one() -> str:
        roll = rng.random()
        if roll < 0.5:
            line = rng.choice(rng.choice(texts).split("\n")).rstrip("\r")
            start = rng.randrange(len(line) + 1)
            return line[start:start + rng.choice((rng.randint(1, 12), rng.randint(8, 40)))]
        token = rng.choice(TOKENS)
        return token.upper() if roll < 0.6 else token if roll < 0.9 else token + "zz"

    cases = []
    while len(cases) < count:
        queries = [one() for _ in range(rng.choice([1, 1, 2, 3]))]
        fold = rng.choice([{}, {"case_sensitive": False}, {"normalized": True}])
        if not all(queries) or fold.get("normalized") and not all(
                normalize(q).strip() for q in queries):
            continue
        folder = rng.choice([None, None, f"{NS}/x", f"{NS}/x/y"])
        cases.append({"queries": queries, "match_mode": rng.choice(["any", "all"]),
                      "path": folder, "max_results": rng.randint(1, 9), **fold})
    return cases


def check_cases(cache: Cache, cases: list[dict], state: str) -> None:
    for case in cases:
        got = all_pages(cache, **case)
        expected = reference(cache, case["queries"], case["match_mode"],
                             case.get("case_sensitive", True), case.get("normalized", False),
                             case["path"])
        assert [(r["path"], r["line_number"]) for r in got] == expected, (state, repr(case))


@pytest.mark.parametrize("segment", [8192, 40], ids=["whole files", "in parts"])
def test_generated_corpus_every_shape_equals_a_full_scan(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, segment: int) -> None:
    """Covering, stale, updated and missing index: always the results of a plain scan."""
    monkeypatch.setattr(search_index, "SEGMENT_BYTES", segment)
    rng = random.Random(15)
    files = generated_files(rng, 70)
    cache = make_cache(tmp_path, files)
    changed = {p: t + "Décision café ΣΊΣΥΦΟΣ\n" for p, t in list(files.items())[:6]}
    added = generated_files(random.Random(16), 4)
    added = {p.replace("/f", "/new"): t for p, t in added.items()}
    gone = list(files)[10:12]
    cases = generated_queries(rng, [*files.values(), *changed.values(), *added.values()], 45)
    monkeypatch.setattr(index_view, "_CHUNK", 2)  # the index is asked a chunk at a time
    search_index.refresh_index(cache)
    check_cases(cache, cases, "covering")
    assert search_mod.searcher(cache)._view.manifest is None  # the manifest was not parsed
    info = NamespaceInfo(NS, "lab", "notes", "markdown", 2, "2026-01-03T00:00:00Z")
    cache.apply([(f"{NS}/{p}", sha256_text(t), t) for p, t in {**changed, **added}.items()],
                [f"{NS}/{p}" for p in gone], {NS: info})
    check_cases(cache, cases, "stale")
    done = search_index.refresh_index(cache)
    assert done == {"changed": 12, "files": 72}
    check_cases(cache, cases, "updated")
    assert search_mod.searcher(cache)._view.manifest is None
    search_index.delete_index(search_index.index_path(cache))
    check_cases(cache, cases, "missing")


@pytest.mark.parametrize("added, slack", [(3, 0), (40, 0), (40, 2)],
                         ids=["a few strays", "scattered", "in the rows left free"])
def test_any_over_ids_out_of_path_order_equals_a_full_scan(
        tmp_path: Path, added: int, slack: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # Files added after the index was built whole with no rows left free (`_SLACK`) get the
    # next ids, so their ids stand far from their neighbours' in path order: a chunk names a
    # few such files unasked, and asks the whole index once when they are many. With rows
    # left free, they take those beside their neighbours'.
    monkeypatch.setattr(search_index, "_SLACK", slack)
    texts = ["alpha\n", "beta\n", "alpha beta\n", "gamma\n"]
    cache = make_cache(tmp_path, {f"f{i:02d}.md": texts[i % 4] for i in range(40)})
    search_index.refresh_index(cache)
    info = NamespaceInfo(NS, "lab", "notes", "markdown", 2, "2026-01-03T00:00:00Z")
    new = {f"{NS}/f{i * 40 // added:02d}x.md": texts[(i + 1) % 4] for i in range(added)}
    cache.apply([(p, sha256_text(t), t) for p, t in new.items()], [], {NS: info})
    search_index.refresh_index(cache)
    assert search_index.index_mark(cache) is not None
    monkeypatch.setattr(index_view, "_CHUNK", 8)
    for queries in (["alpha", "beta"], ["beta", "gamma", "alpha"], ["alpha beta"]):
        got = all_pages(cache, queries=queries, max_results=3)
        assert [(r["path"], r["line_number"]) for r in got] == reference(cache, queries)


@pytest.mark.parametrize("query", ["alpha beta", "alpha"], ids=["a phrase alone", "a word"])
def test_a_few_files_out_of_path_order_are_read_not_asked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, query: str) -> None:
    # A question of the rows past the build's costs SQLite about what one of a whole chunk
    # does (it looks up each word), where a few files cost little to read: up to
    # `_STRAYS_READ` of them are read, unasked.
    monkeypatch.setattr(search_index, "_SLACK", 0)
    cache = make_cache(tmp_path, {f"f{i:03d}.md": "alpha beta\n" if i in (7, 300) else
                                  "gamma delta\n" for i in range(400)})
    search_index.refresh_index(cache)
    info = NamespaceInfo(NS, "lab", "notes", "markdown", 2, "2026-01-03T00:00:00Z")
    added = {f"{NS}/f{i:03d}a.md": "gamma delta epsilon\n" for i in (100, 200)}
    added[f"{NS}/f150a.md"] = "alpha beta\n"
    cache.apply([(p, sha256_text(t), t) for p, t in added.items()], [], {NS: info})
    search_index.refresh_index(cache)
    got, statements = sql_of_next_search(cache, queries=[query])
    assert got == reference(cache, [query]) == [
        (f"{NS}/{name}", 1) for name in ("f007.md", "f150a.md", "f300.md")]
    assert not [s for s in statements if "BETWEEN 401 AND" in s]  # rows 401-403 unasked
    assert search_mod.searcher(cache).scanned == 5  # the three named, and the two others


@pytest.mark.parametrize("query", ["alpha beta", "alpha"], ids=["a phrase alone", "a word"])
def test_files_added_since_the_build_are_asked_apart_not_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, query: str) -> None:
    # With no rows left free, their rows stand past all others, out of path order: asked
    # apart, all in one range of rows, only those named are read, where each was read (a
    # chunk's rows far from the others', or a phrase's next matches).
    monkeypatch.setattr(index_view, "_CHUNK", 64)
    monkeypatch.setattr(search_index, "_SLACK", 0)
    cache = make_cache(tmp_path, {f"f{i:03d}.md": "alpha beta\n" if i in (7, 300) else
                                  "gamma delta\n" for i in range(400)})
    search_index.refresh_index(cache)
    info = NamespaceInfo(NS, "lab", "notes", "markdown", 2, "2026-01-03T00:00:00Z")
    added = {f"{NS}/f{i * 10:03d}a.md": "gamma delta epsilon\n" for i in range(40)}
    added[f"{NS}/f150a.md"] = "alpha beta\n"
    cache.apply([(p, sha256_text(t), t) for p, t in added.items()], [], {NS: info})
    search_index.refresh_index(cache)
    searcher = search_mod.searcher(cache)
    got = [(r["path"], r["line_number"]) for r in all_pages(cache, queries=[query])]
    assert got == reference(cache, [query]) == [
        (f"{NS}/{name}", 1) for name in ("f007.md", "f150a.md", "f300.md")]
    assert searcher.index.begin() is not None
    order = searcher._view.order() if searcher._view else None
    searcher.index.end()
    assert order is not None and len(order[1]) == 40
    assert searcher.scanned == 3  # where the 40 added were read too


def test_a_stale_index_starts_no_rebuild_a_missing_one_does(tmp_path: Path) -> None:
    cache = make_cache(tmp_path, {"a.md": "alpha\n"})
    search_index.refresh_index(cache)
    info = NamespaceInfo(NS, "lab", "notes", "markdown", 2, "2026-01-03T00:00:00Z")
    cache.apply([(f"{NS}/n{i:03d}.md", sha256_text(f"alpha {i}\n"), f"alpha {i}\n")
                 for i in range(100)], [], {NS: info})
    search_mod._SEARCHERS.clear()
    assert len(tools.search(cache, ["alpha"], max_results=200)["results"]) == 101
    assert search_mod.searcher(cache)._refreshed_for is None
    search_index.delete_index(search_index.index_path(cache))
    assert len(tools.search(cache, ["alpha"], max_results=200)["results"]) == 101
    assert search_mod.searcher(cache)._refreshed_for is not None


def test_all_of_common_words_reads_only_the_files_holding_every_one(tmp_path: Path) -> None:
    # Each word is in half the files (too many for the index to narrow by one word), but
    # only the last two files hold both: one MATCH of all their trigrams names just those.
    files = {f"f{i:03d}.md": ("rotate the disk\n" if i % 2 else "signing off\n")
             for i in range(60)}
    files["z1.md"] = files["z2.md"] = "rotate\nsigning key\n"
    cache = make_cache(tmp_path, files)
    search_index.refresh_index(cache)
    query = dict(queries=["rotate", "signing"], match_mode="all")
    got = [(r["path"], r["line_number"]) for r in all_pages(cache, **query)]
    assert got == reference(cache, ["rotate", "signing"], "all")
    assert got == [(f"{NS}/z{n}.md", line) for n in (1, 2) for line in (1, 2)]
    assert search_mod.searcher(cache).scanned == 2


@pytest.mark.parametrize(("query", "by_trigrams"), [
    ("gamma alpha beta", 81), ("mma alpha beta", 81), ("gamma alpha beta ", 81),
    ("a, alpha-beta!", 1)])
def test_a_phrase_of_words_every_file_holds_reads_only_the_files_holding_it(
        tmp_path: Path, query: str, by_trigrams: int) -> None:
    # Every file holds each trigram of the phrase, and its words but never side by side: only
    # the words' places (the words table) tell the one file that holds the phrase.
    files = {f"f{i:03d}.md": f"gamma alpha. alpha gamma beta {i}\n" for i in range(80)}
    files["m.md"] = "gamma, alpha-beta! gamma alpha beta end\n"
    cache = make_cache(tmp_path, files)
    search_index.refresh_index(cache)
    got = [(r["path"], r["line_number"]) for r in all_pages(cache, queries=[query])]
    assert got == reference(cache, [query]) == [(f"{NS}/m.md", 1)]
    searcher = search_mod.searcher(cache)
    assert searcher.scanned == 1
    searcher.index.begin()
    match = searcher.index.expression([normalize(query)], 81)
    assert match is not None and match.words
    grams = index_reader._grams([normalize(query)])
    assert grams is not None and match.grams == ""  # the phrase stands for the trigrams
    assert len(searcher.index.matching(index_reader.Match(grams, ""))) == by_trigrams
    searcher.index.end()


@pytest.mark.parametrize(("query", "words"), [
    ("lpha", ""), ("alpha ", ""), (", beta", ""), ("alpha beta", '("alpha bet"*)'),
    ("pha beta.", '("pha beta ." OR "alpha beta .")'),
    ("a, beta gamma", '("a , beta gam"* OR "alpha , beta gam"* OR "gamma , beta gam"* OR '
                      '"beta , beta gam"*)'),
    ("a, beta gamma.", '("a , beta gamma ." OR "alpha , beta gamma ." OR '
                       '"gamma , beta gamma ." OR "beta , beta gamma .")'),
    ("-gamma beta", '"- gamma bet"*')])
def test_a_phrase_is_asked_with_each_word_its_first_may_end(tmp_path: Path, query: str,
                                                            words: str) -> None:
    # Its words from the first ASCII separator on, each punctuation character a word of its
    # own, the last a prefix of its first three characters unless a separator ends the key, and
    # the first as itself and as each longer word of the index that ends with it (`ends`, in
    # its order: the words spelt backwards). One word alone asks no phrase (in its case, not
    # even beside punctuation).
    cache = make_cache(tmp_path, {"a.md": "alpha beta gamma\n"})
    search_index.refresh_index(cache)
    searcher = search_mod.searcher(cache)
    searcher.index.begin()
    match = searcher.index.expression([query], 1)
    searcher.index.end()
    assert match is not None and match.words == words


@pytest.mark.parametrize(("query", "words"), [
    ("alpha beta g", '("alpha beta")'), ("alpha beta ga", '("alpha beta")'),
    ("alpha beta gam", '("alpha beta gam"*)'), ("alpha beta gamm", '("alpha beta gam"*)'),
    ("alpha beta gamma", '("alpha beta gam"*)'), ("alpha beta gamma ", '("alpha beta gamma")'),
    ("alpha beta gaïa", '("alpha beta gaï"*)')])
def test_a_last_word_is_asked_as_its_first_three_characters_or_left_out(
        tmp_path: Path, query: str, words: str) -> None:
    # The words table keeps a list of every word's first three characters (`prefix='3'`),
    # which SQLite reads only as far as it is asked; a shorter prefix begins too many words.
    cache = make_cache(tmp_path, {"a.md": "alpha beta gamma\n", "b.md": "alpha beta gaïas\n",
                                  "c.md": "alpha beta gam\n", "d.md": "alpha beta\ngamma\n",
                                  "e.md": "alpha beta gamma delta\n"})
    search_index.refresh_index(cache)
    searcher = search_mod.searcher(cache)
    searcher.index.begin()
    assert searcher.index.expression([query], 4).words == words
    searcher.index.end()
    got = [(r["path"], r["line_number"]) for r in all_pages(cache, queries=[query])]
    assert got == reference(cache, [query])
    assert got


def test_a_first_word_that_too_many_words_end_with_is_left_out_of_the_phrase(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Its pairs (`search_index.pairs_text`), then its trigrams, up to the second word's first
    # character, are asked instead once the phrase alone proves to name most files: the files
    # holding the rest of the phrase after another word are not read from then on, and one
    # holding the whole key is still found.
    monkeypatch.setattr(index_reader, "_ENDINGS", 2)  # alpha, gamma and beta end with `a`
    monkeypatch.setattr(index_reader, "_LATER_PAGES", 0)  # nor their phrases asked later,
    monkeypatch.setattr(index_reader, "_LATER_RARE", 0)  # z.md holding the phrase of `a`
    files = {f"c{i:03d}.md": "gamma\nbeta gamma\n" for i in range(200)}
    files.update({"a.md": "alpha beta gamma\n", "b.md": "data beta gamma\n",
                  "z.md": "a beta gamma\n"})
    cache = make_cache(tmp_path, files)
    search_index.refresh_index(cache)
    searcher = search_mod.searcher(cache)
    searcher.index.begin()
    match = searcher.index.expression(["a beta gamma"], 203)
    assert match.grams == "" and match.words == '"beta gam"*' and match.then is not None
    # its pairs first (`a` the end of a word before `beta`), then its trigrams
    assert (match.then.words, match.then.pairs) == ("", '"be\x1ea"* AND "ga\x1eateb"')
    assert match.then.then is not None and match.then.then.words == '"beta gamma"*'
    assert '"a b"' in match.then.then.grams.split(" AND ")
    match = searcher.index.expression(["ta beta gamma"], 203)
    assert match.words == '("ta beta gam"* OR "data beta gam"* OR "beta beta gam"*)'
    assert match.then is not None and match.then.pairs == '"be\x1eat"* AND "ga\x1eateb"'
    assert match.then.then is not None and match.then.then.words == (
        '("ta beta gamma"* OR "data beta gamma"* OR "beta beta gamma"*)')
    searcher.index.end()
    got = [r["path"] for r in all_pages(cache, queries=["a beta gamma"])]
    assert got == [f"{NS}/a.md", f"{NS}/b.md", f"{NS}/z.md"]
    assert searcher.scanned < 100  # the first files the phrase named, then z.md


def test_a_phrase_of_one_word_after_its_first_asks_more_words_ending_with_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # More words end with `alpha` than a longer phrase asks; left out, it would leave one word,
    # no phrase at all. So up to `_ENDINGS_ALONE` of them are asked: only the files holding the
    # two words side by side are read, not every file holding both. Past that many, its pairs
    # (`search_index.pairs_text`) are asked: in its case, from the start, where they name as
    # few; ignoring case, once the first files read by its trigrams prove to lack it.
    monkeypatch.setattr(index_reader, "_ENDINGS", 2)
    monkeypatch.setattr(index_reader, "_ENDINGS_ALONE", 4)
    files = {f"c{i:03d}.md": f"{'xyz'[i % 3]}alpha gamma\ndata beta\n" for i in range(200)}
    files.update({"a.md": "xalpha beta\n", "b.md": "alpha beta\n"})
    cache, searcher = indexed(make_cache(tmp_path, files))
    searcher.index.begin()
    assert searcher.index.expression(["alpha beta"], 202).words == (
        '("alpha bet"* OR "xalpha bet"* OR "yalpha bet"* OR "zalpha bet"*)')
    searcher.index.end()
    for alone, case, read in ((4, True, 2), (2, True, 2), (2, False, 32)):
        monkeypatch.setattr(index_reader, "_ENDINGS_ALONE", alone)
        got = [(r["path"], r["line_number"]) for r in all_pages(
            cache, queries=["alpha beta"], case_sensitive=case)]
        assert got == reference(cache, ["alpha beta"], case_sensitive=case) == [
            (f"{NS}/a.md", 1), (f"{NS}/b.md", 1)]
        assert searcher.scanned == read, (alone, case)


def test_the_one_rare_word_after_a_first_that_ends_too_many_words_is_asked_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # More words end with `to` than are asked (`into`, `onto`, `pluto`): no phrase, in its case
    # or not, and the key's trigrams are in every file (`into sums`, `resupply`). `supply` is
    # in few parts, so only the files holding a word it begins are read. A key holding a
    # capital, case counting, is left to its trigrams, which keep its case.
    monkeypatch.setattr(index_reader, "_ENDINGS", 2)
    monkeypatch.setattr(index_reader, "_ENDINGS_LATER", 2)
    files = {f"c{i:03d}.md": "go into sums to resupply pluto\n" for i in range(200)}
    files.update({"a.md": "up to supply\n", "b.md": "onto supplying\n", "d.md": "to\nsupply\n"})
    cache, searcher = indexed(make_cache(tmp_path, files))
    searcher.index.begin()
    assert searcher.index.expression(["to supply"], 203).words == '"supply"*'
    assert searcher.index.expression(["to Supply"], 203).words == ""
    assert searcher.index.expression(["to supply"], 203, any_case=True).words == '"supply"*'
    searcher.index.end()
    got = [(r["path"], r["line_number"]) for r in all_pages(cache, queries=["to supply"])]
    assert got == reference(cache, ["to supply"]) == [(f"{NS}/a.md", 1), (f"{NS}/b.md", 1)]
    assert searcher.scanned == 3  # a.md, b.md and d.md, whose two words are lines apart


def test_a_short_last_word_is_merged_where_a_first_that_ends_too_many_words_is_left_out(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # More words end with `is` than are asked (`this`, `his`, `axis`): the phrase starts at
    # `used`, and `by`, too short for its three characters' list, would be left out, leaving
    # one word. Ignoring case it is asked as the prefix it may be, the words it begins being
    # few: the files holding `used` and `by` apart are not read.
    monkeypatch.setattr(index_reader, "_ENDINGS_LATER", 2)
    files = {f"c{i:03d}.md": "this is used here\nand by his way\n" for i in range(200)}
    files.update({"a.md": "it is used by all\n", "b.md": "axis used byte\n", "d.md": "is used\nby\n"})
    cache, searcher = indexed(make_cache(tmp_path, files))
    searcher.index.begin()
    assert searcher.index.expression(["is used by"], 203, any_case=True).words == '"used by"*'
    searcher.index.end()
    got = [(r["path"], r["line_number"]) for r in all_pages(cache, queries=["is used by"],
                                                           case_sensitive=False)]
    assert got == reference(cache, ["is used by"], case_sensitive=False) == [
        (f"{NS}/a.md", 1), (f"{NS}/b.md", 1)]
    assert searcher.scanned == 3  # a.md, b.md and d.md, whose two words are lines apart


def fifth_and_three(tmp_path: Path, fifth: str, three: str) -> Cache:
    """1,000 indexed files: a fifth hold `fifth`, files 3, 501 and 998 `three`, the rest neither."""
    files = {f"f{i:04d}.md": f"alpha {fifth}\n" if i % 5 == 0 else "alpha delta\n"
             for i in range(1000)}
    files.update({f"f{i:04d}.md": f"alpha {three}\n" for i in (3, 501, 998)})
    cache = make_cache(tmp_path, files)
    search_index.refresh_index(cache)
    return cache


def asked(cache: Cache, key: str, any_case: bool = False) -> index_reader.Match:
    """What the index is asked for `key` among 1,000 files (`IndexReader.expression`)."""
    searcher = search_mod.searcher(cache)
    searcher.index.begin()
    try:
        match = searcher.index.expression([key], 1000, any_case=any_case)
    finally:
        searcher.index.end()
    assert match is not None
    return match


def read_for_the_three(cache: Cache, query: str, case_sensitive: bool = True) -> int:
    """How many files a search reads to find `query` in the three `fifth_and_three` holds."""
    searcher = search_mod.searcher(cache)
    got = [(r["path"], r["line_number"])
           for r in all_pages(cache, queries=[query], case_sensitive=case_sensitive)]
    assert got == reference(cache, [query], case_sensitive=case_sensitive) == [
        (f"{NS}/f{i:04d}.md", 1) for i in (3, 501, 998)]
    return searcher.scanned


def test_a_phrase_whose_files_mostly_lack_it_is_asked_with_its_last_word_whole(
        tmp_path: Path) -> None:
    # `beta gamma` is asked as `"beta gam"*`, the prefix the words table keeps a list of, and a
    # fifth of the files hold `beta gamut`: once the first files read give under a result in
    # four, the rest is asked as `"beta gamma"*`, so those files are not read past them. In its
    # case, its pairs first (`search_index.pairs_text`), which tell its case but not `gamut`.
    cache = fifth_and_three(tmp_path, "beta gamut", "beta gamma")
    match = asked(cache, "beta gamma")
    assert match.words == '("beta gam"*)' and match.then is not None
    assert match.then.pairs == '"ga\x1eateb"' and match.then.then is not None
    assert match.then.then.words == '("beta gamma"*)'
    assert asked(cache, "beta gamma", any_case=True).then.words == '("beta gamma"*)'
    assert read_for_the_three(cache, "beta gamma", False) < 100  # where all 203 holding
    assert read_for_the_three(cache, "beta gamma") < 160  # `beta gam` were, its pairs read too


@pytest.mark.parametrize("case", ["beta gamut", "Beta Gamut"])
def test_a_last_word_whole_that_names_as_many_parts_is_asked_once(
        tmp_path: Path, case: str) -> None:
    # A fifth of the files hold `beta  gamut`, which the words table takes for the phrase `beta
    # gamut` (its blanks collapsed): the files read give few results, so the phrase is asked
    # with its last word whole (after its pairs in its case, which name them too), which names
    # as many parts at a higher cost (SQLite merges that word's whole list for each question):
    # after that one question it is asked as before.
    cache = fifth_and_three(tmp_path, case.replace(" ", "  "), case)
    sql_of_next_search(cache, queries=["nothing-like-it"])  # the view is loaded
    searcher = search_mod.searcher(cache)
    assert searcher.index.conn is not None
    statements: list[str] = []
    searcher.index.conn.set_trace_callback(statements.append)
    read_for_the_three(cache, case)
    asked = [s.split("MATCH '")[1].split("'")[0] for s in statements
             if re.search("FROM (words|pairs) WHERE (words|pairs) MATCH", s)]
    assert asked.count('("beta gamut"*)') == 1 and asked[0] == '("beta gam"*)', asked


def test_a_lowercase_phrase_whose_words_every_file_holds_is_asked_in_its_case(
        tmp_path: Path) -> None:
    # A fifth of the files hold `For more information`, and `more for` and `information` in
    # lowercase too: the phrase's words, trigrams and word starts are all there. Once the
    # first files read prove to lack it, it is asked of its pairs in their case (`pairs`: the
    # first three characters of a word and the last four of the one before), alone.
    cache = fifth_and_three(tmp_path, "For more information, more for information",
                            "for more information")
    match = asked(cache, "for more information")
    assert match.then is not None and (match.then.words, match.then.grams) == ("", "")
    assert match.then.pairs == '"mo\x1erof"* AND "in\x1eerom"'
    assert read_for_the_three(cache, "for more information") < 100  # where it read 203
    assert len(all_pages(cache, queries=["For more information"])) == 200
    assert len(all_pages(cache, queries=["for more information"], case_sensitive=False)) == 203


def test_a_lowercase_phrase_with_a_short_last_word_is_asked_in_its_case(tmp_path: Path) -> None:
    # A fifth of the files hold `For more in`, and `for`, `more` and `in` in lowercase apart.
    # Its pairs hold only the first two characters of a word after another, so that `in`, the
    # prefix it may be, is asked as theirs; a last word of one character is not: the phrase
    # is asked beside the pairs before it.
    cache = fifth_and_three(tmp_path, "For more in it, more for them", "for more in")
    then = asked(cache, "for more in").then
    assert (then.pairs, then.words) == ('"mo\x1erof"* AND "in\x1eerom"', "")
    then = asked(cache, "for more i").then
    assert (then.pairs, then.words) == ('"mo\x1erof"*', '("for more")')
    assert read_for_the_three(cache, "for more in") < 100  # where it read 203
    assert read_for_the_three(cache, "for more i") < 100


def test_a_phrase_in_its_case_is_asked_alone_for_its_next_matches(tmp_path: Path) -> None:
    # Half the files hold `For more information`: the folded phrase names most parts, which
    # once had its trigrams asked with it a chunk at a time. Its pairs in their case go on
    # alone, for its next matches, sieved by its trigrams across a separator (the pairs tell
    # its case and where its words start).
    files = {f"f{i:04d}.md": "alpha For more information, more for\n" if i % 2 else
             "alpha delta\n" for i in range(600)}
    files.update({f"f{i:04d}.md": "alpha for more information\n" for i in (3, 301, 598)})
    cache = make_cache(tmp_path, files)
    search_index.refresh_index(cache)
    got, statements = sql_of_next_search(cache, queries=["for more information"])
    assert got == reference(cache, ["for more information"]) == [
        (f"{NS}/f{i:04d}.md", 1) for i in (3, 301, 598)]
    in_case = [s for s in statements if "FROM pairs WHERE" in s]
    assert in_case and not any("FROM grams" in s for s in in_case), in_case
    assert any('MATCH \'"e i" AND "r m"\'' in s for s in statements)  # across separators


@pytest.mark.parametrize("added", [0, 1, 500], ids=["built whole", "a file added since",
                                                   "files scattered"])
def test_a_phrase_in_most_files_is_asked_as_its_then_whether_or_not_rows_are_in_path_order(
        tmp_path: Path, added: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # Half the files hold `For more information`. It is asked for its next matches while the
    # rows stand in path order but for a few files added since the build (with no rows left
    # free, their rows past all others); with more than an eighth of them out of it, a chunk at
    # a time. Either way, once the phrase proves to name most parts it is asked as its `then`,
    # where every file was read.
    monkeypatch.setattr(search_index, "_SLACK", 0)
    files = {f"f{i:04d}.md": "alpha For more information, more for\n" if i % 2 else
             "alpha delta\n" for i in range(3000)}
    files.update({f"f{i:04d}.md": "alpha for more information\n" for i in (3, 1501, 2998)})
    cache = make_cache(tmp_path, files)
    search_index.refresh_index(cache)
    if added:
        info = NamespaceInfo(NS, "lab", "notes", "markdown", 2, "2026-01-03T00:00:00Z")
        cache.apply([(f"{NS}/f{i * 6:04d}a.md", sha256_text("alpha\n"), "alpha\n")
                     for i in range(added)], [], {NS: info})
        search_index.refresh_index(cache)
    searcher = search_mod.searcher(cache)
    got = [(r["path"], r["line_number"])
           for r in all_pages(cache, queries=["for more information"])]
    assert got == reference(cache, ["for more information"]) == [
        (f"{NS}/f{i:04d}.md", 1) for i in (3, 1501, 2998)]
    assert searcher.index.begin() is not None
    assert searcher._view is not None
    order = searcher._view.order()
    assert (order[1] if order else None) == {0: [], 1: [1], 500: None}[added]
    searcher.index.end()
    assert searcher.scanned < 600  # where it read all 1,500 holding the words


def test_a_phrase_in_its_case_is_asked_by_its_pairs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Each two words of a key one after the other, in its case (`pairs`): the first two
    # characters of the second and the last four of the first, spelt backwards. A first word
    # of fewer characters, which may end a longer word, is a prefix, unless the key starts with
    # a separator; a last word of one character, which may begin many, is left out. Not asked
    # ignoring case, where the folded words tell as much, nor where a prefix's pairs fill more
    # than `_MERGED` pages: each question merges their lists.
    cache = fifth_and_three(tmp_path, "For more information", "for more information")
    assert asked(cache, "for more information", any_case=True).then.pairs == ""
    then = asked(cache, "For more inf").then
    assert (then.words, then.pairs) == ("", '"mo\x1ero\x06"* AND "in\x1eerom"')
    assert asked(cache, " For more i").then.pairs == '"mo\x1ero\x06"'
    assert asked(cache, "ha more info").then.pairs == '"mo\x1eah"* AND "in\x1eerom"'
    monkeypatch.setattr(index_reader, "_MERGED", 0)
    assert asked(cache, "For inf").then.pairs == ""
    assert asked(cache, "ha more info").then.pairs == '"in\x1eerom"'


def test_two_words_whose_last_is_short_are_asked_by_their_pair_in_their_case(
        tmp_path: Path) -> None:
    # A fifth of the files hold `This is`, and `this` and `is` apart: the folded words cannot
    # ask `is`, the prefix it may be, and its trigrams are in every one of them. Its pair in its
    # case is asked: only the three files that hold `this is` are read.
    cache = fifth_and_three(tmp_path, "This is it, and this one is", "xthis isle")
    match = asked(cache, "this is")
    assert (match.pairs, match.words, match.grams, match.then) == ('"is\x1esiht"', "", "", None)
    assert match.sieve == '"s i"'  # the trigrams across its separator
    assert read_for_the_three(cache, "this is") == 3  # where it read all 203 holding both


def test_two_words_whose_last_is_short_are_a_phrase_ignoring_case_when_its_words_are_few(
        tmp_path: Path) -> None:
    # Ignoring case, the same: the folded words are asked, `is` as the prefix it may be, where
    # the trigrams of `this is` in any case were asked of every file holding both words.
    cache = fifth_and_three(tmp_path, "this one, is it", "This isle")
    assert asked(cache, "this is", any_case=True).words == '("this is"*)'
    searcher = search_mod.searcher(cache)
    got = [(r["path"], r["line_number"])
           for r in all_pages(cache, queries=["this is"], case_sensitive=False)]
    assert got == reference(cache, ["this is"], case_sensitive=False) == [
        (f"{NS}/f{i:04d}.md", 1) for i in (3, 501, 998)]
    assert searcher.scanned == 3  # where it read all 203 holding both


def test_a_short_last_word_whose_words_fill_many_pages_is_not_asked_as_a_prefix(
        tmp_path: Path) -> None:
    # `is` fills over `_MERGED` pages of the words: merged for each question, it costs more than
    # reading the files its trigrams name. `it`, in few of them, is asked. In its case, the pair
    # of `this` and the first two characters of `is` is asked (`pairs` keeps no longer).
    files = {f"f{i:03d}.md": "this alpha " + "is " * 600 + "\n" for i in range(300)}
    files.update({f"g{i}.md": "this is it\n" for i in range(3)})
    cache = make_cache(tmp_path, files)
    search_index.refresh_index(cache)
    for any_case in (False, True):
        match = asked(cache, "this is", any_case=any_case)
        assert (match.words, match.pairs) == ("", "" if any_case else '"is\x1esiht"')
        assert asked(cache, "this it", any_case=True).words == '("this it"*)'
    got = [(r["path"], r["line_number"]) for r in all_pages(cache, queries=["this is"])]
    assert got == reference(cache, ["this is"]) == [(f"{NS}/g{i}.md", 1) for i in range(3)]


def test_two_words_whose_first_ends_common_words_are_not_asked_with_them_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # `xthis` ends with `this`: asked alone beside the phrase `this is`, it names every part
    # holding it, a fifth of the files, each then read. Past `_ENDED` such parts the two words
    # are not asked as a phrase; their trigrams are, and beside them the words that may end
    # where `this` does (not a phrase: no places walked). In its case, its pair is asked.
    cache = fifth_and_three(tmp_path, "xthis one", "this is")
    match = asked(cache, "this is", any_case=True)
    assert (match.words, match.phrase) == ('("this" OR "xthis")', False)
    assert asked(cache, "this is").pairs == '"is\x1esiht"'
    monkeypatch.setattr(index_reader, "_ENDED", 200)
    assert asked(cache, "this is", any_case=True).words == '("this is"* OR "xthis")'


def test_two_words_whose_first_is_rare_are_asked_by_their_trigrams(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # `this` is in three files: ignoring case, the trigrams of `this is` name about as few, and
    # cost no merge of the words `is` begins (`this` is asked beside them, not as a phrase). In
    # more than `_RARE` parts, the two words are asked.
    cache = fifth_and_three(tmp_path, "alpha is one", "this is")
    match = asked(cache, "this is", any_case=True)
    assert (match.words, match.phrase) == ('("this")', False)
    assert "his" in match.grams.replace('"', " ").split()
    monkeypatch.setattr(index_reader, "_RARE", 2)
    assert asked(cache, "this is", any_case=True).words == '("this is"*)'


def test_two_words_whose_last_is_short_find_what_a_full_scan_finds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The text's words may end with the query's first and begin with its last, in its case or
    # not, apart or side by side; more words may end with the first than are asked.
    monkeypatch.setattr(index_reader, "_ENDINGS_ALONE", 2)
    monkeypatch.setattr(index_reader, "_RARE", 20)  # each first word is in more files
    rng = random.Random(19)
    firsts = ["this", "This", "xthis", "aThis", "THIS", "thisx", "ythis", "zthis"]
    lasts = ["is", "Is", "isle", "iS", "i", "IS", "island", "it"]
    files = {f"f{i:03d}.md": "\n".join(
        rng.choice(firsts) + rng.choice([" ", "-", "_", ". ", "\n", " and "]) +
        rng.choice(lasts) + rng.choice(["", "s", " end"])
        for _ in range(rng.randint(1, 4))) + "\n" for i in range(150)}
    cache, _ = indexed(make_cache(tmp_path, files))
    alone = {True: 0, False: 0}
    for _ in range(60):
        query = rng.choice(firsts) + rng.choice([" ", " ", "-"]) + rng.choice(
            ["is", "Is", "i", "IS", "isl", "it"]) + rng.choice(["", "", " "])
        case = rng.choice([True, True, False])
        got, statements = sql_of_next_search(cache, queries=[query], max_results=3,
                                             case_sensitive=case)
        assert got == reference(cache, [query], case_sensitive=case), (query, case)
        alone[case] += any("FROM pairs WHERE" in s if case else re.search(
            r"MATCH '\(\"[^\" ]+ [^\" ]{1,5}\"\*", s) for s in statements)  # its last word asked
    assert min(alone.values()) > 5, alone


def test_a_last_word_of_one_character_is_found_from_the_end_of_a_key_of_any_length() -> None:
    # Asked at every trigram of a key, so only its end is searched; the same as its definition.
    def definition(key: str) -> int | None:
        last = re.search(r"[^\x00-\x2f\x3a-\x40\x5b-\x60\x7b-\x7f]+\Z", key)
        return last.start() if last and len(last.group()) == 1 else None

    rng = random.Random(18)
    pieces = ["a", "ab", "abc", "A", "xB", " ", "-", "é", "word ", "abcdefg"]
    keys = ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 12))) for _ in range(3000)]
    for key in [*keys, "word " * 200 + "i", "x abcdefg", "x I"]:
        assert index_reader._short_last(key) == definition(key), key


@pytest.mark.parametrize("segment", [8192, 24], ids=["whole files", "in parts"])
def test_phrases_in_their_case_find_what_a_full_scan_finds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, segment: int) -> None:
    # Words whose case differs from the query's, where the first word of the text may end
    # with the query's first, in its case or not (`Therefor`, `xFor`), and its last begin with
    # its last (`infoRmation`): each phrase soon asked in its case, the results a scan's.
    monkeypatch.setattr(search_index, "SEGMENT_BYTES", segment)
    monkeypatch.setattr(index_view, "_TRIED", 2)
    monkeypatch.setattr(index_reader, "_ENDINGS", 3)
    rng = random.Random(17)
    firsts = ["for", "For", "FOR", "therefor", "TherEfor", "xFor", "fOr", "befor", "Befor"]
    seconds, lasts = ["more", "More", "MORE", "moRe"], ["info", "Info", "infoRmation", "INFO",
                                                       "infoX", "ínfo"]
    files = {f"f{i:03d}.md": "\n".join(
        rng.choice(firsts) + rng.choice([" ", "-", ". ", "\n"]) + rng.choice(seconds) +
        rng.choice([" ", "_", "  "]) + rng.choice(lasts) + rng.choice(["", "s", " end"])
        for _ in range(rng.randint(1, 5))) + "\n" for i in range(120)}
    cache, _ = indexed(make_cache(tmp_path, files))
    asked_cased = 0
    for _ in range(40):
        query = rng.choice(firsts + ["or", "Or"]) + rng.choice([" ", " ", "-"]) + rng.choice(
            seconds) + " " + rng.choice(lasts + ["infoR", "Inf"]) + rng.choice(["", " "])
        got, statements = sql_of_next_search(cache, queries=[query], max_results=3)
        assert got == reference(cache, [query]), query
        asked_cased += any("FROM pairs WHERE" in s for s in statements)
    assert asked_cased > 10


@pytest.mark.parametrize(("fifth", "three"), [("information, see", "information see"),
                                               ("amazon.com", "amazon com"),
                                               ("amazon com", "amazon.com")])
def test_a_phrase_s_punctuation_is_words_of_its_own(tmp_path: Path, fifth: str,
                                                     three: str) -> None:
    # Each ASCII punctuation character is a word of the words tables, so a phrase tells
    # `information see` from `information, see` from its first question: only the three files
    # holding it are read, where the first 32 or more holding the other were.
    cache = fifth_and_three(tmp_path, fifth, three)
    assert read_for_the_three(cache, three) == 3
    assert f'"{search_index.punctuation_apart(three)}"*' in asked(cache, three).words


def test_one_word_beside_punctuation_is_a_phrase_ignoring_case(tmp_path: Path) -> None:
    # `"beta":` is four words of the words tables, `beta` whole: a fifth of the files hold
    # `"beta", "gamma":`, every trigram of the key, and none of them is read. In its case, or
    # beside a word in most parts, its trigrams are asked as before.
    cache = fifth_and_three(tmp_path, '"Beta", "gamma":', '"beta":')
    assert asked(cache, '"beta":', any_case=True).words == '""" beta "" :"'
    assert asked(cache, '"beta":').words == asked(cache, '"alpha":', any_case=True).words == ""
    # where the 200 holding its trigrams were read
    assert read_for_the_three(cache, '"BETA":', case_sensitive=False) == 3


@pytest.mark.parametrize("three", ["enter a", "datacenter a"])
def test_a_word_before_a_short_last_word_is_asked_with_the_words_ending_with_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, three: str) -> None:
    # `enter a` leaves out its last word, too short to ask (no pages allowed for its prefix),
    # and one word is no phrase; a fifth of the files hold `entering user a`, every trigram of
    # the key. The words that may end where `enter` does (`enter` itself and those ending with
    # it) are asked beside the trigrams, in any case or its own (the words are folded: they
    # narrow, the file tells), and name only the three. Beside a word in most files, the words
    # would narrow little.
    monkeypatch.setattr(index_reader, "_MERGED", 0)
    cache = fifth_and_three(tmp_path, "entering user a", three)
    longer = ' OR "datacenter"' if three.startswith("data") else ""
    for key, any_case in (("Enter a", True), ("enter a", False)):
        match = asked(cache, key, any_case=any_case)
        assert (match.words, match.phrase) == (f'("enter"{longer})', False)
    assert asked(cache, "alpha e", any_case=True).words == ""
    # where the 203 holding its trigrams were read
    assert read_for_the_three(cache, "ENTER A", case_sensitive=False) == 3
    assert read_for_the_three(cache, three) == 3


def beta_endings(tmp_path: Path, fifth: str, rest: str, count: int,
                 three: str) -> tuple[Cache, set[str]]:
    """1,000 indexed files: a fifth hold `fifth`, the others `rest` and one of `count` words
    ending with `beta`, files 3, 501 and 998 `three`; and the words longer than `beta` ending
    with it."""
    words = ["abcdefghijklmnopqrstuvwxyz"[k % 26] * (1 + k // 26) + "beta" for k in range(count)]
    files = {f"f{i:04d}.md": f"alpha {fifth}\n" if i % 5 == 0 else
             f"alpha {rest} {words[i % count]}\n" for i in range(1000)}
    files.update({f"f{i:04d}.md": f"alpha {three}\n" for i in (3, 501, 998)})
    cache = make_cache(tmp_path, files)
    search_index.refresh_index(cache)
    return cache, {w for text in files.values() for w in text.split() if w.endswith("beta")} - {
        "beta"}


@pytest.mark.parametrize("any_case", [False, True])
@pytest.mark.parametrize(("key", "fifth", "each"), [
    ("beta gamma", "beta glow gamut mamma", ' gam"*'), ("beta gamma a", "beta glow gamma a", ' gamma"')])
def test_a_first_word_that_ends_many_words_is_asked_as_their_phrases_once_its_files_lack_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, any_case: bool, key: str, fifth: str,
        each: str) -> None:
    # 51 words end with `beta`, too many for the phrases of `beta gamma` to be asked from the
    # start: its trigrams are, and they are in the fifth of the files holding `fifth`. Once the
    # first 32 files taken give one result, the rest is asked as its pairs, and after them as
    # the phrase of each of those words: the three holding `qqbeta` and the key are the only
    # files read past them. So with
    # a short last word, which a phrase leaves out (`beta gamma a`). So too where the list of
    # `beta` fills more pages than allowed, as the phrase of `beta` itself is in no file.
    cache, longer = beta_endings(tmp_path, fifth, "delta", 51, "qq" + key)
    match = asked(cache, key, any_case=any_case)
    if any_case:  # its pairs first (`beta` and the first two characters of `gamma`)
        assert match.words == "" and match.then is not None
        assert match.then.pairs == '("ga\x1eateb" OR "ga\x1fateb")'
        later = match.then.then
        assert later is not None and 32 < len(longer) <= 128
        assert (later.grams, later.words.count(each)) == ("", len(longer) + 1)
    else:  # in its case, from the start
        assert (match.words, match.pairs, match.then) == ("", '"ga\x1eateb"', None)
    # where the 203 holding its trigrams were read
    assert read_for_the_three(cache, key.upper() if any_case else key,
                              case_sensitive=not any_case) < 40
    monkeypatch.setattr(index_reader, "_LATER_PAGES", 0)
    assert asked(cache, key, any_case=any_case).then == match.then


def test_a_first_word_whose_list_is_long_asks_their_phrases_only_where_its_own_is_rare(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Where the list of `beta` fills more pages than allowed, each question of the phrases of
    # the 51 words ending with it walks that list as far as its page needs: they are asked
    # where the phrase of `beta` itself is in few parts (`beta gamma`: none), as one question
    # then reaches its end, and not where it is in more (`beta glow`: 200 files), nor beside
    # punctuation (`beta gamma, a`), which asking that phrase walks in every part. It is
    # counted among the first `_LATER_ROWS` rows only.
    monkeypatch.setattr(index_reader, "_LATER_PAGES", 0)
    monkeypatch.setattr(index_reader, "_LATER_RARE", 100)
    cache, longer = beta_endings(tmp_path, "beta glow gamut mamma", "delta", 51,
                                 "qqbeta gamma")
    def later(key: str) -> index_reader.Match | None:  # after its pairs
        then = asked(cache, key, any_case=True).then
        return then.then if then is not None and then.pairs else then

    then = later("beta gamma")
    assert then is not None and then.words.count(' gam"*') == len(longer) + 1
    assert read_for_the_three(cache, "beta gamma") < 40
    assert later("beta gamma a") is not None
    assert later("beta glow") is None
    assert later("beta gamma, a") is None
    monkeypatch.setattr(index_reader, "_LATER_ROWS", 600)  # rows of the first 200 or so files
    assert later("beta glow") is not None  # 40 of the 200 there
    monkeypatch.setattr(index_reader, "_LATER_ROWS", 1 << 16)
    monkeypatch.setattr(index_reader, "_LATER_RARE", 200)
    assert later("beta glow") is not None


def test_a_words_pages_are_counted_alike_once_small_refreshes_add_segments(
        tmp_path: Path) -> None:
    # How many pages a word's list fills decides how it is asked (`_LATER_PAGES`, `_MERGED`).
    # FTS5 tells where in each segment a word may lie to a page or two, so each segment a
    # small refresh adds counted one or two more pages for every word, and a key's question
    # changed with them (`file in the` read 1,141 files of the documentation for 117). Of the
    # segments but the largest, only the pages a list fills whole count.
    cache = make_cache(tmp_path, {f"f{i:04d}.md": " ".join(
        f"w{(i * 7919 + j * 104729) % 99991}" for j in range(40)) + " beta gamma" * 12 + "\n"
        for i in range(1000)})
    search_index.refresh_index(cache)

    def pages() -> tuple[float, ...]:
        searcher = search_mod.searcher(cache)
        searcher.index.begin()
        try:
            return tuple(searcher.index._pages("words", word, begun)
                         for word, begun in (("beta", False), ("gam", True), ("w1", True)))
        finally:
            searcher.index.end()

    built = pages()
    assert built[0] >= 4 and built[2] >= 8  # `beta` fills pages, and the words `w1` begins
    info = NamespaceInfo(NS, "lab", "notes", "markdown", 2, "2026-01-02T00:00:00Z")
    for i in range(3):
        text = f"alpha changed {i} " + "beta gamma " * 12 + "\n"
        cache.apply([(f"{NS}/f{i * 300:04d}.md", sha256_text(text), text)], [], {NS: info})
        search_index.refresh_index(cache)
    conn = sqlite3.connect(search_index.index_path(cache))
    try:
        assert conn.execute("SELECT count(DISTINCT segid) FROM words_idx").fetchone()[0] > 2
    finally:
        conn.close()
    assert pages() == built


@pytest.mark.parametrize("any_case", [False, True])
def test_a_phrase_after_a_first_word_that_ends_many_words_asks_its_pairs_once_files_lack_it(
        tmp_path: Path, any_case: bool) -> None:
    # 17 words end with `beta`, too many for the phrases of `beta gamma the` to be asked from the
    # start: the phrase starts after it, and `gamma the` is in every file, `beta` and the rest
    # of the key's trigrams in a fifth of them. Once the first files taken give no result, its
    # pairs are asked (`beta` and `ga`, `gamma` and `th`), where the trigrams were: the three
    # holding `qqbeta gamma the` are the only files read past them.
    cache, longer = beta_endings(tmp_path, "beta glow gamma the", "gamma the delta", 16,
                                 "qqbeta gamma the")
    match = asked(cache, "beta gamma the", any_case=any_case)
    assert match.words == '"gamma the"*' and match.then is not None and 8 < len(longer)
    pairs = ("ga\x1eateb", "th\x1eamma")
    assert match.then.pairs == " AND ".join(
        f'("{p}" OR "{p.replace(chr(30), chr(31))}")' if any_case else f'"{p}"' for p in pairs)
    assert match.then.grams == ""
    assert match.then.then is not None and "bet" in match.then.then.grams
    query = "BETA GAMMA THE" if any_case else "beta gamma the"
    # where the 200 holding its trigrams were read
    assert read_for_the_three(cache, query, case_sensitive=not any_case) < 100


def test_a_phrase_whose_files_mostly_lack_it_is_sieved_by_the_trigrams_across_its_separators(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The words table takes `www. gnu` for the phrase `www.gnu` (a blank beside punctuation is
    # no word), and a fifth of the files hold it: too few for its trigrams to be asked with it.
    # Once the first files read give under a result in four, each later question of its words
    # is sieved by its trigrams across a separator (`w.g`), so the files holding only `www. gnu`
    # are not read past the first ones. (With no pages allowed for a prefix, `gnu` alone after
    # `Www.` is not asked in its case.)
    monkeypatch.setattr(index_reader, "_MERGED", 0)
    cache = fifth_and_three(tmp_path, "www. gnu", "www.gnu")
    sieves = [match.then.sieve if match.then else None
              for match in (asked(cache, "Www.gnu"), asked(cache, "www.gnu", any_case=True))]
    assert sieves == ['"Www" AND "gnu" AND "w.g"', '("w.g" OR "w.G" OR "W.g" OR "W.G")']
    assert read_for_the_three(cache, "www.gnu") < 100  # where all 203 holding its words were


def test_a_phrase_in_most_files_is_asked_with_its_trigrams_which_tell_separators_apart(
        tmp_path: Path) -> None:
    # The words table takes `https:// docs` for the phrase `https://docs` (a blank beside
    # punctuation is no word): once the phrase proves to name most files, its trigrams (`//d`)
    # are asked with it, and the files holding only `https:// docs` are not read past the
    # first ones.
    files = {f"f{i:03d}.md": f"see https:// docs.example/{i}\n" for i in range(300)}
    files["f100.md"] = "see https://docs here\n"
    files["f250.md"] = "https://docs\n"
    cache = make_cache(tmp_path, files)
    search_index.refresh_index(cache)
    searcher = search_mod.searcher(cache)
    got = [(r["path"], r["line_number"]) for r in all_pages(cache, queries=["https://docs"])]
    assert got == reference(cache, ["https://docs"]) == [(f"{NS}/f100.md", 1),
                                                          (f"{NS}/f250.md", 1)]
    assert searcher.scanned < 100  # where every file was read


@pytest.mark.parametrize("added", [False, True], ids=["built whole", "a file added since"])
def test_a_phrase_alone_is_asked_for_the_matches_its_page_needs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, added: bool) -> None:
    # Its words are in every file, so asking the whole index, or a chunk past where the page
    # fills, would have SQLite read their places in files the page never needs: it is asked
    # once, for half again as many matches as the page takes. A file added since the build
    # (its row past all others, none left free) is asked apart, with every such row in one
    # range, once they are too many to read.
    monkeypatch.setattr(index_view, "_CHUNK", 64)
    monkeypatch.setattr(index_view, "_STRAYS_READ", 0)
    monkeypatch.setattr(search_index, "_SLACK", 0)
    cache = make_cache(tmp_path, {f"f{i:04d}.md": f"beta gamma alpha {i}\n" + (
        "" if i % 100 else "alpha beta\n") for i in range(3000)})
    search_index.refresh_index(cache)
    if added:
        info = NamespaceInfo(NS, "lab", "notes", "markdown", 2, "2026-01-03T00:00:00Z")
        cache.apply([(f"{NS}/f0150a.md", sha256_text("alpha beta\n"), "alpha beta\n")], [],
                    {NS: info})
        search_index.refresh_index(cache)
    sql_of_next_search(cache, queries=["nothing-like-it"])  # the view is loaded
    searcher = search_mod.searcher(cache)
    assert searcher.index.conn is not None
    statements: list[str] = []
    searcher.index.conn.set_trace_callback(statements.append)
    page = tools.search(cache, ["alpha beta"], max_results=5)["results"]
    got = [(r["path"], r["line_number"]) for r in page]
    assert got == reference(cache, ["alpha beta"])[:5]
    assert got == [(f"{NS}/f{i:04d}.md", 2) for i in range(0, 500, 100)] if not added else [
        (f"{NS}/f0000.md", 2), (f"{NS}/f0100.md", 2), (f"{NS}/f0150a.md", 1),
        (f"{NS}/f0200.md", 2), (f"{NS}/f0300.md", 2)]
    asked = [s for s in statements if "FROM words WHERE words MATCH" in s]
    assert asked[0].endswith("ORDER BY rowid LIMIT 8)"), asked
    assert asked[1:] == (["SELECT group_concat(rowid) FROM (SELECT rowid FROM words WHERE words "
                          "MATCH '(\"alpha bet\"*)' AND rowid BETWEEN 3001 AND 3001)"]
                         if added else []), asked


def test_a_phrase_dense_in_a_cluster_of_files_is_read_file_by_file_only_while_they_hold_it(
        tmp_path: Path) -> None:
    # `"beta gam"*` names files 100-199 together, so it seems to be in most parts and every file
    # is read from there on, unasked. Past the 40 holding `beta gamma`, the files read give no
    # result: it is asked again from there, and only the two files holding it past them are
    # read, where every file to the end of the index was.
    files = {f"f{i:04d}.md": "alpha delta\n" for i in range(1000)}
    files.update({f"f{i:04d}.md": "alpha beta gamma\n" if i < 140 else "alpha beta gamut\n"
                  for i in range(100, 200)})
    files.update({f"f{i:04d}.md": "alpha beta gamma\n" for i in (501, 998)})
    cache = make_cache(tmp_path, files)
    search_index.refresh_index(cache)
    searcher = search_mod.searcher(cache)
    got = [(r["path"], r["line_number"]) for r in all_pages(cache, queries=["beta gamma"])]
    assert got == reference(cache, ["beta gamma"]) and len(got) == 42
    assert searcher.scanned < 300  # where 900 were


@pytest.mark.parametrize("results", [1, 2, 3, 7])
def test_a_phrase_asked_for_its_next_matches_never_cuts_a_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, results: int) -> None:
    # Files of many parts hold the phrase in several of them: a question for the next matches
    # ends inside a file, which is then asked to its end, so each file is read once and every
    # line of it found, page after page; a file added since the build (out of path order)
    # too.
    monkeypatch.setattr(search_index, "SEGMENT_BYTES", 40)
    files = {f"f{i:02d}.md": "".join(f"line {n} alpha beta\n" if n % 3 == i % 3 else
                                     f"line {n} beta\n" for n in range(30))
             for i in range(12)}
    cache = make_cache(tmp_path, files)
    search_index.refresh_index(cache)
    search_mod._SEARCHERS.clear()
    got = all_pages(cache, queries=["alpha beta"], max_results=results)
    assert [(r["path"], r["line_number"]) for r in got] == reference(cache, ["alpha beta"])
    assert len(got) == 120
    info = NamespaceInfo(NS, "lab", "notes", "markdown", 2, "2026-01-03T00:00:00Z")
    cache.apply([(f"{NS}/f05b.md", sha256_text("alpha beta\n"), "alpha beta\n")], [],
                {NS: info})
    search_index.refresh_index(cache)
    got = all_pages(cache, queries=["alpha beta"], max_results=results)
    assert [(r["path"], r["line_number"]) for r in got] == reference(cache, ["alpha beta"])
    assert len(got) == 121


def sql_of_next_search(cache: Cache, **args: object) -> tuple[list[tuple[str, int]], list[str]]:
    """The (path, line) results of a search by a new searcher, and the SQL it ran."""
    search_mod._SEARCHERS.clear()
    statements: list[str] = []
    searcher = search_mod.searcher(cache)
    searcher.index.begin()
    assert searcher.index.conn is not None
    searcher.index.conn.set_trace_callback(statements.append)
    searcher.index.end()
    got = [(r["path"], r["line_number"]) for r in all_pages(cache, **args)]
    return got, statements


def test_a_search_loads_the_path_order_the_index_stored(tmp_path: Path) -> None:
    # Paths written in an order unlike their ids: the view's order is what the index stored,
    # read in one row, never sorted again by a search; and it is rewritten with each change.
    cache = make_cache(tmp_path, {f"m{i:02d}.md": f"alpha {i}\n" for i in range(20)})
    search_index.refresh_index(cache)
    info = NamespaceInfo(NS, "lab", "notes", "markdown", 2, "2026-01-03T00:00:00Z")
    cache.apply([(f"{NS}/a{i}.md", sha256_text(f"alpha a{i}\n"), f"alpha a{i}\n")
                 for i in range(3)], [f"{NS}/m05.md"], {NS: info})
    search_index.refresh_index(cache)
    got, statements = sql_of_next_search(cache, queries=["alpha"], max_results=4)
    assert got == reference(cache, ["alpha"])
    assert not [s for s in statements if "ORDER BY path" in s]
    assert [s for s in statements if "FROM orders" in s]


def test_the_stored_order_holds_32_bit_integers_or_none_when_a_value_does_not_fit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Half what a new searcher reads of 64-bit ones. Rows past 2**31 (here past 127, with
    # 8-bit integers) store no order: each new searcher sorts the paths, and finds the same.
    files = {f"m{i:02d}.md": f"alpha {i}\n" for i in range(60)}
    cache = make_cache(tmp_path, files)
    search_index.refresh_index(cache)
    conn = sqlite3.connect(search_index.index_path(cache))
    try:
        ids, positions, owners = conn.execute("SELECT ids, positions, owners FROM orders").fetchone()
        last = conn.execute("SELECT max(first + parts) FROM files").fetchone()[0]
    finally:
        conn.close()
    assert (len(ids), len(owners), len(positions)) == (4 * 60, 4 * 60, 4 * last)
    for module in (search_index, index_reader):
        monkeypatch.setattr(module, "ORDER_TYPE", "b")
    cache = make_cache(tmp_path / "small", files)
    search_index.refresh_index(cache)
    conn = sqlite3.connect(search_index.index_path(cache))
    try:
        assert conn.execute("SELECT count(*) FROM orders").fetchone() == (0,)
    finally:
        conn.close()
    got, statements = sql_of_next_search(cache, queries=["alpha"], max_results=4)
    assert got == reference(cache, ["alpha"])
    assert [s for s in statements if "ORDER BY path" in s]


def test_each_result_s_provenance_comes_with_its_path_not_a_query_each(tmp_path: Path) -> None:
    cache = make_cache(tmp_path, {f"m{i:02d}.md": f"alpha {i}\n" for i in range(30)})
    search_index.refresh_index(cache)
    got, statements = sql_of_next_search(cache, queries=["alpha"], max_results=25)
    assert got == reference(cache, ["alpha"])
    assert not [s for s in statements if "sha256" in s and "FROM files WHERE id=" in s]
    page = tools.search(cache, ["alpha"], max_results=25)["results"]
    files = cache.load().files
    assert {r["path"]: (r["machine"], r["source"], r["sha256"]) for r in page} == {
        path: ("lab", "notes", files[path].sha256) for path in sorted(files)[:25]}


def test_an_order_the_index_no_longer_vouches_for_is_not_used(tmp_path: Path) -> None:
    # A writer that does not know the stored order (an older version of this code) adds a file
    # and bumps the generation: the order of the generation before is ignored, paths sorted.
    cache = make_cache(tmp_path, {f"m{i:02d}.md": f"alpha {i}\n" for i in range(20)})
    search_index.refresh_index(cache)
    path = search_index.index_path(cache)
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        before = conn.execute("SELECT * FROM orders").fetchone()
    finally:
        conn.close()
    info = NamespaceInfo(NS, "lab", "notes", "markdown", 2, "2026-01-03T00:00:00Z")
    cache.apply([(f"{NS}/a0.md", sha256_text("alpha a0\n"), "alpha a0\n")], [], {NS: info})
    search_index.refresh_index(cache)
    conn = sqlite3.connect(path, isolation_level=None)
    try:  # as the older writer leaves it: the order of the generation before, still named
        conn.execute("DELETE FROM orders")
        conn.execute("INSERT INTO orders VALUES (?, ?, ?, ?)", before)
        conn.execute("UPDATE meta SET value=? WHERE key='order'", (before[0],))
    finally:
        conn.close()
    got, statements = sql_of_next_search(cache, queries=["alpha"], max_results=4)
    assert got == reference(cache, ["alpha"])
    assert got[0] == (f"{NS}/a0.md", 1)
    assert [s for s in statements if "ORDER BY path" in s]


def test_paths_are_asked_of_the_index_in_batches(tmp_path: Path) -> None:
    # `any` verifies each of its 150 candidates, then reads the page's files: their paths come
    # in a few queries, not one for each file.
    cache = make_cache(tmp_path, {f"f{i:03d}.md": f"alpha {i}\n" if i % 3 else f"beta {i}\n"
                                  for i in range(150)})
    search_index.refresh_index(cache)
    got, statements = sql_of_next_search(cache, queries=["alpha", "beta"], max_results=200)
    assert got == reference(cache, ["alpha", "beta"])
    assert len(got) == 150
    assert 0 < len([s for s in statements if s.startswith("SELECT id, path")]) <= 12


def test_a_page_that_fills_in_the_first_chunk_asks_the_index_about_no_other(
        tmp_path: Path) -> None:
    # One file in ten holds the word: the first chunk of positions holds more than the page
    # takes, so the paths asked in batches must not make the walk look past that chunk.
    cache = make_cache(tmp_path, {f"f{i:04d}.md": "alpha\n" if i % 10 == 0 else f"beta {i}\n"
                                  for i in range(3000)})
    search_index.refresh_index(cache)
    search_mod._SEARCHERS.clear()
    searcher = search_mod.searcher(cache)
    tools.search(cache, ["nothing-like-it"])  # the view is loaded
    assert searcher.index.conn is not None
    statements: list[str] = []
    searcher.index.conn.set_trace_callback(statements.append)
    got = tools.search(cache, ["alpha"], max_results=50)["results"]
    assert [r["path"] for r in got] == [f"{NS}/f{i:04d}.md" for i in range(0, 500, 10)]
    assert len([s for s in statements if "MATCH" in s]) == 1, statements


def test_a_dense_word_costs_the_index_one_chunk_not_a_walk_of_every_file(tmp_path: Path) -> None:
    # The word is in every file: the page fills within the first files, so the index is asked
    # about the first chunk of positions only, not about all 10,000 files.
    cache, searcher = indexed(make_cache(tmp_path, {f"f{i:04d}.md": f"alpha {i}\n" for i in range(10000)}))
    tools.search(cache, ["nothing-like-it"])  # the view is loaded
    assert searcher.index.conn is not None
    steps = [0]

    def count() -> int:
        steps[0] += 1
        return 0
    searcher.index.conn.set_progress_handler(count, 100)
    got = tools.search(cache, ["alpha"], max_results=5)["results"]
    assert [r["path"] for r in got] == [f"{NS}/f{i:04d}.md" for i in range(5)]
    asked, steps[0] = steps[0], 0
    searcher.index.begin()
    expr = searcher.index.expression(["alpha"], 10000)
    assert expr is not None
    assert len(searcher.index.matching(expr)) == 10000  # what asking all costs
    searcher.index.end()
    assert asked * 4 < steps[0], (asked, steps[0])







SHORT_FILES = {
    "a.md": "the AI model\n", "b.md": "nothing here\n", "c.md": "ends with ai",
    "d.md": "ai", "e.md": "Ai and AI\nand ai\n", "f.md": "猫 sat\n", "g.md": "q", "h.md": "zz\n",
    "i.md": "last \U0010ffff code point\n",
    **{f"n{i:03d}.md": f"simple words {i}\n" for i in range(200)}}


@pytest.mark.parametrize("query,case_sensitive", [
    ("AI", True), ("ai", True), ("ai", False), ("i", True), ("q", True), ("猫", True),
    ("zz", True), ("z", False), ("qq", True), ("\u00e9", True), (" w", True),
    ("\U0010ffff", True), (" \U0010ffff", True)])
def test_short_queries_find_what_a_full_scan_finds(tmp_path: Path, query: str,
                                                   case_sensitive: bool) -> None:
    # One or two characters begin a trigram of the index (each text ends in two more line
    # breaks there), at the end of a file without a line break too, and in a file that short.
    cache = make_cache(tmp_path, SHORT_FILES)
    search_index.refresh_index(cache)
    got = [(r["path"], r["line_number"])
           for r in all_pages(cache, queries=[query], case_sensitive=case_sensitive)]
    assert got == reference(cache, [query], case_sensitive=case_sensitive)


def test_a_short_rare_query_reads_only_the_files_the_index_names(tmp_path: Path) -> None:
    cache, searcher = indexed(make_cache(tmp_path, SHORT_FILES))
    got = tools.search(cache, ["猫"])["results"]
    assert [r["path"] for r in got] == [f"{NS}/f.md"]
    assert searcher.scanned == 1
    assert tools.search(cache, ["qq"])["results"] == [] and searcher.scanned == 0
    got = tools.search(cache, ["ai"], case_sensitive=False)["results"]
    assert {r["path"] for r in got} == {f"{NS}/{n}.md" for n in "acde"}
    assert searcher.scanned == 4


def test_a_short_query_that_begins_too_many_trigrams_is_scanned(tmp_path: Path) -> None:
    # More than _SHORT_TERMS trigrams begin with the key: the MATCH would cost more than it
    # saves, so every file is read, and the results are still a full scan's.
    words = " ".join(f"x{chr(0x4e00 + i)}{chr(0x4e00 + i)}" for i in range(600))
    cache, searcher = indexed(make_cache(tmp_path, {"big.md": words + "\n", "small.md": "x\n",
                                                    "none.md": "y\n"}))
    got = [(r["path"], r["line_number"]) for r in all_pages(cache, queries=["x"])]
    assert got == reference(cache, ["x"])
    assert searcher.scanned == 3


def test_a_short_key_in_most_files_is_not_looked_up_and_its_terms_not_all_read(
        tmp_path: Path) -> None:
    # Forty trigrams begin with "q", each in every file: the first few already name more than
    # the dense share of the files, so the key is read in path order, as a common word is; a
    # rare key's terms are all read and name just its files.
    words = " ".join(f"q{chr(0x41 + i)}x" for i in range(40))
    files = {f"f{i:03d}.md": f"{words} {i}\n" for i in range(200)}
    files["rare.md"] = "zj\n"
    cache, searcher = indexed(make_cache(tmp_path, files))
    got = tools.search(cache, ["q"], max_results=3)["results"]
    assert [(r["path"][-7:], r["line_number"]) for r in got] == [
        ("f000.md", 1), ("f001.md", 1), ("f002.md", 1)] and searcher.scanned <= 4
    searcher.index.begin()
    assert searcher.index.expression(["q"], 201) is None
    assert searcher.index.expression(["zj"], 201) == index_reader.Match('("zj\n")', "")
    searcher.index.end()


def test_a_short_key_whose_trigrams_add_up_past_the_dense_share_is_still_looked_up(
        tmp_path: Path) -> None:
    # A tenth of the files hold "- " before ten letters each: the ten trigrams' counts add up
    # to half the files, but each names a tenth, so the index is asked and only those files
    # are read (in path order they come last: a scan would read every file first).
    files = {f"a{i:03d}.md": f"plain line {i}\n" for i in range(180)}
    files.update({f"z{i:02d}.md": " ".join(f"- {c}x" for c in "abcdefghij") + "\n"
                  for i in range(20)})
    cache, searcher = indexed(make_cache(tmp_path, files))
    got = tools.search(cache, ["- "], max_results=50)["results"]
    assert [(r["path"], r["line_number"]) for r in got] == reference(cache, ["- "])
    assert len(got) == 20 and searcher.scanned == 20


def test_a_query_that_keeps_its_accents_reads_only_the_files_holding_them(
        tmp_path: Path) -> None:
    # Every file holds `a`, `resume` and `decision de`; a few hold them accented. The folded
    # text cannot tell them apart, but the accented words kept beside it can: only those files
    # are read, ignoring case or not, while `normalized` still finds them all.
    files = {f"a{i:03d}.md": f"a resume and a decision deploy {i}\n" for i in range(100)}
    files["b1.md"] = "voilà un Résumé\n"
    files["b2.md"] = "la décision de Zoë\n"
    files["b3.md"] = "une DÉCISION\n"
    cache, searcher = indexed(make_cache(tmp_path, files))
    for query, fold, paths, read in [
            ("à", {}, ["b1.md"], 1), ("résumé", {"case_sensitive": False}, ["b1.md"], 1),
            ("Résumé", {}, ["b1.md"], 1), ("décision de", {}, ["b2.md"], 1),
            ("DÉCISION", {"case_sensitive": False}, ["b2.md", "b3.md"], 2),
            ("ë", {}, ["b2.md"], 1),
            ("écisi", {}, ["b2.md"], 1)]:  # the index keeps ASCII capitals: not b3
        got = [(r["path"], r["line_number"]) for r in all_pages(cache, queries=[query], **fold)]
        assert got == reference(cache, [query], case_sensitive=fold == {}) == [
            (f"{NS}/{path}", 1) for path in paths], query
        assert searcher.scanned == read, query
    got = tools.search(cache, ["decision de"], normalized=True, max_results=200)["results"]
    assert len(got) == 101


def test_an_accented_word_between_blanks_is_asked_as_a_whole_word(tmp_path: Path) -> None:
    # Every file holds ` e ` and `été`. An accented word of the query with a blank on a side is
    # the whole word there in any text holding it, so ` é ` names only the files holding `é` as
    # a word, where every trigram beginning with `é` named them all.
    files = {f"a{i:03d}.md": f"un été e chaud {i}\n" for i in range(200)}
    files["b1.md"] = "voilà é fini\n"
    cache, searcher = indexed(make_cache(tmp_path, files))
    for query, fold in [(" é ", {}), ("à é f", {}), (" É ", {"case_sensitive": False})]:
        got = [(r["path"], r["line_number"]) for r in all_pages(cache, queries=[query], **fold)]
        assert got == reference(cache, [query], case_sensitive=fold == {}) == [
            (f"{NS}/b1.md", 1)], query
        assert searcher.scanned == 1, query


def test_a_short_accented_word_is_asked_only_when_no_longer_one_is(tmp_path: Path) -> None:
    # `많` after a line break begins a trigram for each accented word the index keeps that
    # begins with it: any of them is a long question, which narrows little beside `정보` as a
    # whole word. Alone it is asked.
    files = {f"a{i:03d}.md": f"정보 많{chr(0xAC00 + i)}\n" for i in range(50)}
    cache, searcher = indexed(make_cache(tmp_path, files))
    searcher.index.begin()
    alone = searcher.index.expression(["xyz"], 50, accented=["\n많"])
    beside = searcher.index.expression(["xyz"], 50, accented=["정보\n", "\n많"])
    searcher.index.end()
    assert alone is not None and alone.grams.count(" OR ") == 49
    assert beside is not None and beside.grams == '"xyz" AND "정보\n"'
    got = [(r["path"], r["line_number"]) for r in all_pages(cache, queries=["정보 많"])]
    assert got == reference(cache, ["정보 많"]) and len(got) == 50


def test_a_case_sensitive_query_reads_only_the_files_holding_its_capitals(
        tmp_path: Path) -> None:
    # A quarter of the files hold `version e` and `the project`; a few hold them with capitals.
    # The folded text cannot tell them apart, but the text kept around each capital can: a
    # case-sensitive query reads only the files holding its own, while ignoring case still
    # finds them all.
    files = {f"a{i:03d}.md": f"the project of version e{i}\n" if i % 4 == 0 else f"note {i}\n"
             for i in range(600)}
    files["b1.md"] = "Version e7 of it\n"
    files["b2.md"] = "see The project\n"
    files["b3.md"] = "VERSION E\n"
    files["b4.md"] = "a (Version) e\n"
    cache, searcher = indexed(make_cache(tmp_path, files))
    for query, paths, read in [("Version e", ["b1.md"], 1), ("VERSION", ["b3.md"], 1),
                               ("ERSION E", ["b3.md"], 1), ("(Version)", ["b4.md"], 1),
                               ("n) e", ["b4.md"], 1)]:
        got = [(r["path"], r["line_number"]) for r in all_pages(cache, queries=[query])]
        assert got == reference(cache, [query]) == [(f"{NS}/{p}", 1) for p in paths], query
        assert searcher.scanned == read, query
    # A phrase is asked with its capitals once the files its words name prove to lack it,
    # though they are too few for its trigrams to be asked for that alone.
    got = [(r["path"], r["line_number"]) for r in all_pages(cache, queries=["The project"])]
    assert got == reference(cache, ["The project"]) == [(f"{NS}/b2.md", 1)]
    assert searcher.scanned < 100
    assert len(all_pages(cache, queries=["version e"], case_sensitive=False)) == 152


def test_a_lowercase_query_reads_only_the_files_holding_it_in_lowercase(tmp_path: Path) -> None:
    # Every file holds `Developer Guide`; two hold `developer guide`. The index keeps the
    # ASCII capitals of its trigrams: `developer` alone reads those two, where a case-folded
    # index named every file, and the phrase, whose words name them all, is sieved by the
    # starts of its words once its first files read prove to lack it.
    files = {f"a{i:03d}.md": f"see the Developer Guide {i}\n" for i in range(300)}
    files.update({"b1.md": "the developer guide\n", "b2.md": "developer guide\n"})
    cache, searcher = indexed(make_cache(tmp_path, files))
    got = [(r["path"], r["line_number"]) for r in all_pages(cache, queries=["developer"])]
    assert got == reference(cache, ["developer"]) == [(f"{NS}/b1.md", 1), (f"{NS}/b2.md", 1)]
    assert searcher.scanned == 2
    got = [(r["path"], r["line_number"]) for r in all_pages(cache, queries=["developer guide"])]
    assert got == reference(cache, ["developer guide"]) == [(f"{NS}/b1.md", 1),
                                                            (f"{NS}/b2.md", 1)]
    assert searcher.scanned < 100
    assert len(all_pages(cache, queries=["developer guide"], case_sensitive=False)) == 302
    assert len(all_pages(cache, queries=["DEVELOPER"], normalized=True)) == 302
    assert len(all_pages(cache, queries=["d"], case_sensitive=False)) == 302


def test_a_cache_named_by_a_relative_path_uses_its_index(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make_cache(tmp_path / "cache", {f"f{i:03d}.md": f"alpha {i}\n" for i in range(300)})
    monkeypatch.chdir(tmp_path)
    cache = Cache(Path("cache"))
    search_index.refresh_index(cache)
    assert search_index.index_mark(cache) is not None
    got = tools.search(cache, ["alpha 7"], max_results=200)["results"]
    assert [r["path"][-7:] for r in got] == ["f007.md", "f070.md", "f071.md", "f072.md",
                                             "f073.md", "f074.md", "f075.md", "f076.md",
                                             "f077.md", "f078.md", "f079.md"]
    assert search_mod.searcher(cache).scanned == len(got)  # the index named just those


@pytest.mark.parametrize("index", ["fresh", "missing"])
def test_ignoring_case_a_file_with_a_character_that_casefolds_to_ascii(
        tmp_path: Path, index: str) -> None:
    # The Kelvin sign and the ﬁ ligature casefold to ASCII: their lines are folded on their own,
    # the others read as bytes with ASCII lowered; the results are a full scan's.
    cache = make_cache(tmp_path, {"kelvin.md": "300 \u212aelvin\n", "fi.md": "the \ufb01le\n",
                                  "plain.md": "300 kelvin, a File\n", "accent.md": "Café file\n"})
    if index == "fresh":
        search_index.refresh_index(cache)
    for query in ("kelvin", "KELVIN", "file", "caf"):
        got = all_pages(cache, queries=[query], case_sensitive=False)
        assert [(r["path"], r["line_number"]) for r in got] == reference(
            cache, [query], case_sensitive=False), query
    found = tools.search(cache, ["kelvin"], case_sensitive=False)["results"]
    assert {r["path"].rsplit("/", 1)[1] for r in found} == {"kelvin.md", "plain.md"}


@pytest.mark.parametrize("ending", ["\n", ""])
def test_a_file_in_parts_shows_its_lines_and_context_across_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ending: str) -> None:
    # Parts of a few lines: a result's context reaches into the parts around its own, which
    # the index did not name, and the line numbers count from the file's start.
    monkeypatch.setattr(search_index, "SEGMENT_BYTES", 40)
    lines = [f"line {i}" + (" needle" if i % 7 == 0 else "") for i in range(1, 60)]
    text = "\n".join(lines) + ending
    cache = make_cache(tmp_path, {"big.md": text, "small.md": "needle\n"})
    search_index.refresh_index(cache)
    assert len(search_index.segments(text.encode())) > 10
    got = tools.search(cache, ["needle"], context_lines=3, max_results=200)["results"]
    assert [(r["path"].rsplit("/", 1)[1], r["line_number"]) for r in got] == [
        ("big.md", n) for n in range(7, 60, 7)] + [("small.md", 1)]
    for hit in got[:-1]:
        n = hit["line_number"]
        assert hit["line"] == lines[n - 1]
        assert hit["context_before"] == lines[max(0, n - 4):n - 1]
        assert hit["context_after"] == lines[n:n + 3]


def test_a_file_grown_since_it_was_cut_in_parts_is_read_whole(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Bytes on disk that are not the size the index cut (written behind the manifest's back)
    # are looked in whole, as they are now: lines past the parts the index knows are found.
    monkeypatch.setattr(search_index, "SEGMENT_BYTES", 40)
    text = "".join(f"line {i}{' needle' * (i == 3)}\n" for i in range(40))
    cache = make_cache(tmp_path, {"big.md": text})
    search_index.refresh_index(cache)
    (cache.root / NS / "big.md").write_text(text + "grown needle\n", newline="")
    got = all_pages(cache, queries=["needle"], max_results=7)
    assert [(r["path"], r["line_number"]) for r in got] == reference(cache, ["needle"]) == [
        (f"{NS}/big.md", 4), (f"{NS}/big.md", 41)]


@pytest.mark.parametrize("bounds", ["none", "short", "decreasing"])
def test_part_bounds_that_cannot_be_a_files_are_damage(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bounds: str) -> None:
    # A search reads a large file's parts where the index says they begin: bounds of the wrong
    # kind are damage, scanned past and deleted like any other.
    monkeypatch.setattr(search_index, "SEGMENT_BYTES", 40)
    cache = make_cache(tmp_path, {"big.md": "".join(f"line {i} needle\n" for i in range(40))})
    search_index.refresh_index(cache)
    search_mod._SEARCHERS.clear()
    conn = sqlite3.connect(search_index.index_path(cache))
    parts = conn.execute("SELECT parts FROM files").fetchone()[0]
    value = {"none": None, "short": array("q", range(parts)).tobytes(),
             "decreasing": array("q", range(parts, -1, -1)).tobytes()}[bounds]
    conn.execute("UPDATE files SET bounds=?", (value,))
    conn.commit()
    conn.close()
    got = all_pages(cache, queries=["needle"], max_results=7)
    assert [(r["path"], r["line_number"]) for r in got] == reference(cache, ["needle"])
    assert len(got) == 40
    assert not search_index.index_path(cache).exists()


@pytest.mark.parametrize("mode", ["all", "any"])
def test_each_query_is_looked_for_in_the_parts_named_for_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    # Files of many parts, each query in parts of its own: each is found in the parts the index
    # names for it, and a query named in no part of a file is not in it, however many of its
    # parts another query is named in.
    monkeypatch.setattr(search_index, "SEGMENT_BYTES", 40)
    filler = "".join(f"filler line {n}\n" for n in range(12))
    cache = make_cache(tmp_path, {
        "big.md": "Alpha\n" + filler + "beta gamma\n" + filler * 2 + "alpha beta\n" + filler,
        "common.md": (filler + "beta\n") * 6 + "gamma\n",
        "small.md": "gamma\nalpha\n",
        "tail.md": filler * 3 + "ALPHA beta\n"})
    search_index.refresh_index(cache)
    for queries in (["alpha", "beta"], ["alpha", "gamma"], ["beta", "delta"],
                    ["gamma", "alpha", "beta"], ["filler line 1", "gamma"]):
        for case in (True, False):
            got = all_pages(cache, queries=queries, match_mode=mode, case_sensitive=case,
                            max_results=2)
            assert [(r["path"], r["line_number"]) for r in got] == reference(
                cache, queries, mode, case), (queries, case)


def test_pairs_find_what_a_full_scan_finds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Keys cut anywhere from lines of words in any case, punctuation, control characters,
    # accents and blanks between them, or made of the end of a word and two words many files
    # hold; first words that end many (few are asked), so that phrases start after them and
    # their pairs are asked, in their case or not.
    monkeypatch.setattr(index_reader, "_ENDINGS", 1)
    monkeypatch.setattr(index_reader, "_ENDINGS_LATER", 1)
    monkeypatch.setattr(index_reader, "_ENDINGS_ALONE", 1)
    monkeypatch.setattr(index_view, "_TRIED", 1)
    rng = random.Random(23)
    words = ["to", "To", "TO", "in", "In", "the", "The", "file", "File", "profile", "ProFile",
             "is", "this", "used", "by", "byte", "a", "A", "more", "More", "for", "For", "café",
             "Café", "x", "ß", "ﬁle", "e", "of", "Off", "note", "user"]
    blanks = [" ", " ", " ", "  ", "\t", "-", ". ", ", ", "\x01", "\u00a0", " (", ") "]
    files = {f"f{i:03d}.md": "\n".join(
        rng.choice(words) + "".join(rng.choice(blanks) + rng.choice(words)
                                    for _ in range(rng.randint(1, 8)))
        for _ in range(rng.randint(1, 6))) + "\n" for i in range(120)}
    lines = [line for text in files.values() for line in text.splitlines()]
    # where the phrases after a first word are, and not the keys: their pairs are asked
    files.update({f"g{i:03d}.md": "q in the q to the q more for q is used q the file\n"
                  for i in range(200)})
    cache, _ = indexed(make_cache(tmp_path, files))
    asked_pairs = {True: 0, False: 0}
    for _ in range(150):
        line = rng.choice(lines)
        lo = rng.randint(0, len(line) - 2)
        query = line[lo:rng.randint(lo + 2, len(line))] if rng.random() < 0.5 else \
            rng.choice(["e", "le", "o", "E", "s"]) + " " + rng.choice(
                ["in the", "to the", "more for", "is used", "the file", "The File"])
        if not query.strip():
            continue
        case = rng.choice([True, True, False])
        got, statements = sql_of_next_search(cache, queries=[query], max_results=50,
                                             case_sensitive=case)
        assert got == reference(cache, [query], case_sensitive=case), (query, case)
        asked_pairs[case] += any("FROM pairs WHERE" in s for s in statements)
    assert min(asked_pairs.values()) > 5, asked_pairs
