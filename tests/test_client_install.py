"""install_client.py (sharedmem.install.client_install): its steps, then the whole installer.

The first tests check the pieces it is made of (the configuration it builds, the connection
check) in process, on real files in a temporary home; the last run the whole installer, over a
real sshd on loopback and locally.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from conftest import (
    AGENTS,
    CLAUDE,
    CURSOR,
    OPENCODE,
    PREFIX,
    SYSTEM,
    TOML,
    env_for,
    keygen,
    make_client_home,
    mode,
    run_installer,
    ssh_args,
    tree,
)

from sharedmem.client import config as config_mod
from sharedmem.core import ConfigError, InstallError
from sharedmem.install import client_install as ci
from sharedmem.install import harnesses, interpreter
from sharedmem.install.client_install import client_main
from sharedmem.install.console import Console
from sharedmem.rules import Limits
from sharedmem.server.store import Store


def build(argv: list[str], home: Path, prefix: Path) -> tuple[config_mod.ClientConfig, str]:
    err = io.StringIO()
    cfg = ci.build_config(ci.parser().parse_args(argv), {"HOME": str(home), **SYSTEM}, prefix,
                          Console(io.StringIO(), err))
    return cfg, err.getvalue()


def test_ssh_configuration(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".codex" / "memories").mkdir(parents=True)
    prefix = tmp_path / "prefix"
    cfg, warnings = build(["--machine", "laptop", "--ssh-host", "me@srv", "--ssh-port", "2222",
                           "--ssh-identity", "~/.ssh/id_ed25519", "--ssh-option",
                           "ConnectTimeout=5", "--remote-prefix", "/srv/cm/",
                           "--remote-python", "/usr/bin/python3.12", "--no-ssh-reuse"], home,
                          prefix)
    assert warnings == ""
    assert cfg.path == prefix / "client.json" and cfg.machine == "laptop"
    assert cfg.transport == config_mod.Transport(
        "ssh", host="me@srv", port=2222, identity=home / ".ssh" / "id_ed25519",
        options=("ConnectTimeout=5",), remote_command=(
            "/usr/bin/python3.12", "-S", "/srv/cm/shared_memory.py", "serve", "--store",
            "/srv/cm/store.sqlite3"))
    assert [(s.name, s.kind, s.path) for s in cfg.sources] == [
        ("codex", "codex", home / ".codex" / "memories")]  # claude-code has no folder here
    assert cfg.cache == prefix / "cache" and cfg.state == prefix / "state"
    default, _ = build(["--machine", "laptop", "--ssh-host", "srv"], home, prefix)
    assert default.transport.remote_command == (
        "python3", "-S", "~/.local/share/codex-shared-memory/shared_memory.py", "serve", "--store",
        "~/.local/share/codex-shared-memory/store.sqlite3")  # ~ is the server's home
    assert default.transport.port is None and default.transport.identity is None


def test_ssh_configuration_reuses_the_connection_unless_told_not_to(tmp_path: Path) -> None:
    """The reuse options follow the user's own, with the socket in the (short) state folder."""
    argv = ["--machine", "laptop", "--ssh-host", "srv", "--ssh-option", "ConnectTimeout=5"]
    cfg, warnings = build(argv, Path("/h"), Path("/p"))
    assert warnings == ""
    assert cfg.transport.options == ("ConnectTimeout=5", "ControlMaster=auto",
                                     "ControlPath=/p/state/sharedmem-%C", "ControlPersist=360")
    off, _ = build([*argv, "--no-ssh-reuse"], Path("/h"), Path("/p"))
    assert off.transport.options == ("ConnectTimeout=5",)
    mine, _ = build([*argv, "--ssh-option", "ControlPath=/run/me/%C"], Path("/h"), Path("/p"))
    assert mine.transport.options == ("ConnectTimeout=5", "ControlPath=/run/me/%C")


