"""The server's SQLite store: the connection, the one transaction helper, migrations, notes, pulls.

How long it keeps bodies no file uses, tombstones and previous versions of files is
`blob_lifecycle.py`'s; the methods that write them (`put_blobs`, `need`, `finish`, `collect`,
`forget`, `set_history_days`) run its steps in their transactions. A file's previous versions
(schema 3's triggers record them) are read with `history` and `version`.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence

from sharedmem.clock import utc_now
from sharedmem.core import NameRuleError, PathRuleError, StoreError
from sharedmem.namespaces import Namespace, NamespaceList
from sharedmem.rules import (
    MACHINES_DIR,
    MAX_PATH_BYTES,
    NOTES_DIR,
    check_machine_name,
    check_path,
    name_problem,
)
from sharedmem.server import note_log
from sharedmem.server.disk_full import disk_full, full_error
from sharedmem.server.schema import MIGRATIONS, statements
from sharedmem.server.wal import Wal, use_wal

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any

    from sharedmem.server.blob_lifecycle import Collected

BUSY_TIMEOUT_MS = 60_000
# A new store's page size (an existing one keeps its own: SQLite changes it only in a VACUUM,
# never in WAL mode). Memory files of a few kB fill small pages one body to a page, and a
# first sync's bodies (random sha256 keys) rewrite index pages at each commit: larger pages
# store them faster in a smaller file.
PAGE_SIZE = 16384
# SQLite's page cache for a connection, in KiB (it grows only as pages are read). The default
# held the indexes of a small store, not those of a large first sync, whose rows then read and
# spilled index pages again and again; this takes most of what four times as much does. A
# session holds at most this much of it: memory per session is
# bounded, and so is the sessions' number (`session_slots.py`).
CACHE_KIB = 16384
# `need` reads a namespace's rows rather than look each body up when it holds at most this
# many files for each body asked about: a row read costs a tenth of a look-up, or less.
NEED_SCAN_RATIO = 4
MAX_HISTORY_DAYS = 3650  # the longest retention `history --retention-days` takes: ten years
IN_CHUNK = 500  # values in one `IN (...)`: under SQLite's old cap of 999 parameters


def rows_in(conn: sqlite3.Connection, query: str, values: Sequence[object],
            *before: object) -> Iterator[tuple]:
    """The rows of `query` for all of `values`, asked `IN (...)` a chunk at a time.

    `query` holds `{}` where the chunk's placeholders go; `before` are the arguments ahead of
    them.
    """
    for i in range(0, len(values), IN_CHUNK):
        chunk = values[i:i + IN_CHUNK]
        yield from conn.execute(query.format(",".join("?" * len(chunk))), (*before, *chunk))


class NotFound(StoreError):
    """The store holds no such file or version: the session answers `not-found` and goes on."""


class Store:
    """One SQLite file; every write goes through `transaction`."""

    def __init__(self, path: Path | str, conn: sqlite3.Connection) -> None:
        self.path = path
        self.conn = conn
        self.session: int | None = None  # this process's row in `sessions`, once it claims
        # Whether every claim this store made is under `session`: not when its row went (taken
        # for dead) and a later claim made a new one, since the old claims went with it.
        self.claims_whole = True
        self.wal = Wal(conn, path, BUSY_TIMEOUT_MS)

    @classmethod
    def open(cls, path: Path | str, *, create: bool = True,
             before_migrate: Callable[[Path, int], None] | None = None) -> Store:
        """Open (or create) a store, migrating an older schema after `before_migrate` backs it up.

        A `plain_path` with a folder that is there (what `serve` opens at every sync) is opened
        by its text, without pathlib (milliseconds of `serve`'s start): the same file, and the
        same text in every message; making that folder would do nothing.
        """
        if not (create and plain_path(path) and os.path.isdir(os.path.dirname(path) or ".")):
            path = _folder_made(_path(path), create)
        conn, schema = _connect(path)
        latest = len(MIGRATIONS)
        if schema > latest:
            conn.close()
            raise StoreError(f"store {path} has schema version {schema}, newer than this "
                             f"software ({latest}): upgrade codex-shared-memory")
        store = cls(path, conn)
        if schema < latest:
            try:
                if schema > 0 and before_migrate is not None:
                    before_migrate(_path(path), schema)
                store._migrate(schema)
            except BaseException:
                conn.close()
                raise
        return store

    def _migrate(self, schema: int) -> None:
        for number in range(schema + 1, len(MIGRATIONS) + 1):
            with self.transaction() as conn:
                if conn.execute("PRAGMA user_version").fetchone()[0] >= number:
                    continue  # another process migrated while this one waited for the lock
                for statement in statements(MIGRATIONS[number - 1]):
                    conn.execute(statement)
                conn.execute(f"PRAGMA user_version={number}")

    def close(self) -> str | None:
        """Checkpoint the WAL, then close the connection; says why the checkpoint failed, if it did.

        Passive (`Wal.bound` past the log's bound): SQLite's own checkpoint at the last close
        holds the database exclusively, and the next session would wait on it. On a full disk
        the log is left as it is: it holds every commit, and the next connection reads it.
        """
        problem = None
        try:
            if not self.wal.bound():
                self.conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
        except sqlite3.Error as exc:  # the close checkpoints what it can, as before
            if disk_full(exc, self.path):
                problem = (f"store {self.path}: the disk holding it is full, so its write-ahead "
                           f"log {self.path}-wal was not copied into it; it keeps every change "
                           "(nothing is lost) and is copied by the first session that finds room. "
                           f"Disk full: free space on the server's disk holding {self.path}")
        self.conn.close()
        return problem

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def transaction(self, durable: bool = True) -> Iterator[sqlite3.Connection]:
        """The only write path: BEGIN IMMEDIATE, then COMMIT, or ROLLBACK on any error.

        Without `durable` the commit is not fsynced, only written: for what a client redoes by
        itself if a power cut loses it (docs/ARCHITECTURE.md "The store"); the next fsynced
        commit, or the checkpoint at the session's end, makes it durable. Notes always are.
        """
        self.wal.bound()
        if not durable:
            self.conn.execute("PRAGMA synchronous=NORMAL")
        try:
            try:
                self.conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                if disk_full(exc, self.path):
                    raise full_error(self.path, exc) from None
                raise StoreError(f"store {self.path} is busy or unwritable ({exc}); try again") \
                    from None
            before = self.wal.size()
            try:
                yield self.conn
                self.conn.execute("COMMIT")
                self.wal.added(before)
            except BaseException as exc:
                if self.conn.in_transaction:  # SQLite may have rolled back (full disk, I/O)
                    with contextlib.suppress(sqlite3.Error):  # the first error says more
                        self.conn.execute("ROLLBACK")
                if isinstance(exc, sqlite3.Error) and disk_full(exc, self.path):
                    raise full_error(self.path, exc) from None  # at a write, or at COMMIT
                raise
        finally:
            if not durable:
                self.conn.execute("PRAGMA synchronous=FULL")

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        """One read transaction: every read inside sees the store as it was at the first.

        A pull's files then match the generations it announced, whatever commits meanwhile.
        """
        self.conn.execute("BEGIN")
        try:
            yield
        finally:
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")  # nothing to keep: it only read

    def schema_version(self) -> int:
        """The schema version recorded in the file."""
        return self.conn.execute("PRAGMA user_version").fetchone()[0]

    def put_blobs(self, rows: Sequence[tuple[str, int, bytes]]) -> list[str]:
        """Store (sha256, size, text in UTF-8) bodies ahead of the namespace that lists them.

        Every body of `rows` is claimed for this session in the same commit (those stored now
        as one run of rowids, schema 4), so no other session's clean-up deletes it; `finish`
        releases the claims. Returns the sha256s stored now.
        """
        from sharedmem.server import blob_lifecycle
        with self.transaction(durable=False) as conn:
            new = set(self.missing(row[0] for row in rows))  # inside: none goes meanwhile
            claimed = [row[0] for row in rows if row[0] not in new]
            session, now = self.session, int(time.time())
            if new:
                (before,) = conn.execute("SELECT coalesce(max(rowid), 0) FROM blobs").fetchone()
                stored = conn.executemany(
                    "INSERT OR IGNORE INTO blobs VALUES (?,?,CAST(? AS TEXT))",
                    [row for row in rows if row[0] in new]).rowcount
                (after,) = conn.execute("SELECT max(rowid) FROM blobs").fetchone()
                if after - before == stored == len(new):
                    session = blob_lifecycle.claim_run(conn, session, before + 1, after, now)
                else:
                    claimed = [row[0] for row in rows]
            if claimed or session is None:
                session = blob_lifecycle.claim(conn, session, claimed, now, present=True)
        self._claimed_under(session)
        return sorted(new)

    def need(self, shas: Iterable[str], namespace: tuple[str, str] | None = None) -> list[str]:
        """The bodies a manifest lists that the store lacks: the server's `need`.

        Those it holds that no file uses are claimed for this session first (one collected
        meanwhile is needed after all). A namespace sent again whole is read in one pass
        (`NEED_SCAN_RATIO`) rather than a look-up a body.
        """
        wanted = sorted(set(shas))
        have: set[str] = set()
        loose: list[str] = []
        lookup = wanted
        if namespace is not None and wanted:
            row = self.conn.execute("SELECT id, file_count FROM namespaces WHERE machine=? AND "
                                    "source=?", namespace).fetchone()
            if row is not None and row[1] <= NEED_SCAN_RATIO * len(wanted):
                used = {sha for (sha,) in self.conn.execute(
                    "SELECT sha256 FROM files WHERE namespace_id=?", (row[0],))}
                have = used.intersection(wanted)
                lookup = [sha for sha in wanted if sha not in have]
        for sha, used in rows_in(
                self.conn, "SELECT sha256, EXISTS (SELECT 1 FROM files f WHERE f.sha256 = "
                "b.sha256) FROM blobs b WHERE sha256 IN ({})", lookup):
            have.add(sha)
            if not used:
                loose.append(sha)
        if loose:
            from sharedmem.server import blob_lifecycle
            with self.transaction(durable=False) as conn:
                session = blob_lifecycle.claim(conn, self.session, loose, int(time.time()))
                have.difference_update(sha for sha in loose if conn.execute(
                    "SELECT 1 FROM blobs WHERE sha256=?", (sha,)).fetchone() is None)
            self._claimed_under(session)
        return [sha for sha in wanted if sha not in have]

    def _claimed_under(self, session: int) -> None:
        if self.session is not None and session != self.session:
            self.claims_whole = False
        self.session = session

    def gone(self, shas: Iterable[str]) -> set[str]:
        """Which of these bodies, stored by this session as they came (`put_blobs`), are gone.

        None, without a look-up each, while the session's claims stand (its row is there, and
        every claim was made under it): nothing collects a claimed body. Otherwise (another
        process took the session for dead) each is looked up.
        """
        if (self.session is not None and self.claims_whole and self.conn.execute(
                "SELECT 1 FROM sessions WHERE id=?", (self.session,)).fetchone() is not None):
            return set()
        return set(self.missing(shas))

    def finish(self) -> Collected | None:
        """At a session's end: release its claims, and collect what has come due.

        Cheap when there is nothing to do, the usual case: a read of three small tables, and
        no write. Otherwise one commit releases this session and any that were killed (their
        process is gone), deletes the bodies nothing keeps and compacts old tombstones.
        """
        return self.collect(own=True, when_due=True)

    def collect(self, *, own: bool = False, when_due: bool = False, strays: bool = False,
                now: int | None = None) -> Collected | None:
        """Release ended sessions (and this one, with `own`), delete unkept bodies past grace.

        With `when_due`, nothing is written (and None returned) unless a session ended or
        something's time ran out. With `strays`, bodies no file uses that no table marks are
        collected too (a full scan: `doctor --store --repair`). `now` is for tests.
        """
        from sharedmem.server import blob_lifecycle
        now = int(time.time()) if now is None else now
        mine = self.session if own else None
        ended = blob_lifecycle.ended_sessions(self.conn, now, mine)
        if when_due and not ended and not blob_lifecycle.due(self.conn, now):
            return None
        with self.transaction(durable=False) as conn:
            done = blob_lifecycle.collect(conn, now, ended, strays=strays)
        if own:
            self.session = None
        return done

    def missing(self, shas: Iterable[str]) -> list[str]:
        """Which of these content addresses the store has no body for."""
        wanted = sorted(set(shas))
        have = {r[0] for r in rows_in(self.conn, "SELECT sha256 FROM blobs WHERE sha256 IN ({})",
                                      wanted)}
        return [s for s in wanted if s not in have]

    def namespace_digest(self, machine: str, source: str) -> str | None:
        """The digest of a namespace as stored, or None when it does not exist."""
        row = self.conn.execute("SELECT digest FROM namespaces WHERE machine=? AND source=?",
                                (machine, source)).fetchone()
        return row[0] if row else None

    def touch(self, machine: str, source: str) -> int | None:
        """Record an unchanged sync of a namespace; returns its generation.

        Only a time is written, so it is not fsynced (see `transaction`).
        """
        with self.transaction(durable=False) as conn:
            conn.execute("UPDATE namespaces SET synced_at=? WHERE machine=? AND source=?",
                         (utc_now(), machine, source))
            row = conn.execute("SELECT generation FROM namespaces WHERE machine=? AND source=?",
                               (machine, source)).fetchone()
        return row[0] if row else None

    def append_note(self, machine: str, filename: str, text: str,
                    note_id: str | None = None) -> tuple[str, bool]:
        """Append one entry to a note file, within its bounds (note_log); (path, stored now)."""
        body, note_id = note_log.prepare(machine, filename, text, note_id)
        with self.transaction() as conn:
            return note_log.append(conn, machine, filename, body, note_id)

    def note_generation(self) -> int:
        """The sequence number of the newest note, which backups compare (0 for none)."""
        return note_log.newest_seq(self.conn)

    def _note_files(self, seq: int = 0, *, encoded: bool = False
                    ) -> Iterator[tuple[str, str, Any]]:
        """Note files with an entry past sequence number `seq` (all for 0), one at a time."""
        for path, sha, text in note_log.files_since(self.conn, seq):
            yield path, sha, text.encode("utf-8") if encoded else text

    def namespaces(self) -> NamespaceList:
        """Every namespace with its counts, and the notes folder as one more."""
        rows = self.conn.execute(
            "SELECT machine, source, kind, generation, created_generation, synced_at, "
            "file_count, byte_count, digest FROM namespaces ORDER BY machine, source").fetchall()
        notes = self.conn.execute(
            "SELECT count(DISTINCT filename), coalesce(max(seq), 0), max(created_at), (SELECT "
            "CAST(value AS INTEGER) FROM meta WHERE key='notes_epoch') FROM notes").fetchone()
        start = note_log.base(notes[3])
        return NamespaceList(
            [Namespace(f"{MACHINES_DIR}/{r[0]}/{r[1]}", *r) for r in rows],
            Namespace(NOTES_DIR, None, "ad_hoc", "notes", note_log.generation(notes[1], start),
                      start, notes[2], notes[0], 0, ""))

    def export(self, *, encoded: bool = False) -> Iterator[tuple[str, str, Any]]:
        """Every published file as (path, sha256, text), namespaces first, then notes.

        With `encoded` each text is its UTF-8 bytes, as SQLite holds it (what a session sends).
        """
        for path, sha, text, _ in self.changes({}, encoded=encoded):
            yield path, sha, text
        yield from self._note_files(encoded=encoded)

    def manifest(self) -> dict[str, str]:
        """Published path -> sha256, without reading bodies of namespace files."""
        out = {f"{MACHINES_DIR}/{m}/{s}/{p}": sha for m, s, p, sha in self.conn.execute(
            "SELECT n.machine, n.source, f.path, f.sha256 FROM files f JOIN namespaces n "
            "ON n.id = f.namespace_id")}
        out.update({p: s for p, s, _ in self._note_files()})
        return out

    def changes(self, known: Mapping[str, int],
                namespaces: NamespaceList | None = None,
                have: Container[str] = frozenset(), compacted: int = 0, *,
                encoded: bool = False) -> Iterator[tuple[str, str, Any, str]]:
        """Files of machine namespaces changed since the client's generations: (path, sha, text, ns).

        Row by row from one query a namespace, so a pull of the whole store never holds more
        than the file it is at. The text is None for a sha256 in `have` (the client holds that
        body); with `encoded` it is the UTF-8 bytes SQLite holds, not decoded into a string.
        """
        body = "CAST(b.body AS BLOB)" if encoded else "b.body"
        query = (f"SELECT f.path, f.sha256, {body} FROM files f JOIN namespaces n ON "
                 "n.id=f.namespace_id JOIN blobs b ON b.sha256=f.sha256 WHERE n.machine=? AND "
                 "n.source=? AND f.generation > ? ORDER BY f.path")
        for ns in (namespaces or self.namespaces()).machines:
            since = _since(ns, known, compacted)
            if since is None:
                continue
            key = ns.key
            # A body the client has is read all the same: one query beats one per file, and
            # the client has few of those it is sent (its own files are `skipped`).
            for path, sha, text in self.conn.execute(query, (ns.machine, ns.source, since)):
                yield f"{key}/{path}", sha, None if sha in have else text, key

    def pull(self, known: Mapping[str, int], have: Container[str] = frozenset(), *,
             encoded: bool = False) -> tuple[NamespaceList, set[str], Iterator[tuple[str, str, Any]],
                                             list[str]]:
        """What a client with these generations lacks: (namespaces, full keys, upserts, removals).

        The upserts come one at a time, as `changes` reads them (in `reading`, one snapshot).
        An upsert's text is None when its sha256 is in `have` (the client holds the body); with
        `encoded` it is in UTF-8 bytes.

        A namespace is sent whole ("full") when the client's generation predates its creation
        (it was forgotten and re-created, or the store restored: `restart_generations`) or the
        tombstones compacted since (blob_lifecycle.py), or is from the future. So are the notes,
        when the client's generation is not one this store's notes have had (`note_log.since`).
        """
        namespaces = self.namespaces()
        full: set[str] = set()
        removals: list[str] = []
        compacted = 0
        if any(known.get(ns.key, 0) != ns.generation for ns in namespaces.machines):
            row = self.conn.execute("SELECT CAST(value AS INTEGER) FROM meta "
                                    "WHERE key='tombstones_compacted'").fetchone()
            compacted = row[0] if row else 0
        for ns in namespaces.machines:
            since = _since(ns, known, compacted)
            if since == 0:
                full.add(ns.key)
            elif since is not None:
                removals.extend(f"{ns.key}/{r[0]}" for r in self.conn.execute(
                    "SELECT t.path FROM tombstones t JOIN namespaces n ON n.id=t.namespace_id "
                    "WHERE n.machine=? AND n.source=? AND t.generation > ?",
                    (ns.machine, ns.source, since)))
        notes = namespaces.notes
        assert notes is not None  # a store always lists its notes
        known_notes = known.get(NOTES_DIR, 0)
        seq = None
        if known_notes != notes.generation:
            seq = note_log.since(known_notes, notes.generation, notes.created_generation)
            if seq is None:  # not a generation of this store's notes: all of them, whole
                full.add(NOTES_DIR)
                seq = 0

        def upserts() -> Iterator[tuple[str, str, Any]]:
            for path, sha, body, _ in self.changes(known, namespaces, have, compacted,
                                                   encoded=encoded):
                yield path, sha, body
            if seq is not None:
                yield from self._note_files(seq, encoded=encoded)

        return namespaces, full, upserts(), removals

    def forget(self, machine: str, source: str | None = None, reason: str = "") -> int:
        """Remove a machine's namespaces (all, or one source) in one transaction; notes stay.

        Their files' previous versions go with them (`versions` cascades). Their bodies go at
        once, with every other body nothing keeps, except those a live session claims (it is
        about to commit them).
        """
        from sharedmem.server import blob_lifecycle
        check_machine_name(machine)
        with self.transaction() as conn:
            where, args = "machine=?", [machine]
            if source is not None:
                where, args = where + " AND source=?", args + [source]
            count = conn.execute(f"SELECT coalesce(sum(file_count), 0), count(*) FROM namespaces "
                                 f"WHERE {where}", args).fetchone()
            if count[1] == 0:
                raise StoreError(f"store {self.path} holds nothing for machine {machine!r}"
                                 + (f" source {source!r}" if source else "")
                                 + ": check the name with `status` or `doctor --store`")
            conn.execute(f"DELETE FROM namespaces WHERE {where}", args)  # and their versions
            now = int(time.time())  # not before the delete: its triggers marked bodies unused
            conn.execute("INSERT INTO forgotten(machine, source, files, forgotten_at, reason) "
                         "VALUES (?,?,?,?,?)", (machine, source, count[0], utc_now(), reason))
            blob_lifecycle.collect(conn, now, blob_lifecycle.ended_sessions(conn, now, None),
                                   grace=0, strays=True)
        return int(count[0])

    def verify(self) -> list[str]:
        """Problems found by `integrity_check`, foreign keys and the note chain (empty = sound).

        Text is decoded leniently meanwhile: in a damaged file a note (or a key that
        integrity_check quotes) may not be UTF-8, which then breaks the chain, not the check.
        """
        factory = self.conn.text_factory
        self.conn.text_factory = _lenient
        try:
            problems = [r[0] for r in self.conn.execute("PRAGMA integrity_check")
                        if r[0] != "ok"]
            problems += [f"foreign key broken in {r[0]} row {r[1]}"
                         for r in self.conn.execute("PRAGMA foreign_key_check")]
            return problems + note_log.chain_problems(self.conn)
        finally:
            self.conn.text_factory = factory

    def counts(self) -> dict[str, int]:
        """Sizes for reports and backup manifests; previous versions from schema 3 on.

        An archive of an older schema is counted as its manifest listed it, without them.
        """
        row = self.conn.execute(
            "SELECT (SELECT count(*) FROM namespaces), (SELECT count(*) FROM files), "
            "(SELECT count(*) FROM blobs), (SELECT count(*) FROM notes)").fetchone()
        out = {"namespaces": row[0], "files": row[1], "blobs": row[2], "notes": row[3]}
        if self.schema_version() >= 3:
            out["versions"] = self.conn.execute("SELECT count(*) FROM versions").fetchone()[0]
        return out

    # --- file history (schema 3) -------------------------------------------------------------

    def history(self, path: str) -> dict[str, Any]:
        """The versions of one published file the store holds: oldest first, the current last.

        Each version is numbered by the generation that wrote it (stable while older ones are
        pruned). Raises NotFound when there is none: no such file, and none replaced within
        the retention; a path or name that breaks the rules raises their error.
        """
        ns_id, inner = self._namespace_of(path)
        versions = [_version_row(*row) for row in self.conn.execute(
            "SELECT generation, sha256, size, replaced_generation, replaced_at FROM versions "
            "WHERE namespace_id=? AND path=? ORDER BY generation", (ns_id, inner))]
        current = self.conn.execute("SELECT generation, sha256, size FROM files "
                                    "WHERE namespace_id=? AND path=?", (ns_id, inner)).fetchone()
        if current is not None:
            versions.append(_version_row(*current, None, None))
        if not versions:
            raise NotFound(f"store {self.path} holds no file {path!r} and no version of it "
                           f"replaced in the last {self.history_days()} days: check the path "
                           "with `shared_memory.py list`")
        return {"path": path, "retention_days": self.history_days(), "versions": versions}

    def version(self, path: str, number: int) -> dict[str, Any]:
        """One version of a published file with its text (`show PATH@VERSION`)."""
        ns_id, inner = self._namespace_of(path)
        row = None if not 0 <= number < 2**63 else self.conn.execute(
            "SELECT v.generation, v.sha256, v.size, v.replaced_generation, v.replaced_at, b.body "
            "FROM versions v JOIN blobs b ON b.sha256 = v.sha256 WHERE v.namespace_id=? AND "
            "v.path=? AND v.generation=? UNION ALL SELECT f.generation, f.sha256, f.size, NULL, "
            "NULL, b.body FROM files f JOIN blobs b ON b.sha256 = f.sha256 WHERE "
            "f.namespace_id=? AND f.path=? AND f.generation=?",
            (ns_id, inner, number) * 2).fetchone()
        if row is None:
            raise NotFound(f"store {self.path} holds no version {number} of {path!r}: "
                           f"`shared_memory.py history {path}` lists the versions it keeps")
        return {**_version_row(*row[:5]), "path": path, "text": row[5]}

    def history_days(self) -> int:
        """How many days previous versions of files are kept (0: none are recorded)."""
        from sharedmem.server import blob_lifecycle
        return blob_lifecycle.history_days(self.conn)

    def set_history_days(self, days: int) -> int:
        """Keep previous versions `days` days (0: record none); returns how many older ones went.

        Their bodies are collected after the grace, as any body no file uses any more.
        """
        from sharedmem.server import blob_lifecycle
        if type(days) is not int or not 0 <= days <= MAX_HISTORY_DAYS:
            raise StoreError(f"history retention {days!r} is not a whole number of days from 0 "
                             f"to {MAX_HISTORY_DAYS}: e.g. --retention-days 30 (0 keeps none)")
        with self.transaction() as conn:
            conn.execute("INSERT OR REPLACE INTO meta VALUES ('history_days', ?)", (str(days),))
            return blob_lifecycle.prune(conn, int(time.time()), days)

    def history_summary(self) -> dict[str, Any]:
        """The retention and what file history holds: versions, files, bodies only it keeps."""
        versions, paths, oldest = self.conn.execute(
            "SELECT count(*), count(DISTINCT namespace_id || '/' || path), min(replaced_at) "
            "FROM versions").fetchone()
        only = self.conn.execute(
            "SELECT count(*), coalesce(sum(size), 0) FROM blobs WHERE EXISTS (SELECT 1 FROM "
            "versions v WHERE v.sha256 = blobs.sha256) AND NOT EXISTS (SELECT 1 FROM files f "
            "WHERE f.sha256 = blobs.sha256)").fetchone()
        return {"store": str(self.path), "retention_days": self.history_days(),
                "versions": versions, "files": paths,
                "oldest_replaced_at": None if oldest is None else _utc(oldest),
                "bodies": only[0], "bytes": only[1]}

    def _namespace_of(self, path: str) -> tuple[int, str]:
        """(namespace id, path inside it) of a published file path, every rule checked first."""
        machine, source, inner = split_published(path)
        row = self.conn.execute("SELECT id FROM namespaces WHERE machine=? AND source=?",
                                (machine, source)).fetchone()
        if row is None:
            raise NotFound(f"store {self.path} holds nothing of machine {machine!r} source "
                           f"{source!r} (forgotten, or never published): check the path with "
                           "`shared_memory.py list`")
        return row[0], inner


def _folder_made(path: Path, create: bool) -> Path:
    """`path`, its folder made when `create`; without it, the store must be there already."""
    if not create and not path.is_file():
        raise StoreError(f"store {path} does not exist: create it with install_server.py "
                         "or pass the right --store")
    try:
        if create:
            path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        if disk_full(exc, path.parent):
            raise full_error(path.parent, exc, f"store {path} cannot be created") from None
        raise StoreError(f"store {path} cannot be created: its folder {path.parent} cannot be "
                         f"made ({exc.strerror}); fix the path or the folder's permissions"
                         ) from None
    return path


def _connect(path: Path | str) -> tuple[sqlite3.Connection, int]:
    """The store's connection with its settings, and the schema version the file records."""
    try:
        conn = sqlite3.connect(path, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000,
                               check_same_thread=False)
        conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        conn.execute(f"PRAGMA page_size={PAGE_SIZE}")
        conn.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
        use_wal(conn, BUSY_TIMEOUT_MS)
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA foreign_keys=ON")
        # So INSERT OR REPLACE of a file fires the trigger that marks its old body unused.
        conn.execute("PRAGMA recursive_triggers=ON")
        return conn, conn.execute("PRAGMA user_version").fetchone()[0]
    except sqlite3.OperationalError as exc:
        if disk_full(exc, path):  # the -wal and -shm beside it need room
            raise full_error(path, exc, f"store {path} cannot be opened") from None
        raise StoreError(f"store {path} cannot be opened ({exc}): check that the path is "
                         "right and that this account may read and write it and its "
                         "folder") from None
    except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:  # SQLite quoting bad bytes
        raise StoreError(f"store {path} cannot be opened as SQLite ({exc}): restore it from "
                         "a backup (see docs/OPERATIONS.md)") from None


def restart_generations(conn: sqlite3.Connection, floor: int) -> None:
    """After a restore, in its commit: every generation at `floor`, past all a client has seen.

    A restore rewinds the generations to the archive's, and the commits after it would reuse
    numbers clients already hold for other content. At `floor` (larger than any generation the
    store issued before), every namespace counts as created then, so a client's generation from
    before is below its creation and its next pull takes it whole; the notes' generations start
    past it too (`note_log.restart`). `restored_generation` tells the restore's own renumbering
    from commits made since (`backup._retire`).
    """
    conn.execute("UPDATE meta SET value=? WHERE key='generation'", (str(floor),))
    conn.execute("UPDATE namespaces SET generation=?, created_generation=?", (floor, floor))
    conn.execute("INSERT OR REPLACE INTO meta VALUES ('restored_generation', ?)", (str(floor),))
    note_log.restart(conn, floor)


def split_published(path: object) -> tuple[str, str, str]:
    """(machine, source, path inside the namespace) of a published file path, or why not.

    Note files have no history (their entries are never changed or removed): NotFound says so.
    """
    if not isinstance(path, str):
        raise PathRuleError(f"path {path!r} is not a string")
    if len(path) > _LONGEST_PUBLISHED:  # not quoted whole: it may be megabytes
        raise PathRuleError(f"path {path[:80]!r}... is longer than any published path "
                            f"({_LONGEST_PUBLISHED} characters)")
    if path.startswith(NOTES_DIR + "/"):
        raise NotFound(f"{path!r} is a note file: notes are append-only, so it has no earlier "
                       "versions; every entry is in the file itself (`shared_memory.py read`)")
    parts = path.split("/", 3)
    if len(parts) != 4 or parts[0] != MACHINES_DIR:
        raise PathRuleError(f"path {path!r} is not a published file: name it as `list` shows "
                            f"it, {MACHINES_DIR}/<machine>/<source>/<file>.md")
    for value, what in ((parts[1], "machine"), (parts[2], "source")):
        if (problem := name_problem(value, what)) is not None:
            raise NameRuleError(f"{problem} (in path {path!r})")
    return parts[1], parts[2], check_path(parts[3])


# machines/ + a machine and a source name (63 each) and their slashes + the path rule's longest
_LONGEST_PUBLISHED = len(MACHINES_DIR) + 2 * 64 + 1 + MAX_PATH_BYTES


def _version_row(generation: int, sha: str, size: int, replaced_generation: int | None,
                 replaced_at: int | None) -> dict[str, Any]:
    """One version as `history` lists it; the current file is the one never replaced."""
    return {"version": generation, "sha256": sha, "size": size,
            "replaced_generation": replaced_generation,
            "replaced_at": None if replaced_at is None else _utc(replaced_at),
            "current": replaced_at is None}


def _utc(seconds: int) -> str:
    """A time the store keeps in seconds, as the program writes times (`clock.utc_now`)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def _lenient(data: bytes) -> str:
    """SQLite text as a string even where a damaged file holds bytes that are not UTF-8."""
    return data.decode("utf-8", "replace")


def plain_path(value: object) -> bool:
    """Whether `value` is a str that pathlib would keep as it is, with no `~` to expand.

    Such a text names the same file as its Path and prints the same; `serve` then needs no
    pathlib (milliseconds of its start, with the urllib.parse it loads).
    """
    if type(value) is not str or not value or value[0] == "~" or os.sep != "/":
        return False
    parts = value.split("/")
    return "" not in parts[value[0] == "/":] and "." not in parts


def _path(value: Path | str) -> Path:
    """`value` as a Path, loading pathlib only here: the paths `plain_path` takes never come."""
    from pathlib import Path
    return Path(value)


def _since(ns: Namespace, known: Mapping[str, int], compacted: int = 0) -> int | None:
    """The generation a client's copy of a namespace is at: None when current, 0 to send it whole.

    0 also covers a generation from before the namespace was (re)created, or before the newest
    generation whose tombstones were compacted (its removals may be gone), or after its newest.
    """
    since = known.get(ns.key, 0)
    if since == ns.generation:
        return None
    if not max(ns.created_generation, compacted) <= since <= ns.generation:
        return 0
    return since
