"""Starting ssh before the program loads: adopted only for the very same command, else stopped."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
from conftest import Sshd, run_cli, write_config

from sharedmem.cli import main as cli
from sharedmem.client import config as config_mod
from sharedmem.client import early_ssh
from sharedmem.client.transport import Connection, ssh_command


@pytest.fixture(autouse=True)
def nothing_left_started():
    yield
    early_ssh.discard()


def ssh_config(tmp_path: Path, sshd, **transport) -> Path:
    return write_config(tmp_path / "client.json", "laptop", {**sshd.transport(), **transport}, [],
                        tmp_path / "cache")


def test_the_early_ssh_is_adopted_and_speaks_to_serve(tmp_path, sshd):
    cfg = ssh_config(tmp_path, sshd)
    early_ssh.start(str(cfg))
    assert early_ssh._started is not None
    early = early_ssh._started[1]
    config = config_mod.load(cfg)
    assert early_ssh._started[0] == ssh_command(config.transport)
    with Connection(config) as conn:
        assert conn.process is early
        assert conn.hello()["version"] == 3
    assert early_ssh._started is None


def test_a_different_command_stops_the_early_one(tmp_path, sshd):
    cfg = ssh_config(tmp_path, sshd)
    early_ssh.start(str(cfg))
    early = early_ssh._started[1]
    assert early_ssh.take(["ssh", "somewhere-else"]) is None
    assert early.poll() is not None  # stopped, not left running
    assert early_ssh._started is None


@pytest.mark.parametrize("transport", [
    {"kind": "local", "store": "/tmp/store.sqlite3"},
    {"identity": "~/.ssh/id_ed25519"},  # expanded by the configuration, so left to it
    {"identity": "keys/../id"},
    {"identity": "$HOME/id"},
    {"remote_command": "serve"},
    {"host": 7},
])
def test_anything_not_plainly_ssh_is_left_to_the_validated_path(tmp_path, transport):
    plain = {"kind": "ssh", "host": "me@127.0.0.1", "port": 1, "options": [],
             "identity": str(tmp_path / "key"), "remote_command": ["serve"]}
    cfg = write_config(tmp_path / "client.json", "laptop", {**plain, **transport}, [],
                       tmp_path / "cache")
    early_ssh.start(str(cfg))
    assert early_ssh._started is None


def test_unreadable_config_starts_nothing(tmp_path):
    early_ssh.start(str(tmp_path / "missing.json"))
    (tmp_path / "bad.json").write_text("{not json")
    early_ssh.start(str(tmp_path / "bad.json"))
    assert early_ssh._started is None


def ssh_children(wait_for: int = 0) -> list[str]:
    """This test process's children running ssh (Linux /proc), once `wait_for` of them exec'd."""
    deadline = time.monotonic() + 5
    while True:
        out = []
        for task in Path(f"/proc/{os.getpid()}/task").iterdir():
            for pid in (task / "children").read_text().split():
                try:
                    if Path(os.readlink(f"/proc/{pid}/exe")).name == "ssh":
                        out.append(pid)
                except OSError:
                    pass
        if len(out) >= wait_for or time.monotonic() > deadline:
            return out
        time.sleep(0.01)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
def test_a_sync_that_fails_validation_stops_its_early_ssh(tmp_path, sshd, capsys):
    cfg = ssh_config(tmp_path, sshd)
    raw = json.loads(cfg.read_text())
    raw["sources"] = "not a list"  # invalid, but the transport is fine: ssh starts early
    cfg.write_text(json.dumps(raw))
    early_ssh.start(str(cfg))
    assert len(ssh_children(wait_for=1)) == 1  # what cli.main does first, seen from outside
    early_ssh.discard()
    assert ssh_children() == []

    assert cli.main(["sync", "--config", str(cfg)]) == 2
    assert "sources must be a list" in capsys.readouterr().err
    assert ssh_children() == [] and early_ssh._started is None


def test_quote_is_shlex_quote() -> None:
    import random
    import shlex
    rng = random.Random(3)
    alphabet = "aZ09_@%+=:,./-~ '\"$`\\!*?;&|<>()[]{}#\t\né\u00a0日"
    words = ["", "'", "''", "plain", "with space", "a'b"] + [
        "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12))) for _ in range(2000)]
    for word in words:
        assert early_ssh.quote(word) == shlex.quote(word), word


def write_malformed(tmp_path: Path, sshd: Sshd) -> Path:
    """A client.json with an ssh transport and one comma missing."""
    cfg = ssh_config(tmp_path, sshd)
    text = cfg.read_text()
    broken = text.replace('",', '"', 1)
    assert broken != text
    cfg.write_text(broken)
    return cfg


def test_a_malformed_client_json_is_a_configuration_error_for_sync(
        tmp_path: Path, sshd: Sshd, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = write_malformed(tmp_path, sshd)
    assert cli.main(["sync", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert f"configuration {cfg} is not valid JSON (line " in err and "delimiter" in err
    assert early_ssh._started is None


def test_a_malformed_client_json_fails_sync_as_it_fails_status(tmp_path: Path, sshd: Sshd) -> None:
    """In a fresh process `json` is not loaded when the early start reads client.json: there
    Python 3.11's C scanner crashed it with a SystemError (exit 1) instead of the error."""
    cfg = write_malformed(tmp_path, sshd)
    status = run_cli("status", "--config", str(cfg))
    sync = run_cli("sync", "--config", str(cfg))
    assert status.returncode == sync.returncode == 2, sync.stderr
    assert sync.stderr == status.stderr.replace("shared_memory.py status:", "shared_memory.py sync:")
    assert "is not valid JSON" in sync.stderr and "Traceback" not in sync.stderr


