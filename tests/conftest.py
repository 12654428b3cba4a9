"""Shared fixtures and helpers: a temporary HOME, client configurations, a real sshd on loopback.

Tests share helpers only through this file (`from conftest import ...`), never by importing
another test file; a large table of shared test data may live in a plainly named data module
instead (credential_samples.py).
"""

from __future__ import annotations

import gc
import io
import json
import os
import queue
import shutil
import signal
import sqlite3
import stat
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sharedmem.client import config as config_mod
from sharedmem.client.config import ClientConfig, Transport
from sharedmem.hashing import sha256_text
from sharedmem.protocol import Channel
from sharedmem.rules import KIND_MARKDOWN
from sharedmem.server.ingest import IncomingFile, ingest
from sharedmem.server.store import Store
from sharedmem.sources.harness_memory import SYSTEM_ROOT_ENV
from sharedmem.sources.kinds import SourceSpec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

from loopback_sshd import LAUNCHER, REPO, Sshd, SshdUnavailable, pinned_line, start_sshd  # noqa: E402

__all__ = ["AGENTS", "CLAUDE", "CURSOR", "LAB_NS", "LAUNCHER", "LOG_BASE", "LOG_TAIL", "OPENCODE",
           "PREFIX", "REPO", "SYSTEM", "TOML", "McpServer", "Sshd", "backup_manifest",
           "cache_files", "cache_of", "client_with_cache", "compressed_pair", "config_for",
           "delivery_done", "enc", "env_for", "exported", "files", "files_under", "flat_release", "flip",
           "flip_schema_byte", "garbage", "hung_ssh", "index_covers", "inflating", "keygen", "kill_logged",
           "local_config", "make_client_home", "make_memories", "make_store", "mode",
           "pinned_line", "published", "raw_rows", "reasons", "run_cli", "run_installer",
           "run_with_timeout", "spec", "ssh_args", "ssh_client", "sync_json", "talk", "tree",
           "write", "write_config"]


