"""Ingest: one client's snapshot of one source replaces its namespace, every rule checked again.

The store (`store.py`) owns the connection and the one transaction helper; this module is what
a publish means: the server re-checks paths, collisions, sizes and quotas, redacts what the
client sent (or takes what it redacted as the bodies arrived), and swaps the namespace in one
transaction, whole or as a delta against the digest the client last saw.
"""

from __future__ import annotations

import sqlite3
from collections import namedtuple
from collections.abc import Container, Mapping, Sequence
from operator import itemgetter

from sharedmem.clock import utc_now
from sharedmem.core import StoreError
from sharedmem.hashing import digest_of_sorted, sha256_bytes, sha256_text
from sharedmem.rules import (
    KIND_MARKDOWN,
    SOURCE_KINDS,
    Limits,
    check_machine_name,
    check_markdown_source_name,
    collision_key,
)
from sharedmem.server.store import rows_in
from sharedmem.sources import allowlist

TYPE_CHECKING = False
if TYPE_CHECKING:
    from sharedmem.server.store import Store


class IncomingFile(namedtuple("IncomingFile",
                               "path sha256 size mtime_ns text redactions stored refused",
                               defaults=(None, None, 0, None, None, None, None))):
    """A file a client publishes: its text, or only its sha256 when the server may have the body.

    `redactions` is set when the server already redacted `text` as it arrived; when it is
    empty (nothing was redacted), `sha256` and `size` are those the server computed for `text`.
    Such a `text` may be its UTF-8 (bytes, as the session keeps it), stored as it is, under
    `stored` when something was redacted.
    `text` None with `redactions` set: the server stored the body, redacted, as it arrived
    (`Store.put_blobs`), under `stored` (its sha256, which is `sha256` when nothing was
    redacted) and `size` is its size. `refused` is a reason the server refused the body for as
    it arrived (`too-large`, `quota`), keeping nothing of it. Every text is Unicode: the session
    refused a line holding a lone surrogate where it decoded it (`Channel.guard`).
    """

    __slots__ = ()


class IngestReport:
    """What one namespace ingest stored and refused."""

    def __init__(self, machine: str, source: str, generation: int) -> None:
        self.machine, self.source, self.generation = machine, source, generation
        self.accepted = 0
        self.unchanged = False
        self.refused: list[dict[str, str]] = []
        self.redacted: dict[str, int] = {}
        self.stored: dict[str, str] = {}


class StaleBase(StoreError):
    """A delta was based on a namespace digest the server no longer holds."""


MAX_MESSAGE_CHARS = 1000  # of one refusal's message: a hostile path is shown whole only once


class _Machine:
    """What a machine's other namespaces hold, against its totals (`Limits.machine_*`)."""

    def __init__(self, conn: sqlite3.Connection, machine: str, source: str,
                 limits: Limits) -> None:
        self.machine, self.source, self.limits = machine, source, limits
        self.namespaces, self.files, self.size = conn.execute(
            "SELECT count(*), coalesce(sum(file_count), 0), coalesce(sum(byte_count), 0) "
            "FROM namespaces WHERE machine=? AND source<>?", (machine, source)).fetchone()

    def full(self, files: int, size: int) -> bool:
        """Whether `files` more files of `size` bytes in all would pass the machine's totals."""
        return (self.files + files > self.limits.machine_files
                or self.size + size > self.limits.machine_bytes)

    def message(self, path: object) -> str:
        """Why a file is refused for the machine's totals, and the two ways out."""
        limits = self.limits
        return (f"{path!r} would take machine {self.machine!r} past its total over all its "
                f"namespaces ({limits.machine_files} files, {limits.machine_bytes} bytes; its "
                f"other {self.namespaces} namespaces hold {self.files} files, {self.size} bytes): "
                f"forget namespaces it no longer publishes (shared_memory.py forget --store "
                f"STORE --machine {self.machine} --source NAME), or raise the totals for its key "
                f"(serve --limit machine_bytes=N --limit machine_files=N)")

    def too_many(self) -> str:
        """Why a new namespace is refused, and the two ways out."""
        return (f"machine {self.machine!r} already has {self.namespaces} namespaces, its limit "
                f"(machine_namespaces): source {self.source!r} was not created. Forget "
                f"namespaces it no longer publishes (shared_memory.py forget --store STORE "
                f"--machine {self.machine} --source NAME), or raise the limit for its key "
                f"(serve --limit machine_namespaces=N)")


