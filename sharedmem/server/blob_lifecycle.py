"""How long the store keeps what no file uses any more: bodies (blobs) and tombstones.

A body stays while something keeps it (`KEEPS`: a file, a live session's claim, a previous
version), then GRACE_SECONDS more; tombstones stay TOMBSTONE_SECONDS, previous versions meta's
`history_days`. Why, and who collects when: docs/ARCHITECTURE.md "Bodies and tombstones" and
"File history". Every function runs inside the caller's transaction (`Store.transaction`),
except the reads `ended_sessions` and `due`, which tell a session's end whether to open one.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterable, Sequence

GRACE_SECONDS = 3600  # a body no file uses any more is kept this long
SESSION_STALE_SECONDS = 24 * 3600  # a session not seen for this long is taken as dead
TOMBSTONE_SECONDS = 7 * 24 * 3600  # a removed path's tombstone is kept this long
COMPACT_EVERY_SECONDS = 24 * 3600  # tombstones and versions are pruned once this much is past
DAY = 24 * 3600
DEFAULT_HISTORY_DAYS = 30  # previous versions of files are kept this many days (meta history_days)

# What keeps a body: each line the schema version that brought its table and a condition on
# `blobs.sha256`, all in one place, so every collection, a session's, `forget`'s and `doctor
# --repair`'s, honours each: a file uses it, a live session claims it, a retained previous
# version of a file uses it. (`doctor --store` reads a store not yet migrated: `unkept(schema)`.)
KEEPS = (
    (1, "EXISTS (SELECT 1 FROM files WHERE files.sha256 = blobs.sha256)"),
    (2, "EXISTS (SELECT 1 FROM claims WHERE claims.sha256 = blobs.sha256)"),
    (3, "EXISTS (SELECT 1 FROM versions WHERE versions.sha256 = blobs.sha256)"),
    # The run that may hold a rowid is the one that starts nearest below it (runs never overlap).
    (4, "EXISTS (SELECT 1 FROM (SELECT last_rowid FROM stored_ahead WHERE first_rowid <= "
        "blobs.rowid ORDER BY first_rowid DESC LIMIT 1) WHERE last_rowid >= blobs.rowid)"),
)


def unkept(schema: int | None = None) -> str:
    """The condition on `blobs.sha256` that nothing keeps a body, in a store of this schema."""
    return " AND ".join(f"NOT {condition}" for since, condition in KEEPS
                        if schema is None or since <= schema)


UNKEPT = unkept()


class Collected:
    """What one collection released and deleted, for `doctor --repair` and the tests."""

    def __init__(self) -> None:
        self.sessions = 0  # sessions released: the one ending, and those that were killed
        self.bodies = 0
        self.bytes = 0
        self.tombstones = 0
        self.versions = 0  # previous versions of files past their retention

    def to_json(self) -> dict[str, int]:
        """The counts, as `doctor --json` prints them."""
        return {"sessions": self.sessions, "bodies": self.bodies, "bytes": self.bytes,
                "tombstones": self.tombstones, "versions": self.versions}


def host() -> str:
    """This machine's name, recorded with each session: only a local pid can be checked."""
    return os.uname().nodename if hasattr(os, "uname") else os.environ.get("COMPUTERNAME", "")


def claim(conn: sqlite3.Connection, session: int | None, shas: Iterable[str], now: int, *,
          present: bool = False) -> int:
    """Claim these bodies, those the store holds, for a session; returns the session's id.

    The session is registered (a row for this process) at its first claim, and again if its
    row is gone (another process took it for dead after SESSION_STALE_SECONDS unseen). With
    `present` the caller knows the store holds every one (it stored them in this transaction):
    they are claimed without a look-up each, a large part of what storing a first sync's bodies
    would cost.
    """
    session = _seen(conn, session, now)
    if present:
        conn.executemany("INSERT OR IGNORE INTO claims VALUES (?,?)",
                         [(sha, session) for sha in shas])
    else:
        conn.executemany("INSERT OR IGNORE INTO claims SELECT sha256, ? FROM blobs WHERE sha256=?",
                         [(session, sha) for sha in shas])
    return session


def claim_run(conn: sqlite3.Connection, session: int | None, first: int, last: int,
              now: int) -> int:
    """Claim the bodies with rowids `first` to `last`, all stored by this transaction.

    One row for a commit's worth of new bodies (schema 4), where `claim` writes one each.
    Returns the session's id, registered as `claim` does.
    """
    session = _seen(conn, session, now)
    conn.execute("INSERT INTO stored_ahead VALUES (?,?,?)", (first, last, session))
    return session


