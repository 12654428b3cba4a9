"""`doctor` against real setups in a temporary HOME: a real store, real sync, real MCP children."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import LAUNCHER, run_cli, write_config

from sharedmem.cli.doctor import FAIL, OK, WARN, doctor, doctor_store, format_text
from sharedmem.client import config as config_mod
from sharedmem.client import note
from sharedmem.client import sync as client
from sharedmem.install import guidance, harnesses
from sharedmem.server import backup


def make_client(tmp_path: Path, home: Path, transport: dict | None = None) -> tuple[Path, dict]:
    """A synced client with codex and claude-code registered and guided, as the installer does."""
    memories = home / ".codex" / "memories"
    (memories / "rollout_summaries").mkdir(parents=True)
    (memories / "MEMORY.md").write_text("# Memory\n- build with uv, café\n", encoding="utf-8")
    (memories / "rollout_summaries" / "r1.md").write_text("rollout\n", encoding="utf-8")
    (memories / ".hidden.md").write_text("hidden\n", encoding="utf-8")
    (home / ".claude").mkdir()
    base = tmp_path / "client"
    cfg = write_config(base / "client.json", "laptop",
                       transport or {"kind": "local", "store": str(base / "store.sqlite3")},
                       [{"name": "codex", "kind": "codex", "path": str(memories)}],
                       base / "cache")
    env = dict(os.environ, HOME=str(home))
    loaded = config_mod.load(cfg, env)
    report = client.sync(loaded)
    assert report["status"] == "ok", report
    command = [sys.executable, str(LAUNCHER), "mcp", "--config", str(cfg)]
    for name in ("codex", "claude-code"):
        harnesses.register(name, command, env)
        guidance.add_guidance(name, loaded.cache, env)
    return cfg, env


def by_name(report: object) -> dict:
    return {c.name: c for c in report.checks}  # type: ignore[attr-defined]


def test_good_local_setup_passes(tmp_path: Path, home: Path) -> None:
    cfg, env = make_client(tmp_path, home)
    report = doctor(cfg, env)
    checks = by_name(report)
    assert report.exit_code == 0, format_text(report)
    assert report.failed() == []
    for name in ("config", "source codex", "transport", "server", "cache", "registration codex",
                 "mcp codex", "guidance codex", "registration claude-code", "mcp claude-code",
                 "guidance claude-code"):
        assert checks[name].status == OK, (name, checks[name])
    assert checks["schedule"].status in (OK, WARN)
    assert checks["source codex"].details["files"] == 2
    assert [(s["path"], s["reason"]) for s in checks["source codex"].details["skipped"]] == [
        (".hidden.md", "hidden")]
    assert checks["server"].details["counts"]["files"] == 2
    text = format_text(report)
    assert "all good" in text and "mcp claude-code" in text
    assert json.loads(json.dumps(report.to_json()))["exit_code"] == 0


def test_ssh_setup_passes_then_names_transport_when_sshd_stops(tmp_path: Path, home: Path,
                                                               sshd: object) -> None:
    cfg, env = make_client(tmp_path, home, sshd.transport())  # type: ignore[attr-defined]
    report = doctor(cfg, env)
    assert report.exit_code == 0, format_text(report)
    assert by_name(report)["server"].details["protocol"] == 3
    sshd.stop()  # type: ignore[attr-defined]
    report = doctor(cfg, env)
    assert report.exit_code == 1
    assert report.failed() == ["transport"]
    transport = by_name(report)["transport"]
    assert "cannot reach" in transport.message and transport.fix
    assert "server" not in by_name(report)
    assert by_name(report)["mcp codex"].status == OK  # the cache still serves agents offline


def test_deleted_cache_fails(tmp_path: Path, home: Path) -> None:
    cfg, env = make_client(tmp_path, home)
    shutil.rmtree(tmp_path / "client" / "cache")
    report = doctor(cfg, env)
    assert report.exit_code == 1
    assert "cache" in report.failed()
    assert "missing" in by_name(report)["cache"].message
    assert "fail  cache" in format_text(report)


@pytest.mark.parametrize(("age", "status"), [(3600, WARN), (3 * 86400, FAIL)])
def test_old_cache_warns_then_fails(tmp_path: Path, home: Path, age: int, status: str) -> None:
    cfg, env = make_client(tmp_path, home)
    manifest = tmp_path / "client" / "cache" / ".sharedmem" / "manifest.sqlite3"
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - age))
    with contextlib.closing(sqlite3.connect(manifest)) as conn, conn:
        conn.execute("UPDATE meta SET value=? WHERE key='last_sync'", (stamp,))
    assert by_name(doctor(cfg, env))["cache"].status == status


def test_corrupt_harness_file_fails_naming_it(tmp_path: Path, home: Path) -> None:
    cfg, env = make_client(tmp_path, home)
    broken = home / ".claude.json"
    broken.write_text('{"mcpServers": {', encoding="utf-8")
    report = doctor(cfg, env)
    assert report.exit_code == 1
    assert report.failed() == ["registration claude-code"]
    assert str(broken) in by_name(report)["registration claude-code"].message
    assert by_name(report)["mcp codex"].status == OK


def test_registered_command_pointing_to_missing_file_fails(tmp_path: Path, home: Path) -> None:
    cfg, env = make_client(tmp_path, home)
    gone = tmp_path / "old-prefix" / "shared_memory.py"
    harnesses.register("codex", [sys.executable, str(gone), "mcp", "--config", str(cfg)], env)
    report = doctor(cfg, env)
    assert report.exit_code == 1
    assert report.failed() == ["mcp codex"]
    check = by_name(report)["mcp codex"]
    assert str(gone) in check.message and "install_client.py" in check.fix


def test_mcp_server_that_dies_at_start_fails(tmp_path: Path, home: Path) -> None:
    cfg, env = make_client(tmp_path, home)
    harnesses.register("claude-code", [sys.executable, "-c",
                                       "import sys; sys.stderr.write('boom at start'); "
                                       "sys.exit(3)"], env)
    report = doctor(cfg, env)
    assert report.failed() == ["mcp claude-code"]
    assert "boom at start" in by_name(report)["mcp claude-code"].message


def test_registration_for_another_config_and_missing_ones_warn(tmp_path: Path,
                                                               home: Path) -> None:
    cfg, env = make_client(tmp_path, home)
    other = write_config(tmp_path / "other" / "client.json", "laptop",
                         {"kind": "local", "store": str(tmp_path / "other" / "s.sqlite3")}, [],
                         tmp_path / "other" / "cache")
    harnesses.register("codex", [sys.executable, str(LAUNCHER), "mcp", "--config", str(other)],
                       env)
    (home / ".cursor").mkdir()
    (home / ".claude" / "CLAUDE.md").write_text("# my rules\n", encoding="utf-8")
    checks = by_name(doctor(cfg, env))
    assert checks["registration codex"].status == WARN
    assert str(other) in checks["registration codex"].message
    assert checks["registration cursor"].status == WARN
    assert checks["guidance claude-code"].status == WARN


def test_invalid_config_fails_but_harnesses_are_still_checked(tmp_path: Path,
                                                              home: Path) -> None:
    cfg, env = make_client(tmp_path, home)
    cfg.write_text("{not json", encoding="utf-8")
    report = doctor(cfg, env)
    assert report.failed()[0] == "config"
    assert "not valid JSON" in by_name(report)["config"].message
    assert "transport" not in by_name(report)
    assert "mcp codex" in by_name(report)


def test_doctor_store_checks_store_schema_and_backups(tmp_path: Path, home: Path) -> None:
    make_client(tmp_path, home)
    store = tmp_path / "client" / "store.sqlite3"
    report = doctor_store(store)
    checks = by_name(report)
    assert checks["store"].status == OK and checks["schema"].status == OK
    assert checks["backups"].status == WARN and report.exit_code == 0
    backup.create(store)
    checks = by_name(doctor_store(store))
    assert checks["backups"].status == OK and checks["backups"].details["count"] == 1
    assert checks["store"].details["counts"]["files"] == 2


def test_doctor_store_fails_on_missing_or_corrupt_store(tmp_path: Path) -> None:
    report = doctor_store(tmp_path / "nope.sqlite3")
    assert report.failed() == ["store"] and report.exit_code == 1
    junk = tmp_path / "junk.sqlite3"
    junk.write_bytes(b"this is not a database\n" * 200)
    report = doctor_store(junk)
    assert report.failed() == ["store"]
    assert "cannot be read as SQLite" in by_name(report)["store"].message


def test_doctor_through_the_launcher(tmp_path: Path, home: Path) -> None:
    if run_cli("doctor", "--help").returncode != 0:
        pytest.skip("doctor is not wired into the CLI yet")
    cfg, env = make_client(tmp_path, home)
    proc = run_cli("doctor", "--config", str(cfg), "--json", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["exit_code"] == 0
    shutil.rmtree(tmp_path / "client" / "cache")
    proc = run_cli("doctor", "--config", str(cfg), env=env)
    assert proc.returncode != 0
    assert "cache" in proc.stdout and "missing" in proc.stdout
    store = run_cli("doctor", "--store", str(tmp_path / "client" / "store.sqlite3"), "--json",
                    env=env)
    assert store.returncode == 0, store.stderr
    assert {c["name"] for c in json.loads(store.stdout)["checks"]} >= {"store", "backups"}


def test_no_harness_at_all_warns_once(tmp_path: Path, home: Path) -> None:
    cfg, env = make_client(tmp_path, home)
    for name in (".codex", ".claude", ".claude.json"):
        shutil.rmtree(home / name) if (home / name).is_dir() else (home / name).unlink()
    checks = by_name(doctor(cfg, env))
    assert checks["registrations"].status == WARN
    assert not any(name.startswith(("mcp ", "registration ")) for name in checks)


def test_rewritten_note_history_fails_server_and_store(tmp_path: Path, home: Path) -> None:
    cfg, env = make_client(tmp_path, home)
    loaded = config_mod.load(cfg, env)
    assert note.submit_note(loaded, "2026-01-02T03-04-05-decision.md",
                            "we ship on fridays")["status"] == "stored"
    store = tmp_path / "client" / "store.sqlite3"
    with sqlite3.connect(store) as conn:  # someone edits the history behind the store's back
        conn.execute("DROP TRIGGER notes_append_only_update")
        conn.execute("UPDATE notes SET body = 'we never ship on fridays'")
    conn.close()
    report = doctor(cfg, env)
    assert report.failed() == ["server"]
    assert "note chain broken" in by_name(report)["server"].message
    assert doctor_store(store).failed() == ["store"]


@pytest.mark.parametrize(("program", "gone"), [
    ("{tmp}/venv/bin/python3", "no longer exists"),
    ("{tmp}/.pyenv/versions/3.12.1/bin/python3.12", "no longer exists"),
    ("python3.99-not-installed", "is not on PATH"),
])
def test_a_registered_interpreter_that_is_gone_names_the_fix(tmp_path: Path, home: Path,
                                                            program: str, gone: str) -> None:
    cfg, env = make_client(tmp_path, home)
    program = program.format(tmp=tmp_path)
    harnesses.register("codex", [program, str(LAUNCHER), "mcp", "--config", str(cfg)], env)
    report = doctor(cfg, env)
    assert report.failed() == ["mcp codex"]
    check = by_name(report)["mcp codex"]
    assert check.message == (f"interpreter {program} registered for codex {gone}: re-run "
                             "install_client.py")
    assert "--python PATH" in check.fix
    assert by_name(report)["mcp claude-code"].status == OK


def v1_store(path: Path) -> Path:
    """The version-1 fixture: a store from before the lifecycle of bodies, with one orphan."""
    conn = sqlite3.connect(path)
    fixture = Path(__file__).resolve().parent / "fixtures" / "store-v1.sql"
    conn.executescript(fixture.read_text(encoding="utf-8"))
    conn.execute("PRAGMA user_version=1")
    conn.close()
    return path


def test_doctor_store_names_orphan_bodies_and_repair_collects_them(tmp_path: Path) -> None:
    store = v1_store(tmp_path / "store.sqlite3")
    before = store.read_bytes()
    checks = by_name(doctor_store(store))
    assert checks["bodies"].status == WARN and checks["bodies"].details["orphans"] == 1
    assert f"doctor --store {store} --repair" in checks["bodies"].fix
    assert store.read_bytes() == before  # without --repair: read-only
    report = doctor_store(store, repair=True)
    checks = by_name(report)
    assert report.exit_code == 0, format_text(report)
    assert checks["repair"].status == OK and checks["repair"].details["bodies"] == 1
    assert checks["schema"].status == OK  # migrated first, after a backup
    assert [i.label for i in backup.catalog.list_backups(tmp_path / "backups")] == [
        "pre-migrate-v1"]
    assert checks["bodies"].status == OK and checks["bodies"].details["unused"] == 0
    assert checks["store"].details["counts"]["files"] == 7


def test_doctor_store_counts_the_bodies_a_live_session_stored_ahead(tmp_path: Path) -> None:
    """Claimed as a run of rowids or a row each, both count as a running session's."""
    store = tmp_path / "store.sqlite3"
    from sharedmem.server.store import Store
    with Store.open(store) as s:
        s.put_blobs([(c * 64, 3, b"abc") for c in "ab"])  # new: one run
        s.put_blobs([(c * 64, 3, b"abc") for c in "bc"])  # b was there: a claim; c a run
        assert s.conn.execute("SELECT count(*) FROM stored_ahead").fetchone()[0] == 2
        checks = by_name(doctor_store(store))  # while this process, the session, runs
    assert checks["bodies"].status == OK, checks["bodies"].message
    assert checks["bodies"].details["claimed"] == 3 and checks["bodies"].details["orphans"] == 0
    assert "3 claimed by running sessions" in checks["bodies"].message


