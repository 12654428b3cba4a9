"""Shared fixtures: a temporary HOME, client configurations, and a real OpenSSH server on loopback."""

from __future__ import annotations

import gc
import io
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sharedmem.hashing import sha256_text
from sharedmem.protocol import Channel
from sharedmem.server.ingest import IncomingFile
from sharedmem.server.store import Store
from sharedmem.sources.harness_memory import SYSTEM_ROOT_ENV

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

from loopback_sshd import LAUNCHER, REPO, Sshd, SshdUnavailable, pinned_line, start_sshd  # noqa: E402

__all__ = ["LAB_NS", "LAUNCHER", "REPO", "SYSTEM", "McpServer", "Sshd", "cache_of",
           "client_with_cache", "compressed_pair", "delivery_done", "exported", "files",
           "files_under", "flip_schema_byte", "garbage", "hung_ssh", "inflating", "kill_logged",
           "pinned_line", "raw_rows", "run_cli", "run_with_timeout", "ssh_client",
           "write_config"]


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
    from sharedmem.hashing import sha256_text
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
