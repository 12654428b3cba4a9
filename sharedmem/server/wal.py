"""The store's write-ahead log: switched on, copied at a session's end, kept bounded.

Why and how it is bounded while sessions overlap without end: docs/ARCHITECTURE.md "The store".
"""

from __future__ import annotations

import os
import sqlite3
import time

FLOOR_BYTES = 4 << 20  # a log smaller than this is never copied early, nor kept larger emptied
OWN_TIMES = 4  # the log may hold this many times what the session wrote before it is copied
WAIT_MS = 1000
HARD_TIMES = 4
HARD_WAIT_MS = 10_000


def use_wal(conn: sqlite3.Connection, busy_ms: int) -> None:
    """Switch to WAL, retrying while another process creates the same store: 'locked' at once."""
    deadline = time.monotonic() + busy_ms / 1000
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


class Wal:
    """One connection's view of the log: whether it bounds it, and what its commits added."""

    def __init__(self, conn: sqlite3.Connection, store: object, busy_ms: int) -> None:
        self.conn, self.path, self.busy_ms = conn, f"{store}-wal", busy_ms
        self.own_checkpoints = False  # `checkpoint_at_close`: the log is this session's to bound
        self.written = 0  # bytes this connection's commits added to the log
        self.failed = 0  # the log's size when copying it last could not finish

    def checkpoint_at_close(self) -> None:
        """Copy the log into the database when the session ends, not inside each commit."""
        self.conn.execute("PRAGMA wal_autocheckpoint=0")
        self.conn.execute(f"PRAGMA journal_size_limit={FLOOR_BYTES}")
        self.own_checkpoints = True

    def size(self) -> int:
        """The log's size in bytes while this session bounds it (else 0)."""
        if not self.own_checkpoints:
            return 0
        try:
            return os.stat(self.path).st_size
        except OSError:
            return 0

    def added(self, before: int) -> None:
        """Count what a commit added to the log, as near as the file tells: it was `before`."""
        if self.own_checkpoints:
            self.written += max(0, self.size() - before)

    def bound(self) -> bool:
        """Whether the log held over OWN_TIMES this session's writes, and was copied and emptied.

        Readers of older snapshots are waited for WAIT_MS (HARD_WAIT_MS past HARD_TIMES the
        bound); when they hold it, it waits again only once the log grew by FLOOR_BYTES more.
        """
        size = self.size()
        bound = max(FLOOR_BYTES, OWN_TIMES * self.written)
        if size <= bound:
            return False
        if size <= self.failed + FLOOR_BYTES:
            self.conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
            return False
        wait = WAIT_MS if size <= HARD_TIMES * bound else HARD_WAIT_MS
        self.conn.execute(f"PRAGMA busy_timeout={wait}")
        try:  # past the wait it copies what it can without waiting, as a passive one does
            busy = self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
        except sqlite3.OperationalError:  # locked past the wait, or no room: left as it is
            busy = 1
        finally:
            self.conn.execute(f"PRAGMA busy_timeout={self.busy_ms}")
        self.failed = size if busy else 0
        return not busy
