"""The cache manifest kept in SQLite: one row a file, looked up by path or streamed, changed by rows.

A manifest loaded whole would cost one Python object a file, however little a sync changes.
Kept in `manifest.sqlite3`, a lookup is one query, an iteration streams in chunks (each its own
short query, so a long reader never holds a lock a commit waits for), and a commit writes only
the rows that changed, in one transaction whose journal makes it whole or absent. Damage reads
as damage: a file that is not a database, a table missing, the wrong version, or (`verify`) a
failed integrity check.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from collections import namedtuple
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from pathlib import Path

from sharedmem.core import CacheError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

STORE_NAME = "manifest.sqlite3"
STORE_VERSION = "3"  # 3: SQLite (1 and 2 were manifest.json beside namespaces.json)
TIMEOUT = 10.0  # seconds a reader or writer waits for the other's lock
CHUNK = 1024  # rows fetched at a time when streaming, each chunk its own query
IN_CHUNK = 500  # paths in one `IN (...)`: under SQLite's old cap of 999 parameters
_FILE_NAMESPACES = (  # see ManifestStore.file_namespaces
    "WITH RECURSIVE ns(namespace, path) AS ("
    " SELECT * FROM (SELECT namespace, path FROM files ORDER BY path LIMIT 1)"
    " UNION ALL SELECT f.namespace, f.path FROM ns, files f WHERE f.path ="
    " (SELECT min(path) FROM files WHERE path > max(ns.path, ns.namespace || '0')))"
    " SELECT DISTINCT namespace FROM ns")
STATS = "path, size, mtime_ns, sha256"  # what a check of the files reads (file_check.py)
STATS_QUERY = f"SELECT {STATS} FROM files"  # the same, all at once, for a helper process
# What finds damaged pages and keys out of order: the quick check missed keys out of order
# that made lookups by path fail, so a sync inserted such a file's row again at every run.
INTEGRITY_CHECK = "PRAGMA integrity_check"

# A sha256 written here is one this client computed, or checked against its text: the table
# checks its length only, as a check of its digits in SQLite costs every row written. The sync
# checks the digits of every row as it reads them anyway (file_check.differing).
_SCHEMA = (
    "CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID, STRICT",
    "CREATE TABLE files(path TEXT PRIMARY KEY, sha256 TEXT NOT NULL CHECK (length(sha256) = 64),"
    " size INTEGER NOT NULL CHECK (size >= 0), namespace TEXT NOT NULL, mtime_ns INTEGER)"
    " WITHOUT ROWID, STRICT",
)
_TABLES = {"meta", "files"}


class Damaged(CacheError):
    """Why the manifest cannot be what this cache wrote; `Cache.damage` holds the message."""


class Row(namedtuple("Row", "path sha256 size namespace mtime_ns")):
    """One file's row: path, sha256, size, namespace, modification time (None: unknown)."""

    __slots__ = ()


class CachedFile(namedtuple("CachedFile", "sha256 size namespace mtime_ns", defaults=(None,))):
    """One cached file's provenance: its content address, size, namespace and modification time.

    `mtime_ns` is the file's as the cache last wrote or verified it: a file whose size or time
    differs is hashed by the next sync (`Cache.check_files`). None means "verify once".
    """

    __slots__ = ()


class FileTable(Mapping[str, CachedFile]):
    """The manifest's files as a read-only mapping over its store: nothing is held.

    A lookup is one query; iterating streams the rows in path order. It always shows the store
    as it is now, so a caller that needs the file list from before a commit asks before it.
    """

    def __init__(self, store: ManifestStore) -> None:
        self.store = store

    def __getitem__(self, path: str) -> CachedFile:
        row = self.store.get(path) if type(path) is str else None
        if row is None:
            raise KeyError(path)
        return CachedFile(*row[1:])

    def get(self, path: str, default: Any = None) -> Any:  # noqa: D102 - Mapping's, one query
        row = self.store.get(path) if type(path) is str else None
        return default if row is None else CachedFile(*row[1:])

    def __contains__(self, path: object) -> bool:
        return type(path) is str and self.store.get(path) is not None

    def __len__(self) -> int:
        return self.store.count()

    def __bool__(self) -> bool:
        return self.store.holds_any()

    def __iter__(self) -> Iterator[str]:
        return self.store.paths()

    def keys(self) -> Any:  # noqa: D102 - streamed, not a view that would query per key
        return self.store.paths()

    def items(self) -> Any:  # noqa: D102 - streamed in one query
        return ((r[0], CachedFile(*r[1:])) for r in self.store.rows())

    def values(self) -> Any:  # noqa: D102 - streamed in one query
        return (CachedFile(*r[1:]) for r in self.store.rows())

    def rows(self, namespace: str | None = None) -> Iterator[Row]:
        """The rows (path first), of one namespace if named; streamed."""
        return self.store.rows(namespace)

    def sha256s(self, paths: list[str]) -> dict[str, str]:
        """The sha256 of each of `paths` it lists, by path: a few queries for them all."""
        return self.store.sha256s(paths)

    def sizes(self, prefix: str = "") -> Iterator[tuple[str, int]]:
        """(path, size) of each file below `prefix` (a folder and "/", or ""); streamed."""
        return self.store.sizes(prefix)


