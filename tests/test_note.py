"""Adding a note through the real client code, delivered to a real local `serve` and store."""

from __future__ import annotations

from conftest import write_config

from sharedmem.client import config as config_mod
from sharedmem.client.note import submit_note
from sharedmem.client.status import status


def test_submit_note_stores_then_is_idempotent(tmp_path):
    store = tmp_path / "store.sqlite3"
    cfg = config_mod.load(write_config(tmp_path / "laptop" / "client.json", "laptop",
                                       {"kind": "local", "store": str(store)}, [],
                                       tmp_path / "laptop" / "cache"))
    result = submit_note(cfg, "2026-11-30T09-00-00-decision.md", "we chose SQLite")
    assert result["status"] == "stored"
    assert result["path"] == "extensions/ad_hoc/notes/2026-11-30T09-00-00-decision.md"
    assert (cfg.cache / result["path"]).read_text().count("we chose SQLite") == 1
    assert status(cfg)["pending_notes"] == []