def ingest(store: Store, machine: str, source: str, kind: str,
           files: Sequence[IncomingFile], *, limits: Limits | None = None,
           removed: Sequence[str] | None = None, base_digest: str | None = None,
           digest: str | None = None) -> IngestReport:
    """Replace exactly one namespace in one transaction, re-checking every rule first.

    With `base_digest`, `files` and `removed` are a delta against that stored digest: only
    their rows are read and written. The new digest is `digest`, the manifest's, when every
    file is stored as listed; else it is computed. The digest is a token between a machine
    and its own namespace (docs/PROTOCOL.md "Namespaces"); every body's sha256 is checked.
    """
    limits = limits or Limits()
    _check_namespace(machine, source, kind)
    report = IngestReport(machine, source, 0)
    with store.transaction(durable=False) as conn:  # a replica: see Store.transaction
        row = _row(conn, machine, source, base_digest)
        current, kept = _stored(conn, row, base_digest is not None, removed, files)
        others = _Machine(conn, machine, source, limits)
        if row is None and others.namespaces >= limits.machine_namespaces:
            why = others.too_many()
            report.refused.extend({"path": str(f.path), "reason": "machine-quota",
                                   "message": why} for f in files)
            return report  # nothing written: generation 0, no namespace
        absent = store.gone(f.stored or f.sha256 for f in files
                            if f.text is None and f.redactions is not None)
        accepted = _Check(conn, kind, files, limits, report, kept, current, absent, others).run()
        report.accepted = kept.count + len(accepted)
        gone = [p for p in current if p not in accepted]
        # mtime_ns is not compared: a kept file's row is never rewritten, only changed ones.
        changed = [(p, s, z, m) for p, (s, z, m) in accepted.items()
                   if not current or current.get(p, (None,))[0] != s]
        if row is not None and row[2] and not gone and not changed:
            conn.execute("UPDATE namespaces SET synced_at=? WHERE id=?", (utc_now(), row[0]))
            report.generation, report.unchanged = row[2], True
            return report
        # A manifest stored as listed is at the digest it names. Else a whole snapshot's is
        # taken from `accepted` (in path order), and a delta's is listed after its writes.
        if digest is None or report.refused or report.stored:
            digest = (digest_of_sorted([(p, s) for p, (s, _, _) in accepted.items()])
                      if base_digest is None else None)
        size = kept.size + sum(z for _, z, _ in accepted.values())
        report.generation = _write(conn, row, (machine, source, kind), (report.accepted, size),
                                   digest, current, gone, changed)
    return report


def _row(conn: sqlite3.Connection, machine: str, source: str,
         base_digest: str | None) -> tuple | None:
    """The namespace's row, if it is there; a delta's base must be its digest."""
    row = conn.execute("SELECT id, digest, generation, file_count, byte_count FROM namespaces "
                       "WHERE machine=? AND source=?", (machine, source)).fetchone()
    if base_digest is not None and (row is None or row[1] != base_digest):
        raise StaleBase(f"namespace {machine}/{source} changed since the client's "
                        "last sync; send the whole manifest")
    return row


