"""The namespace rows both ends share: the wire list as before, the notes row found by its key."""

from __future__ import annotations

import json
from pathlib import Path

from sharedmem.namespaces import Namespace, NamespaceList
from sharedmem.rules import NOTES_DIR
from sharedmem.server.store import Store

NOTES = {"key": NOTES_DIR, "machine": None, "source": "ad_hoc", "kind": "notes",
         "generation": 4, "created_generation": 0, "synced_at": "2026-01-02T00:00:00Z",
         "files": 2, "bytes": 0, "digest": ""}
DESK = {"key": "machines/desk/notes", "machine": "desk", "source": "notes", "kind": "markdown",
        "generation": 3, "created_generation": 1, "synced_at": "2026-01-01T00:00:00Z",
        "files": 5, "bytes": 120, "digest": "ab" * 32}


def test_a_list_reads_back_as_sent_with_the_notes_apart() -> None:
    listing = NamespaceList.from_rows([DESK, NOTES])
    assert listing.notes == Namespace(**NOTES) and listing.machines == [Namespace(**DESK)]
    assert json.dumps(listing.to_rows()) == json.dumps([DESK, NOTES])  # keys in wire order


def test_the_notes_row_is_found_wherever_it_is_and_may_be_missing() -> None:
    assert NamespaceList.from_rows([NOTES, DESK]).notes == Namespace(**NOTES)
    empty = NamespaceList.from_rows([])
    assert empty.notes is None and empty.every() == [] and empty.to_rows() == []


def test_a_row_with_only_the_fields_a_client_reads() -> None:
    ns = Namespace.from_row({"key": "machines/evil/notes", "machine": "evil", "source": "notes",
                             "kind": "markdown", "generation": "7"})
    assert ns == Namespace("machines/evil/notes", "evil", "notes", "markdown", 7)


def test_a_store_lists_its_notes_last_on_the_wire(tmp_path: Path) -> None:
    with Store.open(tmp_path / "store.sqlite3") as store:
        listing = store.namespaces()
        assert listing.machines == [] and listing.notes is not None
        assert listing.to_rows() == [{**NOTES, "generation": 0, "synced_at": None, "files": 0}]
