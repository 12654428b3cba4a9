"""The sync lock, held by a real second process."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import REPO

from sharedmem.client.lock import sync_lock
from sharedmem.core import LockError


def test_lock_refuses_overlap_and_takes_over_stale(tmp_path):
    state = tmp_path / "state"
    code = (f"import sys, time; sys.path.insert(0, {str(REPO)!r})\n"
            "from pathlib import Path\nfrom sharedmem.client.lock import sync_lock\n"
            f"with sync_lock(Path({str(state)!r})):\n    print('held', flush=True); time.sleep(60)\n")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(LockError, match="another sync"):
        with sync_lock(state):
            pass
    holder.kill()
    holder.wait()
    with sync_lock(state):
        assert (state / "sync.lock").read_text() == str(os.getpid())
