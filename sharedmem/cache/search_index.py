"""The search index's upkeep: its format, and the writers that keep it in line with the cache.

The cache's Markdown files stay the source of truth. The index (`<cache>/.sharedmem/index/`)
holds three SQLite FTS5 tables of each file's normalized text (`folding.normalize`): its
trigrams, ASCII capitals kept (which any substring's narrow to; with those of what the fold
loses, `_grams_text`), its words with their places (which a phrase's narrow to, word by word; a
word is a run of anything but ASCII punctuation and blanks, FTS5's `ascii` tokenizer, so Python
cuts a query alike), and those words two by two in their case, without places (`pairs`:
the first two characters of a word after the last four of the one before, `pairs_text`, which
a phrase whose first word ends too many words, or in its case, narrows to); and every word it
holds, spelt backwards (`ends`: the words that end with a phrase's first word). The FTS5 tables
are contentless: no copy of the text, so a changed or deleted file's old entries stay until the
index is built again, once they are more than a `_STALE` share of all (they only name parts a
search then reads and finds wanting). It is built again too once more than 1/`STRAYS` of the
parts stand out of path order (`strays`: a file added or grown takes the rows a build left
free beside its neighbour's, `_Rows`, else rows past all others, which a search asks apart).
Beside them: each file's path, sha256 and namespace, the `files` mark of the manifest it
covers whole, and the files' ids in path order (so a new searcher loads its view in one read,
not by sorting every path). `refresh_index` keeps it current: run by the `index` command,
which a sync that changed the cache starts detached (`refresh_in_background`) and which waits
for that sync to end; search.py reads it. An index that cannot be read (damaged, or a link or
folder in its place) is deleted and built again: it is derived data.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import sqlite3
import stat
import time
import unicodedata
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Mapping
from itertools import compress, islice, pairwise
from operator import gt, itemgetter
from pathlib import Path

from sharedmem.cache.cache import INDEX_DIR, META_DIR, Cache
from sharedmem.cache.folding import accented_words, lower_ascii, normalize
from sharedmem.cache.layout import CacheFiles
from sharedmem.cache.manifest_store import CachedFile
from sharedmem.core import CacheError, SharedMemoryError
from sharedmem.files import try_lock
from sharedmem.program import LAUNCHER

INDEX_VERSION = "16"
INDEX_FILE = "search.sqlite3"
LOCK_FILE = "index.lock"  # in the cache's metadata folder, beside the index's own folder
WRITER_WAIT = 60.0  # seconds `index` waits for another writer of the index to finish
BACKGROUND_WAIT = 600.0  # and `index --background`, which no one waits for
SEGMENT_BYTES = 8192  # a file is indexed in parts of about this much (`segments`)
_STALE = 0.25  # old entries (parts changed or deleted since the build) over live ones: rebuild
_SCATTERED = 16  # a table whose segments but its largest hold over 1/16 of its pages: merged
_PAST = 1 << 62  # past every row
STRAYS = 8  # more than 1/8 of the parts out of path order (`strays`): rebuild
ORDER_TYPE = "i"  # `orders` holds 32-bit integers: half what a new searcher reads of 64
_SLACK = 2  # rows left free after each file's, for files added beside it later (`_Rows`)
_FOLDER_SLACK = 16  # and more after a folder's last file's, where files named by date go
_WORDS_HELD = 100_000  # words an update holds before it adds them to `ends`
_ROWS_HELD = 1 << 20  # bytes of files read an update holds before it writes them, in row order
# ASCII but letters and digits to a blank: the words `ends` holds (the words tables' but punctuation).
_CUT = bytes(c if c >= 128 or chr(c).isalnum() else 32 for c in range(256))
# ASCII punctuation: each character a word of its own in the words tables (`punctuation_apart`),
# whose tokenizer keeps it in words, so that a phrase tells `information see` from
# `information, see`.
_PUNCTUATION = "".join(chr(c) for c in range(33, 127) if not chr(c).isalnum())
_ONE_EACH = re.compile(f"([{re.escape(_PUNCTUATION)}])")
_WORDS_TOKENIZER = "'ascii tokenchars ''" + _PUNCTUATION.replace("'", "''''") + "'''"
_DETACHED = 0x00000008 | 0x00000200  # Windows: DETACHED_PROCESS | CREATE_NEW_PROCESS_GROUP
# Each indexed text ends with two line breaks more, so every string of one or two characters it
# holds begins one of its trigrams: a short key is looked up as the trigrams it begins.
TEXT_END = "\n\n"
# Word pairs (`pairs_text`): ASCII control characters, which no word of a pair holds
# (`pair_words` cuts at them): each pair's middle, as kept or folded, and each ASCII capital in
# a pair as kept.
PAIRED, FOLDED = "\x1e", "\x1f"
_CONTROL_CAPITALS = bytes(c for c in range(1, 30) if c != 10)[:26]
_CAPITALS = bytes.maketrans(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ", _CONTROL_CAPITALS)
_PAIRS_TOKENIZER = "'ascii tokenchars ''" + (_CONTROL_CAPITALS + b"\x1e\x1f").decode() + "'''"


def index_path(cache: Cache) -> Path:
    """Where the derived index of `cache` lives (private metadata, never published)."""
    return cache.root / META_DIR / INDEX_DIR / INDEX_FILE


_COMPANIONS = ("", "-journal", "-wal", "-shm")
_BUSY = {5, 6}  # SQLITE_BUSY, SQLITE_LOCKED: another process holds the index, which is fine
# What reading an index can raise when the file is not what a refresh wrote: SQLite's errors,
# UnicodeDecodeError (a ValueError) for text or even an error message that is not UTF-8,
# ValueError or TypeError for values of the wrong kind.
READ_ERRORS = (sqlite3.Error, ValueError, TypeError)


def read_only_uri(path: Path, options: str = "") -> str:
    """The URI SQLite opens `path` by read-only (a relative cache too; `?` and `#` quoted)."""
    return f"{Path(os.path.abspath(path)).as_uri()}?mode=ro{options}"


def is_busy(exc: Exception) -> bool:
    """True when `exc` says the index is locked by another process, not that it is damaged."""
    code = getattr(exc, "sqlite_errorcode", None) if isinstance(exc, sqlite3.Error) else None
    return code is not None and code & 0xFF in _BUSY


def is_planted(path: Path) -> bool:
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


@contextlib.contextmanager
def writer_lock(cache: Cache, wait: float) -> Iterator[bool]:
    """Hold the index's one-writer lock, waiting up to `wait` seconds: yields whether it is held.

    Whoever writes the index or deletes it (a sync's update, `index`, a search that finds it
    damaged) holds this lock, so none writes into the folder while another deletes or rebuilds
    it. An OS lock on `<cache>/.sharedmem/index.lock`, dropped when its holder dies. Raises
    CacheError when the lock file cannot be opened (a read-only cache, which no one writes).
    """
    path = cache.root / META_DIR / LOCK_FILE
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
    try:
        try:
            fd = os.open(path, flags, 0o600)
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
            os.unlink(path)  # a link planted in its place goes, never what it names
            fd = os.open(path, flags, 0o600)
    except OSError as exc:
        raise CacheError(f"the search index's lock {path} cannot be opened "
                         f"({exc.strerror or exc}): is the cache read-only?") from None
    try:
        deadline = time.monotonic() + wait
        held = try_lock(fd)
        while not held and time.monotonic() < deadline:
            time.sleep(0.05)
            held = try_lock(fd)
        yield held
    finally:
        os.close(fd)


def wait_for_exit(pid: int, seconds: float) -> None:
    """Wait, at most `seconds`, until process `pid` has ended (POSIX: signal 0 asks only)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        except OSError:  # alive, but not ours to signal
            pass
        time.sleep(0.05)


