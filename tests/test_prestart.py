"""Starting ssh before the program loads: adopted only for the very same command, else stopped."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from conftest import write_config

from sharedmem import cli, prestart
from sharedmem import config as config_mod
from sharedmem.transport import Connection, ssh_command


@pytest.fixture(autouse=True)
def nothing_left_started():
    yield
    prestart.discard()


def ssh_config(tmp_path: Path, sshd, **transport) -> Path:
    return write_config(tmp_path / "client.json", "laptop", {**sshd.transport(), **transport}, [],
                        tmp_path / "cache")


def test_the_early_ssh_is_adopted_and_speaks_to_serve(tmp_path, sshd):
    cfg = ssh_config(tmp_path, sshd)
    prestart.start(str(cfg))
    assert prestart._started is not None
    early = prestart._started[1]
    config = config_mod.load(cfg)
    assert prestart._started[0] == ssh_command(config.transport)
    with Connection(config) as conn:
        assert conn.process is early
        assert conn.hello()["version"] == 2
    assert prestart._started is None


def test_a_different_command_stops_the_early_one(tmp_path, sshd):
    cfg = ssh_config(tmp_path, sshd)
    prestart.start(str(cfg))
    early = prestart._started[1]
    assert prestart.take(["ssh", "somewhere-else"]) is None
    assert early.poll() is not None  # stopped, not left running
    assert prestart._started is None


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
    prestart.start(str(cfg))
    assert prestart._started is None


def test_unreadable_config_starts_nothing(tmp_path):
    prestart.start(str(tmp_path / "missing.json"))
    (tmp_path / "bad.json").write_text("{not json")
    prestart.start(str(tmp_path / "bad.json"))
    assert prestart._started is None


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
    prestart.start(str(cfg))
    assert len(ssh_children(wait_for=1)) == 1  # what cli.main does first, seen from outside
    prestart.discard()
    assert ssh_children() == []

    assert cli.main(["sync", "--config", str(cfg)]) == 2
    assert "sources must be a list" in capsys.readouterr().err
    assert ssh_children() == [] and prestart._started is None