def run_cli(*args: str, env: dict[str, str] | None = None, input: str | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess:
    """Run the real launcher in a child process."""
    return subprocess.run([sys.executable, str(LAUNCHER), *args], capture_output=True, text=True,
                          env=env, input=input, timeout=timeout)


def run_with_timeout(func, seconds: float = 20.0):
    """Run `func` in a daemon thread; fail (instead of hanging the suite) if it does not finish."""
    box: dict = {}

    def target():
        try:
            box["value"] = func()
        except BaseException as exc:  # re-raised in the test thread
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"call did not finish within {seconds}s (blocked on a read?)"
    if "error" in box:
        raise box["error"]
    return box["value"]


def collections_in(work):
    """Run `work` with the collector on; its result and the generation of each collection run.

    The collector must be on when it is called, and on again after.
    """
    generations: list[int] = []

    def count(phase: str, info: dict) -> None:
        if phase == "start":
            generations.append(info["generation"])

    assert gc.isenabled()
    gc.callbacks.append(count)
    try:
        value = work()
    finally:
        gc.callbacks.remove(count)
    assert gc.isenabled()
    return value, generations


# --- the exchange's channel ---------------------------------------------------------------------

def compressed_pair() -> tuple[Channel, io.BytesIO]:
    """A channel that compresses what it sends, and the wire it writes to."""
    wire = io.BytesIO()
    sender = Channel(io.BufferedReader(io.BytesIO()), wire, "client")
    sender.compress_output()
    return sender, wire


def inflating(data: bytes, peer: str = "server") -> Channel:
    """A channel reading `data` as the zlib stream both hellos agreed on."""
    channel = Channel(io.BufferedReader(io.BytesIO(data)), io.BytesIO(), peer)
    channel.decompress_input()
    return channel


def cache_of(root: Path, namespace: str, files: dict[str, str], *, kind: str = "markdown",
             generation: int = 1, synced_at: str = "2026-01-02T03:04:05Z"):
    """A real cache holding one namespace `machines/<machine>/<source>` with these files."""
    from sharedmem.cache.cache import Cache, NamespaceInfo
    _, machine, source = namespace.split("/")
    cache = Cache(root)
    info = NamespaceInfo(namespace, machine, source, kind, generation, synced_at)
    cache.apply([(f"{namespace}/{p}", sha256_text(t), t) for p, t in sorted(files.items())], [],
                {namespace: info})
    return cache


# An empty folder in place of `/` for system-wide harness settings (managed settings, /etc/codex),
# set before any test module is imported: no test, nor any process a test starts, reads the real
# ones. Tests that build an environment of their own copy it from SYSTEM.
SYSTEM_ROOT = Path(tempfile.mkdtemp(prefix="sharedmem-system-root-"))
os.environ[SYSTEM_ROOT_ENV] = str(SYSTEM_ROOT)
SYSTEM = {SYSTEM_ROOT_ENV: str(SYSTEM_ROOT)}


@pytest.fixture(autouse=True, scope="session")
def system_root() -> Iterator[Path]:
    """The stand-in for `/`, removed once the session ends."""
    yield SYSTEM_ROOT
    shutil.rmtree(SYSTEM_ROOT, ignore_errors=True)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A temporary HOME for this test; nothing touches the real one."""
    path = tmp_path / "home"
    path.mkdir()
    for name in ("CODEX_HOME", "CLAUDE_CONFIG_DIR", "XDG_CONFIG_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(path))
    return path


def files_under(root: Path) -> dict[str, bytes]:
    """Every file below `root` (by its relative path) and its bytes, to compare trees."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def write_config(path: Path, machine: str, transport: dict, sources: list[dict],
                 cache: Path, state: Path | None = None) -> Path:
    """A client.json for tests."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "machine": machine, "transport": transport, "sources": sources,
        "cache": str(cache), "state": str(state or path.parent / "state")}), encoding="utf-8")
    return path


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[Sshd]:
    """A real OpenSSH server for this test only, stopped afterwards."""
    store = tmp_path / "server" / "store.sqlite3"
    store.parent.mkdir()
    try:
        server = start_sshd(tmp_path / "sshd", store)
    except SshdUnavailable as exc:
        pytest.skip(str(exc))
    yield server
    server.stop()


@pytest.fixture
def busy_sshd(tmp_path: Path) -> Iterator[Sshd]:
    """A real sshd that drops a connection while another one authenticates (`MaxStartups 1`).

    A test holds one unauthenticated connection (`Sshd.hold_startup`) to make it busy; each drop
    is logged (`Sshd.dropped`).
    """
    store = tmp_path / "server" / "store.sqlite3"
    store.parent.mkdir()
    try:
        server = start_sshd(tmp_path / "sshd", store, max_startups="1", log_level="VERBOSE")
    except SshdUnavailable as exc:
        pytest.skip(str(exc))
    yield server
    server.stop()


# --- the store ---------------------------------------------------------------------------------

@pytest.fixture
def st(tmp_path: Path) -> Iterator[Store]:
    """A real store in a fresh file, closed afterwards."""
    s = Store.open(tmp_path / "store.sqlite3")
    yield s
    s.close()


def files(mapping: dict[str, str]) -> list[IncomingFile]:
    """Files as a client publishes them, with their text."""
    return [IncomingFile(p, sha256_text(t), len(t.encode()), 0, t) for p, t in mapping.items()]


def body(text: str) -> tuple[str, int, bytes]:
    """A body as `Store.put_blobs` takes it: (sha256, size, UTF-8)."""
    return sha256_text(text), len(text.encode()), text.encode()


def old_store(path: Path, version: int) -> Path:
    """A store of schema `version` at `path`, from its fixture (tests/fixtures/store-vN.sql)."""
    conn = sqlite3.connect(path)
    conn.executescript((REPO / "tests" / "fixtures" / f"store-v{version}.sql")
                       .read_text(encoding="utf-8"))
    conn.execute(f"PRAGMA user_version={version}")
    conn.close()
    return path


def exported(st: Store, prefix: str = "") -> dict[str, str]:
    """The store's published tree as path -> text."""
    return {p: t for p, _, t in st.export() if p.startswith(prefix)}