def being_written(cache: Cache) -> bool:
    """Whether another process writes the index now (a refresh under way holds its lock)."""
    try:
        with writer_lock(cache, 0) as held:
            return not held
    except CacheError:
        return False


def delete_damaged(cache: Cache, identity: tuple[int, int] | None = None) -> None:
    """Delete an index a search found unreadable, unless a writer holds it (and handles it).

    With `identity` (st_dev, st_ino), only when the file there is still that one, not one a
    refresh has put in its place since.
    """
    path = index_path(cache)
    try:
        with writer_lock(cache, 0) as held:
            if not held:
                return
            if identity is not None:
                info = os.stat(path)
                if (info.st_dev, info.st_ino) != identity:
                    return
            delete_index(path)
    except (OSError, CacheError):
        return  # nothing to delete, or a cache that cannot be written: the search scans


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
            import shutil  # only here: with it come bz2 and lzma, which a search never needs
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


def index_version() -> str:
    """The index's format, the Unicode tables `normalize` used and the size of a file's parts.

    Any of them changing rebuilds it; a search uses only an index of its own version.
    """
    return f"{INDEX_VERSION}/{unicodedata.unidata_version}/{SEGMENT_BYTES}"


# A file's parts, each indexed on its own: `grams`, `words` and `pairs` rows `first` to
# `first + parts - 1`; `bounds`, for a file of two parts or more, where each part begins and the
# file's end (`segments`, int64 in this machine's order), so a search reads just the parts the
# index names without reading the file to cut it. The segments, in path order then part
# order, and where each segment row stands in that order and whose file it is, as three arrays
# of `ORDER_TYPE` in `orders`: a search loads its view with one read instead of sorting every
# path. Valid only while meta's `order` names it and starts with meta's generation; none is
# stored when a value does not fit.
_TABLES = {"meta", "files", "grams", "words", "pairs", "ends", "orders"}  # as this version has
_SCHEMA = (
    "CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE files(id INTEGER PRIMARY KEY, path TEXT NOT NULL,"
    " sha256 BLOB NOT NULL, namespace TEXT NOT NULL, first INTEGER NOT NULL,"
    " parts INTEGER NOT NULL, bounds BLOB)",
    "CREATE VIRTUAL TABLE grams USING fts5(body, tokenize='trigram case_sensitive 1',"
    " detail=none, content='', columnsize=0)",
    f"CREATE VIRTUAL TABLE words USING fts5(body, tokenize={_WORDS_TOKENIZER}, prefix='3',"
    " content='', columnsize=0)",
    f"CREATE VIRTUAL TABLE pairs USING fts5(body, tokenize={_PAIRS_TOKENIZER}, detail=none,"
    " content='', columnsize=0)",
    "CREATE TABLE ends(word TEXT PRIMARY KEY) WITHOUT ROWID",
    "CREATE TABLE orders(key TEXT PRIMARY KEY, ids BLOB NOT NULL, positions BLOB NOT NULL,"
    " owners BLOB NOT NULL)",
)


