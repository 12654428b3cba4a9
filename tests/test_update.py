"""The cache side of a sync (cache/update.py) under faults: syncs killed, files damaged, a full disk.

Everything is real: the launcher in a child process, `serve` over a real store, the cache on
disk. A kill is a real SIGKILL, sent by the syncing process to itself at a chosen moment (an
audit hook on the renames that put files in place); a full disk is a small tmpfs the test
mounts in a mount namespace of its own, or a file size limit (`RLIMIT_FSIZE`) where mounting
is impossible. After each fault, the next sync must leave the cache exactly as the server
holds it, and `read` and `search` must answer from the right text.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import LAUNCHER

from sharedmem.cache.cache import Cache
from sharedmem.core import CacheError
from sharedmem.hashing import sha256_text
from sharedmem.mcp import tools

LAPTOP_NOTES = {f"note-{i:02}.md": f"# note {i:02}\nversion A of note {i:02}\n" for i in range(12)}
DESK_NOTES = {f"desk-{i}.md": f"# desk {i}\ndesk text {i} alpha\n" for i in range(4)}
REPAIRING = "the cache is being repaired: run `shared_memory.py sync`"

# Run the launcher with an audit hook that SIGKILLs this process just before the COUNT-th rename
# onto a path the POINT names: a kill at that very moment of a sync, without changing its code.
# POINT "commit" is the COUNT-th COMMIT of the cache's manifest store, killed just before it is
# sent to SQLite (the connections of the manifest are opened with a class that kills there).
KILLER = r"""
import os, runpy, signal, sqlite3, sys
point, count, launcher = sys.argv[1], int(sys.argv[2]), sys.argv[3]
seen = [0]
class Killing(sqlite3.Connection):
    def execute(self, sql, *args):
        if sql == "COMMIT":
            seen[0] += 1
            if seen[0] >= count:
                os.kill(os.getpid(), signal.SIGKILL)
        return super().execute(sql, *args)
connect = sqlite3.connect
def killing_connect(database, *args, **kwargs):
    if point == "commit" and str(database).endswith("/.sharedmem/manifest.sqlite3"):
        kwargs["factory"] = Killing
    return connect(database, *args, **kwargs)
sqlite3.connect = killing_connect
def hits(dst):
    if point == "file":
        return dst.endswith(".md") and "/.sharedmem/" not in dst
    if point == "state":
        return "/state/sources/" in dst
    return dst.endswith("/.sharedmem/" + point)
def hook(event, args):
    if event == "os.rename" and hits(os.fsdecode(args[1])):
        seen[0] += 1
        if seen[0] >= count:
            os.kill(os.getpid(), signal.SIGKILL)
sys.addaudithook(hook)
sys.argv = [launcher, *sys.argv[4:]]
runpy.run_path(launcher, run_name="__main__")
"""


def machine(world: Path, name: str, notes: dict[str, str]) -> Path:
    """One client of the world's store; its paths are relative, so a copied world works."""
    folder = world / name
    (folder / "notes").mkdir(parents=True)
    for rel, text in notes.items():
        (folder / "notes" / rel).write_text(text, encoding="utf-8")
    config = folder / "client.json"
    config.write_text(json.dumps({
        "machine": name, "transport": {"kind": "local", "store": "../store.sqlite3"},
        "sources": [{"name": "notes", "kind": "markdown", "path": "notes"}],
        "cache": "cache", "state": "state"}), encoding="utf-8")
    return config


