"""The installed copy of the code: what an upgrade writes, removes, and in which order.

The last test upgrades a real install of the flat layout (before the subpackages) in place.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from importlib.util import cache_from_source
from pathlib import Path

from conftest import (
    PREFIX,
    REPO,
    env_for,
    flat_release,
    make_client_home,
    run_installer,
    ssh_args,
    tree,
)

from sharedmem.install import harnesses
from sharedmem.install.console import Console
from sharedmem.install.prefix import LAUNCHER_NAME, install_code, release_files
from sharedmem.server.store import Store


def install(prefix: Path, *, dry_run: bool = False) -> list[str]:
    return install_code(prefix, Console(io.StringIO(), io.StringIO()), dry_run=dry_run)


def test_removed_package_and_orphan_compiled_files_leave_nothing_behind(tmp_path):
    prefix = tmp_path / "prefix"
    install(prefix)
    package = prefix / "sharedmem"
    retired = package / "retired"
    (retired / "inner" / "__pycache__").mkdir(parents=True)
    for rel in ("__init__.py", "old.py", "inner/__init__.py"):
        (retired / rel).write_text("x = 1\n")
    (retired / "inner" / "__pycache__" / "__init__.cpython-311.pyc").write_bytes(b"old")
    (package / "__pycache__" / "gone.cpython-39.opt-1.pyc").write_bytes(b"old")  # .py gone before
    (package / "cli" / "__pycache__" / "retired.cpython-311.pyc").write_bytes(b"old")
    kept = package / "mine" / "notes.txt"  # not ours: it and its folder stay
    kept.parent.mkdir()
    kept.write_text("mine\n")
    (kept.parent / "old.py").write_text("x = 1\n")
    before = tree(prefix)

    dry = install(prefix, dry_run=True)
    assert tree(prefix) == before
    assert set(dry) == {f"sharedmem/{rel} (removed)" for rel in (
        "__pycache__/gone.cpython-39.opt-1.pyc", "cli/__pycache__/retired.cpython-311.pyc",
        "mine/old.py", "retired/__init__.py", "retired/old.py", "retired/inner/__init__.py",
        "retired/inner/__pycache__/__init__.cpython-311.pyc", "retired/inner/__pycache__/",
        "retired/inner/", "retired/")}
    assert dry.index("sharedmem/retired/inner/ (removed)") < dry.index(
        "sharedmem/retired/ (removed)")

    assert install(prefix) == dry
    assert tree(prefix) == {k: v for k, v in before.items() if f"{k}/ (removed)" not in dry
                            and f"{k} (removed)" not in dry}
    assert kept.read_text() == "mine\n" and not retired.exists()
    assert install(prefix) == []


def test_new_modules_come_before_their_package_and_the_launcher_last(tmp_path):
    prefix = tmp_path / "prefix"
    (prefix / "sharedmem").mkdir(parents=True)
    (prefix / "sharedmem" / "cli.py").write_text("def main(argv): return 0\n")  # the flat layout
    order = install(prefix, dry_run=True)
    assert order[-1] == LAUNCHER_NAME
    assert order[-2] == "sharedmem/cli.py (removed)"
    assert set(order[:-2]) == set(release_files()) - {LAUNCHER_NAME}
    for rel in order[:-2]:
        package = rel.rpartition("/")[0]
        if rel.startswith("sharedmem/") and not rel.endswith("/__init__.py"):
            assert order.index(rel) < order.index(f"{package}/__init__.py"), rel
    assert order.index("sharedmem/cli/__init__.py") < order.index("sharedmem/__init__.py")
    assert install(prefix) == order
    assert not (prefix / "sharedmem" / "cli.py").exists()


# --- an install of the flat layout (before the subpackages), upgraded in place ------------------

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