def raw_rows(st: Store, machine: str, source: str) -> tuple:
    """The namespace row, its file rows and its tombstones, as SQLite holds them."""
    ns = st.conn.execute("SELECT * FROM namespaces WHERE machine=? AND source=?",
                         (machine, source)).fetchone()
    rows = st.conn.execute("SELECT * FROM files WHERE namespace_id=? ORDER BY path",
                           (ns[0],)).fetchall()
    tombs = st.conn.execute("SELECT * FROM tombstones WHERE namespace_id=? ORDER BY path",
                            (ns[0],)).fetchall()
    return ns, rows, tombs


# --- the MCP server -----------------------------------------------------------------------------

class McpServer:
    """A running `shared_memory.py mcp` with line-level helpers and a read timeout.

    Replies are matched to requests by id: one that comes before the one awaited (a note's,
    answered once the server has it) is kept until it is asked for.
    """

    def __init__(self, config: Path, cmd: list[str] | None = None, env: dict | None = None) -> None:
        self.proc = subprocess.Popen(
            cmd or [sys.executable, str(LAUNCHER), "mcp", "--config", str(config)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        self.lines: queue.Queue[bytes] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        self.next_id = 100
        self.kept: dict = {}

    def _pump(self) -> None:
        assert self.proc.stdout
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(b"")

    def send(self, data: bytes | str | Any) -> None:
        if not isinstance(data, bytes | str):
            data = json.dumps(data)
        if isinstance(data, str):
            data = data.encode("utf-8")
        assert self.proc.stdin
        self.proc.stdin.write(data if data.endswith(b"\n") else data + b"\n")
        self.proc.stdin.flush()

    def reply(self, timeout: float = 20) -> Any:
        """The next line the server writes, parsed."""
        line = self.lines.get(timeout=timeout)
        assert line, "the server closed its output"
        return json.loads(line)

    def request(self, method: str, params: Any = None, **extra: Any) -> int:
        """Send a request without waiting for its reply: its id."""
        self.next_id += 1
        msg = {"jsonrpc": "2.0", "id": self.next_id, "method": method, **extra}
        if params is not None:
            msg["params"] = params
        self.send(msg)
        return self.next_id

    def answer(self, ident: Any, timeout: float = 20) -> Any:
        """The reply to request `ident`; replies to others that come first are kept."""
        deadline = time.monotonic() + timeout
        while ident not in self.kept:
            got = self.reply(max(0.01, deadline - time.monotonic()))
            assert isinstance(got, dict) and "id" in got, got
            self.kept[got["id"]] = got
        return self.kept.pop(ident)

    def ask(self, method: str, params: Any = None, **extra: Any) -> Any:
        return self.answer(self.request(method, params, **extra))

    def start_call(self, name: str, **arguments: Any) -> int:
        """Send a tools/call without waiting: its id (`result_of` then waits for it)."""
        return self.request("tools/call", {"name": name, "arguments": arguments})

    def result_of(self, ident: int, timeout: float = 20) -> dict[str, Any]:
        result = self.answer(ident, timeout)["result"]
        if not result["isError"]:
            assert json.loads(result["content"][0]["text"]) == result.get(
                "structuredContent", json.loads(result["content"][0]["text"]))
        return result

    def call(self, name: str, **arguments: Any) -> dict[str, Any]:
        return self.result_of(self.start_call(name, **arguments))

    def init(self, version: str = "2025-06-18") -> dict[str, Any]:
        answer = self.ask("initialize", {"protocolVersion": version, "capabilities": {},
                                         "clientInfo": {"name": "pytest", "version": "1"}})
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return answer["result"]

    def alive(self) -> None:
        assert self.ask("ping")["result"] == {}

    def close(self) -> int:
        assert self.proc.stdin
        self.proc.stdin.close()
        code = self.proc.wait(timeout=30)
        self.stderr = self.proc.stderr.read().decode() if self.proc.stderr else ""
        return code


LAB_NS = "machines/lab/codex"  # the namespace `client_with_cache` fills


def client_with_cache(root: Path, files: dict[str, str]) -> Path:
    """A cache under `root` of one namespace (LAB_NS) holding `files`; its client.json."""
    from sharedmem.cache.cache import Cache, NamespaceInfo
    info = NamespaceInfo(LAB_NS, "lab", "codex", "codex", 1, "2026-01-01T00:00:00Z")
    Cache(root / "cache").apply(
        [(f"{LAB_NS}/{p}", sha256_text(t), t) for p, t in sorted(files.items())], [],
        {LAB_NS: info})
    path = root / "client.json"
    path.write_text(json.dumps({
        "machine": "lab", "transport": {"kind": "local", "store": str(root / "s.sqlite3")},
        "sources": [], "cache": str(root / "cache"), "state": str(root / "state")}))
    return path


def hung_ssh(folder: Path) -> tuple[Path, Path]:
    """An `ssh` that never answers, in `folder`/bin: (that bin folder, the log of its pids)."""
    bin_dir, log = folder / "bin", folder / "ssh-starts.log"
    bin_dir.mkdir(parents=True)
    script = bin_dir / "ssh"
    script.write_text(f"#!/bin/sh\necho $$ >> '{log}'\nexec sleep 300\n", encoding="utf-8")
    script.chmod(0o755)
    return bin_dir, log


def ssh_client(folder: Path) -> Path:
    """A client.json whose server is reached by `ssh` (the one on PATH)."""
    path = folder / "laptop" / "client.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "machine": "laptop", "sources": [], "cache": str(folder / "laptop" / "cache"),
        "state": str(folder / "laptop" / "state"),
        "transport": {"kind": "ssh", "host": "server.invalid",
                      "remote_command": ["python3", "shared_memory.py", "serve"]}}))
    return path


