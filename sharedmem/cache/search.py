"""Substring search over the cache, with a derived trigram index that only ever narrows the scan.

The cache's Markdown files stay the source of truth. `refresh_index` keeps an SQLite FTS5 trigram
index of each file's normalized text under `<cache>/.sharedmem/index/`; a search asks it which
files can possibly match and then verifies every candidate against the real file. Files whose
indexed digest differs from the manifest (or that the index lacks) are always scanned, and a
missing or broken index means a full scan, so results never depend on the index being current.
An index that cannot be read (damaged, or a link or folder in its place) is deleted by whichever
finds it, a search or a refresh, and the refresh builds it again.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import sqlite3
import stat
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sharedmem.cache.cache import META_DIR, Cache, Manifest
from sharedmem.cache.layout import CacheFiles
from sharedmem.core import CacheError, SharedMemoryError
from sharedmem.program import LAUNCHER

INDEX_VERSION = "1"
INDEX_FILE = "search.sqlite3"
LINE_CHARS = 1000
AUTO_REFRESH_STALE = 64  # more stale files than this and a search starts a background refresh
_DETACHED = 0x00000008 | 0x00000200  # Windows: DETACHED_PROCESS | CREATE_NEW_PROCESS_GROUP
_MAX_GRAMS = 8
_DENSE = 0.3  # above this share of files, scanning in path order beats the index
_SPACES = re.compile(r" [^\S\n]+|[^\S\n ][^\S\n]*")


def normalize(text: str) -> str:
    """NFKC, casefold, drop accents, collapse blanks: so `decision` finds `Décision`.

    Line breaks survive, so line numbers in the normalized text are those of the original.
    """
    text = unicodedata.normalize("NFD", unicodedata.normalize("NFKC", text).casefold())
    if not text.isascii():
        for mark in [c for c in set(text) if c > "\u02ff" and unicodedata.combining(c)]:
            text = text.replace(mark, "")
    return _SPACES.sub(" ", text)


def index_path(cache: Cache) -> Path:
    """Where the derived index of `cache` lives (private metadata, never published)."""
    return cache.root / META_DIR / "index" / INDEX_FILE


_COMPANIONS = ("", "-journal", "-wal", "-shm")
_BUSY = {5, 6}  # SQLITE_BUSY, SQLITE_LOCKED: another process holds the index, which is fine
# What reading an index can raise when the file is not what a refresh wrote: SQLite's errors,
# UnicodeDecodeError (a ValueError) for text or even an error message that is not UTF-8, and
# ValueError or TypeError for values of the wrong kind.
_READ_ERRORS = (sqlite3.Error, ValueError, TypeError)


def _busy(exc: Exception) -> bool:
    """True when `exc` says the index is locked by another process, not that it is damaged."""
    code = getattr(exc, "sqlite_errorcode", None) if isinstance(exc, sqlite3.Error) else None
    return code is not None and code & 0xFF in _BUSY


def _planted(path: Path) -> bool:
    """True when a link or a non-file stands where the index or its folder should be.

    SQLite would follow a link there, and a refresh would then write into whatever it names.
    """
    try:
        if not stat.S_ISDIR(os.lstat(path.parent).st_mode):
            return True
    except FileNotFoundError:
        return False
    for suffix in _COMPANIONS:
        try:
            mode = os.lstat(str(path) + suffix).st_mode
        except FileNotFoundError:
            continue
        if not stat.S_ISREG(mode):
            return True
    return False


def delete_index(path: Path) -> None:
    """Remove the index and its companion files: derived data, which a refresh builds again.

    A link goes itself, never what it names; a folder planted in the index's place goes too.
    """
    if os.path.lexists(path.parent) and not _real_folder(path.parent):
        os.unlink(path.parent)
        return
    for suffix in _COMPANIONS:
        name = str(path) + suffix
        if _real_folder(name):
            shutil.rmtree(name)
        else:
            Path(name).unlink(missing_ok=True)


def _real_folder(path: os.PathLike[str] | str) -> bool:
    """A folder, not a link to one."""
    return os.path.isdir(path) and not os.path.islink(path)


def _connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=10, isolation_level=None)
    conn.execute("PRAGMA busy_timeout=10000")
    # Derived data: WAL with NORMAL sync cannot corrupt on power loss (it may only lose the last
    # refresh, which the sha256 check then redoes) and spares a sync its fsyncs.
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    return conn


_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS files(id INTEGER PRIMARY KEY, path TEXT UNIQUE NOT NULL,"
    " sha256 TEXT NOT NULL)",
    "CREATE VIRTUAL TABLE IF NOT EXISTS grams USING fts5(body,"
    " tokenize='trigram case_sensitive 1', detail=none)",
)


def refresh_index(cache: Cache) -> dict[str, int]:
    """Bring the index in line with the cache manifest; only changed files are re-read.

    Run by `index` (which a search that finds many stale files starts in the background);
    safe to run concurrently (one writer waits). Returns files re-indexed or dropped
    (`changed`) and files indexed in all (`files`).
    """
    path = index_path(cache)
    if _planted(path):
        delete_index(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        return _refresh(cache, path)
    except _READ_ERRORS as exc:
        if _busy(exc):
            raise CacheError(f"the search index {path} is busy: another `index` holds it; "
                             "try again when it is done") from None
    delete_index(path)  # damaged: derived data, so built again from the cache
    try:
        return _refresh(cache, path)
    except _READ_ERRORS as exc:
        raise CacheError(f"the search index {path} cannot be built ({exc}): delete the folder "
                         f"{path.parent} (derived data only) and run `shared_memory.py index` "
                         "again") from None


def refresh_in_background(cache: Cache) -> bool:
    """Start `index --cache DIR --background` detached; False when it could not be started.

    A search that finds many stale files calls this instead of refreshing in its own time, so
    no request (and no sync) waits for the index; the refresh runs on idle CPU time.
    """
    import subprocess
    import sys
    command = [sys.executable, str(LAUNCHER), "index", "--cache", str(cache.root),
               "--background"]
    try:
        subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, close_fds=True,
                         creationflags=_DETACHED if os.name == "nt" else 0,
                         start_new_session=os.name != "nt")
    except OSError:
        return False
    return True


def _refresh(cache: Cache, path: Path) -> dict[str, int]:
    conn = _connect(path)
    disk = CacheFiles(cache.root)
    try:
        conn.execute("BEGIN IMMEDIATE")
        for statement in _SCHEMA:
            conn.execute(statement)
        version = conn.execute("SELECT value FROM meta WHERE key='version'").fetchone()
        if version is not None and version[0] != INDEX_VERSION:
            conn.execute("DELETE FROM files")
            conn.execute("DELETE FROM grams")
        indexed = {p: (i, s) for i, p, s in conn.execute("SELECT id, path, sha256 FROM files")}
        manifest = cache.load()
        changed = 0
        for relpath, (row_id, _sha) in indexed.items():
            meta = manifest.files.get(relpath)
            if meta is None or meta.sha256 != _sha:
                conn.execute("DELETE FROM files WHERE id=?", (row_id,))
                conn.execute("DELETE FROM grams WHERE rowid=?", (row_id,))
                changed += 1
        for relpath in sorted(manifest.files):
            meta = manifest.files[relpath]
            old = indexed.get(relpath)
            if old is not None and old[1] == meta.sha256:
                continue
            data = _read(disk, relpath)
            if data is None or hashlib.sha256(data).hexdigest() != meta.sha256:
                continue  # a sync is rewriting it: left unindexed, so searches scan it
            text = data.decode("utf-8", "replace")
            row_id = conn.execute("INSERT INTO files(path, sha256) VALUES (?, ?)",
                                  (relpath, meta.sha256)).lastrowid
            conn.execute("INSERT INTO grams(rowid, body) VALUES (?, ?)", (row_id, normalize(text)))
            changed += 1
        generation = conn.execute("SELECT value FROM meta WHERE key='generation'").fetchone()
        number = int(generation[0]) + (1 if changed else 0) if generation else 1
        conn.executemany("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)",
                         [("version", INDEX_VERSION), ("generation", str(number))])
        indexed_now = conn.execute("SELECT count(*) FROM files").fetchone()[0]
        conn.execute("COMMIT")
        return {"changed": changed, "files": indexed_now}
    finally:
        disk.close()
        conn.close()


@dataclass
class Query:
    """One search, validated by the caller (tools.py)."""

    queries: list[str]
    match_mode: str = "any"
    path: str | None = None
    case_sensitive: bool = True
    normalized: bool = False
    context_lines: int = 0


class _Index:
    """A read-only view of the index file: which files may contain a normalized string."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.conn: sqlite3.Connection | None = None
        self.generation: str | None = None
        self.ids: dict[int, tuple[str, str]] = {}
        self._identity: tuple[int, int] | None = None  # the file this connection reads

    def open(self) -> bool:
        """(Re)load the id map when the index changed; False when there is no usable index.

        An index that cannot be read is deleted (see `_unreadable`), so the searches scan and
        the next refresh builds it again.
        """
        try:
            if self.conn is None:
                if _planted(self.path):
                    delete_index(self.path)
                    return False
                if not self.path.is_file():
                    return False
                self.conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=10,
                                            isolation_level=None, check_same_thread=False)
                info = os.stat(self.path)
                self._identity = (info.st_dev, info.st_ino)
            row = self.conn.execute("SELECT value FROM meta WHERE key='generation'").fetchone()
            if row is None:
                return False
            if row[0] != self.generation:
                self.ids = {i: (p, s) for i, p, s in
                            self.conn.execute("SELECT id, path, sha256 FROM files")}
                self.generation = row[0]
            return True
        except (*_READ_ERRORS, OSError) as exc:
            self._unreadable(exc)
            return False

    def close(self) -> None:
        """Forget the connection so the next search reopens (or scans)."""
        if self.conn is not None:
            self.conn.close()
        self.conn, self.generation, self.ids, self._identity = None, None, {}, None

    def _unreadable(self, exc: Exception) -> None:
        """Close, and delete the file unless it is only locked, or new and not yet written.

        Only the very file this connection read is deleted, not one a refresh has put in its
        place since.
        """
        identity = self._identity
        self.close()
        if isinstance(exc, OSError) or _busy(exc) or identity is None or _is_new(self.path):
            return
        try:
            info = os.stat(self.path)
        except OSError:
            return
        if (info.st_dev, info.st_ino) == identity:
            delete_index(self.path)

    def candidates(self, key: str) -> set[str] | None:
        """Indexed paths whose text may contain `key`; None when the index cannot narrow it."""
        if len(key) < 3 or self.conn is None:
            return None
        # Trigrams every third character cover the key; more only cost time in SQLite.
        grams = sorted({key[i:i + 3] for i in range(0, len(key) - 2, 3)} | {key[-3:]})
        if len(grams) > _MAX_GRAMS:
            step = len(grams) / _MAX_GRAMS
            grams = [grams[int(i * step)] for i in range(_MAX_GRAMS)]
        expr = " AND ".join('"' + g.replace('"', '""') + '"' for g in grams)
        try:
            row = self.conn.execute("SELECT group_concat(rowid) FROM grams WHERE grams MATCH ?",
                                    (expr,)).fetchone()
        except UnicodeEncodeError:  # a lone surrogate: no indexed text holds one
            return None
        except _READ_ERRORS as exc:
            self._unreadable(exc)
            return None
        found = (row[0] or "").split(",") if row[0] else []
        if len(found) > len(self.ids) * _DENSE:
            return None
        ids = self.ids
        return {ids[int(i)][0] for i in found if int(i) in ids}


