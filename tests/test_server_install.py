"""The installers end to end: real files in a temporary HOME, a real sshd on loopback."""

from __future__ import annotations

import base64
import io
import json
import os
import subprocess
import sys
import tarfile
import tomllib
from importlib.util import cache_from_source
from pathlib import Path

import pytest
from conftest import (
    AGENTS,
    CLAUDE,
    CURSOR,
    OPENCODE,
    PREFIX,
    REPO,
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

from sharedmem.core import InstallError
from sharedmem.install import authorized_keys as authkeys
from sharedmem.install import harnesses, interpreter
from sharedmem.install.client_install import client_main
from sharedmem.install.server_install import server_main
from sharedmem.server.store import Store

ED25519_BLOB = base64.b64encode(b"\0\0\0\x0bssh-ed25519\0\0\0\x20" + bytes(32)).decode()


def without_ours(data: dict, *keys: str) -> dict:
    node = data
    for key in keys:
        node = node[key]
    del node[harnesses.SERVER_NAME]
    return data


# --- the server --------------------------------------------------------------------------------

def test_server_install_pins_key_once_and_refuses_another_machine(tmp_path):
    home = tmp_path / "server-home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh").chmod(0o755)
    keys = home / ".ssh" / "authorized_keys"
    keys.write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBBBB old@box\n")
    keys.chmod(0o644)
    pub = keygen(tmp_path / "laptop_key")
    prefix = home / PREFIX
    proc = run_installer("install_server.py", "--authorize", "laptop", "--key",
               str(tmp_path / "laptop_key.pub"), home=home, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    store = prefix / "store.sqlite3"
    python = interpreter.choose().path  # as the client installer chooses: a stable one
    line = (f'restrict,command="{python} -S {prefix}/shared_memory.py serve --store '
            f'{store} --machine laptop" {pub}')
    assert keys.read_text() == "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBBBB old@box\n" + line + "\n"
    assert mode(home / ".ssh") == 0o700 and mode(keys) == 0o600
    assert keys.stat().st_uid == os.getuid()
    backups = sorted((home / ".ssh").glob("authorized_keys.bak-*"))
    assert [b.read_text() for b in backups] == ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBBBB old@box\n"]
    assert "install_client.py --machine laptop --ssh-host USER@HOST" in proc.stdout
    assert "--remote-prefix" not in proc.stdout
    assert list((prefix / "sharedmem" / "__pycache__").glob("core.cpython-*.pyc"))
    assert (prefix / "docs" / "AGENT-GUIDANCE.md").is_file()
    with Store.open(store, create=False) as opened:
        assert opened.verify() == []

    before = tree(home)
    again = run_installer("install_server.py", "--authorize", "laptop", "--key", pub, home=home,
                cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert tree(home, skip=(str(PREFIX / "store.sqlite3"),)) == {
        k: v for k, v in before.items() if k != str(PREFIX / "store.sqlite3")}
    assert keys.read_text().count(pub.split()[1]) == 1

    refused = run_installer("install_server.py", "--authorize", "desktop", "--key", pub, home=home,
                  cwd=tmp_path)
    assert refused.returncode == 2
    assert "pinned to machine 'laptop'" in refused.stderr
    assert "--authorize desktop --key ... --repin" in refused.stderr
    assert keys.read_text().count(pub.split()[1]) == 1 and "--machine laptop" in keys.read_text()

    moved = run_installer("install_server.py", "--authorize", "desktop", "--key", pub, "--repin",
                home=home, cwd=tmp_path)
    assert moved.returncode == 0, moved.stderr
    text = keys.read_text()
    assert text.count(pub.split()[1]) == 1 and "--machine desktop" in text
    assert "old@box" in text


def test_server_pins_a_stable_interpreter_keeps_a_working_one_and_takes_python(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    mine = bin_dir / "python3"
    mine.symlink_to(sys.executable)
    pub = keygen(tmp_path / "laptop_key")
    prefix, keys = home / PREFIX, home / ".ssh" / "authorized_keys"
    key = authkeys.parse_key(pub, {"HOME": str(home)})

    def pinned(python: str) -> str:
        command = authkeys.forced_command(python, prefix / "shared_memory.py",
                                          prefix / "store.sqlite3", "laptop")
        return authkeys.pinned_line(command, key) + "\n"

    def install(*extra: str) -> tuple[int, dict, str]:
        out, err = io.StringIO(), io.StringIO()
        code = server_main(["--authorize", "laptop", "--key", pub, "--json", *extra],
                           {"HOME": str(home)}, out=out, err=err)
        return code, json.loads(out.getvalue() or "{}"), err.getvalue()

    (home / ".ssh").mkdir(mode=0o700)
    keys.write_text(pinned(str(mine)))  # an older install pinned a Python that still runs
    code, summary, err = install()
    assert code == 0, err
    assert summary["authorized_keys"]["action"] == "unchanged" and summary["python"] == str(mine)
    assert keys.read_text() == pinned(str(mine))

    mine.unlink()  # a version manager took it away: the stable choice replaces it
    code, summary, err = install()
    assert code == 0, err
    assert summary["authorized_keys"]["action"] == "updated"
    assert keys.read_text() == pinned(interpreter.choose().path)

    mine.symlink_to(sys.executable)
    code, summary, err = install("--python", str(mine))  # named: it wins over a working line
    assert code == 0, err
    assert keys.read_text() == pinned(str(mine)) and summary["python"] == str(mine)
    code, _, err = install("--python", str(bin_dir / "python9"))
    assert code == 2 and f"--python {bin_dir / 'python9'}: no Python runs there" in err
    assert keys.read_text() == pinned(str(mine))


def test_server_upgrade_removes_stale_files_and_custom_prefix_hint(tmp_path):
    home = tmp_path / "h"
    home.mkdir()
    prefix = tmp_path / "srv"
    first = run_installer("install_server.py", "--prefix", str(prefix), home=home, cwd=tmp_path)
    assert first.returncode == 0
    stale = prefix / "sharedmem" / "retired.py"
    stale.write_text("x = 1\n")
    (prefix / "sharedmem" / "__pycache__" / "retired.cpython-311.pyc").write_bytes(b"old")
    (prefix / "sharedmem" / "core.py").write_text("# damaged\n")
    proc = run_installer("install_server.py", "--prefix", str(prefix), home=home, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert not stale.exists()
    assert not list((prefix / "sharedmem" / "__pycache__").glob("retired.*"))
    assert (prefix / "sharedmem" / "core.py").read_bytes() == (REPO / "sharedmem" / "core.py").read_bytes()
    assert f"--remote-prefix {prefix}" in proc.stdout
    assert not (home / ".ssh").exists()


def test_server_argument_and_key_problems(tmp_path):
    home = tmp_path / "h"
    home.mkdir()
    private = tmp_path / "k"
    keygen(private)
    proc = run_installer("install_server.py", "--authorize", "Bad Name", "--key", str(private),
               "--repin", home=home, cwd=tmp_path)
    assert proc.returncode == 2
    assert "2 problem(s)" in proc.stderr
    assert "--authorize 'Bad Name' is invalid" in proc.stderr
    assert "PRIVATE key" in proc.stderr
    assert not (home / PREFIX).exists()
    lone = run_installer("install_server.py", "--key", str(private) + ".pub", home=home, cwd=tmp_path)
    assert lone.returncode == 2 and "go together" in lone.stderr
    assert run_installer("install_server.py", "--help", home=home, cwd=tmp_path).stdout.count("--authorize")


@pytest.mark.parametrize("text,needle", [
    ("ssh-ed25519 not*base64", "damaged"),
    ("ssh-rsa " + ED25519_BLOB, "does not match its type"),
    ("ssh-ed25519 " + ED25519_BLOB[:-8], "damaged"),
    ("hello world", "no such file"),
    ("ssh-ed25519 AAAA\nssh-ed25519 AAAA", "exactly one"),
])
def test_parse_key_refuses_bad_keys(text, needle, tmp_path):
    good = authkeys.parse_key(f"ssh-ed25519 {ED25519_BLOB} me@pc", {"HOME": str(tmp_path)})
    assert good.text == f"ssh-ed25519 {ED25519_BLOB} me@pc"
    with pytest.raises(InstallError, match=needle):
        authkeys.parse_key(text if "world" not in text else "/no/such.pub",
                           {"HOME": str(tmp_path)})


def test_split_line_reads_options_with_quoted_spaces():
    line = 'restrict,command="py /a b/shared_memory.py serve --machine pc" ssh-ed25519 AAAB c'
    options, blob = authkeys.split_line(line)
    assert blob == "AAAB" and authkeys.pinned_machine(options) == "pc"
    assert authkeys.split_line("# comment") is None
    assert authkeys.pinned_machine(authkeys.split_line("ssh-rsa AAAA x")[0]) is None


# --- the client over SSH ---------------------------------------------------------------------

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


# --- an install of the flat layout (before the subpackages), upgraded in place ------------------

FLAT_RELEASE = "a634ca8e0a758313191098f480dcac4e16fd2934"  # the last one of 44 flat modules


def flat_release(dest: Path) -> Path:
    """The flat-layout release, from this checkout's history: its installers and its code."""
    try:
        archive = subprocess.run(["git", "-C", str(REPO), "archive", FLAT_RELEASE,
                                  "install_server.py", "install_client.py", "shared_memory.py",
                                  "sharedmem", "docs/AGENT-GUIDANCE.md"],
                                 capture_output=True, timeout=60)
    except FileNotFoundError:
        pytest.fail(f"git is not installed: it is needed to extract release {FLAT_RELEASE}")
    if archive.returncode != 0:
        pytest.fail(f"commit {FLAT_RELEASE[:7]} (the last release of the flat layout) is not "
                    f"in {REPO}: {archive.stderr.decode().strip()}. This test needs a git clone "
                    "with that history: fetch it with `git fetch --unshallow` (or `git fetch "
                    f"origin {FLAT_RELEASE}`) and re-run")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(dest, filter="data")
    return dest


def package_tree(root: Path) -> tuple[set[str], set[str], set[str]]:
    """The package under `root`: its .py files, its compiled files and its folders."""
    sources, compiled, folders = set(), set(), {"sharedmem"}
    for path in (root / "sharedmem").rglob("*"):
        rel = path.relative_to(root).as_posix()
        if path.is_dir():
            folders |= set() if path.name == "__pycache__" else {rel}
        elif path.suffix == ".pyc":
            compiled.add(rel)
        elif path.suffix == ".py" and "__pycache__" not in path.parts:
            sources.add(rel)
    return sources, compiled, folders


def mcp_list(command: list[str], home: Path, cwd: Path) -> dict:
    """Start the MCP server by a registered command: `initialize`, then call the `list` tool."""
    messages = [{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                    "protocolVersion": "2025-06-18", "capabilities": {},
                    "clientInfo": {"name": "test", "version": "1"}}},
                {"jsonrpc": "2.0", "method": "notifications/initialized"},
                {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                 "params": {"name": "list",
                            "arguments": {"path": "machines/laptop/codex/rollout_summaries"}}}]
    served = subprocess.run(command, input="".join(json.dumps(m) + "\n" for m in messages),
                            capture_output=True, text=True, env=env_for(home), cwd=cwd,
                            timeout=60)
    replies = {r["id"]: r for r in map(json.loads, served.stdout.splitlines())}
    assert replies[1]["result"]["protocolVersion"] == "2025-06-18", served.stderr
    assert not replies[2]["result"]["isError"], replies[2]
    return replies[2]["result"]["structuredContent"]


def test_flat_layout_install_upgrades_in_place(tmp_path, sshd):
    old = flat_release(tmp_path / "flat")
    server_home, home = tmp_path / "server-home", make_client_home(tmp_path)
    server_home.mkdir()
    server_args = ["--authorize", "laptop", "--key", str(sshd.pinned_key) + ".pub"]
    client_args = ["--machine", "laptop", *ssh_args(sshd)]
    new_client_args = [*client_args, "--no-ssh-reuse"]  # no master left behind, whatever tmp is
    proc = run_installer("install_server.py", *server_args, home=server_home, cwd=tmp_path, root=old)
    assert proc.returncode == 0, proc.stderr
    keys = (server_home / ".ssh" / "authorized_keys").read_bytes()
    assert f"{server_home / PREFIX}/shared_memory.py serve --store" in keys.decode()
    (sshd.root / "authorized_keys").write_bytes(keys)  # sshd keeps the old line throughout
    proc = run_installer("install_client.py", *client_args, home=home, cwd=tmp_path, root=old)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert "first sync: ok" in proc.stdout
    env = {"HOME": str(home)}
    registered = {name: harnesses.registered_command(name, env) for name in harnesses.HARNESSES}
    assert all(registered.values()), registered
    prefixes = (server_home / PREFIX, home / PREFIX)
    old_client_json = (home / PREFIX / "client.json").read_bytes()
    flat, _, _ = package_tree(old)
    new, _, new_folders = package_tree(REPO)
    stale = flat - new
    assert {"sharedmem/cli.py", "sharedmem/client.py", "sharedmem/store.py"} <= stale
    for prefix in prefixes:  # the old installers wrote and compiled the flat modules
        assert package_tree(prefix)[0] == flat
        assert Path(cache_from_source(str(prefix / "sharedmem" / "store.py"))).is_file()

    before = tree(server_home)
    dry = run_installer("install_server.py", *server_args, "--dry-run", "--json", home=server_home,
              cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert {f"{rel} (removed)" for rel in stale} <= set(json.loads(dry.stdout)["files"])
    assert tree(server_home) == before

    proc = run_installer("install_server.py", *server_args, home=server_home, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (server_home / ".ssh" / "authorized_keys").read_bytes() == keys
    proc = run_installer("install_client.py", *new_client_args, home=home, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert "  sync: ok (nothing changed; 2 files in the cache)" in proc.stdout
    for prefix in prefixes:
        sources, compiled, folders = package_tree(prefix)
        assert sources == new, (sources - new, new - sources)
        assert compiled == {Path(cache_from_source(str(prefix / rel))).relative_to(prefix)
                            .as_posix() for rel in new}
        assert folders == new_folders  # no folder of a removed subpackage either
        assert {p.parent.relative_to(prefix).as_posix() for p in
                (prefix / "sharedmem").rglob("__pycache__")} == new_folders

    (home / ".codex" / "memories" / "rollout_summaries" / "r2.md").write_text("upgraded\n")
    (tmp_path / "old-client.json").write_bytes(old_client_json)
    (tmp_path / "old-client.json").chmod(0o600)
    synced = subprocess.run([sys.executable, str(home / PREFIX / "shared_memory.py"), "sync",
                             "--config", str(tmp_path / "old-client.json")], capture_output=True,
                            text=True, env=env_for(home), cwd=tmp_path, timeout=60)
    assert synced.returncode == 0, synced.stderr + synced.stdout
    with Store.open(server_home / PREFIX / "store.sqlite3", create=False) as store:
        assert "machines/laptop/codex/rollout_summaries/r2.md" in store.manifest()
    for command in {tuple(c) for c in registered.values()}:
        listed = mcp_list(list(command), home, tmp_path)
        assert "r2.md" in {e["name"] for e in listed["entries"]}, listed

    installed = {"server": tree(server_home, (str(PREFIX / "store.sqlite3"),)),
                 "client": tree(home, (str(PREFIX / "cache"), str(PREFIX / "state")))}
    again = run_installer("install_server.py", *server_args, home=server_home, cwd=tmp_path)
    assert again.returncode == 0 and "(0 file(s) changed)" in again.stdout, again.stdout
    again = run_installer("install_client.py", *new_client_args, home=home, cwd=tmp_path)
    assert again.returncode == 0 and "code: 0 file(s) changed" in again.stdout, again.stdout
    assert "(unchanged)" in again.stdout and "updated" not in again.stdout
    assert {"server": tree(server_home, (str(PREFIX / "store.sqlite3"),)),
            "client": tree(home, (str(PREFIX / "cache"), str(PREFIX / "state")))} == installed


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


def test_server_warns_when_home_is_writable_by_others(tmp_path):
    home = tmp_path / "shared-home"
    home.mkdir()
    home.chmod(0o777)
    keygen(tmp_path / "k")
    proc = run_installer("install_server.py", "--authorize", "pc", "--key", str(tmp_path / "k.pub"),
               home=home, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert f"chmod go-w {home}" in proc.stderr
    assert "--machine pc" in (home / ".ssh" / "authorized_keys").read_text()