class ManifestStore:
    """One connection to a manifest file ('' for a private temporary one), opened on first use.

    A reader that keeps it open notices a file replaced under it (a rebuilt manifest moved in)
    by its inode, and opens the new one.
    """

    def __init__(self, path: Path | str) -> None:
        self.path = str(path)
        self._conn: sqlite3.Connection | None = None
        self._identity: tuple[int, int] | None = None
        self._verified: tuple[tuple[int, int], str] | None = None

    def exists(self) -> bool:
        """Whether there is a manifest file at all ('' always has one)."""
        return not self.path or os.path.isfile(self.path)

    def connection(self, *, create: bool = False) -> sqlite3.Connection:
        """The open connection; `create` makes the file and its tables when there is none.

        Raises Damaged when the file is not a manifest of this version.
        """
        identity = None
        if self.path:
            try:
                info = os.stat(self.path)
                identity = (info.st_dev, info.st_ino)
            except FileNotFoundError:
                if not create:
                    self.close()
                    raise Damaged(f"{self.path} is missing") from None
                os.makedirs(os.path.dirname(self.path), exist_ok=True)
            except OSError as exc:
                raise Damaged(f"{self.path} cannot be read ({exc.strerror or exc})") from None
        if self._conn is not None and (identity == self._identity or not self.path):
            return self._conn
        self.close()
        try:
            conn = sqlite3.connect(self.path, timeout=TIMEOUT, isolation_level=None,
                                   check_same_thread=False)
        except sqlite3.Error as exc:
            raise Damaged(f"{self.path} cannot be opened ({exc})") from None
        try:
            names = {n for (n,) in conn.execute("SELECT name FROM sqlite_master")}
            if not names and (create or not self.path):
                conn.execute("BEGIN IMMEDIATE")
                for statement in _SCHEMA:
                    conn.execute(statement)
                conn.execute("INSERT INTO meta(key, value) VALUES ('version', ?)",
                             (STORE_VERSION,))
                conn.execute("COMMIT")
                names = set(_TABLES)
            if not _TABLES <= names:
                raise Damaged(f"{self.path} lacks its tables "
                              f"({', '.join(sorted(_TABLES - names))})")
            row = conn.execute("SELECT value FROM meta WHERE key='version'").fetchone()
            if row is None or row[0] != STORE_VERSION:
                raise Damaged(f"{self.path} is not a manifest of version {STORE_VERSION}")
        except sqlite3.Error as exc:
            conn.close()
            raise Damaged(f"{self.path} is not a readable manifest ({exc})") from None
        except Damaged:
            conn.close()
            raise
        if self.path and identity is None:
            info = os.stat(self.path)
            identity = (info.st_dev, info.st_ino)
        self._conn, self._identity = conn, identity
        return conn

    def close(self) -> None:
        """Release the connection (a temporary store is then gone)."""
        if self._conn is not None:
            self._conn.close()
        self._conn, self._identity, self._verified = None, None, None

    def verify(self) -> None:
        """SQLite's integrity check, once for each committed state: Damaged when it fails.

        Its cost grows with the file (tens of milliseconds at 100,000 rows), so a reader that
        stays open pays it once a sync.
        """
        conn = self.connection()
        key = (self._identity or (0, 0), self.meta().get("commit", ""))
        if self._verified == key:
            return
        try:
            problems = [r for (r,) in conn.execute(INTEGRITY_CHECK)]
        except sqlite3.Error as exc:
            raise Damaged(f"{self.path} is damaged ({exc})") from None
        if problems != ["ok"]:
            raise Damaged(f"{self.path} is damaged ({'; '.join(map(str, problems[:3]))})")
        self._verified = key

    def check_size(self) -> None:
        """Damaged when the file is shorter than its header says: cut short (cheap, O(1)).

        Read under SQLite's shared lock, so a commit in progress elsewhere cannot look like it.
        """
        if not self.path:
            return
        conn = self.connection()
        try:
            conn.execute("BEGIN")
            try:
                pages = conn.execute("PRAGMA page_count").fetchone()[0]
                size = conn.execute("PRAGMA page_size").fetchone()[0]
                actual = os.stat(self.path).st_size
            finally:
                conn.execute("COMMIT")
        except sqlite3.Error as exc:
            raise Damaged(f"{self.path} cannot be read ({exc})") from None
        if actual < pages * size:
            raise Damaged(f"{self.path} is cut short ({actual} bytes of {pages * size})")

    def _rows(self, sql: str, args: tuple[Any, ...] = ()) -> list[Any]:
        try:
            return self.connection().execute(sql, args).fetchall()
        except sqlite3.Error as exc:
            raise Damaged(f"{self.path} cannot be read ({exc})") from None

    def _pages(self, columns: str, where: str = "", args: tuple[Any, ...] = ()) -> Iterator[Any]:
        """File rows in path order (`columns` begins with the path), CHUNK at a time.

        Each chunk is its own short query from the last path on, so no read lock is held
        between them: a reader that takes long over the rows (an index build) never keeps a
        sync from committing. A commit between two chunks shows in the later ones only;
        whoever needs one state compares `meta` marks before and after.
        """
        last = None
        while True:
            conditions = [c for c in (where, "path > ?" if last is not None else "") if c]
            params = args if last is None else (*args, last)
            sql = (f"SELECT {columns} FROM files"
                   + (f" WHERE {' AND '.join(conditions)}" if conditions else "")
                   + f" ORDER BY path LIMIT {CHUNK}")
            rows = self._rows(sql, params)
            yield from rows
            if len(rows) < CHUNK:
                return
            last = rows[-1][0]

    def meta(self) -> dict[str, str]:
        """The small values: version, last_sync, server and namespaces (JSON), the two marks."""
        return dict(self._rows("SELECT key, value FROM meta"))

    def get(self, path: str) -> Row | None:
        """One file's row, or None."""
        rows = self._rows("SELECT path, sha256, size, namespace, mtime_ns FROM files"
                          " WHERE path=?", (path,))
        return Row(*rows[0]) if rows else None

    def sha256s(self, paths: Sequence[str]) -> dict[str, str]:
        """The sha256 of each of `paths` the manifest lists, by path: IN_CHUNK paths a query."""
        found: dict[str, str] = {}
        for i in range(0, len(paths), IN_CHUNK):
            chunk = tuple(paths[i:i + IN_CHUNK])
            found.update(self._rows("SELECT path, sha256 FROM files WHERE path IN "
                                    f"({','.join('?' * len(chunk))})", chunk))
        return found

    def count(self) -> int:
        """How many files."""
        return int(self._rows("SELECT count(*) FROM files")[0][0])

    def holds_any(self) -> bool:
        """Whether there is a file row at all (one row read, not a count of them all)."""
        return bool(self._rows("SELECT 1 FROM files LIMIT 1"))

    def holds(self, count: int) -> bool:
        """Whether there are at least `count` (> 0) file rows, without counting them all."""
        return bool(self._rows(f"SELECT 1 FROM files LIMIT 1 OFFSET {int(count) - 1}"))

    def counts(self) -> dict[str, int]:
        """How many files each namespace holds."""
        return dict(self._rows("SELECT namespace, count(*) FROM files GROUP BY namespace"))

    def rows(self, namespace: str | None = None) -> Iterator[Row]:
        """Every file's row in path order (of one namespace), streamed."""
        columns = "path, sha256, size, namespace, mtime_ns"
        if namespace is None:
            return (Row(*r) for r in self._pages(columns))
        return (Row(*r) for r in self._pages(columns, "namespace=?", (namespace,)))

    def paths(self, namespace: str | None = None) -> Iterator[str]:
        """Every file's path in path order (of one namespace), streamed."""
        if namespace is None:
            return (p for (p,) in self._pages("path"))
        return (p for (p,) in self._pages("path", "namespace=?", (namespace,)))

    def sizes(self, prefix: str = "") -> Iterator[tuple[str, int]]:
        """(path, size) of every file below `prefix` (ending in "/", or ""), in path order."""
        if not prefix:
            return self._pages("path, size")
        upper = prefix[:-1] + chr(ord(prefix[-1]) + 1)  # the first path past the folder
        return self._pages("path, size", "path >= ? AND path < ?", (prefix, upper))

    def stats(self) -> Iterator[tuple[str, int, int | None, str]]:
        """(path, size, mtime_ns, sha256) of every file in path order, for a check of the files."""
        return self._pages(STATS)

    def file_namespaces(self) -> list[str]:
        """The namespaces that hold at least one file, a lookup of the path index each.

        A namespace's paths all begin with its key and "/", so they are one run in path order,
        and "0" follows "/": each step jumps to the first path past that run (and past the
        path found, so a row whose namespace were not its path's could not hold it still),
        where `SELECT DISTINCT namespace` would read every row at every commit.
        """
        return [n for (n,) in self._rows(_FILE_NAMESPACES)]

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Writing]:
        """One write transaction: all of it is committed, or none of it."""
        conn = self.connection(create=True)
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield Writing(conn)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def save_as(self, target: Path) -> None:
        """Write this (temporary) store to `target` whole, replacing what is there at once.

        The hot journal of a damaged file it replaces goes first: SQLite would otherwise roll
        the new file back with the old one's pages.
        """
        part = Path(str(target) + ".part")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(part)
        self.connection().execute("VACUUM INTO ?", (str(part),))
        for suffix in ("-journal", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(str(target) + suffix)
        os.replace(part, target)


class Writing:
    """The statements of one transaction (`ManifestStore.transaction`)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.files_changed = False

    def upsert(self, rows: Iterable[tuple[str, str, int, str, int | None]]) -> None:
        """Insert or replace file rows (path, sha256, size, namespace, mtime_ns), streamed."""
        before = self.conn.total_changes
        self.conn.executemany("INSERT OR REPLACE INTO files(path, sha256, size, namespace,"
                              " mtime_ns) VALUES (?, ?, ?, ?, ?)", rows)
        self.files_changed |= self.conn.total_changes != before

    def delete(self, paths: Iterable[str]) -> None:
        """Delete file rows by path."""
        before = self.conn.total_changes
        self.conn.executemany("DELETE FROM files WHERE path=?", ((p,) for p in paths))
        self.files_changed |= self.conn.total_changes != before

    def set_namespaces(self, rows: Iterable[tuple[Any, ...]]) -> None:
        """Replace every namespace (key, machine, source, kind, generation, synced_at, digest).

        They are few, and the server's names and times may hold a lone surrogate, which SQLite
        text cannot: one JSON value, ASCII with escapes, as the older namespaces.json.
        """
        self.conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('namespaces', ?)",
                          (json.dumps([list(r) for r in rows]),))

    def set_meta(self, last_sync: str | None, server: Mapping[str, Any]) -> None:
        """The small values, and new marks: `commit` always, `files` when a file row changed.

        A search index records the `files` mark it covers (search.py).
        """
        values = [("commit", os.urandom(16).hex()), ("server", json.dumps(dict(server)))]
        if self.conn.execute("SELECT 1 FROM meta WHERE key='namespaces'").fetchone() is None:
            values.append(("namespaces", "[]"))
        if last_sync is not None:
            values.append(("last_sync", last_sync))
        if self.files_changed or self.conn.execute(
                "SELECT 1 FROM meta WHERE key='files'").fetchone() is None:
            values.append(("files", os.urandom(16).hex()))
        self.conn.executemany("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", values)


class PullRows:
    """A pull's record of each file, in a private temporary SQLite database, not in Python.

    A first pull names every file of the store, so its records are not held in Python. Each is a
    row (path, sha256, what to do with it), the latest record of a path the one that counts,
    written in batches as the pull streams in and read back in path order, a chunk at a time,
    by the commit and the search index. SQLite keeps at most its page cache in memory and
    spills the rest to a temporary file that is gone when the pull is. Nothing here is the
    cache's: a pull that fails leaves only this behind, and it goes with the process.
    """

    WRITE, OWN, KEPT, DROPPED = 0, 1, 2, 3  # OWN: written with this client's own text
    TAKEN = (WRITE, OWN)  # what the commit writes
    HELD = (WRITE, OWN, KEPT)  # what the cache holds after the commit
    BATCH = 512  # records held before they are written: a bounded few

    def __init__(self) -> None:
        self._conn = sqlite3.connect("", isolation_level=None, check_same_thread=False)
        self._conn.execute("PRAGMA journal_mode=OFF")
        self._conn.execute("PRAGMA synchronous=OFF")
        self._conn.execute("CREATE TABLE pulled(path TEXT PRIMARY KEY, sha256 TEXT NOT NULL,"
                           " state INTEGER NOT NULL) WITHOUT ROWID")
        self._pending: list[tuple[str, str, int]] = []
        self._touched: set[str] | None = None  # see `watch`

    def watch(self) -> None:
        """From now on, note the namespace (machines/<m>/<source>) of each path recorded."""
        self._touched = set()

    def touched(self) -> set[str] | None:
        """The namespaces recorded in since `watch`; None when not watched."""
        return self._touched

    def set(self, path: str, sha: str, state: int) -> None:
        """Record what the pull does with `path`; a later record of it replaces this one."""
        if self._touched is not None:
            self._touched.add("/".join(path.split("/", 3)[:3]))
        self._pending.append((path, sha, state))
        if len(self._pending) >= self.BATCH:
            self.flush()

    def flush(self) -> None:
        """Write the records not written yet, in the order they came."""
        if self._pending:
            self._conn.executemany("INSERT OR REPLACE INTO pulled(path, sha256, state)"
                                   " VALUES (?, ?, ?)", self._pending)
            self._pending = []

    def state(self, path: str) -> int | None:
        """What the pull does with `path`, or None when it did not name it."""
        self.flush()
        row = self._conn.execute("SELECT state FROM pulled WHERE path=?", (path,)).fetchone()
        return None if row is None else int(row[0])

    @staticmethod
    def _where(states: tuple[int, ...], prefix: str,
               outside: Collection[str] = ()) -> tuple[str, tuple[str, ...]]:
        """The condition on `states`, and its arguments.

        Below `prefix` (a folder and "/") if given, and below none of the folders `outside`.
        """
        where = f"state IN ({', '.join(str(int(s)) for s in states)})"
        args: list[str] = []
        for folder, test in ([(prefix, "path >= ? AND path < ?")] if prefix else []) + [
                (f"{key}/", "NOT (path >= ? AND path < ?)") for key in sorted(outside)]:
            where += f" AND {test}"
            args += [folder, folder[:-1] + chr(ord(folder[-1]) + 1)]  # to the first path past it
        return where, tuple(args)

    def _select(self, columns: str, states: tuple[int, ...], prefix: str = "",
                outside: Collection[str] = ()) -> Iterator[Any]:
        """The records in `states` (below `prefix`, outside those folders), in path order.

        One query read a row at a time: nothing writes this database while it is read.
        """
        self.flush()
        where, args = self._where(states, prefix, outside)
        return iter(self._conn.execute(f"SELECT {columns} FROM pulled WHERE {where}"
                                       " ORDER BY path", args))

    def rows(self, states: tuple[int, ...], prefix: str = "", *,
             outside: Collection[str] = ()) -> Iterator[tuple[str, str, int]]:
        """(path, sha256, state) of each record in `states` (below `prefix`), in path order.

        `outside`: folders (namespace keys) whose records are left out.
        """
        return self._select("path, sha256, state", states, prefix, outside)

    def paths(self, states: tuple[int, ...], prefix: str = "", *,
              outside: Collection[str] = ()) -> Iterator[str]:
        """The path of each record in `states` (below `prefix`, outside those), in path order."""
        return (p for (p,) in self._select("path", states, prefix, outside))

    def count(self, states: tuple[int, ...], prefix: str = "") -> int:
        """How many records are in `states` (below `prefix`, a folder and "/")."""
        self.flush()
        where, args = self._where(states, prefix)
        return int(self._conn.execute(f"SELECT count(*) FROM pulled WHERE {where}",
                                      args).fetchone()[0])

    def view(self, states: tuple[int, ...]) -> PulledPaths:
        """The paths in `states` as a collection to iterate again and count, not held."""
        return PulledPaths(self, states)


class PulledPaths:
    """The paths of a pull's records in some states: iterated in path order, counted, not held."""

    def __init__(self, rows: PullRows, states: tuple[int, ...]) -> None:
        self.rows, self.states = rows, states

    def __iter__(self) -> Iterator[str]:
        return self.rows.paths(self.states)

    def __len__(self) -> int:
        return self.rows.count(self.states)

    def __contains__(self, path: object) -> bool:
        return type(path) is str and self.rows.state(path) in self.states