def _files_of(cache: Cache) -> Mapping[str, CachedFile] | None:
    """The manifest's file list (a view of its store, in path order); None when damaged."""
    files = cache.load().files
    return None if cache.damage is not None else files


def refresh_index(cache: Cache, wait: float = WRITER_WAIT) -> dict[str, int]:
    """Bring the index in line with the whole cache manifest; only changed files are re-read.

    Run by `index` (which a search starts in the background when the index is missing, old or
    broken); one writer at a time: this waits up to `wait` s for another. Returns files
    re-indexed or dropped (`changed`) and files indexed in all (`files`).
    """
    with writer_lock(cache, wait) as held:
        if not held:
            raise CacheError(f"the search index of {cache.root} is busy: another `index` has "
                             f"been writing it for over {wait:.0f} s; try again when it is done")
        return _reconciled(cache)


def index_mark(cache: Cache) -> str | None:
    """The manifest's files mark (`Cache.files_mark`) when the index covers it exactly, else None.

    Reading it costs one query of each.
    """
    path = index_path(cache)
    if is_planted(path) or not path.is_file():  # no index: the manifest is not read at all
        return None
    try:
        conn = sqlite3.connect(read_only_uri(path), uri=True, timeout=10,
                               isolation_level=None)
        try:
            meta = dict(conn.execute("SELECT key, value FROM meta"))
        finally:
            conn.close()
    except READ_ERRORS:
        return None
    mark = cache.files_mark()
    return mark if mark and meta.get("version") == index_version() \
        and meta.get("manifest") == mark else None


