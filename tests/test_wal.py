"""Tests for sharedmem.server.wal on real SQLite files: the log copied at a session's end, and bounded."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from pathlib import Path

from conftest import body, files

from sharedmem.server import wal
from sharedmem.server.ingest import ingest
from sharedmem.server.store import Store


def test_close_copies_the_wal_into_the_database_even_while_another_session_reads(
        tmp_path: Path) -> None:
    # SQLite's own checkpoint on close is skipped while another connection is open, and when it
    # runs it holds the database; the passive one of Store.close does neither.
    path = tmp_path / "store.sqlite3"
    st = Store.open(path)
    st.wal.checkpoint_at_close()
    reader = sqlite3.connect(path)
    reader.execute("SELECT count(*) FROM blobs").fetchone()
    ingest(st, "m1", "notes", "markdown", files({"big.md": "x" * 200_000}))
    st.close()
    assert path.stat().st_size > 200_000
    assert reader.execute("SELECT count(*) FROM files").fetchone()[0] == 1
    reader.close()


def test_the_wal_stays_bounded_while_sessions_and_pulls_overlap_without_end(
        tmp_path: Path) -> None:
    # A burst: sessions one after another, each writing its own bodies, while pulls (read
    # snapshots that come and go) never all end at once. Each session copies the log only at its
    # end, passively, which readers of older snapshots hold back: without a bound the log keeps
    # every session's pages.
    path = tmp_path / "store.sqlite3"
    Store.open(path).close()
    stop = threading.Event()

    def pulls(offset: float) -> None:
        time.sleep(offset)
        conn = sqlite3.connect(path, isolation_level=None)
        while not stop.is_set():
            conn.execute("BEGIN")
            conn.execute("SELECT count(*) FROM blobs").fetchone()
            time.sleep(0.04)
            conn.execute("ROLLBACK")
        conn.close()

    readers = [threading.Thread(target=pulls, args=(i * 0.02,)) for i in range(2)]
    for reader in readers:
        reader.start()
    largest = written = 0
    try:
        for session in range(40):
            st = Store.open(path)
            st.wal.checkpoint_at_close()
            for batch in range(2):
                st.put_blobs([body(f"{session} {batch} {i} " + "x" * 3000) for i in range(30)])
                largest = max(largest, os.stat(f"{path}-wal").st_size)
            written = max(written, st.wal.written)
            st.close()
            time.sleep(0.01)
    finally:
        stop.set()
        for reader in readers:
            reader.join()
    bound = max(wal.FLOOR_BYTES, wal.OWN_TIMES * written)
    assert 40 * written > 2 * bound  # what the sessions wrote in all would pass it
    assert largest <= bound + written, (largest, written)  # a commit past it: copied at the next