def test_doctor_repair_never_writes_a_store_that_fails_its_checks(tmp_path: Path) -> None:
    store = tmp_path / "store.sqlite3"
    from sharedmem.server.store import Store
    with Store.open(store) as s:
        s.append_note("m1", "2026-01-02T03-04-05-decision.md", "we ship on fridays")
        s.put_blobs([("a" * 64, 3, b"abc")])  # an orphan, after its session is taken for dead
        s.conn.execute("UPDATE sessions SET seen_at = 0")
    with sqlite3.connect(store) as conn:
        conn.execute("DROP TRIGGER notes_append_only_update")
        conn.execute("UPDATE notes SET body = 'rewritten'")
    conn.close()
    report = doctor_store(store, repair=True)
    assert "repair" in report.failed() and "note chain broken" in by_name(report)["repair"].message
    with sqlite3.connect(store) as conn:
        assert conn.execute("SELECT count(*) FROM blobs").fetchone()[0] == 1
    conn.close()


def test_doctor_repair_needs_a_store(tmp_path: Path, home: Path) -> None:
    proc = run_cli("doctor", "--config", str(tmp_path / "client.json"), "--repair")
    assert proc.returncode == 2 and proc.stdout == ""
    assert "--repair works on a server's store: pass --store PATH" in proc.stderr