def _reconciled(cache: Cache) -> dict[str, int]:
    """`refresh_index` once the writer's lock is held: a damaged or old index is built again."""
    path = index_path(cache)
    if is_planted(path):
        delete_index(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    damaged = False
    while True:
        try:
            return _Writer.run(path, cache)
        except READ_ERRORS as exc:
            if is_busy(exc):  # SQLite's own lock, held by a writer older than the one above
                raise CacheError(f"the search index {path} is busy: another `index` holds it; "
                                 "try again when it is done") from None
            if damaged:
                raise CacheError(f"the search index {path} cannot be built ({exc}): delete "
                                 f"the folder {path.parent} (derived data only) and run "
                                 "`shared_memory.py index` again") from None
            damaged = True
            delete_index(path)  # damaged: derived data, so built again from the cache


class _Writer:
    """One write transaction on the index: files read, normalized and (un)indexed."""

    def __init__(self, conn: sqlite3.Connection, disk: CacheFiles) -> None:
        self.conn, self.disk = conn, disk
        self.changed = 0
        self.emptied = False  # an index of another version was emptied: VACUUM after
        self.words: set[str] = set()  # words of the texts stored, for `ends` (`store_words`)
        # each file's first row and texts (raw, normalized, apart), held for `store_rows`
        self.rows: list[tuple[int, list[str], list[str], list[str]]] = []
        self.held = 0  # bytes of the files they were read from

    @classmethod
    def run(cls, path: Path, cache: Cache) -> dict[str, int]:
        conn = _connect(path)
        try:
            with CacheFiles(cache.root) as disk:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    writer = cls(conn, disk)
                    writer.prepare()
                    done = writer.reconcile(cache)
                    conn.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
            # Each question reads every segment of a table: merged into one, questions cost
            # less (docs/BENCHMARKS.md). Written mostly anew, every table is, and VACUUM frees
            # the pages the old segments held; else a table whose small segments have grown.
            rewritten = 4 * done["changed"] >= max(done["files"], 1)
            for table in ("grams", "words", "pairs"):
                if rewritten or _scattered(conn, table):
                    conn.execute(f"INSERT INTO {table}({table}) VALUES('optimize')")
            if rewritten or writer.emptied:  # emptied: the old version's pages
                conn.execute("VACUUM")
            # A big write leaves a WAL as large as itself; searches read the file, not the WAL.
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            return done
        finally:
            conn.close()

    def prepare(self) -> None:
        """Create the tables, or empty an index of another version in place."""
        names = {n for (n,) in self.conn.execute("SELECT name FROM sqlite_master")}
        version = None
        if "meta" in names:
            row = self.conn.execute("SELECT value FROM meta WHERE key='version'").fetchone()
            version = row[0] if row else None
        if version == index_version() and _TABLES <= names and not self.stale():
            return
        self.emptied = bool(names)
        for name in sorted(_TABLES | {"texts"}):  # texts: version 5's
            self.conn.execute(f"DROP TABLE IF EXISTS {name}")
        for statement in _SCHEMA:
            self.conn.execute(statement)
        self.conn.executemany("INSERT INTO meta(key, value) VALUES (?, ?)",
                              [("version", index_version()), ("generation", "0"),
                               ("manifest", "")])

    def meta(self, key: str) -> str:
        row = self.conn.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return str(row[0]) if row else ""

    def finish(self, mark: str | None, complete: bool) -> dict[str, int]:
        """Record the generation and which manifest the index now covers whole, if any."""
        self.store_rows()
        self.store_words()
        generation = int(self.meta("generation") or 0) + (1 if self.changed else 0)
        self.conn.executemany("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)",
                              [("generation", str(generation)),
                               ("manifest", mark if complete and mark else "")])
        self.store_order(generation)
        files = self.conn.execute("SELECT count(*) FROM files").fetchone()[0]
        return {"changed": self.changed, "files": files}

    def store_order(self, generation: int) -> None:
        """Write the segments in path order (see `_SCHEMA`) when the files changed since."""
        key = self.meta("order")
        if not self.changed and key.split("/")[0] == str(generation) and self.conn.execute(
                "SELECT 1 FROM orders WHERE key=?", (key,)).fetchone():
            return
        ids, owners = array("q"), array("q")
        for file_id, first, parts in self.conn.execute(
                "SELECT id, first, parts FROM files ORDER BY path"):
            ids.extend(range(first, first + parts))
            owners.extend([file_id] * parts)
        key = f"{generation}/{os.urandom(8).hex()}"
        self.conn.execute("DELETE FROM orders")
        try:
            stored = [array(ORDER_TYPE, values).tobytes() for values in (ids, inverse(ids), owners)]
        except OverflowError:  # rows or files past 2**31: each new searcher sorts the paths
            stored = []
        if stored:
            self.conn.execute("INSERT INTO orders(key, ids, positions, owners) "
                              "VALUES (?, ?, ?, ?)", (key, *stored))
        self.conn.executemany("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)",
                              [("order", key), ("strays", str(len(strays(ids.tolist()))))])

    def reconcile(self, cache: Cache) -> dict[str, int]:
        """Compare every indexed file with the manifest; re-read only those that differ."""
        mark = cache.files_mark()
        files = _files_of(cache)
        manifest = files or {}
        indexed = {p: (i, s, first, parts) for i, p, s, first, parts in self.conn.execute(
            "SELECT id, path, lower(hex(sha256)), first, parts FROM files")}
        gone = []
        for relpath, (row_id, sha, _, _) in indexed.items():
            meta = manifest.get(relpath)
            if meta is None:
                self.drop(row_id)
                gone.append(relpath)
            elif meta.sha256 != sha:
                self.drop(row_id, keep=True)
        for relpath in gone:  # their rows free for the files put
            del indexed[relpath]
        rows = _Rows(indexed)
        complete = files is not None
        for relpath, meta in manifest.items():  # streamed in path order, not held
            old = indexed.get(relpath)
            if old is not None and old[1] == meta.sha256:
                continue
            complete &= self.put(relpath, meta, old[0] if old else None, rows)
        return self.finish(mark, complete and mark == cache.files_mark())

    def stale(self) -> bool:
        """Whether it is worn enough to build anew: parts out of path order, or old entries.

        Old entries are those of parts changed or deleted since the build.
        """
        live = self.conn.execute("SELECT coalesce(sum(parts), 0) FROM files").fetchone()[0]
        return int(self.meta("stale") or 0) > _STALE * live or \
            int(self.meta("strays") or 0) * STRAYS > live

    def drop(self, row_id: int, keep: bool = False) -> None:
        """Count a file's entries as old (they stay, naming parts that no longer hold them)."""
        parts = self.conn.execute("SELECT parts FROM files WHERE id=?", (row_id,)).fetchone()[0]
        self.conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('stale', ?)",
                          (str(int(self.meta("stale") or 0) + parts),))
        if not keep:
            self.conn.execute("DELETE FROM files WHERE id=?", (row_id,))
            self.changed += 1

    def put(self, relpath: str, meta: CachedFile, row_id: int | None, rows: _Rows) -> bool:
        """Index the file as the manifest describes it; False when its bytes do not match.

        Such a file (a sync is rewriting it, or a link stands there) is left unindexed, so
        searches scan it. `row_id` is the row it had, already dropped from the trigrams.
        """
        data = read_cached(self.disk, relpath)
        if data is None or hashlib.sha256(data).hexdigest() != meta.sha256:
            if row_id is not None:
                self.conn.execute("DELETE FROM files WHERE id=?", (row_id,))
                self.changed += 1
            return False
        bounds = segments(data)
        raws = [data[lo:hi].decode("utf-8", "replace") for lo, hi in pairwise(bounds)]
        cased = [normalize(raw, keep_case=True) + TEXT_END for raw in raws]
        apart = [punctuation_apart(text) for text in cased]
        first = rows.place(relpath, len(raws))
        cut = array("q", bounds).tobytes() if len(raws) > 1 else None
        digest = bytes.fromhex(meta.sha256)  # the hexdigest of `data`, as checked above
        if row_id is None:
            row_id = self.conn.execute(
                "INSERT INTO files(path, sha256, namespace, first, parts, bounds) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (relpath, digest, meta.namespace, first, len(raws), cut)).lastrowid
        else:
            self.conn.execute("UPDATE files SET sha256=?, namespace=?, first=?, parts=?, "
                              "bounds=? WHERE id=?", (digest, meta.namespace, first,
                                                      len(raws), cut, row_id))
        self.rows.append((first, raws, cased, apart))
        self.held += len(data)
        if self.held > _ROWS_HELD:
            self.store_rows()
        self.changed += 1
        return True

    def store_rows(self) -> None:
        """Write the texts held to the FTS5 tables in row order.

        FTS5 writes what it holds as a new segment whenever a row comes below the one before
        it, and every question reads every segment: a file placed past all others between
        files placed in path order would cut a refresh's rows in two segments or more.
        """
        self.rows.sort(key=itemgetter(0))
        self.conn.executemany("INSERT INTO grams(rowid, body) VALUES (?, ?)", (
            (row, _grams_text(text, raw)) for first, raws, cased, _ in self.rows
            for row, text, raw in zip(range(first, first + len(raws)), cased, raws, strict=True)))
        self.conn.executemany("INSERT INTO words(rowid, body) VALUES (?, ?)", (
            (row, lower_ascii(text)) for first, _, _, apart in self.rows
            for row, text in enumerate(apart, first)))
        pairs = []
        for first, _, cased, _ in self.rows:
            for row, text in enumerate(cased, first):
                words = pair_words(text)  # the words `ends` holds too
                self.words.update(words)
                pairs.append((row, pairs_text(words)))
        self.conn.executemany("INSERT INTO pairs(rowid, body) VALUES (?, ?)", pairs)
        self.rows.clear()
        self.held = 0
        if len(self.words) > _WORDS_HELD:
            self.store_words()

    def store_words(self) -> None:
        """Add the words seen to `ends`, each spelt backwards; words no file holds may stay.

        Each as the `words` table holds it, folded.
        """
        self.conn.executemany("INSERT OR IGNORE INTO ends(word) VALUES (?)", (
            (lower_ascii(word)[::-1],) for word in self.words))
        self.words.clear()


class _Rows:
    """Which rows each file holds, so that a file added or grown takes rows in path order.

    A build leaves `_SLACK` rows free after each file's, and `_FOLDER_SLACK` more after a
    folder's last file's, where notes named by their date are added one after another (Codex's
    `rollout_summaries`). A file added later, or grown past its rows, takes the first free
    rows after those of the file before it in path order, when they are enough and below the
    next file's; else rows past all others, where searches ask it apart (`strays`). Rows a
    deleted file held may be taken again: its old entries only name parts a search then reads
    and finds wanting, as a changed file's do. The files indexed when the refresh began are
    the caller's (`held`, not copied: 100,000 paths), sorted only once a file needs rows; a
    build, which puts each file after the one before in path order, sorts nothing.
    """

    def __init__(self, held: Mapping[str, tuple[int, str, int, int]]) -> None:
        self.held = held  # path -> id, sha256, first row, parts
        self.building = not held
        self.top = 1  # past every row held or placed: counted once rows are sought
        self.given: dict[str, tuple[int, int]] = {}  # path -> rows placed since, first and end
        self.paths: list[str] = []  # every path, in path order, once sorted
        self.firsts, self.ends = array("q"), array("q")  # every file's rows, in row order
        self.folder: str | None = None  # the folder of the file a build placed last

    def place(self, relpath: str, parts: int) -> int:
        """The first of `parts` rows for the file, which gives up any it held.

        Those it held while they are enough: it keeps its place in path order.
        """
        if relpath in self.held:
            _, _, first, held = self.held[relpath]
            if held >= parts:
                return first
        if self.building:
            folder = relpath.rpartition("/")[0]
            if folder != self.folder and self.folder is not None:
                self.top += _FOLDER_SLACK
            self.folder = folder
            self.top += parts + _SLACK
            return self.top - parts - _SLACK
        if not self.paths:
            self.paths = sorted(self.held)
            spans = [(first, first + n) for _, _, first, n in self.held.values()]
            # spans never overlap: in order of their starts, their ends rise too
            self.firsts = array("q", sorted(first for first, _ in spans))
            self.ends = array("q", sorted(end for _, end in spans))
            self.top = self.ends[-1]
        if relpath in self.held:
            lo, hi = self._span(relpath)
            self.paths.pop(bisect_left(self.paths, relpath))
            at = bisect_left(self.firsts, lo)
            while self.ends[at] != hi:  # past files of no part at the same row
                at += 1
            del self.firsts[at], self.ends[at]
        at = bisect_left(self.paths, relpath)
        first = self._span(self.paths[at - 1])[1] if at else 1
        if at == len(self.paths) or not self._free(first, first + parts) or \
                first + parts > self._span(self.paths[at])[0]:
            first = self.top
            self.top = first + parts + _SLACK
        self.paths.insert(at, relpath)
        self.given[relpath] = (first, first + parts)
        at = bisect_left(self.firsts, first)
        self.firsts.insert(at, first)
        self.ends.insert(at, first + parts)
        return first

    def _span(self, relpath: str) -> tuple[int, int]:
        """The file's rows, first and end: those placed since the refresh began, else its own."""
        if relpath in self.given:
            return self.given[relpath]
        _, _, first, parts = self.held[relpath]
        return first, first + parts

    def _free(self, lo: int, hi: int) -> bool:
        """Whether no file holds a row from `lo` to `hi` - 1."""
        at = bisect_left(self.firsts, lo)
        return not (at < len(self.firsts) and self.firsts[at] < hi or
                    at and self.ends[at - 1] > lo)


def last_pages(table: str) -> str:
    """SQL that names each FTS5 segment of `table` and its last leaf page: `last(segment, page)`.

    `_idx` names every segment; its leaves are the rows of `_data` from its id shifted left 37
    bits, numbered from 1. The start of a query, for the tables' own names only.
    """
    return (f"WITH RECURSIVE segments(segment) AS (SELECT min(segid) FROM {table}_idx UNION ALL "
            f"SELECT (SELECT min(segid) FROM {table}_idx WHERE segid > segment) FROM segments "
            "WHERE segment IS NOT NULL), last(segment, page) AS (SELECT segment, (SELECT "
            f"max(rowid) - (segment << 37) FROM {table}_data WHERE rowid BETWEEN segment << 37 "
            "AND (segment << 37) + 2147483647) FROM segments WHERE segment IS NOT NULL) ")


def _scattered(conn: sqlite3.Connection, table: str) -> bool:
    """Whether the segments of `table` but its largest hold over 1/`_SCATTERED` of its pages.

    A refresh that changes few files adds a segment, which FTS5 merges only with others of its
    size, so they pile up beside the build's: merged whole once they hold that share, each
    question reads one segment again, for a rewrite of the table each time about a sixteenth
    of it has been written anew.
    """
    sizes = [pages for (pages,) in conn.execute(last_pages(table) + "SELECT page FROM last")
             if type(pages) is int]
    return _SCATTERED * (sum(sizes) - max(sizes, default=0)) > sum(sizes)


def _grams_text(text: str, raw: str) -> str:
    """A part's folded text (its ASCII capitals kept), then its accented words, one per line.

    As `raw` has them (`folding.accented_words`): what an exact query can narrow by that the
    folded text has lost.
    """
    more = "\n".join(accented_words(raw))
    return text + more + TEXT_END if more else text


def punctuation_apart(text: str) -> str:
    """`text` with a space either side of each ASCII punctuation character: a word of its own.

    As the words tables hold a text, and a phrase asked of them: their tokenizer keeps those
    characters in words, and cuts at blanks alone.
    """
    return " ".join(_ONE_EACH.split(text))


def pairs_text(words: list[str]) -> str:
    """The word pairs of a part's words (`pair_words`), as the `pairs` table holds them.

    Each two one after the other as `pair_token` makes it: a phrase whose first word may be the
    end of a longer one asks a prefix, and one whose last word may begin a longer one asks it
    whole from two characters on. Its ASCII capitals as control characters (`in_case`), as the
    `ascii` tokenizer folds ASCII case; and each pair holding one again folded, with `FOLDED`
    in the middle: a search ignoring case asks either. Two words on lines of their own make a
    pair too, which no key asks (cut at the line breaks, the pairs took longer to make).
    """
    pairs = list(map(pair_token, words, words[1:]))
    cased = lower_ascii(" ".join([pair for pair in pairs if not pair.islower()]))
    return in_case(" ".join(pairs)) + " " + cased.replace(PAIRED, FOLDED)


def pair_token(first: str, second: str) -> str:
    """Two words side by side as a pair, before `in_case`.

    The first two characters of the second, `PAIRED`, then the last four of the first spelt
    backwards.
    """
    return f"{second[:2]}{PAIRED}{first[:-5:-1]}"


def pair_words(text: str) -> list[str]:
    """The words of `text` cut at ASCII separators, punctuation too: those `ends` holds.

    As the pairs have them, a key's as a text's.
    """
    return text.encode("utf-8", "surrogatepass").translate(_CUT).decode(
        "utf-8", "surrogatepass").split()


def in_case(text: str) -> str:
    """`text` with each ASCII capital a control character: as `pairs` keeps a pair's case.

    Through its UTF-8 bytes: `str.translate` of a text not ASCII took twenty times as long.
    """
    return text.encode("utf-8", "surrogatepass").translate(_CAPITALS).decode(
        "utf-8", "surrogatepass")


def segments(data: bytes) -> list[int]:
    """Where a file's parts begin, and its end: each part is about `SEGMENT_BYTES`, whole lines.

    Part k ends after the first line break from byte k * SEGMENT_BYTES - 1 on. A line break
    never joins two characters, so each part folds as it does within the whole text.
    """
    bounds, size = [0], len(data)
    while bounds[-1] < size:
        k = bounds[-1] // SEGMENT_BYTES + 1
        end = data.find(b"\n", k * SEGMENT_BYTES - 1) + 1
        bounds.append(end if 0 < end < size else size)
    return bounds


def refresh_in_background(cache: Cache, after: int | None = None) -> bool:
    """Start `index --cache DIR --background` detached; False when it could not be started.

    A search that finds no usable index calls this instead of building it in its own time, so
    no request waits for the index; the refresh runs on idle CPU time. A sync passes its own pid
    (`after`, POSIX only): the refresh waits until the sync has ended, so that its reads and
    writes do not slow the end of the sync.
    """
    import subprocess
    import sys
    command = [sys.executable, str(LAUNCHER), "index", "--cache", str(cache.root),
               "--background"]
    if after is not None and os.name != "nt":
        command += ["--after", str(after)]
    try:
        subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, close_fds=True,
                         creationflags=_DETACHED if os.name == "nt" else 0,
                         start_new_session=os.name != "nt")
    except OSError:
        return False
    return True



