"""The store's schema: one list of migrations, applied in order, each in its own transaction.

A store records how many it has applied in `PRAGMA user_version`. To change the schema, append a
migration here; never edit one that has shipped (tests/fixtures holds a store of each version).
"""

from __future__ import annotations

import sqlite3

MIGRATIONS: list[str] = [
    # 1: the first schema.
    """
    CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
    CREATE TABLE blobs(sha256 TEXT PRIMARY KEY, size INTEGER NOT NULL, body TEXT NOT NULL);
    CREATE TABLE namespaces(
        id INTEGER PRIMARY KEY,
        machine TEXT NOT NULL, source TEXT NOT NULL, kind TEXT NOT NULL,
        generation INTEGER NOT NULL, created_generation INTEGER NOT NULL,
        synced_at TEXT NOT NULL, file_count INTEGER NOT NULL, byte_count INTEGER NOT NULL,
        digest TEXT NOT NULL,
        UNIQUE(machine, source));
    CREATE TABLE files(
        namespace_id INTEGER NOT NULL REFERENCES namespaces(id) ON DELETE CASCADE,
        path TEXT NOT NULL, sha256 TEXT NOT NULL REFERENCES blobs(sha256),
        size INTEGER NOT NULL, mtime_ns INTEGER NOT NULL, generation INTEGER NOT NULL,
        PRIMARY KEY(namespace_id, path)) WITHOUT ROWID;
    CREATE TABLE tombstones(
        namespace_id INTEGER NOT NULL REFERENCES namespaces(id) ON DELETE CASCADE,
        path TEXT NOT NULL, generation INTEGER NOT NULL,
        PRIMARY KEY(namespace_id, path)) WITHOUT ROWID;
    CREATE TABLE notes(
        seq INTEGER PRIMARY KEY, note_id TEXT NOT NULL UNIQUE, filename TEXT NOT NULL,
        machine TEXT NOT NULL, created_at TEXT NOT NULL, body TEXT NOT NULL,
        prev_sha256 TEXT NOT NULL, sha256 TEXT NOT NULL);
    CREATE INDEX notes_by_file ON notes(filename, seq);
    CREATE TRIGGER notes_append_only_update BEFORE UPDATE ON notes
        BEGIN SELECT RAISE(ABORT, 'notes are append-only: an entry is never changed'); END;
    CREATE TRIGGER notes_append_only_delete BEFORE DELETE ON notes
        BEGIN SELECT RAISE(ABORT, 'notes are append-only: an entry is never deleted'); END;
    CREATE TRIGGER notes_append_only_replace BEFORE INSERT ON notes
        WHEN EXISTS (SELECT 1 FROM notes WHERE seq = NEW.seq OR note_id = NEW.note_id)
        BEGIN SELECT RAISE(ABORT, 'notes are append-only: an entry is never replaced'); END;
    CREATE TABLE forgotten(
        id INTEGER PRIMARY KEY, machine TEXT NOT NULL, source TEXT, files INTEGER NOT NULL,
        forgotten_at TEXT NOT NULL, reason TEXT NOT NULL);
    INSERT INTO meta VALUES ('generation', '0');
    """,
    # 2: the lifecycle of bodies and tombstones (blob_lifecycle.py). `sessions` and `claims`:
    # the `serve` processes that stored bodies ahead of the files that will use them, and those
    # bodies, so another session's clean-up leaves them alone. `unused`: bodies that may no
    # longer be used, since when (a file stopped using them, through the trigger, which
    # Store.open's recursive_triggers also fires for INSERT OR REPLACE). `tombstone_times`:
    # when each generation removed paths, so tombstones are compacted after a retention; the
    # newest compacted generation is meta's `tombstones_compacted`. The bodies no file uses
    # today (orphans of killed sessions, and old versions of files) are due at once; today's
    # tombstones count as new.
    """
    CREATE TABLE sessions(
        id INTEGER PRIMARY KEY AUTOINCREMENT, pid INTEGER NOT NULL, host TEXT NOT NULL,
        started_at INTEGER NOT NULL, seen_at INTEGER NOT NULL);
    CREATE TABLE claims(
        sha256 TEXT NOT NULL,
        session_id INTEGER NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
        PRIMARY KEY(sha256, session_id)) WITHOUT ROWID;
    CREATE INDEX claims_by_session ON claims(session_id);
    CREATE TABLE unused(sha256 TEXT PRIMARY KEY, since INTEGER NOT NULL) WITHOUT ROWID;
    CREATE INDEX unused_by_since ON unused(since);
    CREATE INDEX files_by_sha256 ON files(sha256);
    CREATE TRIGGER files_unused AFTER DELETE ON files
        BEGIN INSERT OR REPLACE INTO unused
              VALUES (OLD.sha256, CAST(strftime('%s', 'now') AS INTEGER)); END;
    CREATE TABLE tombstone_times(generation INTEGER PRIMARY KEY, at INTEGER NOT NULL);
    CREATE TRIGGER tombstones_timed AFTER INSERT ON tombstones
        BEGIN INSERT OR IGNORE INTO tombstone_times
              VALUES (NEW.generation, CAST(strftime('%s', 'now') AS INTEGER)); END;
    INSERT INTO meta VALUES ('tombstones_compacted', '0');
    INSERT INTO unused SELECT sha256, 0 FROM blobs WHERE sha256 NOT IN (SELECT sha256 FROM files);
    INSERT INTO tombstone_times SELECT DISTINCT generation, CAST(strftime('%s', 'now') AS INTEGER)
        FROM tombstones;
    """,
    # 3: file history. `versions`: each file row that went (an edit, a rename, a delete), as it
    # was: its body (by sha256, so unchanged content costs nothing: no row is replaced when
    # nothing changed, and bodies are shared), the generation it was written at (its version
    # number) and the one and the time it was replaced at. The trigger records them, so ingest
    # needs no part in it; it records nothing while meta's `history_days` is 0, nor for the
    # files of a namespace being deleted (`forget`: the namespace row is gone by then, and its
    # versions go with it). Versions past `history_days` are pruned (blob_lifecycle.py).
    """
    CREATE TABLE versions(
        namespace_id INTEGER NOT NULL REFERENCES namespaces(id) ON DELETE CASCADE,
        path TEXT NOT NULL, generation INTEGER NOT NULL,
        sha256 TEXT NOT NULL, size INTEGER NOT NULL,
        replaced_generation INTEGER NOT NULL, replaced_at INTEGER NOT NULL,
        PRIMARY KEY(namespace_id, path, generation)) WITHOUT ROWID;
    CREATE INDEX versions_by_sha256 ON versions(sha256);
    CREATE INDEX versions_by_time ON versions(replaced_at);
    CREATE TRIGGER files_history AFTER DELETE ON files
        BEGIN INSERT OR REPLACE INTO versions
              SELECT OLD.namespace_id, OLD.path, OLD.generation, OLD.sha256, OLD.size,
                     (SELECT CAST(value AS INTEGER) FROM meta WHERE key='generation'),
                     CAST(strftime('%s', 'now') AS INTEGER)
              FROM namespaces WHERE id = OLD.namespace_id AND (SELECT CAST(value AS INTEGER)
                  FROM meta WHERE key='history_days') > 0; END;
    INSERT INTO meta VALUES ('history_days', '30');
    """,
    # 4: bodies a session stored ahead, claimed as runs of rowids, not a row each. A session's
    # commit of new bodies takes consecutive rowids (it holds the write lock, and SQLite gives
    # each new row the largest rowid plus one), so one row here claims a commit's worth. A
    # `claims` row each (two random inserts in 64-character keys) cost a large first sync
    # much of its storing time. `claims` still holds
    # the bodies a session was told the store holds. A run goes with its session; while it
    # stands its bodies are kept, so the largest rowid stays at or past its end and a later
    # run starts after it: runs never overlap.
    """
    CREATE TABLE stored_ahead(
        first_rowid INTEGER PRIMARY KEY, last_rowid INTEGER NOT NULL,
        session_id INTEGER NOT NULL REFERENCES sessions(id) ON DELETE CASCADE);
    CREATE INDEX stored_ahead_by_session ON stored_ahead(session_id);
    """,
]
SCHEMA_VERSION = len(MIGRATIONS)


def statements(script: str) -> list[str]:
    """Split a migration into statements, keeping trigger bodies whole."""
    out, buf = [], ""
    for line in script.splitlines(keepends=True):
        buf += line
        if sqlite3.complete_statement(buf):
            out.append(buf.strip())
            buf = ""
    return [s for s in out if s]