@pytest.mark.skipif(not hasattr(os, "posix_spawnp"), reason="no posix_spawn here")
def test_a_spawned_child_has_pipes_a_session_and_can_be_waited_for_and_killed() -> None:
    import subprocess
    echo = early_ssh.Spawned(["sh", "-c", 'read line; echo "got $line"; echo oops >&2'])
    assert os.getsid(echo.pid) == echo.pid  # a session of its own, as start_new_session gives
    echo.stdin.write(b"hello\n")
    echo.stdin.close()
    assert echo.stdout.read() == b"got hello\n" and echo.stderr.read() == b"oops\n"
    assert echo.wait(timeout=30) == 0 and echo.poll() == 0
    sleeper = early_ssh.Spawned(["sleep", "30"])
    assert sleeper.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        sleeper.wait(timeout=0.05)
    sleeper.kill()
    assert sleeper.wait() == -9
    sleeper.kill()  # reaped: nothing to kill, and no error
    for stream in (echo.stdout, echo.stderr, sleeper.stdin, sleeper.stdout, sleeper.stderr):
        stream.close()


def test_the_early_ssh_is_started_without_subprocess_where_it_can_be(tmp_path, sshd):
    early_ssh.start(str(ssh_config(tmp_path, sshd)))
    assert early_ssh._started is not None
    expected = early_ssh.Spawned if hasattr(os, "posix_spawnp") else __import__("subprocess").Popen
    assert isinstance(early_ssh._started[1], expected)


@pytest.mark.skipif(not hasattr(os, "posix_spawnp"), reason="no posix_spawn here")
def test_a_spawned_child_reaped_elsewhere_counts_as_ended() -> None:
    child = early_ssh.Spawned(["true"])
    os.waitpid(child.pid, 0)  # as a SIGCHLD handler or another waiter would
    assert child.poll() == 0 and child.wait() == 0
    for stream in (child.stdin, child.stdout, child.stderr):
        stream.close()


def test_an_early_ssh_a_busy_server_resets_is_followed_by_a_fresh_one(tmp_path, busy_sshd):
    """sshd past MaxStartups resets the ssh started early: the connection starts another."""
    cfg = ssh_config(tmp_path, busy_sshd)
    held = busy_sshd.hold_startup()
    before = busy_sshd.dropped()
    early_ssh.start(str(cfg))
    early = early_ssh._started[1]
    timer = threading.Timer(1.0, held.close)
    timer.start()
    try:
        with Connection(config_mod.load(cfg)) as conn:
            assert conn.hello()["version"] == 3
            assert conn.process is not early
    finally:
        timer.join()
    assert early.poll() == 255 and early_ssh._started is None
    assert busy_sshd.dropped() > before