def kill_logged(log: Path) -> None:
    """Kill every hung `ssh` that wrote its pid to `log`."""
    for pid in log.read_text().split() if log.exists() else []:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass


def delivery_done(state: Path, seconds: float = 30) -> bool:
    """Wait until no note delivery of this client runs (none started, or it has ended)."""
    from sharedmem.client.lock import delivery_lock
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with delivery_lock(state) as free:
            if free:
                return True
        time.sleep(0.05)
    return False

def index_covers(cache: Any, seconds: float = 60) -> bool:
    """Wait until the search index covers the cache's manifest whole (the background refresh a
    sync started is done), and its writer has let go."""
    from sharedmem.cache import search_index
    deadline = time.monotonic() + seconds
    while search_index.index_mark(cache) is None:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    with search_index.writer_lock(cache, seconds) as held:
        return held


def flip_schema_byte(path: Path) -> None:
    """One bit of a search index's schema text flipped: SQLite's error about it is not UTF-8."""
    import sqlite3
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    data = bytearray(path.read_bytes())
    data[data.index(b"CREATE TABLE 'grams_config'") + 2] ^= 0x80  # E: 'CR\xc5ATE'
    path.write_bytes(bytes(data))


def garbage(path: Path) -> None:
    """A file that is not a database at all."""
    path.write_bytes(b"this is not a database" * 100)


# --- syncs end to end ---------------------------------------------------------------------------

def make_memories(home: Path, files: int = 20) -> Path:
    """A codex memory folder and a markdown notes folder for one machine; the notes folder."""
    mem = home / ".codex" / "memories"
    (mem / "rollout_summaries").mkdir(parents=True)
    (mem / "MEMORY.md").write_text("# Memory\n- build with uv\n", encoding="utf-8")
    (mem / "memory_summary.md").write_text("summary of memory\n", encoding="utf-8")
    (mem / "raw_memories.md").write_text("never published\n", encoding="utf-8")
    notes = home / "notes"
    for i in range(files):
        target = notes / f"d{i % 4}" / f"note-{i:03}.md"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(f"# note {i}\nbody {i} café\n", encoding="utf-8")
    return notes


def config_for(tmp: Path, home: Path, machine: str, transport: dict) -> Path:
    """A client.json of `machine` publishing the two sources `make_memories` fills."""
    return write_config(tmp / machine / "client.json", machine, transport, [
        {"name": "codex", "kind": "codex", "path": str(home / ".codex" / "memories")},
        {"name": "notes", "kind": "markdown", "path": str(home / "notes")},
    ], tmp / machine / "cache")