def _seen(conn: sqlite3.Connection, session: int | None, now: int) -> int:
    """The session's id after recording it seen now; a new row if it has none (or it went)."""
    if session is None or not conn.execute("UPDATE sessions SET seen_at=? WHERE id=?",
                                           (now, session)).rowcount:
        session = int(conn.execute(
            "INSERT INTO sessions(pid, host, started_at, seen_at) VALUES (?,?,?,?)",
            (os.getpid(), host(), now, now)).lastrowid or 0)
    return session


def alive(pid: int, where: str, seen_at: int, now: int) -> bool:
    """Whether a session's process may still run: its pid exists here, or it is elsewhere.

    Past SESSION_STALE_SECONDS it is taken as dead even if the pid exists (it may be another
    process's by now). On Windows a pid is not probed: `os.kill` there would stop the process.
    """
    if seen_at < now - SESSION_STALE_SECONDS:
        return False
    if where != host() or os.name == "nt":
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another account's process: it exists
        return True
    return True


def ended_sessions(conn: sqlite3.Connection, now: int, own: int | None) -> list[int]:
    """The sessions whose claims can go: `own` (ending now) and those whose process is gone."""
    return [row[0] for row in conn.execute("SELECT id, pid, host, seen_at FROM sessions")
            if row[0] == own or not alive(row[1], row[2], row[3], now)]