def _stored(conn: sqlite3.Connection, row: tuple | None, delta: bool,
            removed: Sequence[str] | None, files: Sequence[IncomingFile]
            ) -> tuple[dict[str, tuple[str, int, int]], _Kept]:
    """The rows the ingest replaces, path -> (sha256, size, 0), and what a delta keeps as it is."""
    query = "SELECT path, sha256, size FROM files WHERE namespace_id=?"
    if not delta:
        current = {p: (s, z, 0) for p, s, z in conn.execute(query, (row[0],))} if row else {}
        return current, _Kept(conn, None, set(), 0, 0)
    drop = set(removed or ()) | {f.path for f in files}
    current = {p: (s, z, 0) for p, s, z in rows_in(conn, query + " AND path IN ({})",
                                                   sorted(drop), row[0])}
    # Every ingest writes the namespace's count and size with its rows.
    return current, _Kept(conn, row[0], drop, row[3] - len(current),
                          row[4] - sum(v[1] for v in current.values()))


def _write(conn: sqlite3.Connection, row: tuple | None, names: tuple[str, str, str],
           totals: tuple[int, int], digest: str | None,
           current: Mapping[str, tuple[str, int, int]], gone: list[str],
           changed: list[tuple[str, str, int, int]]) -> int:
    """Write the namespace at the next generation: its files, tombstones and row; that generation.

    `totals` is its (file count, size); `digest` None lists a delta's after its writes.
    """
    generation = int(conn.execute("SELECT value FROM meta WHERE key='generation'")
                     .fetchone()[0]) + 1
    conn.execute("UPDATE meta SET value=? WHERE key='generation'", (str(generation),))
    ns_id = row[0] if row is not None else conn.execute(
        "INSERT INTO namespaces(machine, source, kind, generation, created_generation,"
        " synced_at, file_count, byte_count, digest) VALUES (?,?,?,?,?,?,?,?,?)",
        (*names, generation, generation, utc_now(), *totals, digest)).lastrowid
    conn.executemany("DELETE FROM files WHERE namespace_id=? AND path=?",
                     [(ns_id, p) for p in gone])
    conn.executemany("INSERT OR REPLACE INTO tombstones VALUES (?,?,?)",
                     [(ns_id, p, generation) for p in gone])
    # A path the namespace holds is replaced: the delete fires the triggers that keep its
    # previous version and mark its old body unused. A new one is only inserted, which is
    # cheaper (a first sync's every file).
    for verb, rows in (("INSERT", [c for c in changed if c[0] not in current]
                        if current else changed),
                       ("INSERT OR REPLACE", [c for c in changed if c[0] in current])):
        if rows:
            conn.executemany(f"{verb} INTO files VALUES (?,?,?,?,?,?)",
                             [(ns_id, p, s, z, m, generation) for p, s, z, m in rows])
    if row is not None:  # a new namespace has no tombstones yet
        conn.executemany("DELETE FROM tombstones WHERE namespace_id=? AND path=?",
                         [(ns_id, c[0]) for c in changed])
        conn.execute("UPDATE namespaces SET kind=?, generation=?, synced_at=?, file_count=?, "
                     "byte_count=?, digest=? WHERE id=?",
                     (names[2], generation, utc_now(), *totals,
                      digest or _stored_digest(conn, ns_id), ns_id))
    return generation


def _stored_digest(conn: sqlite3.Connection, ns_id: int) -> str:
    """`digest_of` the namespace's rows, joined in path order by SQLite itself.

    SQLite compares paths as UTF-8 bytes, which orders them as Python orders the strings.
    """
    return sha256_bytes(conn.execute(_ORDERED_LINES, (ns_id,)).fetchone()[0] or b"")


# One blob of the lines `digest_of` hashes. Before SQLite 3.44 an aggregate has no ORDER BY of
# its own: it takes the rows in the order of a subquery that is not flattened (an ordered
# subquery of an aggregate never is). test_ingest checks the result against digest_of.
_ORDERED_LINES = (
    "SELECT CAST(group_concat(path || char(0) || sha256 || char(10), '' ORDER BY path) AS BLOB)"
    " FROM files WHERE namespace_id=?" if sqlite3.sqlite_version_info >= (3, 44) else
    "SELECT CAST(group_concat(line, '') AS BLOB) FROM (SELECT path || char(0) || sha256 || "
    "char(10) AS line FROM files WHERE namespace_id=? ORDER BY path)")