def test_named_sources_and_a_missing_default_folder(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / "notes").mkdir(parents=True)
    cfg, warnings = build(["--machine", "pc", "--local", "--source", "claude-code", "--markdown",
                           "notes=~/notes", "--markdown", "notes=~/notes"], home,
                          tmp_path / "prefix")
    assert [(s.name, s.kind, s.path) for s in cfg.sources] == [
        ("claude-code", "claude-code", home / ".claude" / "projects"),
        ("notes", "markdown", home / "notes")]
    assert "claude-code: none of its memory folders exists yet" in warnings
    assert cfg.transport == config_mod.Transport("local", store=tmp_path / "prefix" /
                                                 "store.sqlite3")


def test_existing_limits_compression_and_timeouts_are_kept_and_a_broken_file_is_replaced(
        tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    prefix = tmp_path / "prefix"
    argv = ["--machine", "pc", "--local", "--store", str(tmp_path / "s.sqlite3")]
    cfg, _ = build(argv, home, prefix)
    tuned = cfg.to_json()
    tuned["limits"] = {"file_bytes": 4096, "namespace_bytes": 8192, "namespace_files": 3}
    tuned["compress"] = "on"
    tuned["timeouts"] = {"reply_seconds": 30}
    prefix.mkdir()
    cfg.path.write_text(json.dumps(tuned))
    again, warnings = build(argv, home, prefix)
    assert again.limits == Limits(4096, 8192, 3) and warnings == ""
    assert again.compress == "on" and again.timeouts.reply_seconds == 30
    assert config_mod.dumps(again) == config_mod.dumps(config_mod.load(
        cfg.path, {"HOME": str(home)}))
    cfg.path.write_text("{broken")
    replaced, warnings = build(argv, home, prefix)
    assert replaced.limits == Limits()
    assert f"the existing {cfg.path} is replaced" in warnings and "not valid JSON" in warnings


def test_check_connection(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    store = tmp_path / "server" / "store.sqlite3"
    cfg, _ = build(["--machine", "pc", "--local", "--store", str(store)], home, tmp_path / "p")
    err = io.StringIO()
    hello = ci.check_connection(cfg, Console(io.StringIO(), err))
    assert hello["type"] == "hello" and hello["machine"] == "pc"
    assert "checking the connection to the local store" in err.getvalue()
    (tmp_path / "blocker").write_text("a file in the way")
    blocked, _ = build(["--machine", "pc", "--local", "--store",
                        str(tmp_path / "blocker" / "store.sqlite3")], home, tmp_path / "p")
    with pytest.raises(InstallError, match="the connection check failed") as exc:
        ci.check_connection(blocked, Console(io.StringIO(), io.StringIO()))
    assert "Nothing was installed" in str(exc.value) and str(tmp_path / "blocker") in str(exc.value)


def test_body_refuses_bad_arguments_before_writing(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(ConfigError) as exc:
        ci.body(["--machine", "pc", "--ssh-host=-oProxyCommand=touch x", "--local",
                 "--ssh-option=-F/etc/evil"], {"HOME": str(home)}, Console(out, err),
                None, "linux")
    text = str(exc.value)
    for needle in ("exactly one of --ssh-host", "--ssh-host '-oProxyCommand=touch x' is not a "
                   "host name", "--ssh-option: only for --ssh-host",
                   "--ssh-option '-F/etc/evil' must look like Name=value"):
        assert needle in text, needle
    assert "4 problem(s)" in text
    assert list(home.iterdir()) == [] and out.getvalue() == ""


# --- what a run says: true numbers, and nothing repeated when nothing changed -------------------

def install(home: Path, *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = ci.client_main(["--local", "--schedule", "none", *argv], {"HOME": str(home), **SYSTEM},
                          out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def waiting_index_builds(cache: Path, stop: bool = False) -> int:
    """Background `index` runs for `cache` waiting for this process to end (Linux: /proc);
    with `stop`, they are stopped."""
    wanted = ["index", "--cache", str(cache), "--background", "--after", str(os.getpid())]
    found = 0
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().decode().split("\0")[:-1]
        except OSError:
            continue
        if argv[-len(wanted):] == wanted:
            found += 1
            if stop:
                os.kill(int(entry.name), signal.SIGKILL)
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_each_run_says_what_its_sync_did(tmp_path: Path) -> None:
    home = tmp_path / "home"
    notes = home / "notes"
    notes.mkdir(parents=True)
    for name in ("a.md", "b.md", "c.md"):
        (notes / name).write_text(f"{name}\n")
    store = str(tmp_path / "store.sqlite3")
    laptop = ["--machine", "laptop", "--store", store, "--markdown", f"notes={notes}",
              "--harness", "codex"]
    code, out, err = install(home, *laptop)
    assert code == 0, err
    assert "running the first sync with the local store" in err
    assert "sending 0 changed files" not in err
    assert "  first sync: ok (3 files published, 0 pulled; 3 files in the cache)" in out
    # The first sync started the search index's build, which runs once the installer has
    # ended (here, the test's own process: tests/test_search_index.py sees one finish).
    cache = home / ".local" / "share" / "codex-shared-memory" / "cache"
    assert waiting_index_builds(cache) == 1

    code, out, err = install(home, *laptop)
    assert code == 0, err
    assert "first sync" not in out + err and "syncing with the local store" in err
    assert "  sync: ok (nothing changed; 3 files in the cache)" in out
    assert "  codex: already registered, unchanged (" in out

    (notes / "a.md").write_text("changed\n")
    (notes / "d.md").write_text("new\n")
    desk = tmp_path / "desk"
    desk.mkdir()
    (desk / "x.md").write_text("from the desk\n")
    code, _, err = install(tmp_path / "desk-home", "--machine", "desk", "--store", store,
                           "--prefix", str(tmp_path / "desk-prefix"), "--markdown",
                           f"d={desk}", "--harness", "codex")
    assert code == 0, err
    code, out, err = install(home, *laptop)
    assert code == 0, err
    assert "  sync: ok (2 files published, 1 pulled; 5 files in the cache)" in out
    # The re-install's sync found the index not built yet and asked again; this one changed
    # the cache: each starts one, and the first to run does the work.
    assert waiting_index_builds(cache, stop=True) == 3


def test_harness_memory_where_it_is_today(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Codex version 2 user, Claude Code memory moved by autoMemoryDirectory, subagent memory
    and a legacy .config.json: each is found, published, registered where it is read, and the
    summary says where each harness writes memory."""
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))  # the in-process sync reads this process's HOME
    v2 = home / ".codex" / "memories_v2"
    (v2 / "rollout_summaries").mkdir(parents=True)
    (v2 / "MEMORY.md").write_text("# v2 index\n")
    (v2 / "raw_memories.md").write_text("raw\n")
    claude = home / ".claude"
    (claude / "agent-memory" / "reviewer").mkdir(parents=True)
    (claude / "agent-memory" / "reviewer" / "MEMORY.md").write_text("reviewer\n")
    moved = tmp_path / "elsewhere" / "claude-mem"
    moved.mkdir(parents=True)
    (moved / "MEMORY.md").write_text("moved index\n")
    (claude / "settings.json").write_text(json.dumps({"autoMemoryDirectory": str(moved)}))
    (claude / ".config.json").write_text('{"numStartups": 5}\n')
    code, out, err = install(home, "--machine", "pc", "--harness", "codex", "--harness",
                             "claude-code")
    assert code == 0, err
    assert f"  source codex (codex): {home / '.codex' / 'memories'}" in out
    assert f"  source claude-code (claude-code): {claude / 'projects'}" in out
    assert f"  memory codex: writes {v2} (version v2: memories.version is not set" in out
    assert "published by source codex as machines/pc/codex/memories_v2/" in out
    assert f"  memory claude-code: writes its automatic memory to {moved} (autoMemoryDirectory " \
           f"in {claude / 'settings.json'})" in out
    assert f"shared_memories added to {claude / '.config.json'}" in out
    assert not (home / ".claude.json").exists()
    cache = home / ".local" / "share" / "codex-shared-memory" / "cache" / "machines" / "pc"
    assert (cache / "codex" / "memories_v2" / "MEMORY.md").read_text() == "# v2 index\n"
    assert not (cache / "codex" / "memories_v2" / "raw_memories.md").exists()
    assert (cache / "claude-code" / "auto-memory" / "MEMORY.md").read_text() == "moved index\n"
    assert (cache / "claude-code" / "agent-memory" / "reviewer" / "MEMORY.md").exists()
    summary = json.loads(install(home, "--machine", "pc", "--harness", "codex", "--json")[1])
    assert [(m["harness"], m["status"]) for m in summary["memory"]] == [("codex", "ok")]


def test_the_cursor_block_is_shown_when_new_or_asked(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".cursor").mkdir(parents=True)
    base = ["--machine", "pc", "--harness", "cursor"]
    intro = "Cursor has no global instructions file: paste this block"
    code, out, _ = install(home, *base, "--dry-run")
    assert code == 0 and intro in out
    code, out, _ = install(home, *base)
    assert code == 0 and intro in out and "<!-- BEGIN codex-shared-memory" in out
    code, out, _ = install(home, *base)
    assert code == 0 and intro not in out and "BEGIN codex-shared-memory" not in out
    assert "is the one shown before (--cursor-rules prints it again)" in out
    code, out, _ = install(home, *base, "--cursor-rules")
    assert code == 0 and intro in out
    code, out, _ = install(home, *base, "--json")
    summary = json.loads(out)
    assert summary["cursor_block"].startswith("<!-- BEGIN") and not summary["cursor_block_shown"]


def test_python_names_the_interpreter_to_register(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".codex").mkdir(parents=True)
    code, _, err = install(home, "--machine", "pc", "--python", str(tmp_path / "gone"))
    assert code == 2 and f"--python {tmp_path / 'gone'}: no Python runs there" in err
    assert not (home / ".local").exists()
    python = tmp_path / "bin" / "python3"
    python.parent.mkdir()
    python.symlink_to(sys.executable)
    code, out, err = install(home, "--machine", "pc", "--python", str(python))
    assert code == 0, err
    assert f"  python: {python} (what the harnesses and the schedule run)" in out
    assert harnesses.registered_command("codex", {"HOME": str(home)})[0] == str(python)


# --- the client over SSH ---------------------------------------------------------------------

def without_ours(data: dict, *keys: str) -> dict:
    """`data` without our server's entry in the table at `keys`."""
    node = data
    for key in keys:
        node = node[key]
    del node[harnesses.SERVER_NAME]
    return data


def test_client_over_ssh_end_to_end(tmp_path, sshd):
    server_home = tmp_path / "server-home"
    server_home.mkdir()
    proc = run_installer("install_server.py", "--authorize", "laptop", "--key",
                         str(sshd.pinned_key) + ".pub", home=server_home, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    (sshd.root / "authorized_keys").write_bytes((server_home / ".ssh" / "authorized_keys")
                                                 .read_bytes())
    home = make_client_home(tmp_path)
    args = ["--machine", "laptop", *ssh_args(sshd), "--remote-prefix", "/ignored/by/pin"]
    originals = tree(home)

    dry = run_installer("install_client.py", *args, "--dry-run", home=home, cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert tree(home) == originals
    assert "+[mcp_servers.shared_memories]" in dry.stdout and "client.json (after)" in dry.stdout

    first = run_installer("install_client.py", *args, home=home, cwd=tmp_path)
    assert first.returncode == 0, first.stderr + first.stdout
    prefix = home / PREFIX
    cache = prefix / "cache" / "machines" / "laptop" / "codex"
    assert (cache / "MEMORY.md").read_text() == "# Memory\n- deploy with make\n"
    assert (cache / "rollout_summaries" / "r1.md").is_file()
    assert "first sync: ok (2 files published, 0 pulled; 2 files in the cache)" in first.stdout
    assert "running the first sync with ssh" in first.stderr
    assert "sending 0 changed files" not in first.stderr
    with Store.open(server_home / PREFIX / "store.sqlite3", create=False) as store:
        assert "machines/laptop/codex/MEMORY.md" in store.manifest()
    cfg = json.loads((prefix / "client.json").read_text())
    assert cfg["transport"]["remote_command"][1:3] == ["-S", "/ignored/by/pin/shared_memory.py"]
    assert mode(prefix / "client.json") == 0o600
    assert list((prefix / "sharedmem" / "client" / "__pycache__").glob("sync.cpython-*.pyc"))

    mcp = [interpreter.choose().path, "-S", str(prefix / "shared_memory.py"), "mcp", "--config",
           str(prefix / "client.json")]
    env = {"HOME": str(home)}
    for name in harnesses.HARNESSES:
        assert harnesses.registered_command(name, env) == mcp, name
    hello = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "test", "version": "1"}}}
    served = subprocess.run(mcp, input=json.dumps(hello) + "\n", capture_output=True,
                            text=True, env=env_for(home), cwd=tmp_path, timeout=60)
    assert json.loads(served.stdout.splitlines()[0])["result"]["protocolVersion"] == "2025-06-18"
    toml = tomllib.loads((home / ".codex" / "config.toml").read_text())
    assert without_ours(toml, "mcp_servers") == tomllib.loads(TOML)
    claude = json.loads((home / ".claude.json").read_text())
    assert without_ours(claude, "mcpServers") == {**CLAUDE, "mcpServers": {}}
    opencode = json.loads((home / ".config" / "opencode" / "opencode.json").read_text())
    guide = home / ".config" / "opencode" / "shared-memories.md"
    assert without_ours(opencode, "mcp") == {**OPENCODE, "mcp": {}, "instructions": [str(guide)]}
    assert str(prefix / "cache") in guide.read_text()
    assert not (home / ".config" / "opencode" / "AGENTS.md").exists()
    cursor = json.loads((home / ".cursor" / "mcp.json").read_text())
    assert without_ours(cursor, "mcpServers") == CURSOR
    agents = (home / ".codex" / "AGENTS.md").read_text()
    assert agents.startswith(AGENTS) and agents.count("BEGIN codex-shared-memory") == 1
    assert str(prefix / "cache") in (home / ".claude" / "CLAUDE.md").read_text()
    assert "Cursor Settings > Rules > User Rules" in first.stdout

    skip = (str(PREFIX / "cache"), str(PREFIX / "state"))
    installed = tree(home, skip)
    second = run_installer("install_client.py", *args, home=home, cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert tree(home, skip) == installed
    assert "first sync" not in second.stdout + second.stderr
    assert "  sync: ok (nothing changed; 2 files in the cache)" in second.stdout
    for name in harnesses.HARNESSES:
        assert f"  {name}: already registered, unchanged (" in second.stdout, name
    assert "Cursor has no global instructions file" not in second.stdout
    assert "--cursor-rules prints it again" in second.stdout
    (home / ".codex" / "memories" / "MEMORY.md").write_text("# Memory\n- deploy with tox\n")
    third = run_installer("install_client.py", *args, "--cursor-rules", home=home, cwd=tmp_path)
    assert third.returncode == 0, third.stderr
    assert "  sync: ok (1 file published, 0 pulled; 2 files in the cache)" in third.stdout
    assert "Cursor has no global instructions file" in third.stdout

    gone = run_installer("install_client.py", "--uninstall", home=home, cwd=tmp_path)
    assert gone.returncode == 0, gone.stderr
    assert (home / ".codex" / "config.toml").read_text() == TOML
    assert (home / ".codex" / "AGENTS.md").read_text() == AGENTS
    for rel, data in ((".claude.json", CLAUDE), (".cursor/mcp.json", CURSOR),
                      (".config/opencode/opencode.json", OPENCODE)):
        assert (home / rel).read_bytes() == json.dumps(data).encode(), rel  # every byte back
    assert not (home / ".claude" / "CLAUDE.md").exists()
    assert (cache / "MEMORY.md").is_file()

    purged = run_installer("install_client.py", "--uninstall", "--purge", home=home, cwd=tmp_path)
    assert purged.returncode == 0, purged.stderr
    assert not (prefix / "client.json").exists() and not (prefix / "cache").exists()
    assert not (prefix / "sharedmem").exists()


def test_client_ssh_failures_name_the_fix(tmp_path, sshd):
    home = make_client_home(tmp_path)
    originals = tree(home)
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    unknown = run_installer("install_client.py", "--machine", "laptop", *ssh_args(sshd, known=empty),
                            home=home, cwd=tmp_path)
    assert unknown.returncode == 2
    assert "host key" in unknown.stderr and "ssh-keyscan" in unknown.stderr
    assert "Nothing was installed" in unknown.stderr

    stranger = tmp_path / "stranger"
    keygen(stranger)
    refused = run_installer("install_client.py", "--machine", "laptop", *ssh_args(sshd, key=stranger),
                            home=home, cwd=tmp_path)
    assert refused.returncode == 2
    assert "refused this client's key" in refused.stderr
    assert "install_server.py --authorize" in refused.stderr

    other = run_installer("install_client.py", "--machine", "desktop", *ssh_args(sshd), home=home,
                          cwd=tmp_path)
    assert other.returncode == 2 and "pinned to machine 'laptop'" in other.stderr
    assert tree(home) == originals


def test_client_argument_problems_are_listed_together(tmp_path):
    home = tmp_path / "h"
    home.mkdir()
    proc = run_installer("install_client.py", "--machine", "Laptop", "--local", "--ssh-port", "99999",
                         "--harness", "vim", "--source", "notes", "--markdown", "x=/no/such/dir",
                         "--schedule", "daily", "--purge", home=home, cwd=tmp_path)
    assert proc.returncode == 2
    for needle in ("8 problem(s)", "--harness vim", "--schedule 'daily'", "--purge only",
                   "--machine 'Laptop'", "--ssh-port", "--source 'notes'", "is not a folder"):
        assert needle in proc.stderr, needle
    assert not any(home.iterdir())
    helped = run_installer("install_client.py", "--help", home=home, cwd=tmp_path)
    assert helped.returncode == 0 and "--ssh-host HOST" in helped.stdout
    assert "SHAREDMEM_SCHEDULER_DRYRUN" in helped.stdout


# --- the client, local, in process: guidance choices and the schedule ---------------------------

class Recorder:
    """Stands in for systemctl and crontab: records each command and reports success."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, argv: list[str], stdin: str | None = None) -> subprocess.CompletedProcess:
        self.calls.append(argv)
        return subprocess.CompletedProcess(argv, 0, "", "")


def test_local_install_override_policy_and_schedule(home):
    (home / ".codex").mkdir()
    override = home / ".codex" / "AGENTS.override.md"
    override.write_text("# override\n")
    (home / ".claude").mkdir()
    policy = "# Rules\nUse the shared memory MCP server with care.\n"
    (home / ".claude" / "CLAUDE.md").write_text(policy)
    notes = home / "notes"
    notes.mkdir()
    (notes / "a.md").write_text("alpha\n")
    env = {"HOME": str(home), "PATH": os.environ.get("PATH", ""), **SYSTEM}
    recorder, out, err = Recorder(), io.StringIO(), io.StringIO()
    code = client_main(["--machine", "pc", "--local", "--markdown", f"notes={notes}",
                        "--harness", "codex", "--harness", "claude-code"], env,
                       run=recorder, platform="linux", out=out, err=err)
    assert code == 0, err.getvalue() + out.getvalue()
    prefix = home / PREFIX
    assert (prefix / "cache" / "machines" / "pc" / "notes" / "a.md").read_text() == "alpha\n"
    assert (prefix / "store.sqlite3").is_file()
    assert "BEGIN codex-shared-memory" in override.read_text()
    assert not (home / ".codex" / "AGENTS.md").exists()
    assert (home / ".claude" / "CLAUDE.md").read_text() == policy
    assert not (home / ".cursor").exists()
    units = home / ".config" / "systemd" / "user"
    service = (units / "codex-shared-memory-sync.service").read_text()
    assert f'"-S" "{prefix}/shared_memory.py" "sync" "--config" "{prefix}/client.json"' in service
    assert f"append:{prefix}/sync.log" in service
    assert ["systemctl", "--user", "enable", "--now", "codex-shared-memory-sync.timer"] \
        in recorder.calls
    cfg = json.loads((prefix / "client.json").read_text())
    assert [s["name"] for s in cfg["sources"]] == ["notes"]
    assert cfg["transport"] == {"kind": "local", "store": str(prefix / "store.sqlite3")}

    recorder.calls.clear()
    assert client_main(["--uninstall"], env, run=recorder, platform="linux", out=out,
                       err=err) == 0
    assert not (units / "codex-shared-memory-sync.timer").exists()
    assert override.read_text() == "# override\n"
    assert harnesses.registered_command("codex", env) is None
    assert ["systemctl", "--user", "disable", "--now", "codex-shared-memory-sync.timer"] \
        in recorder.calls