def sync(config: Path, *, kill: tuple[str, int] | None = None,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`shared_memory.py sync --json`, killed at `kill` (point, count) if given."""
    argv = ["sync", "--config", str(config), "--json"]
    if kill is not None:
        argv = ["-c", KILLER, kill[0], str(kill[1]), str(LAUNCHER), *argv]
    else:
        argv = [str(LAUNCHER), *argv]
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=120,
                          env=env)


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store and two machines, synced: the desk, then the laptop (whose cache holds both)."""
    world = tmp_path_factory.mktemp("world")
    desk = machine(world, "desk", DESK_NOTES)
    laptop = machine(world, "laptop", LAPTOP_NOTES)
    for config in (desk, laptop):
        done = sync(config)
        assert done.returncode == 0, done.stdout + done.stderr
    # The last `serve` ends after its client: it checkpoints the store, then removes the log.
    # A copy taken meanwhile would miss files or hold half a checkpoint.
    deadline = time.monotonic() + 60
    while (world / "store.sqlite3-wal").exists():
        assert time.monotonic() < deadline, "the last serve never closed the store"
        time.sleep(0.02)
    return world


@pytest.fixture
def world(template: Path, tmp_path: Path) -> Path:
    """A copy of the synced world for one test (times kept, so the cache is as synced)."""
    return Path(shutil.copytree(template, tmp_path / "world", symlinks=True))


def published(world: Path) -> dict[str, str]:
    """What the laptop's cache must hold: its notes and the desk's, as each source has them."""
    out = {}
    for name in ("laptop", "desk"):
        for path in sorted((world / name / "notes").iterdir()):
            out[f"machines/{name}/notes/{path.name}"] = path.read_text(encoding="utf-8")
    return out


def assert_cache_is_the_server(world: Path) -> None:
    """The cache holds exactly what was published, its manifest says so, and the tools agree."""
    root = world / "laptop" / "cache"
    expected = published(world)
    on_disk = {p.relative_to(root).as_posix(): p.read_text(encoding="utf-8")
               for p in sorted(root.rglob("*.md")) if ".sharedmem" not in p.parts}
    assert on_disk == expected
    cache = Cache(root)
    manifest = cache.load()
    assert getattr(cache, "damage", None) is None
    assert {p: m.sha256 for p, m in manifest.files.items()} == {
        p: sha256_text(t) for p, t in expected.items()}
    for path, text in list(expected.items())[::max(1, len(expected) // 40)]:
        read = tools.read_file(cache, path)
        assert read["lines"] == text.rstrip("\n").split("\n") and read["sha256"] == sha256_text(text)
        line = text.split("\n")[1][:60]
        found = tools.search(Cache(root), [line])
        assert [(r["path"], r["line"][:60]) for r in found["results"]] == [(path, line)]
    assert not (root / ".sharedmem" / "staging").exists()


# --- killed syncs -------------------------------------------------------------------------------

@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL (POSIX)")
@pytest.mark.parametrize(("point", "count"), [
    ("file", 1),  # before the first file of the pull is put in place
    ("file", 3),  # with two of the five in place
    ("commit", 1),  # every file in place, the manifest's rows not yet committed
    ("state", 1),  # the cache complete, the source's saved state not
])
def test_a_killed_sync_then_a_revert_at_the_same_size_is_repaired(
        world: Path, point: str, count: int) -> None:
    notes, config = world / "laptop" / "notes", world / "laptop" / "client.json"
    changed = [f"note-{i:02}.md" for i in range(5)]
    for name in changed:  # the same size: only the text tells them apart
        (notes / name).write_text(LAPTOP_NOTES[name].replace("version A", "version B"))
    killed = sync(config, kill=(point, count))
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    for name in changed:  # back to the bytes the cache's manifest still names
        (notes / name).write_text(LAPTOP_NOTES[name])
    done = sync(config)
    assert done.returncode == 0, done.stdout + done.stderr
    assert_cache_is_the_server(world)
    assert tools.search(Cache(world / "laptop" / "cache"), ["version B"])["results"] == []


def _same_size(text: str) -> str:
    return text.replace("text", "TEXT").replace("version", "VERSION")


@pytest.mark.parametrize("whose", ["laptop", "desk"])  # its own file, or one the server sends
@pytest.mark.parametrize(("edit", "how"), [
    ("same size", lambda p: p.write_text(_same_size(p.read_text()))),
    ("truncated", lambda p: p.write_bytes(p.read_bytes()[:5])),
    ("deleted", lambda p: p.unlink()),
    ("touched", lambda p: os.utime(p, ns=(p.stat().st_atime_ns, p.stat().st_mtime_ns + 10**9))),
])
def test_a_cache_file_edited_by_hand_is_verified_and_repaired(
        world: Path, whose: str, edit: str, how: Callable[[Path], None]) -> None:
    root = world / "laptop" / "cache"
    path = root / "machines" / whose / "notes" / ("note-03.md" if whose == "laptop" else "desk-2.md")
    how(path)
    done = sync(world / "laptop" / "client.json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert_cache_is_the_server(world)
    meta = Cache(root).load().files[path.relative_to(root).as_posix()]
    assert meta.mtime_ns == path.stat().st_mtime_ns  # recorded: the next sync hashes nothing
    report = json.loads(done.stdout)
    assert report["pull"].get("repaired", {}).get("files", 0) == (edit != "touched")


def test_an_older_versions_manifest_is_rebuilt_by_the_next_sync(world: Path) -> None:
    # Versions 1 and 2 kept manifest.json beside namespaces.json; an upgraded client's first
    # sync rebuilds the list from the files and pulls every namespace whole, once.
    root = world / "laptop" / "cache"
    meta = root / ".sharedmem"
    cache = Cache(root)
    manifest = cache.load()
    (meta / "manifest.json").write_text(json.dumps(  # as version 1 wrote them
        {"version": 1, "files": {p: list(v[:3]) for p, v in manifest.files.items()}}))
    (meta / "namespaces.json").write_text(json.dumps(
        {"last_sync": manifest.last_sync, "server": manifest.server, "version": 1,
         "namespaces": {k: v._asdict() for k, v in manifest.namespaces.items()}}))
    cache.store.close()
    (meta / "manifest.sqlite3").unlink()
    assert "older version" in str(Cache(root).check())
    edited = root / "machines" / "laptop" / "notes" / "note-05.md"
    edited.write_text(_same_size(edited.read_text()))  # its size alone would not tell
    done = sync(world / "laptop" / "client.json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["pull"]["repaired"]["records"] is True
    assert_cache_is_the_server(world)
    assert not (meta / "manifest.json").exists() and not (meta / "namespaces.json").exists()
    assert Cache(root).check() is None


# --- damaged manifest -----------------------------------------------------------------------------

def _sql(statement: str) -> Callable[[Path], None]:
    def edit(path: Path) -> None:
        import sqlite3
        conn = sqlite3.connect(path)
        conn.execute(statement)
        conn.commit()
        conn.close()
    return edit


def _bytes(change: Callable[[bytes], bytes]) -> Callable[[Path], None]:
    return lambda path: path.write_bytes(change(path.read_bytes()))


def _flip_page_type(data: bytes) -> bytes:
    """One flipped byte: the type of the second page (a table's B-tree) made invalid."""
    size = int.from_bytes(data[16:18], "big") or 65536
    return data[:size] + bytes([data[size] ^ 0xFF]) + data[size + 1:]


def _older_pair(path: Path) -> None:
    """An older version's namespaces.json, its manifest.json damaged: not converted."""
    path.unlink()
    (path.parent / "manifest.json").write_text("{")
    (path.parent / "namespaces.json").write_text("{}")


DAMAGE = [
    ("one flipped byte of the header", _bytes(lambda d: d[:3] + b"X" + d[4:])),
    ("one flipped byte of a table's page", _bytes(_flip_page_type)),
    ("truncated", _bytes(lambda d: d[:len(d) // 2])),
    ("not a database", _bytes(lambda d: b"{" * len(d))),
    ("a table dropped", _sql("DROP TABLE files")),
    ("another version", _sql("UPDATE meta SET value='2' WHERE key='version'")),
    ("the server value not JSON", _sql("UPDATE meta SET value='{' WHERE key='server'")),
    ("namespaces of the wrong kind", _sql("UPDATE meta SET value='{}' WHERE key='namespaces'")),
    ("a generation of the wrong kind", _sql(
        "UPDATE meta SET value=replace(value, ', 1, ', ', \"1\", ') WHERE key='namespaces'")),
    ("missing", lambda p: p.unlink()),
    ("an older version's pair, damaged", _older_pair),
]


@pytest.mark.parametrize(("damage", "how"), DAMAGE, ids=[damage for damage, _ in DAMAGE])
def test_a_damaged_manifest_is_refused_then_rebuilt_by_the_next_sync(
        world: Path, damage: str, how: Callable[[Path], None]) -> None:
    root = world / "laptop" / "cache"
    strays = [root / "machines" / m / "notes" / "stray.md" for m in ("desk", "laptop")]
    for stray in strays:  # the server has no such file
        stray.write_text("# stray\nleft behind\n")
    edited = root / "machines" / "laptop" / "notes" / "note-07.md"
    edited.write_text(_same_size(edited.read_text()))
    how(root / ".sharedmem" / "manifest.sqlite3")
    for call in (lambda cache: tools.list_files(cache, "machines"),
                 lambda cache: tools.read_file(cache, "machines/desk/notes/desk-1.md"),
                 lambda cache: tools.search(cache, ["desk text 1"])):
        with pytest.raises(CacheError, match="being repaired") as caught:
            call(Cache(root))  # each on its own, as a new MCP server asks
        assert str(caught.value).startswith(REPAIRING)
    done = sync(world / "laptop" / "client.json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert not any(stray.exists() for stray in strays)
    assert_cache_is_the_server(world)


def _key_out_of_order(path: Path) -> None:
    """One path of the file list changed in place so that its key is out of order.

    Lookups by path then miss rows that are there: a sync wrote such a file's row again at
    every run (the rows grew). SQLite's quick check does not see it; its integrity check does.
    """
    data = path.read_bytes()
    assert b"notes/note-05.md" in data
    path.write_bytes(data.replace(b"notes/note-05.md", b"notes/note-95.md", 1))


SYNC_FINDS = [
    ("a key out of order", _key_out_of_order),
    ("a sha256 not hex", _sql("UPDATE files SET sha256 = 'g' || substr(sha256, 2) "
                              "WHERE path LIKE '%/note-03.md'")),
]


@pytest.mark.parametrize("large", [False, True], ids=["checked in process", "by the helper"])
@pytest.mark.parametrize(("damage", "how"), SYNC_FINDS, ids=[d for d, _ in SYNC_FINDS])
def test_damage_a_plain_read_misses_is_found_by_the_sync_and_repaired(
        world: Path, large: bool, damage: str, how: Callable[[Path], None]) -> None:
    from sharedmem.cache import file_check
    root, config = world / "laptop" / "cache", world / "laptop" / "client.json"
    if large:  # past file_check.MIN_FILES: a helper checks the manifest while the sync walks
        for i in range(file_check.MIN_FILES):
            (world / "laptop" / "notes" / f"extra-{i:04}.md").write_text(
                f"# extra {i}\nextra body {i:04}\n")
        assert sync(config).returncode == 0
    manifest = root / ".sharedmem" / "manifest.sqlite3"
    how(manifest)
    assert Cache(root).check(verify=False) is None  # what a plain read sees: nothing
    done = sync(config)
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["pull"]["repaired"]["records"] is True
    assert_cache_is_the_server(world)
    import sqlite3
    with sqlite3.connect(manifest) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert conn.execute("SELECT count(*) FROM files").fetchone()[0] == len(published(world))
    again = sync(config)  # and it stays repaired
    assert again.returncode == 0 and "repaired" not in json.loads(again.stdout)["pull"]


def test_a_damaged_manifest_stays_refused_while_the_server_cannot_be_reached(
        world: Path) -> None:
    root, config = world / "laptop" / "cache", world / "laptop" / "client.json"
    (root / ".sharedmem" / "manifest.sqlite3").write_text("{")
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    raw = json.loads(config.read_text())
    raw["transport"]["store"] = "client.json/store.sqlite3"  # no store can be made there
    config.write_text(json.dumps(raw))
    failed = sync(config)
    assert failed.returncode == 2, failed.stdout + failed.stderr
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before
    with pytest.raises(CacheError, match="being repaired"):
        tools.search(Cache(root), ["desk text 1"])


def test_the_mcp_server_says_the_cache_is_being_repaired(world: Path) -> None:
    from conftest import McpServer as Server
    (world / "laptop" / "cache" / ".sharedmem" / "manifest.sqlite3").write_text("{")
    server = Server(world / "laptop" / "client.json")
    try:
        server.init()
        answer = server.call("search", queries=["desk text"])
        assert answer["isError"] is True
        assert REPAIRING in answer["content"][0]["text"], answer
    finally:
        server.close()
    cli = subprocess.run([sys.executable, str(LAUNCHER), "read", "--config",
                          str(world / "laptop" / "client.json"), "machines/desk/notes/desk-1.md"],
                         capture_output=True, text=True, timeout=60)
    assert cli.returncode == 2 and REPAIRING in cli.stderr, cli.stderr


# --- a full disk --------------------------------------------------------------------------------

# Inside a mount namespace of its own: put the cache on a tmpfs of SIZE, sync, note the cache
# before and after; then make the tmpfs larger (space freed) and sync again. The tmpfs goes with
# the namespace, so what the test checks is printed as JSON.
SMALL_DISK = r"""
import hashlib, json, os, shutil, subprocess, sys
cache, size, launcher, config = sys.argv[1:5]
def tree(root):
    out = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, root).replace(os.sep, "/")
            if os.path.isdir(path):
                out[rel] = None
            else:
                with open(path, "rb") as handle:
                    out[rel] = hashlib.sha256(handle.read()).hexdigest()
    return out
def sync():
    done = subprocess.run([sys.executable, launcher, "sync", "--config", config, "--json"],
                          capture_output=True, text=True)
    return {"code": done.returncode, "stdout": done.stdout, "stderr": done.stderr}
os.rename(cache, cache + ".orig")
os.mkdir(cache)
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=" + size, "tmpfs", cache], check=True)
shutil.copytree(cache + ".orig", cache, dirs_exist_ok=True)  # times kept: the cache as synced
before = tree(cache)
first = sync()
after = tree(cache)
subprocess.run(["mount", "-o", "remount,size=64m", cache], check=True)
second = sync()
final = {}
for rel, sha in tree(cache).items():
    if sha and rel.endswith(".md") and not rel.startswith(".sharedmem/"):
        with open(os.path.join(cache, rel), encoding="utf-8") as handle:
            final[rel] = handle.read()
print(json.dumps({"before": before, "after": after, "first": first, "second": second,
                  "final": final}))
"""


@functools.cache
def _mount_namespace() -> list[str] | str:
    """How to run a command that may mount a tmpfs of its own (`unshare`), or why it cannot."""
    unshare = shutil.which("unshare")
    if not sys.platform.startswith("linux") or unshare is None:
        return "needs Linux and unshare(1) to mount a small tmpfs"
    probe = "d=$(mktemp -d) && mount -t tmpfs -o size=1m tmpfs $d && umount $d && rmdir $d"
    tried = []
    for prefix in ([unshare, "-m"], [unshare, "-rm"]):  # as root; else in a user namespace
        done = subprocess.run([*prefix, "sh", "-c", probe], capture_output=True, text=True)
        if done.returncode == 0:
            return prefix
        tried.append(f"{' '.join(prefix[1:])}: {done.stderr.strip()[:200]}")
    return "cannot mount a tmpfs in a mount namespace here (" + "; ".join(tried) + ")"


def _add_notes(folder: Path, count: int, size: int, stem: str = "big") -> None:
    for i in range(count):
        (folder / f"{stem}-{i:03}.md").write_text(f"# {stem}\n{stem} {i:03} " + "x" * size + "\n")


@pytest.mark.parametrize(("case", "machine_name", "count", "size"), [
    ("own files staged ahead by the helper", "laptop", 300, 16_000),
    ("own files written by the pull", "laptop", 6, 900_000),
    ("another machine's files, staged as they arrive", "desk", 300, 16_000),
])
def test_a_full_cache_disk_fails_cleanly_and_the_next_sync_completes(
        world: Path, case: str, machine_name: str, count: int, size: int) -> None:
    prefix = _mount_namespace()
    if isinstance(prefix, str):
        pytest.skip(prefix)
    _add_notes(world / machine_name / "notes", count, size)
    if machine_name == "desk":
        done = sync(world / "desk" / "client.json")
        assert done.returncode == 0, done.stdout + done.stderr
    cache = world / "laptop" / "cache"
    run = subprocess.run([*prefix, sys.executable, "-c", SMALL_DISK, str(cache), "4m",
                          str(LAUNCHER), str(world / "laptop" / "client.json")],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout)
    first = seen["first"]
    assert first["code"] == 2, first
    assert "Traceback" not in first["stderr"], first["stderr"]
    error = json.loads(first["stdout"])["error"]
    assert f"no space left on device writing {cache}{os.sep}" in error, error
    assert "free space on that disk" in error
    assert seen["after"] == seen["before"]  # exactly as it was: no file the manifest lacks
    assert seen["second"]["code"] == 0, seen["second"]
    assert seen["final"] == published(world)


# Lower this process's file size limit (RLIMIT_FSIZE: writes past it fail with EFBIG) once the
# sync has started `serve`, whose store must grow: a file-too-large fault anywhere a mount is
# impossible.
SIZE_LIMIT = r"""
import os, resource, runpy, signal, sys
limit, launcher = int(sys.argv[1]), sys.argv[2]
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG, not a signal
state = {"spawned": False, "set": False}
def hook(event, args):
    if event == "subprocess.Popen":
        state["spawned"] = True
    elif event == "open" and state["spawned"] and not state["set"]:
        state["set"] = True
        hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
sys.addaudithook(hook)
sys.argv = [launcher, *sys.argv[3:]]
runpy.run_path(launcher, run_name="__main__")
"""


def _tree(root: Path) -> dict[str, bytes | None]:
    return {p.relative_to(root).as_posix(): None if p.is_dir() else p.read_bytes()
            for p in sorted(root.rglob("*"))}


def assert_consistent(root: Path) -> None:
    """Every file the manifest names holds its sha256, and it names every cached file."""
    cache = Cache(root)
    files = cache.load().files
    assert cache.damage is None
    assert {p.relative_to(root).as_posix() for p in root.rglob("*.md")
            if ".sharedmem" not in p.parts} == set(files)
    for path, meta in files.items():
        assert sha256_text((root / path).read_text(encoding="utf-8")) == meta.sha256, path
        assert tools.read_file(cache, path)["sha256"] == meta.sha256


@pytest.mark.skipif(not hasattr(signal, "SIGXFSZ"), reason="needs RLIMIT_FSIZE (POSIX)")
@pytest.mark.parametrize(("case", "machine_name", "count", "size", "where"), [
    ("the manifest past the limit", "laptop", 600, 10, ".sharedmem/manifest.sqlite3"),
    ("the manifest past the limit, files replaced", "laptop", 600, 10,
     ".sharedmem/manifest.sqlite3"),
    ("a pulled file past the limit", "desk", 1, 100_000, ".sharedmem/staging/"),
])
def test_a_file_size_limit_fails_cleanly_and_the_next_sync_completes(
        world: Path, case: str, machine_name: str, count: int, size: int, where: str) -> None:
    _add_notes(world / machine_name / "notes", count, size, "small")
    replaced = "replaced" in case
    for i in range(3 if replaced else 0):  # these the sync writes before the manifest fails
        note = world / "laptop" / "notes" / f"note-{i:02}.md"
        note.write_text(note.read_text() + "changed\n")
    if machine_name == "desk":
        done = sync(world / "desk" / "client.json")
        assert done.returncode == 0, done.stdout + done.stderr
    cache, config = world / "laptop" / "cache", world / "laptop" / "client.json"
    before = _tree(cache)
    failed = subprocess.run([sys.executable, "-c", SIZE_LIMIT, str(48 * 1024), str(LAUNCHER),
                             "sync", "--config", str(config), "--json"],
                            capture_output=True, text=True, timeout=120)
    assert failed.returncode == 2, failed.stdout + failed.stderr
    assert "Traceback" not in failed.stderr, failed.stderr
    error = json.loads(failed.stdout)["error"]
    if "manifest" in where:  # SQLite says "disk I/O error" or "disk is full", not the errno
        assert f"cannot write {cache / where} (" in error, error
        assert "size limit" in error and "free space" in error
    else:
        assert f"file too large writing {cache / where}" in error, error
    assert_consistent(cache)
    if replaced:  # the newer texts it had put in place stay, and the manifest records them
        assert {p for p, v in _tree(cache).items() if v != before.get(p)} == {
            f"machines/laptop/notes/note-{i:02}.md" for i in range(3)} | {
            ".sharedmem/manifest.sqlite3"}
    else:
        assert _tree(cache) == before  # exactly as it was
    done = sync(config)
    assert done.returncode == 0, done.stdout + done.stderr
    assert_cache_is_the_server(world)