def cache_files(cache: Path) -> dict[str, str]:
    """The Markdown files of a cache (its metadata left out) as path -> text."""
    return {str(p.relative_to(cache)): p.read_text(encoding="utf-8")
            for p in sorted(cache.rglob("*.md")) if ".sharedmem" not in p.parts}


def sync_json(cfg: Path, *extra: str) -> tuple[int, dict]:
    """A real `sync --json` in a child process: its exit status and its report."""
    proc = run_cli("sync", "--config", str(cfg), "--json", *extra)
    return proc.returncode, json.loads(proc.stdout)


def local_config(tmp_path: Path, store: Path, machine: str = "laptop") -> ClientConfig:
    """A loaded client configuration whose server is a local `serve` of `store`."""
    path = tmp_path / "client" / "client.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(config_mod.dumps(ClientConfig(
        path, machine, Transport("local", store=store), (), tmp_path / "cache",
        tmp_path / "state")))
    return config_mod.load(path, {"HOME": str(tmp_path)})


# --- a real `serve` fed raw lines ---------------------------------------------------------------

def enc(message: object) -> bytes:
    """One protocol line."""
    return json.dumps(message).encode() + b"\n"


def talk(store: Path, lines: list[bytes], *args: str) -> list[dict]:
    """Send raw lines to a real `serve` and return every message it wrote."""
    proc = subprocess.run([sys.executable, str(LAUNCHER), "serve", "--store", str(store), *args],
                          input=b"".join(lines), capture_output=True, timeout=60)
    return messages_of(proc.stdout)


def messages_of(data: bytes) -> list[dict]:
    """Every message of a server's output; a version 3 `files` message's raw texts in `texts`.

    The texts are decoded (None where the size is null), and each entry of `files` gains its
    text, as in versions 1 and 2, so a test reads a pull alike in every version.
    """
    out: list[dict] = []
    at, raw = 0, False
    while at < len(data):
        end = data.index(b"\n", at) + 1
        message = json.loads(data[at:end])
        at = end
        if message.get("type") == "hello":
            raw = message.get("version", 0) >= 3
        if raw and message.get("type") == "files" and "sizes" in message:
            texts = []
            for size in message["sizes"]:
                texts.append(None if size is None else data[at:at + size].decode())
                at += size or 0
            message["texts"] = texts
            message["files"] = [[*f, t] for f, t in zip(message["files"], texts, strict=True)]
        out.append(message)
    return out


# A log that grows: a file (about 1.8 KB) big enough to be sent as a tail once a line is appended.
LOG_BASE = "# log\n\n" + "".join(f"- line {i}: what happened then\n" for i in range(60))
LOG_TAIL = "- line 60: and then this\n"


# --- stores to back up --------------------------------------------------------------------------

def make_store(path: Path) -> Path:
    """A store at `path` holding two machines' files and a note of each."""
    with Store.open(path) as s:
        ingest(s, "alpha", "codex", "codex", [
            IncomingFile("MEMORY.md", text="# Alpha\n\n- likes ruff\n"),
            IncomingFile("rollout_summaries/one.md", text="rollout one\n")])
        ingest(s, "beta", "team", "markdown", [IncomingFile("a/b.md", text="team file\n")])
        s.append_note("alpha", "2026-01-31T09-30-00-release.md", "tag after CI")
        s.append_note("beta", "2026-01-31T09-30-00-release.md", "bump the version")
    return path


def flip(path: Path, offset: int) -> None:
    """Every bit of the byte at `offset` of the file flipped."""
    with open(path, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)
        handle.seek(offset)
        handle.write(bytes([byte[0] ^ 0xFF]))


def backup_manifest(folder: Path) -> dict:
    """The backups a backups folder's manifest.json lists, by file name."""
    return json.loads((folder / "manifest.json").read_text())["backups"]


# --- sources on real trees ----------------------------------------------------------------------