def inverse(ids: array[int]) -> array[int]:
    """Position of each id in `ids` (-1 for ids not in it), indexed by id."""
    where = array("q", [-1]) * (max(ids, default=0) + 1)
    for pos, row_id in enumerate(ids):
        if row_id >= 0:
            where[row_id] = pos
    return where


def strays(ids: list[int]) -> list[int]:
    """The positions whose id is past a later position's: parts out of path order.

    A build puts every part in path order; a file a sync adds, or grows, takes rows past all
    others when those left free beside its neighbour's are too few (`_Rows`). Where the id
    falls, a run of rising ids ends: its ids past the least id after it stray (each fall is a
    stray's).
    """
    if ids == sorted(ids):
        return []
    falls = compress(range(1, len(ids)), map(gt, ids, islice(ids, 1, None)))
    runs, least = [], _PAST
    for lo, hi in reversed(list(pairwise([0, *falls, len(ids)]))):
        runs.append(range(bisect_right(ids, least, lo, hi), hi))
        least = min(least, ids[lo])
    return [pos for run in reversed(runs) for pos in run]


def read_cached(disk: CacheFiles, relpath: str) -> bytes | None:
    """A cached file's bytes; None when it is missing, a link (never followed) or unreadable."""
    try:
        return disk.read(relpath)
    except SharedMemoryError:
        return None

