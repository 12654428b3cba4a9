"""`status` over a real cache, outbox and last-attempt file."""

from __future__ import annotations

from pathlib import Path

from conftest import write_config

from sharedmem.cache.cache import Cache, NamespaceInfo
from sharedmem.client import config as config_mod
from sharedmem.client.outbox import Outbox
from sharedmem.client.status import status
from sharedmem.hashing import sha256_text

NS = "machines/laptop/notes"


def load(tmp_path: Path) -> config_mod.ClientConfig:
    path = write_config(tmp_path / "client.json", "laptop",
                        {"kind": "local", "store": str(tmp_path / "store.sqlite3")},
                        [{"name": "notes", "kind": "markdown", "path": str(tmp_path)}],
                        tmp_path / "cache")
    return config_mod.load(path, {"HOME": str(tmp_path)})


def test_a_client_that_never_synced(tmp_path: Path) -> None:
    info = status(load(tmp_path))
    assert info["machine"] == "laptop" and info["last_sync"] is None
    assert info["age"] is None and info["age_seconds"] is None
    assert info["last_attempt"] == {} and info["pending_notes"] == [] and info["namespaces"] == []


def test_what_the_cache_holds_and_what_waits(tmp_path: Path) -> None:
    cfg = load(tmp_path)
    Cache(cfg.cache).apply([(f"{NS}/a.md", sha256_text("a\n"), "a\n"),
                            (f"{NS}/b/c.md", sha256_text("c\n"), "c\n")], [],
                           {NS: NamespaceInfo(NS, "laptop", "notes", "markdown", 3, "then")})
    Outbox(cfg.state / "outbox").put("2026-01-31T09-30-00-idea.md", "later")
    cfg.state.mkdir(parents=True, exist_ok=True)
    (cfg.state / "last-sync.json").write_text('{"status": "failed", "error": "unreachable"}')
    info = status(cfg)
    assert info["last_sync"] is not None and 0 <= info["age_seconds"] < 60
    assert info["last_attempt"] == {"status": "failed", "error": "unreachable"}
    assert info["pending_notes"] == ["2026-01-31T09-30-00-idea.md"]
    assert info["namespaces"] == [{"key": NS, "machine": "laptop", "source": "notes",
                                   "kind": "markdown", "files": 2, "synced_at": "then"}]
    (cfg.state / "last-sync.json").write_text("[not an object")  # damaged: read as nothing
    assert status(cfg)["last_attempt"] == {}
