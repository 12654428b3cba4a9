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


def test_a_session_over_the_count_waits_then_is_turned_away(tmp_path: Path) -> None:
    store = tmp_path / "store.sqlite3"
    held = [take(store, 2), take(store, 2)]
    started = time.monotonic()
    with pytest.raises(Busy) as exc:
        take(store, 2, wait=0.3)
    assert 0.3 <= time.monotonic() - started < 5
    assert "sessions already run on store" in str(exc.value)
    assert "serve --limit sessions=2" in str(exc.value) and "try again" in str(exc.value)
    held[0].release()
    held.append(take(store, 2, wait=0))  # the slot given back
    assert sorted(os.listdir(folder(store))) == ["0", "1"]
    for slot in held:
        slot.release()


def test_a_waiting_session_gets_the_slot_once_one_ends(tmp_path: Path) -> None:
    store = tmp_path / "store.sqlite3"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\n"
         f"sys.path.insert(0, {str(REPO)!r})\n"
         "from sharedmem.server.session_slots import take\n"
         f"slot = take({str(store)!r}, 1)\n"
         "print('held', flush=True)\n"
         "time.sleep(0.5)\n"], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    started = time.monotonic()
    slot = take(store, 1, wait=20)  # taken once the holder's process ends
    assert time.monotonic() - started < 15
    slot.release()
    holder.wait(timeout=30)


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")
def test_a_killed_session_leaves_no_slot_taken(tmp_path: Path) -> None:
    store = tmp_path / "store.sqlite3"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\n"
         f"sys.path.insert(0, {str(REPO)!r})\n"
         "from sharedmem.server.session_slots import take\n"
         f"slot = take({str(store)!r}, 1)\n"
         "print('held', flush=True)\n"
         "time.sleep(60)\n"], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    with pytest.raises(Busy):
        take(store, 1, wait=0)
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=30)
    take(store, 1, wait=0).release()