def write(path: Path, data: str | bytes) -> Path:
    """`data` written at `path` (UTF-8 if text), its folders made."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode("utf-8")
    path.write_bytes(data)
    return path


def spec(kind: str, root: Path, name: str | None = None) -> SourceSpec:
    """A source of `kind` at `root`, named as a client names it by default."""
    return SourceSpec(name or ("notes" if kind == KIND_MARKDOWN else kind), kind, root)


def published(snap: Any) -> list[str]:
    """The paths a snapshot publishes."""
    return [e.path for e in snap.files]


def reasons(snap: Any) -> dict[str, str]:
    """Each path a snapshot skipped, with the reason."""
    return {s.path: s.reason for s in snap.skipped}


# --- the installers -----------------------------------------------------------------------------

PREFIX = Path(".local/share/codex-shared-memory")  # the default prefix, under HOME
TOML = '# my settings\nmodel = "o3"\n\n[mcp_servers.other]\ncommand = "npx"\nargs = ["x"]\n'
CLAUDE = {"numStartups": 3, "projects": {"/src": {"allowedTools": []}}}
OPENCODE = {"$schema": "https://opencode.ai/config.json", "theme": "dark"}
CURSOR = {"mcpServers": {"other": {"command": "npx", "args": ["y"]}}}
AGENTS = "# My rules\n\nAlways run the tests.\n"


def keygen(path: Path) -> str:
    """A fresh ed25519 key pair; returns the public line."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", path.name, "-f",
                    str(path)], check=True, capture_output=True)
    return path.with_suffix(".pub").read_text().strip()


def env_for(home: Path, **extra: str) -> dict[str, str]:
    """This environment with HOME at `home`, no harness folder variables, no real scheduler."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("CODEX_HOME", "CLAUDE_CONFIG_DIR", "XDG_CONFIG_HOME")}
    env.update(HOME=str(home), SHAREDMEM_SCHEDULER_DRYRUN="1", **extra)
    return env


def run_installer(script: str, *args: str, home: Path, cwd: Path,
                  root: Path = REPO) -> subprocess.CompletedProcess:
    """Run an installer (of this checkout, or of the release in `root`) as a user would."""
    return subprocess.run([sys.executable, str(root / script), *args], capture_output=True,
                          text=True, env=env_for(home), cwd=cwd, timeout=180)


def tree(root: Path, skip: tuple[str, ...] = ()) -> dict[str, bytes | None]:
    """Every path under `root` with its bytes (None for folders), but those under `skip`."""
    out: dict[str, bytes | None] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if any(rel == s or rel.startswith(s + "/") for s in skip):
            continue
        out[rel] = None if path.is_dir() else path.read_bytes()
    return out


def mode(path: Path) -> int:
    """A file's permission bits."""
    return stat.S_IMODE(path.stat().st_mode)


def make_client_home(root: Path) -> Path:
    """A home with all four harnesses configured already, and some Codex memory."""
    home = root / "client-home"
    mem = home / ".codex" / "memories"
    (mem / "rollout_summaries").mkdir(parents=True)
    (mem / "MEMORY.md").write_text("# Memory\n- deploy with make\n", encoding="utf-8")
    (mem / "rollout_summaries" / "r1.md").write_text("rollout one\n", encoding="utf-8")
    (home / ".codex" / "config.toml").write_text(TOML, encoding="utf-8")
    (home / ".codex" / "AGENTS.md").write_text(AGENTS, encoding="utf-8")
    (home / ".claude").mkdir()
    (home / ".claude.json").write_text(json.dumps(CLAUDE), encoding="utf-8")
    (home / ".config" / "opencode").mkdir(parents=True)
    (home / ".config" / "opencode" / "opencode.json").write_text(json.dumps(OPENCODE))
    (home / ".cursor").mkdir()
    (home / ".cursor" / "mcp.json").write_text(json.dumps(CURSOR), encoding="utf-8")
    return home


def ssh_args(sshd: Sshd, key: Path | None = None, known: Path | None = None) -> list[str]:
    """install_client.py's options to reach `sshd` with `key` (its pinned key by default)."""
    return ["--ssh-host", f"{sshd.user}@127.0.0.1", "--ssh-port", str(sshd.port),
            "--ssh-identity", str(key or sshd.pinned_key),
            "--ssh-option", f"UserKnownHostsFile={known or sshd.known_hosts}",
            "--ssh-option", "GlobalKnownHostsFile=/dev/null", "--ssh-option", "LogLevel=ERROR"]


# --- an earlier release, from this checkout's history ---------------------------------------

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