@pytest.mark.parametrize("where", ["gone", "too long"])
def test_ssh_reuse_whose_socket_cannot_be_made_fails_naming_the_fix(tmp_path: Path, home: Path,
                                                                   sshd: object,
                                                                   where: str) -> None:
    from sharedmem.install import ssh_reuse
    short = Path(tempfile.mkdtemp(prefix="smd-", dir="/tmp"))
    try:
        folder = short / "gone" if where == "gone" else tmp_path / ("x" * 60)
        transport = sshd.transport()  # type: ignore[attr-defined]
        transport["options"] += ssh_reuse.options(folder)
        cfg = write_config(tmp_path / "client.json", "laptop", transport, [],
                           tmp_path / "cache")
        report = doctor(cfg, dict(os.environ, HOME=str(home)))
        checks = by_name(report)
        assert checks["transport"].status == FAIL  # ssh itself cannot make the socket
        assert checks["ssh reuse"].status == FAIL
        needle = (f"the socket's folder {folder} does not exist" if where == "gone"
                  else "is too long for a Unix socket")
        assert needle in checks["ssh reuse"].message
        assert "re-run install_client.py" in checks["ssh reuse"].fix
    finally:
        shutil.rmtree(short, ignore_errors=True)


def test_ssh_transport_without_reuse_says_it_is_off(tmp_path: Path, home: Path,
                                                    sshd: object) -> None:
    cfg, env = make_client(tmp_path, home, sshd.transport())  # type: ignore[attr-defined]
    check = by_name(doctor(cfg, env))["ssh reuse"]
    assert check.status == OK and check.message.startswith("off: each sync opens its own")
    assert check.details == {"configured": False}