def _is_new(path: Path) -> bool:
    """True for an index a refresh has created but not yet committed to: no tables at all."""
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None)
        try:
            return conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0
        finally:
            conn.close()
    except _READ_ERRORS:
        return False


class _Page:
    """The results of one page, which ends at `limit` results or `max_bytes` of their text."""

    def __init__(self, query: Query, manifest: Manifest, limit: int, max_bytes: int) -> None:
        self.query, self.manifest, self.limit = query, manifest, limit
        self.left = max_bytes
        self.results: list[dict[str, Any]] = []

    def add(self, relpath: str, text: str, number: int, which: Iterable[int]) -> bool:
        """Add the result for this line; False when the page has no room for it (it is full)."""
        if len(self.results) == self.limit:
            return False
        result = _result(self.query, self.manifest, relpath, text, number, which)
        cost = sum(len(t.encode("utf-8", "surrogatepass")) for t in (
            relpath, result["line"], *result["context_before"], *result["context_after"],
            *result["matched_queries"]))
        if self.results and cost > self.left:
            return False
        self.results.append(result)
        self.left -= cost
        return True


class Searcher:
    """Search over one cache; long-lived in the MCP server so the index stays open."""

    def __init__(self, cache: Cache) -> None:
        self.cache = cache
        self.index = _Index(index_path(cache))
        self._state: tuple[int, str | None, list[str], set[str]] | None = None
        self._refreshed_for: int | None = None

    def _files(self, manifest: Manifest) -> tuple[list[str], set[str]]:
        """All paths in order, and the paths the index does not vouch for (always scanned)."""
        usable = self.index.open()
        stamp = (id(manifest), self.index.generation if usable else None)
        if self._state is None or self._state[:2] != stamp:
            indexed = dict(self.index.ids.values()) if usable else {}
            stale = {p for p, m in manifest.files.items() if indexed.get(p) != m.sha256}
            if len(stale) > AUTO_REFRESH_STALE and self._refreshed_for != id(manifest):
                self._refreshed_for = id(manifest)
                refresh_in_background(self.cache)  # meanwhile the stale files are scanned
            self._state = (*stamp, sorted(manifest.files), stale)
        return self._state[2], self._state[3]

    def search(self, query: Query, after: list[Any] | None, limit: int,
               max_bytes: int) -> tuple[list[dict[str, Any]], list[Any] | None]:
        """Up to `limit` results after the sort key `after`, and the key to resume from.

        A page also ends before the result that would take its text past `max_bytes` (see
        `_Page`); it always holds one result when there is one.
        """
        manifest = self.cache.load()
        paths, stale = self._files(manifest)
        fold = _folder(query)
        needles = [fold(q) for q in query.queries]
        allowed = self._candidates(query, stale)
        if allowed is not None:
            paths = sorted(p for p in allowed if p in manifest.files)
        if query.path:
            prefix = query.path.rstrip("/") + "/"
            paths = [p for p in paths if p.startswith(prefix) or p == query.path]
        page = _Page(query, manifest, limit, max_bytes)
        with CacheFiles(self.cache.root) as disk:
            if len(needles) == 1 or query.match_mode == "all":
                return self._ordered(disk, page, paths, needles, fold, after)
            return self._ranked(disk, page, paths, needles, fold, after)

    def _candidates(self, query: Query, stale: set[str]) -> set[str] | None:
        sets = [self.index.candidates(normalize(q)) for q in query.queries]
        if query.match_mode == "all":
            known = [s for s in sets if s is not None]
            if not known:
                return None
            out = set.intersection(*known)
        else:
            if any(s is None for s in sets):
                return None
            out = set().union(*sets)
        return out | stale

    def _ordered(self, disk: CacheFiles, page: _Page, paths: list[str], needles: list[str],
                 fold: Any, after: list[Any] | None) -> tuple[list[dict[str, Any]],
                                                               list[Any] | None]:
        last_path, last_line = (after[0], after[1]) if after else ("", 0)
        for relpath in paths:
            if relpath < last_path:
                continue
            text, hits = self._scan(disk, relpath, needles, fold)
            if text is None or (page.query.match_mode == "all" and not all(hits)):
                continue
            lines = _merge(hits)
            for number in lines:
                if relpath == last_path and number <= last_line:
                    continue
                if not page.add(relpath, text, number, lines[number]):
                    last = page.results[-1]
                    return page.results, [last["path"], last["line_number"]]
        return page.results, None

    def _ranked(self, disk: CacheFiles, page: _Page, paths: list[str], needles: list[str],
                fold: Any, after: list[Any] | None) -> tuple[list[dict[str, Any]],
                                                              list[Any] | None]:
        found: list[tuple[str, str, list[set[int]]]] = []
        freq = [0] * len(needles)
        for relpath in paths:
            text, hits = self._scan(disk, relpath, needles, fold)
            if text is None or not any(hits):
                continue
            found.append((relpath, text, hits))
            for i, lines in enumerate(hits):
                freq[i] += bool(lines)
        keyed = []
        for relpath, text, hits in found:
            matched = [i for i, lines in enumerate(hits) if lines]
            rank = [-len(matched), sum(freq[i] for i in matched), relpath]
            for number, which in _merge(hits).items():
                keyed.append((rank + [number], relpath, text, number, which))
        keyed.sort(key=lambda item: item[0])
        if after is not None:
            keyed = [item for item in keyed if item[0] > after]
        for i, (_, relpath, text, number, which) in enumerate(keyed):
            if not page.add(relpath, text, number, which):
                return page.results, keyed[i - 1][0]
        return page.results, None

    @staticmethod
    def _scan(disk: CacheFiles, relpath: str, needles: list[str],
              fold: Any) -> tuple[str | None, list[set[int]]]:
        """The file's text and, per needle, the 1-based numbers of the lines containing it."""
        data = _read(disk, relpath)
        if data is None:
            return None, []
        text = data.decode("utf-8", "replace")
        hay = fold(text)
        hits = []
        for needle in needles:
            lines: set[int] = set()
            pos, line, counted = hay.find(needle), 1, 0
            while pos >= 0:
                line += hay.count("\n", counted, pos)
                lines.add(line)
                counted = hay.find("\n", pos)
                if counted < 0:
                    break
                pos = hay.find(needle, counted)
            hits.append(lines)
        return text, hits


