"""The store's session slots: real OS locks on real files, held by this process or by others."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sharedmem.server.session_slots import Busy, folder, take

REPO = Path(__file__).resolve().parent.parent


def locked(path: str) -> bool:
    """Whether another open file holds the lock on `path` (fcntl only)."""
    import fcntl
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def waiters(store: Path, count: int) -> list[subprocess.Popen]:
    """`count` other processes each waiting for a run slot of `count` (up to 30 s), then exit 0.

    Returned once every wait slot is held.
    """
    started = [subprocess.Popen(
        [sys.executable, "-c", "import sys\n"
         f"sys.path.insert(0, {str(REPO)!r})\n"
         "from sharedmem.server.session_slots import take\n"
         f"take({str(store)!r}, {count}, wait=30)\n"]) for _ in range(count)]
    deadline = time.monotonic() + 30
    while not all(locked(os.path.join(folder(store), f"wait-{i}")) for i in range(count)):
        assert time.monotonic() < deadline, "the waiters never held the wait slots"
        time.sleep(0.05)
    return started


def holding(store: Path, seconds: float) -> subprocess.Popen:
    """Another process that holds the store's one slot for `seconds`, once it says so."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\n"
         f"sys.path.insert(0, {str(REPO)!r})\n"
         "from sharedmem.server.session_slots import take\n"
         f"slot = take({str(store)!r}, 1)\n"
         "print('held', flush=True)\n"
         f"time.sleep({seconds})\n"], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    return holder


def test_a_session_over_the_count_waits_then_is_turned_away(tmp_path: Path) -> None:
    store = tmp_path / "store.sqlite3"
    held = [take(store, 2), take(store, 2)]
    started = time.monotonic()
    with pytest.raises(Busy) as exc:
        take(store, 2, wait=0.3)
    assert 0.3 <= time.monotonic() - started < 5
    assert "sessions already run on store" in str(exc.value) and "none ended" in str(exc.value)
    assert "serve --limit sessions=2" in str(exc.value) and "try again" in str(exc.value)
    held[0].release()
    held.append(take(store, 2, wait=0))  # the slot given back
    assert {"0", "1"} <= set(os.listdir(folder(store)))
    for slot in held:
        slot.release()


@pytest.mark.skipif(sys.platform == "win32", reason="flock")
def test_as_many_wait_as_run_and_the_rest_are_turned_away_at_once(tmp_path: Path) -> None:
    # Each waiting session holds its interpreter: the waiting ones are bounded too, so the
    # server's memory is, however many clients come at once.
    store = tmp_path / "store.sqlite3"
    running = [take(store, 2) for _ in range(2)]
    waiting = waiters(store, 2)
    started = time.monotonic()
    with pytest.raises(Busy, match="and 2 more already wait for one"):
        take(store, 2, wait=30)
    assert time.monotonic() - started < 5
    running[0].release()  # a waiting one takes it, and ends
    deadline = time.monotonic() + 20
    while all(w.poll() is None for w in waiting):
        assert time.monotonic() < deadline, "no waiting session took the slot given back"
        time.sleep(0.05)
    assert 0 in [w.poll() for w in waiting]  # it ended well: the other may have followed it
    running[1].release()
    assert all(w.wait(timeout=30) == 0 for w in waiting)


def test_a_waiting_session_gets_the_slot_once_one_ends(tmp_path: Path) -> None:
    store = tmp_path / "store.sqlite3"
    holder = holding(store, 0.5)
    started = time.monotonic()
    slot = take(store, 1, wait=20)  # taken once the holder's process ends
    assert time.monotonic() - started < 15
    slot.release()
    holder.wait(timeout=30)


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")
def test_a_killed_session_leaves_no_slot_taken(tmp_path: Path) -> None:
    store = tmp_path / "store.sqlite3"
    holder = holding(store, 60)
    with pytest.raises(Busy):
        take(store, 1, wait=0)
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=30)
    take(store, 1, wait=0).release()