def due(conn: sqlite3.Connection, now: int) -> bool:
    """Whether a body's grace, the tombstones' or the versions' retention has run out.

    One read of three indexes and a meta key; a day past a retention, so about once a day.
    """
    row = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM unused WHERE since <= ?), coalesce((SELECT at FROM "
        "tombstone_times ORDER BY generation LIMIT 1) <= ?, 0), coalesce((SELECT replaced_at "
        "FROM versions ORDER BY replaced_at LIMIT 1) <= ? - ? * (SELECT CAST(value AS INTEGER) "
        "FROM meta WHERE key='history_days'), 0)",
        (now - GRACE_SECONDS, now - TOMBSTONE_SECONDS - COMPACT_EVERY_SECONDS,
         now - COMPACT_EVERY_SECONDS, DAY)).fetchone()
    return bool(row[0] or row[1] or row[2])


def collect(conn: sqlite3.Connection, now: int, ended: Sequence[int], *,
            grace: int = GRACE_SECONDS, strays: bool = False) -> Collected:
    """Release ended sessions, prune old versions, delete unkept bodies, compact tombstones.

    A released claim's body may go at once: a session told the store held it claimed it too.
    With `strays`, bodies no file uses that are not yet marked unused (written by a version
    before these tables, or by a connection without the triggers) are collected too: a full
    scan, for `doctor --repair` and `forget`.
    """
    done = Collected()
    if ended:
        ids = [(session,) for session in ended]
        conn.executemany("INSERT OR IGNORE INTO unused SELECT sha256, 0 FROM claims c WHERE "
                         "session_id=? AND NOT EXISTS (SELECT 1 FROM files f "
                         "WHERE f.sha256 = c.sha256)", ids)  # what a commit used is kept
        conn.executemany("INSERT OR IGNORE INTO unused SELECT b.sha256, 0 FROM stored_ahead s "
                         "JOIN blobs b ON b.rowid BETWEEN s.first_rowid AND s.last_rowid "
                         "WHERE s.session_id=? AND NOT EXISTS (SELECT 1 FROM files f "
                         "WHERE f.sha256 = b.sha256)", ids)
        conn.executemany("DELETE FROM sessions WHERE id=?", ids)  # and its claims and runs
        done.sessions = len(ids)
    done.versions = prune(conn, now)
    if strays:
        conn.execute(f"INSERT OR IGNORE INTO unused SELECT sha256, 0 FROM blobs WHERE {UNKEPT}")
    cutoff = now - grace
    gone = f"sha256 IN (SELECT sha256 FROM unused WHERE since <= ?) AND {UNKEPT}"
    done.bodies, done.bytes = conn.execute(
        f"SELECT count(*), coalesce(sum(size), 0) FROM blobs WHERE {gone}", (cutoff,)).fetchone()
    if done.bodies:
        conn.execute(f"DELETE FROM blobs WHERE {gone}", (cutoff,))
    conn.execute("DELETE FROM unused WHERE since <= ?", (cutoff,))
    done.tombstones = compact(conn, now)
    return done


def census(conn: sqlite3.Connection, schema: int, now: int) -> dict[str, int]:
    """What keeps the bodies no file uses, read only (`doctor --store`), in a store of `schema`.

    unused and unused_bytes: bodies no file uses; claimed: those a live session claims;
    waiting: those marked unused (kept for the grace, then collected); orphans and
    orphan_bytes: those nothing keeps and nothing marks, which only a full scan collects
    (`collect(strays=True)`); killed_sessions: sessions whose process is gone; tombstones.
    A store from before these tables (schema 1) has only orphans.
    """
    unused = "NOT EXISTS (SELECT 1 FROM files WHERE files.sha256 = blobs.sha256)"
    total = conn.execute(f"SELECT count(*), coalesce(sum(size), 0) FROM blobs WHERE {unused}"
                         ).fetchone()
    out = {"unused": total[0], "unused_bytes": total[1], "claimed": 0, "waiting": 0,
           "orphans": total[0], "orphan_bytes": total[1], "killed_sessions": 0,
           "tombstones": conn.execute("SELECT count(*) FROM tombstones").fetchone()[0]}
    if schema < 2:
        return out
    sessions = conn.execute("SELECT id, pid, host, seen_at FROM sessions").fetchall()
    live = [r[0] for r in sessions if alive(r[1], r[2], r[3], now)]
    out["killed_sessions"] = len(sessions) - len(live)
    if live:
        marks = ",".join("?" * len(live))
        claimed = (f"EXISTS (SELECT 1 FROM claims c WHERE c.sha256 = blobs.sha256 AND "
                   f"c.session_id IN ({marks}))")
        if schema >= 4:  # bodies stored ahead, claimed as runs of rowids
            claimed += (f" OR EXISTS (SELECT 1 FROM stored_ahead s WHERE s.session_id IN "
                        f"({marks}) AND blobs.rowid BETWEEN s.first_rowid AND s.last_rowid)")
        out["claimed"] = conn.execute(f"SELECT count(*) FROM blobs WHERE {unused} AND "
                                      f"({claimed})", live * (2 if schema >= 4 else 1)
                                      ).fetchone()[0]
    out["waiting"] = conn.execute(f"SELECT count(*) FROM blobs WHERE {unused} AND sha256 IN "
                                  "(SELECT sha256 FROM unused)").fetchone()[0]
    out["orphans"], out["orphan_bytes"] = conn.execute(
        f"SELECT count(*), coalesce(sum(size), 0) FROM blobs WHERE {unkept(schema)} AND sha256 "
        "NOT IN (SELECT sha256 FROM unused)").fetchone()
    return out


def history_days(conn: sqlite3.Connection) -> int:
    """How many days previous versions of files are kept: meta's `history_days`."""
    row = conn.execute("SELECT CAST(value AS INTEGER) FROM meta WHERE key='history_days'"
                       ).fetchone()
    return DEFAULT_HISTORY_DAYS if row is None else max(0, int(row[0]))


def prune(conn: sqlite3.Connection, now: int, days: int | None = None) -> int:
    """Delete the versions replaced over `days` (default: the store's setting) ago; how many.

    Their bodies count as unused from the moment each version expired: past the grace by the
    time a daily prune comes, they go in the same collection unless something else keeps them
    (a live session that was told the store holds one claimed it).
    """
    keep = DAY * (history_days(conn) if days is None else days)
    cutoff = now - keep
    if conn.execute("SELECT 1 FROM versions WHERE replaced_at <= ? LIMIT 1",
                    (cutoff,)).fetchone() is None:
        return 0
    conn.execute("INSERT INTO unused SELECT sha256, max(replaced_at) + ? FROM versions "
                 "WHERE replaced_at <= ? GROUP BY sha256 ON CONFLICT(sha256) DO UPDATE "
                 "SET since = max(since, excluded.since)", (keep, cutoff))
    return conn.execute("DELETE FROM versions WHERE replaced_at <= ?", (cutoff,)).rowcount


def compact(conn: sqlite3.Connection, now: int) -> int:
    """Delete tombstones older than the retention; returns how many."""
    (newest,) = conn.execute("SELECT max(generation) FROM tombstone_times WHERE at <= ?",
                             (now - TOMBSTONE_SECONDS,)).fetchone()
    if newest is None:
        return 0
    count = conn.execute("DELETE FROM tombstones WHERE generation <= ?", (newest,)).rowcount
    conn.execute("DELETE FROM tombstone_times WHERE generation <= ?", (newest,))
    conn.execute("UPDATE meta SET value=CAST(max(CAST(value AS INTEGER), ?) AS TEXT) "
                 "WHERE key='tombstones_compacted'", (newest,))
    return count

