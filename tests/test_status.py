"""`status` and the freshness the MCP server reads, over a real cache, outbox and last-attempt file."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from conftest import run_with_timeout, write_config

from sharedmem.cache.cache import Cache, NamespaceInfo
from sharedmem.client import config as config_mod
from sharedmem.client.outbox import Outbox
from sharedmem.client.status import (
    CLOCK_SLACK,
    STALE_PERIODS,
    SYNCED_FILE,
    config_paths,
    describe,
    freshness,
    stale_reason,
    status,
)
from sharedmem.clock import SYNC_INTERVAL_SECONDS, age_text
from sharedmem.hashing import sha256_text

NS = "machines/laptop/notes"


def load(tmp_path: Path) -> config_mod.ClientConfig:
    path = write_config(tmp_path / "client.json", "laptop",
                        {"kind": "local", "store": str(tmp_path / "store.sqlite3")},
                        [{"name": "notes", "kind": "markdown", "path": str(tmp_path)}],
                        tmp_path / "cache")
    return config_mod.load(path, {"HOME": str(tmp_path)})


def test_a_client_that_never_synced(tmp_path: Path) -> None:
    info = status(load(tmp_path))
    assert info["machine"] == "laptop" and info["last_sync"] is None
    assert info["age"] is None and info["age_seconds"] is None
    assert info["last_attempt"] == {} and info["pending_notes"] == [] and info["namespaces"] == []


def test_what_the_cache_holds_and_what_waits(tmp_path: Path) -> None:
    cfg = load(tmp_path)
    Cache(cfg.cache).apply([(f"{NS}/a.md", sha256_text("a\n"), "a\n"),
                            (f"{NS}/b/c.md", sha256_text("c\n"), "c\n")], [],
                           {NS: NamespaceInfo(NS, "laptop", "notes", "markdown", 3, "then")})
    Outbox(cfg.state / "outbox").put("2026-01-31T09-30-00-idea.md", "later")
    cfg.state.mkdir(parents=True, exist_ok=True)
    (cfg.state / "last-sync.json").write_text('{"status": "failed", "error": "unreachable"}')
    info = status(cfg)
    assert info["last_sync"] is not None and 0 <= info["age_seconds"] < 60
    assert info["last_attempt"] == {"status": "failed", "error": "unreachable"}
    assert info["pending_notes"] == ["2026-01-31T09-30-00-idea.md"]
    assert info["namespaces"] == [{"key": NS, "machine": "laptop", "source": "notes",
                                   "kind": "markdown", "files": 2, "synced_at": "then"}]
    (cfg.state / "last-sync.json").write_text("[not an object")  # damaged: read as nothing
    assert status(cfg)["last_attempt"] == {}


# freshness: what the MCP server reads at `initialize` ---------------------------------------------

@pytest.mark.parametrize("cache, state, where", [
    ("/abs/cache", "/abs/state", "folder"),
    ("cache", None, "folder"),
    ("~/memory/cache", "~/memory/state", "folder"),
    ("~", "rel/state", "folder"),
    ("cache", "state", "cwd"),
    ("cache", None, "link"),  # a client.json kept elsewhere (dotfiles) and linked
])
def test_the_cheap_paths_are_the_configuration_s(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                cache: str, state: str | None,
                                                where: str) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    raw = {"machine": "laptop", "transport": {"kind": "local", "store": "/s.sqlite3"},
           "sources": [], "cache": cache}
    if state is not None:
        raw["state"] = state
    path = tmp_path / "sub" / "client.json" if where == "folder" else Path("client.json")
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(raw))
    if where == "link":
        path = tmp_path / "linked" / "client.json"
        path.parent.mkdir()
        path.symlink_to(tmp_path / "client.json")
    cfg = config_mod.load(path)
    assert config_paths(str(path)) == (str(cfg.cache), str(cfg.state))


def test_no_cheap_paths_from_a_configuration_that_cannot_say(tmp_path: Path) -> None:
    path = tmp_path / "client.json"
    assert config_paths(str(path)) is None
    for text in ("{not json", "[]", '{"cache": 3}', '{"cache": "c", "state": ""}'):
        path.write_text(text)
        assert config_paths(str(path)) is None, text


def test_freshness_of_a_synced_cache_a_failed_attempt_and_queued_notes(tmp_path: Path) -> None:
    cfg = load(tmp_path)
    Cache(cfg.cache).apply([(f"{NS}/a.md", sha256_text("a\n"), "a\n")], [],
                           {NS: NamespaceInfo(NS, "laptop", "notes", "markdown", 3, "then")})
    for i in range(3):
        Outbox(cfg.state / "outbox").put(f"2026-01-31T09-30-0{i}-idea.md", "later")
    (cfg.state / "outbox" / ".hidden.json").write_text("{}")
    (cfg.state / "outbox" / "notes.txt").write_text("")
    (cfg.state / "last-sync.json").write_text(json.dumps(
        {"status": "failed", "error": "unreachable", "finished_at": "2026-01-31T09:30:00Z",
         "exit_code": 2}))
    now = time.time() + 125
    fresh = freshness(str(cfg.cache), str(cfg.state), now)
    assert fresh["last_sync"] == status(cfg)["last_sync"] and 125 <= fresh["age_seconds"] < 200
    assert fresh["age"].startswith("2m ")
    assert fresh["last_attempt"] == {"status": "failed", "error": "unreachable",
                                     "finished_at": "2026-01-31T09:30:00Z"}
    assert fresh["pending_notes"] == 3 == len(status(cfg)["pending_notes"])
    assert describe(fresh) == (
        f"The shared memory cache was last synced at {fresh['last_sync']} ({fresh['age']} ago). "
        "The last sync attempt (2026-01-31T09:30:00Z) failed: unreachable. 3 notes wait on this "
        "machine to be delivered to the server.")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
@pytest.mark.parametrize("damage", ["fifo", "link", "large", "list", "garbage", "stamp", "folder"])
def test_freshness_reads_damaged_bookkeeping_as_unknown_without_blocking(
        tmp_path: Path, damage: str) -> None:
    meta, state = tmp_path / "cache" / ".sharedmem", tmp_path / "state"
    meta.mkdir(parents=True)
    state.mkdir()
    outside = tmp_path / "outside.json"
    outside.write_text('{"last_sync": "2026-01-31T09:30:00Z", "status": "ok"}')
    targets = [meta / "synced.json", state / "last-sync.json"]
    for target in targets[:1] if damage == "link" else targets:  # state's links are the user's
        if damage == "fifo":
            os.mkfifo(target)
        elif damage == "link":
            target.symlink_to(outside)
        elif damage == "large":
            target.write_text('{"last_sync": "2026-01-31T09:30:00Z", "status": "ok", "x": "'
                              + "x" * (1 << 20) + '"}')
        elif damage == "folder":
            target.mkdir()
        else:
            target.write_text({"list": '["last_sync"]', "garbage": "\xff{",
                               "stamp": '{"last_sync": "yesterday", "status": 3}'}[damage])
    (state / "outbox").write_text("not a folder")
    fresh = run_with_timeout(lambda: freshness(str(tmp_path / "cache"), str(state)), 10)
    assert fresh == {"last_sync": None, "age_seconds": None, "age": None, "last_attempt": None,
                     "pending_notes": 0}
    assert "No sync has completed" in describe(fresh)


HOUR = 3600


@pytest.mark.parametrize("age, attempted, stale", [
    (None, None, False),  # never synced: the first sync is the installer's
    (2 * 60, None, False),
    (SYNC_INTERVAL_SECONDS * STALE_PERIODS, None, False),
    (SYNC_INTERVAL_SECONDS * STALE_PERIODS + 1, None, True),
    (HOUR, HOUR, True),  # a laptop that slept: the schedule did not run either
    (HOUR, 30, False),  # the schedule tried half a minute ago (the server is unreachable)
    (HOUR, SYNC_INTERVAL_SECONDS + 1, True),
    (HOUR, -600, True),  # an attempt stamped in the future: a clock that jumped
])
def test_a_cache_is_stale_after_three_missed_periods(age: int | None, attempted: int | None,
                                                     stale: bool) -> None:
    now = 1_800_000_000
    fresh = {"age_seconds": age, "age": None if age is None else age_text(age),
             "last_attempt": None if attempted is None else {
                 "status": "failed", "finished_at": time.strftime(
                     "%Y-%m-%dT%H:%M:%SZ", time.gmtime(now - attempted))}}
    reason = stale_reason(fresh, now)
    assert (reason is not None) == stale
    if stale:
        assert reason == f"the cache was {age_text(age)} old"


def test_a_long_error_is_one_short_line() -> None:
    fresh = {"last_sync": None, "last_attempt": {"status": "failed",
                                                 "error": "first\n\n  second " + "x" * 500}}
    sentence = describe(fresh).split("failed: ", 1)[1]
    assert sentence.startswith("first second xxx") and sentence.endswith("x…")
    assert len(sentence) == 301


def test_the_synced_file_read_is_the_cache_s(tmp_path: Path) -> None:
    from sharedmem.cache.cache import SYNCED_NAME
    assert tmp_path.joinpath(*SYNCED_FILE) == Cache(tmp_path).meta / SYNCED_NAME


@pytest.mark.parametrize("name", ["manifest.sqlite3"])
def test_a_damaged_cache_is_said_and_the_next_sync_named(tmp_path: Path, name: str) -> None:
    cfg = load(tmp_path)
    Cache(cfg.cache).apply([(f"{NS}/a.md", sha256_text("a\n"), "a\n")], [],
                           {NS: NamespaceInfo(NS, "laptop", "notes", "markdown", 3, "then")})
    assert status(cfg)["damage"] is None
    (cfg.cache / ".sharedmem" / name).write_text("{", encoding="utf-8")
    info = status(cfg)
    assert info["damage"] and name in info["damage"], info["damage"]


def test_refused_notes_are_listed_with_their_reasons(tmp_path: Path) -> None:
    from sharedmem.client.exchange import _quarantine
    from sharedmem.client.status import REFUSED_SHOWN, refused_notes
    cfg = load(tmp_path)
    outbox = Outbox(cfg.state / "outbox")
    for i in range(REFUSED_SHOWN + 2):
        queued = outbox.put(f"2026-01-31T09-30-{i:02}-idea.md", f"idea {i}")
        [path] = [p for p, n in outbox.pending() if n.note_id == queued.note_id]
        _quarantine(path, {"filename": queued.filename, "note_id": queued.note_id,
                           "message": f"refused because {i}"})
        outbox.done(path)
    older = cfg.state / "refused-notes" / "2099-old.json"  # kept by a version without reasons
    older.write_text(json.dumps({"filename": "2020-01-01T00-00-00-old.md", "note_id": "x"}))
    info = status(cfg)
    assert info["refused_notes_total"] == REFUSED_SHOWN + 3
    assert len(info["refused_notes"]) == REFUSED_SHOWN
    first, second = info["refused_notes"][:2]  # the newest first
    assert first["filename"] == "2020-01-01T00-00-00-old.md"
    assert first["message"].startswith("no reason recorded") and first["refused_at"] is None
    assert second["filename"] == f"2026-01-31T09-30-{REFUSED_SHOWN + 1:02}-idea.md"
    assert second["message"] == f"refused because {REFUSED_SHOWN + 1}" and second["refused_at"]
    assert refused_notes(str(tmp_path / "nowhere")) == {"refused_notes_total": 0,
                                                        "refused_notes": []}


@pytest.mark.parametrize("ahead, future", [(3600, True), (10 * 365 * 86400, True),
                                           (CLOCK_SLACK + 5, True), (CLOCK_SLACK - 5, False)])
def test_a_last_sync_in_the_future_is_stale_not_fresh(tmp_path: Path, ahead: int, future: bool,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = load(tmp_path)
    Cache(cfg.cache).apply([(f"{NS}/a.md", sha256_text("a\n"), "a\n")], [],
                           {NS: NamespaceInfo(NS, "laptop", "notes", "markdown", 3, "then")})
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + ahead))
    cfg.cache.joinpath(*SYNCED_FILE).write_text(json.dumps({"last_sync": stamp}))
    fresh = freshness(str(cfg.cache), str(cfg.state))
    assert fresh["last_sync"] == stamp
    synced = status(cfg)["last_sync"]  # the manifest's own record of the same pull
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() - ahead)  # this clock, set back
    info = status(cfg)
    monkeypatch.undo()
    assert info["last_sync"] == synced
    if not future:  # a clock NTP stepped back a little: as if just synced
        assert fresh["age_seconds"] == 0 == info["age_seconds"] and stale_reason(fresh) is None
        assert "last_sync_in_future" not in fresh and "last_sync_in_future" not in info
        return
    assert fresh["age_seconds"] is None and fresh["age"] is None and info["age_seconds"] is None
    assert fresh["last_sync_in_future"] is True and info["last_sync_in_future"] is True
    assert stale_reason(fresh) == (f"the cache's last sync time ({stamp}) is in the future, so "
                                   "its age is unknown")
    assert f"records its last sync at {stamp}, a time in the future" in describe(fresh)
    assert "cannot be told: treat it as possibly out of date" in describe(fresh)
    cfg.state.mkdir(parents=True, exist_ok=True)
    (cfg.state / "last-sync.json").write_text(json.dumps(  # the schedule tried just now
        {"status": "failed", "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}))
    assert stale_reason(freshness(str(cfg.cache), str(cfg.state))) is None