def _read(disk: CacheFiles, relpath: str) -> bytes | None:
    """A cached file's bytes; None when it is missing, a link (never followed) or unreadable."""
    try:
        return disk.read(relpath)
    except SharedMemoryError:
        return None


def _folder(query: Query) -> Any:
    if query.normalized:
        return normalize
    if not query.case_sensitive:
        return str.casefold
    return lambda text: text


def _merge(hits: list[set[int]]) -> dict[int, list[int]]:
    """Line number -> indexes of the queries found on it, in line order."""
    out: dict[int, list[int]] = {}
    for i, lines in enumerate(hits):
        for number in lines:
            out.setdefault(number, []).append(i)
    return dict(sorted(out.items()))


def _clip(line: str) -> str:
    line = line.rstrip("\r")
    return line if len(line) <= LINE_CHARS else line[:LINE_CHARS] + "…"


def _result(query: Query, manifest: Manifest, relpath: str, text: str, number: int,
            which: Iterable[int]) -> dict[str, Any]:
    lines = text.split("\n")
    if text.endswith("\n"):
        lines.pop()
    width = query.context_lines
    start = max(0, number - 1 - width)
    return {
        "path": relpath,
        "line_number": number,
        "line": _clip(lines[number - 1]),
        "context_before": [_clip(x) for x in lines[start:number - 1]],
        "context_after": [_clip(x) for x in lines[number:number + width]],
        "matched_queries": [query.queries[i] for i in which],
        **provenance(manifest, relpath),
    }


def provenance(manifest: Manifest, relpath: str) -> dict[str, Any]:
    """Where a cached file came from: machine, source, content address, when it was synced."""
    meta = manifest.files.get(relpath)
    info = manifest.namespaces.get(meta.namespace) if meta else None
    return {
        "machine": info.machine if info else None,
        "source": info.source if info else None,
        "sha256": meta.sha256 if meta else None,
        "synced_at": info.synced_at if info else None,
    }


_SEARCHERS: dict[str, Searcher] = {}


def searcher(cache: Cache) -> Searcher:
    """The long-lived searcher for this cache root (one per process)."""
    key = os.fspath(cache.root)
    if key not in _SEARCHERS:
        _SEARCHERS[key] = Searcher(cache)
    return _SEARCHERS[key]
