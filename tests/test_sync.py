"""Sync end to end: the real launcher, real `serve`, real SQLite, and a real sshd on loopback."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import (
    LAUNCHER,
    cache_files,
    collections_in,
    config_for,
    index_covers,
    make_memories,
    run_cli,
    sync_json,
)

from sharedmem.cache.cache import Cache
from sharedmem.server.store import Store


def test_ssh_first_nochange_changed_and_deleted(tmp_path, sshd):
    home = tmp_path / "laptop-home"
    notes = make_memories(home)
    cfg = config_for(tmp_path, home, "laptop", sshd.transport())
    code, report = sync_json(cfg)
    assert code == 0, report
    assert report["protocol"] == 3
    cache = tmp_path / "laptop" / "cache"
    files = cache_files(cache)
    assert "machines/laptop/codex/MEMORY.md" in files
    assert "machines/laptop/notes/d1/note-001.md" in files
    assert not any("raw_memories" in p for p in files)
    assert len(files) == 22

    code, again = sync_json(cfg)
    assert code == 0 and all(s["status"] == "unchanged" for s in again["sources"])
    assert again["pull"]["written"] == 0
    assert again["bytes"]["sent"] < 2000

    (notes / "d1" / "note-001.md").write_text("changed text\n", encoding="utf-8")
    (notes / "d2" / "note-002.md").unlink()
    code, third = sync_json(cfg)
    assert code == 0
    files = cache_files(cache)
    assert files["machines/laptop/notes/d1/note-001.md"] == "changed text\n"
    assert "machines/laptop/notes/d2/note-002.md" not in files
    assert third["pull"] == {"written": 1, "removed": 1, "files": 21, "skipped": [],
                             "skipped_total": 0}
    with Store.open(sshd.store, create=False) as store:
        assert store.verify() == []
        assert "machines/laptop/notes/d2/note-002.md" not in store.manifest()


def indexed_paths(cache: Path) -> set[str]:
    """The paths the search index holds."""
    conn = sqlite3.connect(f"file:{cache / '.sharedmem' / 'index' / 'search.sqlite3'}?mode=ro",
                           uri=True)
    try:
        return {p for (p,) in conn.execute("SELECT path FROM files")}
    finally:
        conn.close()


def test_sync_keeps_the_index_current(tmp_path):
    home = tmp_path / "laptop-home"
    notes = make_memories(home, files=70)
    store = tmp_path / "server" / "store.sqlite3"
    cfg = config_for(tmp_path, home, "laptop", {"kind": "local", "store": str(store)})
    cache = tmp_path / "laptop" / "cache"
    assert sync_json(cfg)[0] == 0  # a plain sync builds no index the cache lacks: a search does
    assert not (cache / ".sharedmem" / "index").exists()
    assert not (cache / ".sharedmem" / "staging").exists()
    # With --index (the installer's first sync) it is built whole, once the sync has ended.
    assert sync_json(cfg, "--index")[0] == 0
    assert index_covers(Cache(cache))
    assert indexed_paths(cache) == set(cache_files(cache))
    found = run_cli("search", "--config", str(cfg), "--json", "body 3 café")
    assert found.returncode == 0, found.stderr
    assert {r["path"] for r in json.loads(found.stdout)["results"]} == {
        "machines/laptop/notes/d3/note-003.md"}

    for i in range(65):  # 65 files changed and one removed: the index follows
        (notes / f"d{i % 4}" / f"note-{i:03}.md").write_text(f"# note {i}\nnew {i}\n")
    (notes / "d0" / "note-068.md").unlink()
    assert sync_json(cfg)[0] == 0
    assert index_covers(Cache(cache))
    assert indexed_paths(cache) == set(cache_files(cache))
    found = run_cli("search", "--config", str(cfg), "--json", "new 64")
    assert [r["path"] for r in json.loads(found.stdout)["results"]] == [
        "machines/laptop/notes/d0/note-064.md"]


def test_state_of_an_older_client_is_read_and_rewritten(tmp_path):
    home = tmp_path / "laptop-home"
    notes = make_memories(home, files=4)
    store = tmp_path / "server" / "store.sqlite3"
    cfg = config_for(tmp_path, home, "laptop", {"kind": "local", "store": str(store)})
    assert sync_json(cfg)[0] == 0
    state_file = tmp_path / "laptop" / "state" / "sources" / "notes.json"
    state = json.loads(state_file.read_text())
    assert set(state["acked"]) == {"digest"}  # the files are those of the record
    state["acked"]["files"] = {p: r[2] for p, r in state["record"].items()}  # the older form
    state_file.write_text(json.dumps(state))

    code, again = sync_json(cfg)  # nothing changed on disk: only the state is rewritten
    assert code == 0 and again["bytes"]["sent"] < 2000
    rewritten = json.loads(state_file.read_text())
    assert rewritten == {**state, "acked": {"digest": state["acked"]["digest"]}}

    (notes / "d1" / "note-001.md").write_text("changed\n", encoding="utf-8")
    code, third = sync_json(cfg)  # a delta against the acknowledged files: one body goes
    assert code == 0 and third["bytes"]["sent"] < 2000
    assert cache_files(tmp_path / "laptop" / "cache")["machines/laptop/notes/d1/note-001.md"] == (
        "changed\n")


def test_two_machines_share_one_store(tmp_path, sshd):
    for machine in ("laptop", "desktop"):
        home = tmp_path / f"{machine}-home"
        make_memories(home, files=3)
        (home / ".codex" / "memories" / "MEMORY.md").write_text(f"I am {machine}\n")
    laptop = config_for(tmp_path, tmp_path / "laptop-home", "laptop", sshd.transport())
    desktop = config_for(tmp_path, tmp_path / "desktop-home", "desktop",
                         sshd.transport(pinned=False))
    assert sync_json(laptop)[0] == 0
    assert sync_json(desktop)[0] == 0
    assert sync_json(laptop)[0] == 0
    for machine in ("laptop", "desktop"):
        files = cache_files(tmp_path / machine / "cache")
        assert files["machines/laptop/codex/MEMORY.md"] == "I am laptop\n"
        assert files["machines/desktop/codex/MEMORY.md"] == "I am desktop\n"


def test_pinned_key_claiming_another_machine_is_refused(tmp_path, sshd):
    home = tmp_path / "h"
    make_memories(home, files=2)
    cfg = config_for(tmp_path, home, "intruder", sshd.transport(pinned=True))
    code, report = sync_json(cfg)
    assert code == 2
    assert "pinned to machine 'laptop'" in report["error"]
    assert not (tmp_path / "intruder" / "cache" / "machines").exists()
    with Store.open(sshd.store) as store:
        assert store.counts()["files"] == 0


def test_unreachable_server_keeps_cache_and_queues_note(tmp_path, sshd):
    home = tmp_path / "h"
    make_memories(home, files=2)
    cfg = config_for(tmp_path, home, "laptop", sshd.transport())
    assert sync_json(cfg)[0] == 0
    cache = tmp_path / "laptop" / "cache"
    before = cache_files(cache)
    meta_before = {p.name: p.read_bytes() for p in (cache / ".sharedmem").glob("*.json")}
    sshd.stop()
    for i in range(300):  # enough new files to start the staging helper
        (home / "notes" / "new" / f"n{i}.md").parent.mkdir(parents=True, exist_ok=True)
        (home / "notes" / "new" / f"n{i}.md").write_text(f"new {i}\n", encoding="utf-8")
    code, report = sync_json(cfg)  # the new files were staged, then the sync failed
    assert code == 2 and "cannot reach" in report["error"]
    assert cache_files(cache) == before
    assert not (cache / ".sharedmem" / "staging").exists()
    assert {p.name: p.read_bytes() for p in (cache / ".sharedmem").glob("*.json")} == meta_before
    note = run_cli("note", "--config", str(cfg), "2026-11-30T10-00-00-offline-idea.md",
                   "remember the offline idea", "--json")
    assert note.returncode == 0, note.stderr
    assert json.loads(note.stdout)["status"] == "queued"
    info = json.loads(run_cli("status", "--config", str(cfg), "--json").stdout)
    assert info["pending_notes"] == ["2026-11-30T10-00-00-offline-idea.md"]
    assert info["age_seconds"] is not None and info["last_attempt"]["status"] == "failed"
    sshd.start()
    code, report = sync_json(cfg)
    assert code == 0, report
    assert report["notes"]["delivered"] == 1
    assert sync_json(cfg)[1]["notes"]["delivered"] == 0
    with Store.open(sshd.store) as store:
        assert store.counts()["notes"] == 1
    text = cache_files(cache)["extensions/ad_hoc/notes/2026-11-30T10-00-00-offline-idea.md"]
    assert "remember the offline idea" in text and "laptop" in text


def test_server_killed_mid_sync_leaves_store_consistent(tmp_path, sshd):
    home = tmp_path / "h"
    notes = make_memories(home, files=0)
    for i in range(1500):
        target = notes / f"d{i % 10}" / f"big-{i:04}.md"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(f"# {i}\n" + ("lorem ipsum dolor sit amet\n" * 400), encoding="utf-8")
    cfg = config_for(tmp_path, home, "laptop", sshd.transport())
    proc = subprocess.Popen([sys.executable, str(LAUNCHER), "sync", "--config", str(cfg),
                             "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    killed = False
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None and not killed:
        try:
            with sqlite3.connect(f"file:{sshd.store}?mode=ro", uri=True) as probe:
                # bodies are stored as they arrive, well before the sync can end
                ready = probe.execute("SELECT (SELECT count(*) FROM blobs) + "
                                      "(SELECT count(*) FROM namespaces)").fetchone()[0] >= 1
        except sqlite3.Error:
            ready = False
        if ready:
            pids = subprocess.run(["pgrep", "-f", f"serve --store {sshd.store}"],
                                  capture_output=True, text=True).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                    killed = True
                except ProcessLookupError:
                    pass
        time.sleep(0.01)
    proc.wait(timeout=60)
    assert killed
    assert proc.returncode == 2
    conn = sqlite3.connect(sshd.store)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    rows = conn.execute("SELECT source, file_count FROM namespaces").fetchall()
    counts = dict(rows)
    assert counts.get("notes") in (None, 1500)
    conn.close()
    code, report = sync_json(cfg)
    assert code == 0, report
    assert len(cache_files(tmp_path / "laptop" / "cache")) == 1502


def test_a_server_that_speaks_only_version_1_is_named_and_nothing_changes(tmp_path, sshd):
    # Every released server speaks version 2; a client no longer speaks version 1.
    home = tmp_path / "h"
    make_memories(home, files=5)
    store = tmp_path / "store.sqlite3"
    command = [sys.executable, str(LAUNCHER), "serve", "--store", str(store),
               "--max-protocol", "1"]
    cfg = config_for(tmp_path, home, "laptop",
                     sshd.transport(pinned=False, remote_command=command))
    code, report = sync_json(cfg)
    assert code == 2, report
    assert "speaks protocol version 1 only" in report["error"]
    assert "upgrade the server" in report["error"]
    assert not (tmp_path / "laptop" / "cache" / "machines").exists()
    with Store.open(store) as s:
        assert list(s.export()) == []


def test_a_version_2_client_and_server_sync_both_ways(tmp_path, sshd):
    home = tmp_path / "h"
    notes = make_memories(home, files=5)
    store = tmp_path / "store.sqlite3"
    command = [sys.executable, str(LAUNCHER), "serve", "--store", str(store),
               "--max-protocol", "2"]
    cfg = config_for(tmp_path, home, "laptop",
                     sshd.transport(pinned=False, remote_command=command))
    code, report = sync_json(cfg)
    assert code == 0 and report["protocol"] == 2, report
    (notes / "d0" / "note-000.md").unlink()
    (notes / "d1" / "note-001.md").write_text("v2 change\n", encoding="utf-8")
    code, report = sync_json(cfg, "--max-protocol", "2")
    assert code == 0 and report["protocol"] == 2
    files = cache_files(tmp_path / "laptop" / "cache")
    assert "machines/laptop/notes/d0/note-000.md" not in files and len(files) == 6
    assert files["machines/laptop/notes/d1/note-001.md"] == "v2 change\n"


def test_unreadable_source_leaves_namespace_untouched(tmp_path):
    home = tmp_path / "h"
    notes = make_memories(home, files=2)
    store = tmp_path / "store.sqlite3"
    cfg = config_for(tmp_path, home, "laptop", {"kind": "local", "store": str(store)})
    assert sync_json(cfg)[0] == 0
    notes.rename(tmp_path / "moved-away")
    code, report = sync_json(cfg)
    assert code == 1
    src = {s["source"]: s for s in report["sources"]}
    assert src["notes"]["status"] == "unreadable"
    assert len([p for p in cache_files(tmp_path / "laptop" / "cache") if "/notes/" in p]) == 2
    (tmp_path / "moved-away").rename(notes)
    for p in notes.rglob("*.md"):
        p.unlink()
    code, report = sync_json(cfg)
    assert code == 0
    assert not [p for p in cache_files(tmp_path / "laptop" / "cache") if "/notes/" in p]


@pytest.mark.parametrize("planted", [False, True])
def test_what_an_older_version_left_in_the_cache_is_removed_by_the_next_sync(tmp_path, planted):
    home = tmp_path / "h"
    notes = make_memories(home, files=3)
    store = tmp_path / "store.sqlite3"
    cfg = config_for(tmp_path, home, "laptop", {"kind": "local", "store": str(store)})
    assert sync_json(cfg)[0] == 0
    cache = tmp_path / "laptop" / "cache"
    meta = cache / ".sharedmem"
    before = cache_files(cache)
    outside = tmp_path / "outside"
    (outside / "folder").mkdir(parents=True)
    (outside / "folder" / "0.md").write_text("not the cache's\n")
    (outside / "manifest").write_text("not the cache's either\n")
    if planted:  # links where older versions kept their files: removed, never followed
        (meta / "replaced").symlink_to(outside / "folder", target_is_directory=True)
        (meta / "manifest.next.part").symlink_to(outside / "manifest")
    else:  # as older versions left them: the manifest written ahead, a replaced file kept
        (meta / "replaced").mkdir()
        os.link(cache / "machines/laptop/notes/d1/note-001.md", meta / "replaced" / "0.md")
        (meta / "manifest.next.part").write_text('{"version": 1, "files": {}}')
    (notes / "d2" / "note-002.md").write_text("changed\n", encoding="utf-8")
    code, report = sync_json(cfg)
    assert code == 0, report
    assert not os.path.lexists(meta / "replaced")
    assert not os.path.lexists(meta / "manifest.next.part")
    assert cache_files(cache) == {**before, "machines/laptop/notes/d2/note-002.md": "changed\n"}
    assert os.stat(cache / "machines/laptop/notes/d1/note-001.md").st_nlink == 1
    assert (outside / "folder" / "0.md").read_text() == "not the cache's\n"
    assert (outside / "manifest").read_text() == "not the cache's either\n"


# --- version 3: pipelined, no echo of this machine's own files -----------------------------------

def sync_in_process(cfg: Path, max_version: int = 3) -> tuple[dict, list[str]]:
    """One real sync (its server end a real `serve` child) and the progress it told."""
    from sharedmem.client import config as config_mod
    from sharedmem.client.sync import sync
    told: list[str] = []
    report = sync(config_mod.load(cfg), max_version=max_version, progress=told.append)
    return report, told


def local_laptop(tmp_path: Path, files: int = 20) -> tuple[Path, Path, Path]:
    home = tmp_path / "h"
    notes = make_memories(home, files=files)
    store = tmp_path / "store.sqlite3"
    return notes, store, config_for(tmp_path, home, "laptop", {"kind": "local",
                                                                "store": str(store)})


def test_version_3_pulls_none_of_its_own_files_back_first_or_delta(tmp_path):
    notes, _, cfg = local_laptop(tmp_path)
    cache = tmp_path / "laptop" / "cache"
    report, told = sync_in_process(cfg)
    assert report["status"] == "ok" and report["protocol"] == 3, report
    assert "cache: 0 files pulled" in told and len(cache_files(cache)) == 22
    assert report["round_trips"] == 2  # the hello, then manifests, notes and pull at once

    (notes / "d1" / "note-001.md").write_text("changed text\n", encoding="utf-8")
    (notes / "d2" / "note-002.md").unlink()
    (notes / "d3" / "added.md").write_text("added text\n", encoding="utf-8")
    report, told = sync_in_process(cfg)
    assert report["status"] == "ok", report
    assert "cache: 0 files pulled" in told  # the server sent none of them back
    assert report["round_trips"] == 2
    files = cache_files(cache)
    assert files["machines/laptop/notes/d1/note-001.md"] == "changed text\n"
    assert files["machines/laptop/notes/d3/added.md"] == "added text\n"
    assert "machines/laptop/notes/d2/note-002.md" not in files and len(files) == 22
    assert report["pull"]["written"] == 2 and report["pull"]["removed"] == 1

    report, told = sync_in_process(cfg)  # no change: one round trip after the hello
    assert report["round_trips"] == 2 and report["pull"]["written"] == 0
    assert all(s["status"] == "unchanged" for s in report["sources"])


def test_version_3_still_pulls_a_namespace_the_server_changed(tmp_path, sshd):
    # The server refuses a file the client took (its file limit is lower): the namespace it
    # holds is not the client's snapshot, so the pull sends it as usual and the cache does
    # not take the refused file.
    home = tmp_path / "h"
    notes = make_memories(home, files=3)
    command = [sys.executable, str(LAUNCHER), "serve", "--store", str(sshd.store),
               "--limit", "file_bytes=1000"]
    cfg = config_for(tmp_path, home, "laptop",
                     sshd.transport(pinned=False, remote_command=command))
    assert sync_in_process(cfg)[0]["status"] == "ok"
    (notes / "d0" / "note-000.md").write_text("changed\n", encoding="utf-8")
    (notes / "d1" / "big.md").write_text("x" * 2000, encoding="utf-8")
    report, told = sync_in_process(cfg)
    assert report["status"] == "partial", report
    assert [r["reason"] for r in report["sources"][1]["refused"]] == ["too-large"]
    assert "cache: 1 files pulled" in told  # note-000.md, as the server holds it
    files = cache_files(tmp_path / "laptop" / "cache")
    assert files["machines/laptop/notes/d0/note-000.md"] == "changed\n"
    assert "machines/laptop/notes/d1/big.md" not in files


def test_version_3_answers_a_need_between_pipelined_manifests(tmp_path):
    # The server forgot the codex namespace: its delta is stale, the whole manifest goes, and
    # the bodies (not sent ahead: the client thought the server had them) are named in need,
    # while the notes manifest, the pull and the note wait on the server's side.
    notes, store, cfg = local_laptop(tmp_path, files=4)
    sync_in_process(cfg)
    with Store.open(store) as s:
        s.forget("laptop", "codex")
    (notes / "d1" / "note-001.md").write_text("changed while codex was away\n", encoding="utf-8")
    from sharedmem.client import config as config_mod
    from sharedmem.client.outbox import Outbox
    Outbox(config_mod.load(cfg).state / "outbox").put("2026-01-01T00-00-00-piped.md",
                                                       "a note while pipelining")
    report, told = sync_in_process(cfg)
    assert report["status"] == "ok", report
    assert [s["status"] for s in report["sources"]] == ["published", "published"]
    assert report["round_trips"] == 4  # hello; pipeline; whole manifest; bodies and commit
    files = cache_files(tmp_path / "laptop" / "cache")
    assert files["machines/laptop/codex/MEMORY.md"] == "# Memory\n- build with uv\n"
    assert files["machines/laptop/notes/d1/note-001.md"] == "changed while codex was away\n"
    assert report["notes"]["delivered"] == 1
    assert "extensions/ad_hoc/notes/2026-01-01T00-00-00-piped.md" in files
    with Store.open(store) as s:
        assert s.verify() == [] and "machines/laptop/codex/MEMORY.md" in s.manifest()


def test_version_2_session_is_unchanged_and_echoes_a_delta(tmp_path):
    notes, _, cfg = local_laptop(tmp_path, files=3)
    report, _ = sync_in_process(cfg, max_version=2)
    assert report["protocol"] == 2 and report["status"] == "ok"
    (notes / "d1" / "note-001.md").write_text("v2 change\n", encoding="utf-8")
    report, told = sync_in_process(cfg, max_version=2)
    assert report["status"] == "ok" and "cache: 1 files pulled" in told
    # hello; per source its manifest, then its commit; then the pull, after the last result
    assert report["round_trips"] == 5
    files = cache_files(tmp_path / "laptop" / "cache")
    assert files["machines/laptop/notes/d1/note-001.md"] == "v2 change\n"


def test_a_first_sync_names_the_bodies_it_sent_ahead_by_their_place(tmp_path):
    # Version 3: the manifest names each body sent ahead by its place among them, not by its
    # sha256 (64 hex digits an entry, more than all else the entry and its text cost here).
    notes, _, cfg = local_laptop(tmp_path, files=400)
    report, _ = sync_in_process(cfg)
    assert report["status"] == "ok" and report["protocol"] == 3, report
    files = [p for p in notes.rglob("*.md")]
    texts = sum(len(p.read_bytes()) + len(str(p.relative_to(notes))) for p in files)
    assert report["bytes"]["sent"] - texts < 64 * len(files), report["bytes"]


def test_version_3_answers_a_need_with_raw_texts(tmp_path):
    # The bodies answering a need go as raw UTF-8 after their line: a text JSON would escape
    # to twice its size (quotes, backslashes) costs its own size on the wire.
    notes, store, cfg = local_laptop(tmp_path, files=2)
    text = '# Memory\n' + '"quoted\\" ' * 2_000 + "\n"  # 20,010 bytes, 40,000 more in JSON
    (tmp_path / "h" / ".codex" / "memories" / "MEMORY.md").write_text(text, encoding="utf-8")
    sync_in_process(cfg)
    with Store.open(store) as s:
        s.forget("laptop", "codex")  # unchanged here, so not sent ahead: named in need
    report, _ = sync_in_process(cfg)
    assert report["status"] == "ok" and report["protocol"] == 3, report
    assert report["round_trips"] == 4  # hello; pipeline; whole manifest; bodies and commit
    assert report["bytes"]["sent"] < 25_000
    with Store.open(store) as s:
        assert {p: t for p, _, t in s.export()}["machines/laptop/codex/MEMORY.md"] == text
    assert cache_files(tmp_path / "laptop" / "cache")["machines/laptop/codex/MEMORY.md"] == text


@pytest.mark.parametrize("files", [20, 600])  # 600: the files are stat'ed by a helper
def test_the_cache_is_checked_after_the_manifests_are_sent(tmp_path, files):
    # The check of the cache's files needs no answer, and neither do the manifests: they go
    # first, so the server commits them while the files are compared; the pull, which names
    # what the check found, goes after it. A file edited by hand is still written again.
    notes, _, cfg = local_laptop(tmp_path, files=files)
    assert sync_in_process(cfg)[0]["status"] == "ok"
    cached = tmp_path / "laptop" / "cache" / "machines" / "laptop" / "notes" / "d3" / "note-003.md"
    kept = cached.read_text()
    cached.write_text("edited by hand\n")
    report, told = sync_in_process(cfg)
    assert report["status"] == "ok" and cached.read_text() == kept
    walked = next(i for i, line in enumerate(told) if line.startswith("notes: "))
    checked = next(i for i, line in enumerate(told) if "not as last written" in line)
    assert walked < checked, told


def test_a_sync_loads_no_typing_and_one_without_change_no_hashlib(tmp_path):
    # Every sync starts a fresh interpreter: typing, the NamedTuple classes it makes, and
    # hashlib (OpenSSL) each cost that start time (docs/BENCHMARKS.md). A sync that changed
    # nothing hashes nothing.
    _, _, cfg = local_laptop(tmp_path)
    probe = (
        "import sys\n"
        f"sys.path.insert(0, {str(LAUNCHER.parent)!r})\n"
        "from sharedmem.cli.main import main\n"
        f"code = main(['sync', '--config', {str(cfg)!r}])\n"
        "sys.stderr.write(repr((code, 'typing' in sys.modules, 'hashlib' in sys.modules)))\n")
    for hashed in (True, False):  # a first sync, then one that finds nothing changed
        run = subprocess.run([sys.executable, "-S", "-c", probe], capture_output=True, text=True,
                             check=True)
        assert run.stderr.splitlines()[-1] == repr((0, False, hashed)), run.stderr[-2000:]


def test_a_sync_runs_with_the_cycle_collector_paused_and_restores_it(tmp_path):
    # Its record and snapshot are tens of thousands of objects that each collection walks
    # (docs/BENCHMARKS.md); reference counting frees what the run drops.
    notes, _, cfg = local_laptop(tmp_path, files=3000)
    assert sync_in_process(cfg)[0]["status"] == "ok"
    for path in sorted(notes.rglob("*.md"))[::50]:  # 1% changed: each read, hashed, sent
        path.write_text(path.read_text() + "appended\n")
    (report, _), collections = collections_in(lambda: sync_in_process(cfg))
    published = {s["source"]: s["status"] for s in report["sources"]}
    assert report["status"] == "ok" and published == {"codex": "unchanged", "notes": "published"}
    assert collections == []


@pytest.mark.parametrize("version", ["3", "2"])
def test_manifests_name_no_modification_time(tmp_path: Path, version: str) -> None:
    # The server stores mtime_ns and reads it for nothing; the real times were a third of a
    # first sync's manifest on the wire (docs/PROTOCOL.md "Version 2").
    home = tmp_path / "laptop-home"
    notes = make_memories(home, files=6)
    store = tmp_path / "server" / "store.sqlite3"
    cfg = config_for(tmp_path, home, "laptop", {"kind": "local", "store": str(store)})
    assert sync_json(cfg, "--max-protocol", version)[0] == 0
    (notes / "later.md").write_text("# later\n", encoding="utf-8")  # and a delta
    assert sync_json(cfg, "--max-protocol", version)[0] == 0
    with sqlite3.connect(store) as conn:
        assert conn.execute("SELECT max(mtime_ns) FROM files").fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM files").fetchone()[0] > 6


BUSY_FIRST = r"""
import os, sys
count = sys.argv[1]
seen = int(open(count).read()) if os.path.exists(count) else 0
open(count, "w").write(str(seen + 1))
if seen < int(sys.argv[2]):  # as `serve` does when its store runs all the sessions it takes
    sys.stdin.readline()
    sys.stdout.write('{"type": "error", "code": "busy", "message": "the server is busy"}\n')
    sys.exit(0)