class _Kept:
    """The files a delta leaves as they are: counted, and their names read only when needed."""

    def __init__(self, conn: sqlite3.Connection, ns_id: int | None, drop: set[str],
                 count: int, size: int) -> None:
        self.conn, self.ns_id, self.drop = conn, ns_id, drop
        self.count, self.size = count, size
        self._keys: set[str] | None = None

    def keys(self) -> set[str]:
        """Their collision keys: read when a new name comes, which must not clash with them."""
        if self._keys is None:
            self._keys = set() if self.ns_id is None else {
                collision_key(p) for (p,) in self.conn.execute(
                    "SELECT path FROM files WHERE namespace_id=?", (self.ns_id,))
                if p not in self.drop}
        return self._keys


class _Check:
    """Every rule again, on the server, file by file in path order (each path once).

    `existing`: the stored rows of `files`' paths (a row's size stands for its body's);
    `absent`: bodies stored as they arrived that another session dropped since.
    """

    def __init__(self, conn: sqlite3.Connection, kind: str, files: Sequence[IncomingFile],
                 limits: Limits, report: IngestReport, kept: _Kept,
                 existing: Mapping[str, tuple[str, int, int]], absent: Container[str],
                 machine: _Machine) -> None:
        self.conn, self.kind, self.files, self.limits, self.report = (
            conn, kind, files, limits, report)
        self.kept, self.existing, self.absent, self.machine = kept, existing, absent, machine
        self.accepted: dict[str, tuple[str, int, int]] = {}
        self.keys: set[str] = set()  # of the files accepted from `files`
        self.kept_keys: set[str] | None = None
        self.total = kept.size
        self.blobs: list[tuple[str, int, str | bytes]] = []  # inserted together, in one call
        paths = [f.path for f in files]
        self.plain = all(type(p) is str for p in paths) and allowlist.plain(kind, paths)
        # The sizes of the stored bodies files name: from the file's own row when it names the
        # body it has, else in a few queries (one each cost a whole-manifest re-sync dear).
        self.sizes = dict(rows_in(conn, "SELECT sha256, size FROM blobs WHERE sha256 IN ({})",
                                  sorted({f.sha256 for f in files if self._looked_up(f)})))

    def _looked_up(self, f: IncomingFile) -> bool:
        """Whether `f` names a stored body whose size its own row does not give."""
        return (f.text is None and f.refused is None
                and (f.redactions is None or (f.stored or f.sha256) in self.absent)
                and not (type(f.path) is str and self.existing.get(f.path, ("",))[0] == f.sha256))

    def run(self) -> dict[str, tuple[str, int, int]]:
        """Check every file; path -> (sha256, size, mtime_ns) of those accepted, in path order."""
        for item in sorted(self.files, key=_PATH if self.plain else _shown_path):
            key = self._name(item.path)
            body = None if key is None else self._body(item)
            if body is not None and self._room(item.path, body[3]):
                self._accept(item, key, *body)
        # CAST: a body kept as its UTF-8 (bytes) is stored as TEXT, as one kept as a str is.
        self.conn.executemany("INSERT OR IGNORE INTO blobs VALUES (?,?,CAST(? AS TEXT))",
                              self.blobs)
        return self.accepted

    def _refuse(self, path: object, reason: str, message: str) -> None:
        if len(message) > MAX_MESSAGE_CHARS:
            message = message[:MAX_MESSAGE_CHARS - 1] + "…"
        self.report.refused.append({"path": str(path), "reason": reason, "message": message})

    def _name(self, path: str) -> str | None:
        """The path's collision key, or None when the path rule or a collision refuses it."""
        problem = None if self.plain else allowlist.problem(self.kind, path)
        if problem:
            self._refuse(path, "bad-path", problem)
            return None
        key = path.lower() if self.plain else collision_key(path)  # the same, for ASCII
        clash = key in self.keys
        if not clash and path not in self.existing:
            # A stored name never clashes with those stored beside it (every ingest refuses
            # such pairs), so only a new name is checked against the kept files.
            if self.kept_keys is None:
                self.kept_keys = self.kept.keys()
            clash = key in self.kept_keys
        if clash:
            self._refuse(path, "collision", f"{path!r} collides with another path that "
                         "differs only by case or Unicode form; rename one of them")
            return None
        return key

    def _body(self, item: IncomingFile) -> tuple[str | bytes | None, dict | None, str, int] | None:
        """(text to store or None, redactions, sha256, size) of a file's body, or None: refused."""
        path, sha256, size, _, text, counts, stored_as, refused = item
        if refused is not None:
            self._refuse(path, refused, _REFUSED[refused].format(
                path=path, size=size, limits=self.limits))
            return None
        if text is None and counts is not None and (stored_as or sha256) not in self.absent:
            return None, counts, stored_as or sha256, size  # stored as it arrived
        if counts == {} and text is not None:  # verified as it arrived
            return text, counts, sha256, size
        if counts and type(text) is bytes:  # redacted as it arrived, in UTF-8
            return text, counts, stored_as, size
        if text is not None:
            if counts is None:
                from sharedmem.redact.redactor import redact  # compiled only when bodies come
                text, counts = redact(text)
            return text, counts, sha256_text(text), len(text.encode("utf-8"))
        row = self.existing.get(path)
        found = row[1] if row is not None and row[0] == sha256 else self.sizes.get(sha256)
        if found is None:
            self._refuse(path, "missing-body", f"{path!r}: the server has no body "
                         f"for sha256 {sha256}; send it")
            return None
        return None, None, str(sha256), found

    def _room(self, path: str, size: int) -> bool:
        """Whether the file limit, the namespace's quota and the machine's totals take it."""
        limits = self.limits
        count = self.kept.count + len(self.accepted)
        if size > limits.file_bytes:  # every body: one stored before may be over it
            self._refuse(path, "too-large", _REFUSED["too-large"].format(
                path=path, size=size, limits=limits))
        elif count >= limits.namespace_files or self.total + size > limits.namespace_bytes:
            self._refuse(path, "quota", _REFUSED["quota"].format(path=path, limits=limits))
        elif self.machine.full(count + 1, self.total + size):
            self._refuse(path, "machine-quota", self.machine.message(path))
        else:
            return True
        return False

    def _accept(self, item: IncomingFile, key: str, text: str | bytes | None,
                counts: dict | None, sha: str, size: int) -> None:
        """Take the file: its redactions counted, its body stored, its name and size kept."""
        if counts:  # a body sent this time: its redactions count
            redacted = self.report.redacted
            for name, number in counts.items():
                redacted[name] = redacted.get(name, 0) + number
        if text is not None:  # only now: a body refused by the quota is not stored
            self.blobs.append((sha, size, text))
        if sha != item.sha256:
            self.report.stored[item.path] = sha
        self.keys.add(key)
        self.total += size
        self.accepted[item.path] = (sha, size, int(item.mtime_ns or 0))


_PATH = itemgetter(0)  # an IncomingFile's path, when every path is a string


def _shown_path(item: IncomingFile) -> str:
    """The order files are checked in when some path may not be a string."""
    return str(item.path)


# The message of each refusal a session may decide as a body arrives (IncomingFile.refused).
_REFUSED = {
    "too-large": "{path!r} is {size} bytes, over the {limits.file_bytes}-byte file limit",
    "quota": "{path!r} is past the namespace quota ({limits.namespace_files} files, "
             "{limits.namespace_bytes} bytes)",
}


def _check_namespace(machine: str, source: str, kind: str) -> None:
    check_machine_name(machine)
    if kind not in SOURCE_KINDS:
        raise StoreError(f"source kind {kind!r} is unknown; use one of {', '.join(SOURCE_KINDS)}")
    if kind == KIND_MARKDOWN:
        check_markdown_source_name(source)
    elif source != kind:
        raise StoreError(f"a {kind} source must be named {kind!r}, not {source!r}")
