"""Adding a note through the real client code, delivered to a real local `serve` and store,
or to a server end that hangs (an `ssh` on PATH that reads nothing and never answers)."""

from __future__ import annotations

import json
import os
import time

import pytest
from conftest import hung_ssh, kill_logged, ssh_client, write_config

from sharedmem.client import config as config_mod
from sharedmem.client.lock import delivery_lock
from sharedmem.client.note import add_note, deliver_queued, submit_note
from sharedmem.client.outbox import Outbox
from sharedmem.client.status import status
from sharedmem.core import NoteError

NOTE = "2026-11-30T09-00-00-decision.md"


def test_submit_note_stores_then_is_idempotent(tmp_path):
    store = tmp_path / "store.sqlite3"
    cfg = config_mod.load(write_config(tmp_path / "laptop" / "client.json", "laptop",
                                       {"kind": "local", "store": str(store)}, [],
                                       tmp_path / "laptop" / "cache"))
    result = submit_note(cfg, NOTE, "we chose SQLite")
    assert result["status"] == "stored"
    assert result["path"] == f"extensions/ad_hoc/notes/{NOTE}"
    assert (cfg.cache / result["path"]).read_text().count("we chose SQLite") == 1
    assert status(cfg)["pending_notes"] == []


def test_deliver_queued_delivers_every_note_and_refreshes_the_cache(tmp_path, home):
    cfg = config_mod.load(write_config(tmp_path / "laptop" / "client.json", "laptop",
                                       {"kind": "local", "store": str(tmp_path / "s.sqlite3")},
                                       [], tmp_path / "laptop" / "cache"))
    outbox = Outbox(cfg.state / "outbox")
    for i in range(3):
        outbox.put(f"2026-11-30T09-00-0{i}-idea.md", f"idea {i}")
    report = deliver_queued(cfg, lock_wait=0)
    assert (report["status"], report["notes"]["delivered"], report["pending"]) == ("ok", 3, 0)
    for i in range(3):
        assert f"idea {i}" in (cfg.cache / f"extensions/ad_hoc/notes/2026-11-30T09-00-0{i}"
                                           "-idea.md").read_text()
    again = deliver_queued(cfg, lock_wait=0)  # nothing queued: nothing to do
    assert (again["status"], again["notes"]["delivered"]) == ("ok", 0)


def test_a_delivery_gives_up_on_a_hung_server_and_keeps_the_note(tmp_path, monkeypatch, home):
    bin_dir, log = hung_ssh(tmp_path)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    cfg = config_mod.load(ssh_client(tmp_path))
    Outbox(cfg.state / "outbox").put(NOTE, "we chose SQLite")
    started = time.monotonic()
    try:
        report = deliver_queued(cfg, lock_wait=0, timeout=1.0)
    finally:
        kill_logged(log)
    assert time.monotonic() - started < 10
    assert report["status"] == "failed"
    assert "did not answer within 1 s" in report["error"] and "ssh server.invalid" in report["error"]
    assert report["pending"] == 1 and status(cfg)["pending_notes"] == [NOTE]
    assert len(log.read_text().split()) == 1
    kept = json.loads((cfg.state / "last-delivery.json").read_text())  # for a note waiting
    assert (kept["status"], kept["pending"], kept["delivered"]) == ("failed", 1, 0)
    assert kept["error"] == report["error"] and kept["finished_ns"] > time.time_ns() - 60e9


def test_a_delivery_leaves_its_notes_to_the_one_running(tmp_path, monkeypatch, home):
    bin_dir, log = hung_ssh(tmp_path)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    cfg = config_mod.load(ssh_client(tmp_path))
    Outbox(cfg.state / "outbox").put(NOTE, "we chose SQLite")
    with delivery_lock(cfg.state) as held:
        assert held
        report = deliver_queued(cfg, lock_wait=0, timeout=1.0)
    assert report["status"] == "ok" and "another delivery" in report["message"]
    assert report["pending"] == 1 and not log.exists()  # it never reached for the server


def test_only_one_holds_the_delivery_lock(tmp_path):
    with delivery_lock(tmp_path) as first, delivery_lock(tmp_path) as second:
        assert (first, second) == (True, False)
    with delivery_lock(tmp_path) as again:
        assert again


def test_a_note_the_server_refuses_is_an_error_with_its_reason(tmp_path, home):
    cfg = config_mod.load(write_config(tmp_path / "laptop" / "client.json", "laptop",
                                       {"kind": "local", "store": str(tmp_path / "s.sqlite3")},
                                       [], tmp_path / "laptop" / "cache"))
    block = "x" * (60 * 1024)
    for i in range(17):  # a note file holds 1 MiB: the 18th entry of 60 KiB does not fit
        assert submit_note(cfg, NOTE, f"{i} {block}")["status"] == "stored"
    with pytest.raises(NoteError, match=r"the server refused the note: note file .* is full"):
        add_note(cfg, NOTE, f"17 {block}", wait=10)
    [kept] = status(cfg)["refused_notes"]
    assert kept["filename"] == NOTE and "is full" in kept["message"]
    assert status(cfg)["pending_notes"] == []