os.execv(sys.executable, [sys.executable, *sys.argv[3:]])
"""


@pytest.mark.parametrize("turned_away,retries,code", [(2, 4, 0), (3, 2, 2)])
def test_a_session_the_server_turns_away_as_busy_is_tried_again(
        tmp_path, sshd, turned_away, retries, code):
    home = tmp_path / "h"
    make_memories(home, files=3)
    script, count = tmp_path / "busy_first.py", tmp_path / "sessions"
    script.write_text(BUSY_FIRST)
    store = tmp_path / "store.sqlite3"
    command = [sys.executable, str(script), str(count), str(turned_away), str(LAUNCHER), "serve",
               "--store", str(store)]
    cfg = config_for(tmp_path, home, "laptop",
                     sshd.transport(pinned=False, remote_command=command))
    raw = json.loads(cfg.read_text())
    raw["timeouts"] = {"busy_retries": retries}
    cfg.write_text(json.dumps(raw))
    done = run_cli("sync", "--config", str(cfg))
    assert done.returncode == code, done.stderr
    assert int(count.read_text()) == min(turned_away, retries) + 1
    assert done.stderr.count("the server is busy; trying again in") == min(turned_away, retries)
    if code:
        assert "busy" in done.stderr.splitlines()[-1]
    else:
        assert "machines/laptop/notes/d0/note-000.md" in cache_files(tmp_path / "laptop" / "cache")

