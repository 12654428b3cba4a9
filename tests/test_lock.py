"""The sync lock, held by a real second process; `sync` waiting for it, run many at once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import LAUNCHER, REPO, run_cli, write_config

from sharedmem.client.lock import adopt_lock, delivery_lock, delivery_lock_file, sync_lock
from sharedmem.core import LockError


def hold(state: Path, seconds: float = 60, purpose: str = "note delivery") -> subprocess.Popen:
    """A real process holding the machine's sync lock for `seconds`, once it printed 'held'."""
    code = (f"import sys, time; sys.path.insert(0, {str(REPO)!r})\n"
            "from pathlib import Path\nfrom sharedmem.client.lock import sync_lock\n"
            f"with sync_lock(Path({str(state)!r}), purpose={purpose!r}):\n"
            f"    print('held', flush=True); time.sleep({seconds})\n")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_lock_refuses_overlap_and_takes_over_stale(tmp_path):
    state = tmp_path / "state"
    holder = hold(state)
    with pytest.raises(LockError, match="another sync"):
        with sync_lock(state):
            pass
    holder.kill()
    holder.wait()
    with sync_lock(state):
        pid, _started, purpose = (state / "sync.lock").read_text().split()
        assert (pid, purpose) == (str(os.getpid()), "sync")


def test_lock_waits_for_its_holder_and_says_who_it_is(tmp_path):
    state = tmp_path / "state"
    holder = hold(state, seconds=1.0)
    said: list[str] = []
    started = time.monotonic()
    with sync_lock(state, wait=30, waiting=said.append):
        waited = time.monotonic() - started
    holder.wait()
    assert 0.5 < waited < 20
    assert said and said[0].startswith("waiting for the note delivery of this machine started "
                                       "at 20") and f"by pid {holder.pid}" in said[0]


def test_lock_gives_up_after_its_wait_naming_the_holder(tmp_path):
    state = tmp_path / "state"
    holder = hold(state)
    try:
        started = time.monotonic()
        with pytest.raises(LockError, match=f"note delivery .* by pid {holder.pid}.*waited 1 s"):
            with sync_lock(state, wait=0.8):
                pass
        assert 0.8 <= time.monotonic() - started < 5
    finally:
        holder.kill()
        holder.wait()


def local_client(tmp_path: Path) -> Path:
    """A client with one small markdown source, on a local store."""
    notes = tmp_path / "notes"
    notes.mkdir()
    for i in range(5):
        (notes / f"n{i}.md").write_text(f"# note {i}\n", encoding="utf-8")
    return write_config(tmp_path / "laptop" / "client.json", "laptop",
                        {"kind": "local", "store": str(tmp_path / "store.sqlite3")},
                        [{"name": "notes", "kind": "markdown", "path": str(notes)}],
                        tmp_path / "laptop" / "cache")


def test_many_syncs_at_once_all_run(tmp_path, home):
    """Twelve scheduled runs that start together each wait their turn; none fails."""
    cfg = local_client(tmp_path)
    procs = [subprocess.Popen([sys.executable, str(LAUNCHER), "sync", "--config", str(cfg),
                               "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(12)]
    results = [(p.wait(timeout=120), p.stdout.read(), p.stderr.read()) for p in procs]
    for p in procs:
        p.stdout.close()
        p.stderr.close()
    assert [code for code, _, _ in results] == [0] * 12, [err for _, _, err in results]
    assert sum("waiting for the sync of this machine" in err for _, _, err in results) >= 1
    statuses = sorted(json.loads(out)["sources"][0]["status"] for _, out, _ in results)
    assert statuses == ["published"] + ["unchanged"] * 11
    assert len(list((tmp_path / "laptop" / "cache" / "machines" / "laptop" / "notes").iterdir())) == 5


def test_sync_held_past_its_wait_fails_clearly(tmp_path, home):
    cfg = local_client(tmp_path)
    holder = hold(tmp_path / "laptop" / "state")
    try:
        started = time.monotonic()
        proc = run_cli("sync", "--config", str(cfg), "--wait", "1.5")
        took = time.monotonic() - started
        assert proc.returncode == 2, proc.stderr
        assert 1.5 <= took < 10
        assert ("sync: waiting for the note delivery of this machine started at 20"
                in proc.stderr) and f"by pid {holder.pid}" in proc.stderr
        assert "sync failed: another sync of this machine is running" in proc.stderr
        assert "--wait SECONDS" in proc.stderr
        last = json.loads((tmp_path / "laptop" / "state" / "last-sync.json").read_text())
        assert last["status"] == "failed" and "another sync" in last["error"]
        started = time.monotonic()
        proc = run_cli("sync", "--config", str(cfg), "--wait", "0")  # as before: at once
        assert proc.returncode == 2 and "another sync" in proc.stderr
        assert "waiting" not in proc.stderr and time.monotonic() - started < 10
    finally:
        holder.kill()
        holder.wait()
    assert not (tmp_path / "laptop" / "cache" / "machines").exists()
    assert run_cli("sync", "--config", str(cfg), "--wait", "0").returncode == 0


@pytest.mark.parametrize("value", ["-1", "abc", "nan", "inf", "1e9", ""])
def test_sync_wait_must_be_seconds(tmp_path, value, home):
    proc = run_cli("sync", "--config", str(local_client(tmp_path)), "--wait", value)
    assert proc.returncode == 2
    assert "--wait" in proc.stderr and "seconds from 0 to 86400" in proc.stderr
    assert not (tmp_path / "laptop" / "state").exists()


def test_a_handed_delivery_lock_is_adopted_only_when_it_is_the_lock(tmp_path):
    with delivery_lock_file(tmp_path) as fd:
        handed = os.dup(fd)  # what `pass_fds` gives a child: the same open file
    with delivery_lock(tmp_path) as free:
        assert not free  # the handed file holds the lock after its starter let go
    os.set_inheritable(handed, True)  # as the child finds it
    held = adopt_lock(tmp_path, handed)
    assert held is not None and not os.get_inheritable(handed)  # passed on to no child
    with held as ok:
        assert ok
    with delivery_lock(tmp_path) as free:
        assert free  # let go at the end of the `with`
    other = os.open(tmp_path / "other", os.O_RDWR | os.O_CREAT, 0o600)
    assert adopt_lock(tmp_path, other) is None  # not the lock file: left open, untouched
    os.close(other)
    closed = os.open(tmp_path / "delivery.lock", os.O_RDWR)
    os.close(closed)
    assert adopt_lock(tmp_path, closed) is None  # no such descriptor now
    with delivery_lock(tmp_path) as free:
        assert free
        stray = os.open(tmp_path / "delivery.lock", os.O_RDWR)
        assert adopt_lock(tmp_path, stray) is None  # the lock file, but another holds it
