"""ssh connection reuse as install_client.py sets it up: against a real sshd on loopback.

The paths under pytest's temporary folder are too long for a Unix socket, so the end-to-end
tests use a short home of their own in /tmp (removed afterwards), and stop every master they
started.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Sshd, run_cli, write_config

from sharedmem.cli.doctor import OK, doctor, format_text
from sharedmem.client import config as config_mod
from sharedmem.clock import SYNC_INTERVAL_SECONDS
from sharedmem.install import ssh_reuse
from sharedmem.install.client_install import client_main

PREFIX = Path(".local/share/codex-shared-memory")


@pytest.fixture
def short_home() -> Iterator[Path]:
    """A home whose path leaves room for a socket in ~/.ssh (pytest's tmp_path does not)."""
    root = Path(tempfile.mkdtemp(prefix="smr-", dir="/tmp"))
    home = root / "h"
    (home / ".codex" / "memories").mkdir(parents=True)
    (home / ".codex" / "memories" / "MEMORY.md").write_text("# Memory\n- reuse ssh\n")
    yield home
    shutil.rmtree(root, ignore_errors=True)


def env_for(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("CODEX_HOME", "CLAUDE_CONFIG_DIR", "XDG_CONFIG_HOME")}
    env.update(HOME=str(home), SHAREDMEM_SCHEDULER_DRYRUN="1")
    return env


def install(home: Path, sshd: Sshd, *extra: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = client_main(["--machine", "laptop", "--ssh-host", f"{sshd.user}@127.0.0.1",
                        "--ssh-port", str(sshd.port), "--ssh-identity", str(sshd.pinned_key),
                        "--ssh-option", f"UserKnownHostsFile={sshd.known_hosts}",
                        "--ssh-option", "GlobalKnownHostsFile=/dev/null",
                        "--ssh-option", "LogLevel=ERROR", "--schedule", "none", "--json",
                        *extra], env_for(home), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def connections(sshd: Sshd) -> int:
    """How many connections sshd accepted (it logs each at INFO: see `log_connections`)."""
    return len(re.findall(r"Accepted publickey for ", sshd.log.read_text()))


def log_connections(sshd: Sshd) -> None:
    """Restart sshd logging at INFO, which names every accepted connection."""
    sshd.stop()
    sshd.config_file.write_text(sshd.config_file.read_text().replace("LogLevel ERROR",
                                                                    "LogLevel INFO"))
    sshd.start()


def sockets(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("sharedmem-*") if stat.S_ISSOCK(p.lstat().st_mode))


def test_syncs_share_one_connection_until_reuse_is_turned_off(sshd: Sshd, short_home: Path):
    log_connections(sshd)
    env = env_for(short_home)
    cfg_path = short_home / PREFIX / "client.json"
    transport = None
    try:
        code, out, err = install(short_home, sshd)
        assert code == 0, err + out
        summary = json.loads(out)
        folder = short_home / ".ssh"  # the state folder's path is too long for a socket
        assert summary["ssh_reuse"] == {
            "on": True, "folder": str(folder), "persist_seconds": 3 * SYNC_INTERVAL_SECONDS,
            "control_path": f"{folder}/sharedmem-%C", "reason": ""}
        assert summary["sync"]["status"] == "ok"
        options = json.loads(cfg_path.read_text())["transport"]["options"]
        assert options[-3:] == ["ControlMaster=auto", f"ControlPath={folder}/sharedmem-%C",
                                f"ControlPersist={3 * SYNC_INTERVAL_SECONDS}"]
        assert 3 * SYNC_INTERVAL_SECONDS > SYNC_INTERVAL_SECONDS
        transport = config_mod.load(cfg_path, env).transport
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        [socket] = sockets(folder)  # the first sync left its connection open
        assert ssh_reuse.check(transport)[0]
        # The install's check connected without reuse (the folder did not exist yet), then the
        # first sync opened the master connection.
        assert connections(sshd) == 2

        (short_home / ".codex" / "memories" / "MEMORY.md").write_text("# Memory\n- again\n")
        synced = run_cli("sync", "--config", str(cfg_path), "--json", env=env)
        assert json.loads(synced.stdout)["status"] == "ok", synced.stderr
        assert connections(sshd) == 2  # the second sync rode the first one's connection
        assert sockets(folder) == [socket]

        effective = ssh_reuse.settings(transport)
        assert (effective["batchmode"], effective["stricthostkeychecking"]) == ("yes", "true")
        assert effective["controlpath"] == str(socket)

        report = doctor(cfg_path, env)
        reuse = {c.name: c for c in report.checks}["ssh reuse"]
        assert reuse.status == OK and reuse.message.startswith("on: Master running"), \
            format_text(report)
        assert connections(sshd) == 2

        code, out, err = install(short_home, sshd, "--no-ssh-reuse")
        assert code == 0, err + out
        summary = json.loads(out)
        assert summary["ssh_reuse"]["on"] is False and summary["ssh_reuse"]["stopped_old"]
        assert summary["ssh_reuse"]["reason"] == "turned off with --no-ssh-reuse"
        options = json.loads(cfg_path.read_text())["transport"]["options"]
        assert not ssh_reuse.own_keys(options)
        assert not ssh_reuse.check(transport)[0] and sockets(folder) == []
        before = connections(sshd)
        synced = run_cli("sync", "--config", str(cfg_path), "--json", env=env)
        assert json.loads(synced.stdout)["status"] == "ok", synced.stderr
        assert connections(sshd) == before + 1 and sockets(folder) == []
        report = doctor(cfg_path, env)
        assert {c.name: c for c in report.checks}["ssh reuse"].message.startswith("off:")
    finally:
        if transport is not None:
            ssh_reuse.stop(transport)


def test_uninstall_closes_the_master_connection(sshd: Sshd, short_home: Path):
    cfg_path = short_home / PREFIX / "client.json"
    transport = None
    try:
        code, out, err = install(short_home, sshd)
        assert code == 0, err + out
        transport = config_mod.load(cfg_path, env_for(short_home)).transport
        assert ssh_reuse.check(transport)[0]
        out, err = io.StringIO(), io.StringIO()
        assert client_main(["--uninstall", "--json"], env_for(short_home), out=out,
                           err=err) == 0, err.getvalue()
        assert json.loads(out.getvalue())["ssh_master_stopped"] is True
        assert not ssh_reuse.check(transport)[0]
        assert sockets(short_home / ".ssh") == []
    finally:
        if transport is not None:
            ssh_reuse.stop(transport)


def test_a_socket_folder_that_cannot_be_made_stops_the_install_before_it_writes(
        sshd: Sshd, short_home: Path):
    (short_home / ".ssh").write_text("a file where the folder would go")
    code, out, err = install(short_home, sshd)
    assert code == 2
    assert f"cannot make {short_home / '.ssh'} for ssh's connection socket" in err
    assert "--no-ssh-reuse" in err
    assert not (short_home / PREFIX / "client.json").exists()


def test_strict_host_key_checking_still_refuses_an_unknown_host(sshd: Sshd, short_home: Path,
                                                                 tmp_path: Path):
    folder = short_home / ".ssh"
    ssh_reuse.prepare(folder)
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    transport = sshd.transport()
    transport["options"] = [f"UserKnownHostsFile={empty}", "GlobalKnownHostsFile=/dev/null",
                            *ssh_reuse.options(folder)]
    cfg = write_config(tmp_path / "client.json", "laptop", transport, [], tmp_path / "cache")
    synced = run_cli("sync", "--config", str(cfg), "--json", env=env_for(short_home))
    assert synced.returncode != 0
    assert "host key" in json.loads(synced.stdout)["error"]
    assert sockets(folder) == []  # no master for a host it could not verify


# --- where the socket goes ---------------------------------------------------------------------

def test_a_socket_path_must_fit_with_openssh_s_temporary_suffix():
    room = ssh_reuse.SUN_PATH_MAX - 1 - len("/sharedmem-") - 40 - ssh_reuse.MUX_SUFFIX
    assert ssh_reuse.fits(Path("/" + "a" * (room - 1)))
    assert not ssh_reuse.fits(Path("/" + "a" * room))


@pytest.mark.parametrize(("state", "home", "given", "wanted", "folder", "reason"), [
    ("/s", "/h", [], True, "/s", ""),
    ("/" + "s" * 60, "/h", [], True, "/h/.ssh", ""),
    ("/" + "s" * 60, "/" + "h" * 60, [], True, None, "103-byte limit"),
    ("/with space", "/h", [], True, "/h/.ssh", ""),
    ("/50%", "/h", [], True, "/h/.ssh", ""),
    ("/s", "/h", [], False, None, "turned off with --no-ssh-reuse"),
    ("/s", "/h", ["controlpath=/mine/%C"], True, None, "your --ssh-option controlpath=/mine/%C"),
    ("/s", "/h", ["ControlMaster=no"], True, None, "your --ssh-option ControlMaster=no decides"),
])
def test_where_the_socket_goes_or_why_reuse_is_off(state, home, given, wanted, folder, reason):
    plan = ssh_reuse.plan(Path(state), {"HOME": home}, given, wanted)
    assert plan.folder == (Path(folder) if folder else None)
    assert reason in plan.reason and bool(plan.reason) == (folder is None)
    assert plan.options == ([] if folder is None else [
        "ControlMaster=auto", f"ControlPath={folder}/sharedmem-%C",
        f"ControlPersist={3 * SYNC_INTERVAL_SECONDS}"])


def test_prepare_makes_the_folder_private(tmp_path: Path):
    folder = tmp_path / "sockets"
    folder.mkdir()
    folder.chmod(0o755)  # others may read: ssh makes the socket itself 0600
    ssh_reuse.prepare(folder)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o755
    folder.chmod(0o777)  # others may write: they could put their own socket there
    ssh_reuse.prepare(folder)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    ssh_reuse.prepare(tmp_path / "new" / "deeper")
    assert stat.S_IMODE((tmp_path / "new" / "deeper").stat().st_mode) == 0o700


def test_only_the_installer_s_own_options_count_as_ours(tmp_path: Path):
    env = {"HOME": "/h"}
    assert ssh_reuse.ours(["X=1", *ssh_reuse.options(Path("/h/.ssh"))], tmp_path, env)
    assert ssh_reuse.ours(ssh_reuse.options(tmp_path), tmp_path, env)
    assert not ssh_reuse.ours(["ControlMaster=auto", "ControlPath=/h/.ssh/cm-%C",
                               "ControlPersist=yes"], tmp_path, env)
    assert ssh_reuse.control_path(["A=b", "ControlPath = /x/%C"]) == "/x/%C"
    assert ssh_reuse.control_path(["A=b"]) is None


def test_no_ssh_reuse_only_goes_with_ssh(tmp_path: Path):
    out, err = io.StringIO(), io.StringIO()
    code = client_main(["--machine", "pc", "--local", "--no-ssh-reuse"],
                       {"HOME": str(tmp_path)}, out=out, err=err)
    assert code == 2 and "--no-ssh-reuse: only for --ssh-host" in err.getvalue()


def test_the_schedule_leaves_the_master_connection_alive(tmp_path: Path):
    from sharedmem.install import scheduler
    service, _ = scheduler.systemd_units([sys.executable, "x.py", "sync"], tmp_path / "log")
    assert "KillMode=process\n" in service
