"""Shared fixtures: a temporary HOME, client configurations, and a real OpenSSH server on loopback."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sharedmem.hashing import sha256_text
from sharedmem.server.ingest import IncomingFile
from sharedmem.server.store import Store

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

from loopback_sshd import LAUNCHER, REPO, Sshd, SshdUnavailable, pinned_line, start_sshd  # noqa: E402

__all__ = ["LAUNCHER", "REPO", "Sshd", "cache_of", "exported", "files", "flip_schema_byte",
           "garbage", "pinned_line", "raw_rows", "run_cli", "run_with_timeout", "write_config"]


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


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A temporary HOME for this test; nothing touches the real one."""
    path = tmp_path / "home"
    path.mkdir()
    for name in ("CODEX_HOME", "CLAUDE_CONFIG_DIR", "XDG_CONFIG_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(path))
    return path


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
