"""The namespace rows both ends share: the wire list as before, the notes row found by its key."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from sharedmem.core import ProtocolError
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
                             "kind": "markdown", "generation": 7})
    assert ns == Namespace("machines/evil/notes", "evil", "notes", "markdown", 7)


@pytest.mark.parametrize(("row", "said"), [
    ({**DESK, "generation": "7"}, "generation must be an integer from 0, not '7'"),
    ({**DESK, "generation": True}, "generation must be an integer from 0, not True"),
    ({**DESK, "generation": -1}, "generation must be an integer from 0, not -1"),
    ({**DESK, "key": None}, "key must be a string, not None"),
    ({**DESK, "machine": 5}, "machine must be a string or null, not 5"),
    ({**DESK, "synced_at": ["x"]}, "synced_at must be a string or null"),
    ({**DESK, "files": 1.5}, "files must be an integer from 0, not 1.5"),
    ({**DESK, "digest": 0}, "digest must be a string or null, not 0"),
    ({k: v for k, v in DESK.items() if k != "kind"}, "has no kind"),
    ([DESK], "a namespaces row is not an object: list"),
])
def test_a_row_of_the_wrong_shape_is_refused_where_it_is_read(row: object, said: str) -> None:
    with pytest.raises(ProtocolError, match=re.escape(said)):
        Namespace.from_row(row)
    with pytest.raises(ProtocolError, match=re.escape(said)):
        NamespaceList.from_rows([NOTES, row])


def test_a_list_that_is_not_a_list_is_refused() -> None:
    with pytest.raises(ProtocolError, match="namespaces must be a list of rows, not dict"):
        NamespaceList.from_rows({"key": "x"})


def test_a_store_lists_its_notes_last_on_the_wire(tmp_path: Path) -> None:
    with Store.open(tmp_path / "store.sqlite3") as store:
        listing = store.namespaces()
        assert listing.machines == [] and listing.notes is not None
        assert listing.to_rows() == [{**NOTES, "generation": 0, "synced_at": None, "files": 0,
                                      "created_generation": 2 * 10**12}]