@pytest.mark.parametrize("name", ["manifest.sqlite3"])
def test_a_damaged_cache_warns_that_the_next_sync_repairs_it(tmp_path: Path, home: Path,
                                                             name: str) -> None:
    cfg, env = make_client(tmp_path, home)
    (tmp_path / "client" / "cache" / ".sharedmem" / name).write_text("{", encoding="utf-8")
    check = by_name(doctor(cfg, env))["cache"]
    assert check.status == WARN, check
    assert check.message.startswith(f"the cache's manifest in {tmp_path / 'client' / 'cache'} "
                                    "is damaged, so the tools refuse to answer until the next "
                                    "sync repairs it: "), check.message
    assert check.fix.startswith(f"run `shared_memory.py sync --config {cfg}`")
    assert name in check.details["damage"]
    assert client.sync(config_mod.load(cfg, env))["status"] == "ok"
    assert by_name(doctor(cfg, env))["cache"].status == OK


def test_doctor_says_where_each_harness_writes_memory(tmp_path: Path, home: Path) -> None:
    """A Codex version 2 user whose codex source publishes it, and Claude Code memory that no
    source publishes: the first is ok, the second a warning naming the fix."""
    v2 = home / ".codex" / "memories_v2"
    v2.mkdir(parents=True)
    (v2 / "MEMORY.md").write_text("# v2\n", encoding="utf-8")
    (home / ".claude" / "agent-memory" / "reviewer").mkdir(parents=True)
    base = tmp_path / "client"
    cfg = write_config(base / "client.json", "laptop",
                       {"kind": "local", "store": str(base / "store.sqlite3")},
                       [{"name": "codex", "kind": "codex", "path": str(home / ".codex" /
                                                                      "memories")}],
                       base / "cache")
    env = dict(os.environ, HOME=str(home))
    assert client.sync(config_mod.load(cfg, env))["status"] == "ok"
    harnesses.register("codex", [sys.executable, str(LAUNCHER), "mcp", "--config", str(cfg)],
                       env)
    checks = by_name(doctor(cfg, env))
    assert checks["source codex"].status == OK  # its configured folder need not exist
    assert checks["source codex"].message.startswith(f"1 file(s) publishable from {home}")
    memory = checks["memory codex"]
    assert memory.status == OK and "machines/laptop/codex/memories_v2/" in memory.message
    claude = checks["memory claude-code"]
    assert claude.status == WARN and "no claude-code source publishes it" in claude.message
    assert "--source claude-code" in claude.fix
    assert "memory codex" in format_text(doctor(cfg, env))
