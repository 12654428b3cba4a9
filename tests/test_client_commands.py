"""Tests for sharedmem.cli.client_commands: status, index, note and the sync's text, in process.

The commands run through `main` as a user runs them (or the real launcher, as a child), on a real
cache and outbox under tmp_path.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import config_for, make_memories, run_cli, write_config

from sharedmem.cache.cache import Cache, NamespaceInfo
from sharedmem.cli import main as cli
from sharedmem.client.outbox import Outbox
from sharedmem.hashing import sha256_text


def status_config(tmp_path: Path) -> Path:
    """A client with a cache of one namespace of two files and one note waiting."""
    cfg = write_config(tmp_path / "client" / "client.json", "laptop",
                       {"kind": "local", "store": str(tmp_path / "store.sqlite3")}, [],
                       tmp_path / "cache")
    key = "machines/desk/notes"
    Cache(tmp_path / "cache").apply(
        [(f"{key}/a.md", sha256_text("a\n"), "a\n"), (f"{key}/b.md", sha256_text("b\n"), "b\n")],
        [], {key: NamespaceInfo(key, "desk", "notes", "markdown", 3, "2026-01-01T00:00:00Z")})
    Outbox(tmp_path / "client" / "state" / "outbox").put("2026-01-31T09-30-00-idea.md", "idea")
    return cfg


def test_a_note_that_is_not_utf8_is_refused_by_the_note_rule(tmp_path: Path) -> None:
    cfg = status_config(tmp_path)
    result = run_cli("note", "--config", str(cfg), "2026-01-31T09-30-00-x.md", "bad \udcff byte")
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("shared_memory.py note: error: argument 'note' of "
                                    "add_ad_hoc_note is not valid UTF-8 text")
    assert len(Outbox(tmp_path / "client" / "state" / "outbox").pending()) == 1  # only "idea"


def test_status_json_is_valid_json(tmp_path: Path, home: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    cfg = status_config(tmp_path)
    assert cli.main(["status", "--config", str(cfg), "--json"]) == 0
    out, err = capsys.readouterr()
    info = json.loads(out)
    assert err == ""
    assert info["machine"] == "laptop" and info["cache"] == str(tmp_path / "cache")
    assert info["pending_notes"] == ["2026-01-31T09-30-00-idea.md"]
    assert info["namespaces"] == [{"key": "machines/desk/notes", "machine": "desk",
                                   "source": "notes", "kind": "markdown", "files": 2,
                                   "synced_at": "2026-01-01T00:00:00Z"}]
    assert info["last_sync"] and info["age_seconds"] >= 0

    assert cli.main(["status", "--config", str(cfg)]) == 0
    text = capsys.readouterr().out
    assert "machine laptop" in text and "machines/desk/notes: 2 files" in text
    assert "pending notes: 1" in text


def test_index_refreshes_and_reports(tmp_path: Path, home: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    cfg = status_config(tmp_path)
    assert cli.main(["index", "--config", str(cfg), "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == {"changed": 2, "files": 2} and err == ""
    assert cli.main(["index", "--config", str(cfg)]) == 0
    assert capsys.readouterr().out == "index: 0 files refreshed, 2 indexed\n"
    quiet = run_cli("index", "--cache", str(tmp_path / "cache"), "--background")  # a child:
    assert (quiet.returncode, quiet.stdout, quiet.stderr) == (0, "", "")  # it lowers its priority
    assert cli.main(["index", "--cache", str(tmp_path)]) == 2
    assert "is not a synced cache" in capsys.readouterr().err


def test_status_says_a_damaged_cache_and_the_refused_notes(tmp_path: Path, home: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    from sharedmem.client.exchange import _quarantine
    cfg = status_config(tmp_path)
    outbox = Outbox(tmp_path / "client" / "state" / "outbox")
    [(path, queued)] = outbox.pending()
    _quarantine(path, {"filename": queued.filename, "note_id": queued.note_id,
                       "message": "a note must not be empty\x1b[2J"})
    outbox.done(path)
    (tmp_path / "cache" / ".sharedmem" / "manifest.sqlite3").write_text("{", encoding="utf-8")
    assert cli.main(["status", "--config", str(cfg)]) == 0
    text = capsys.readouterr().out
    assert (f"the cache is damaged and will be repaired by the next sync (run "
            f"`shared_memory.py sync --config {cfg}` now to repair it): ") in text
    assert "refused notes: 1 (kept in " in text
    assert "  2026-01-31T09-30-00-idea.md: a note must not be empty\\x1b[2J" in text
    assert cli.main(["status", "--config", str(cfg), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert "manifest.sqlite3" in info["damage"] and info["refused_notes_total"] == 1


def test_the_sync_text_counts_the_cache_files_it_repaired(tmp_path: Path) -> None:
    home = tmp_path / "h"
    make_memories(home, files=3)
    cfg = config_for(tmp_path, home, "laptop",
                     {"kind": "local", "store": str(tmp_path / "store.sqlite3")})
    assert run_cli("sync", "--config", str(cfg)).returncode == 0
    cache = tmp_path / "laptop" / "cache"
    (cache / "machines/laptop/notes/d1/note-001.md").write_text("edited by hand\n")
    (cache / "machines/laptop/codex/MEMORY.md").write_text("edited too\n")
    proc = run_cli("sync", "--config", str(cfg))
    assert proc.returncode == 0, proc.stderr
    assert "    2 cache files repaired (changed by hand or damaged" in proc.stdout, proc.stdout
    again = run_cli("sync", "--config", str(cfg))
    assert again.returncode == 0 and "repaired" not in again.stdout, again.stdout
