"""The note outbox on real files: whole, private, in order, and junk left for a person."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from sharedmem.client.outbox import Outbox
from sharedmem.core import NoteError


def note_name(i: int) -> str:
    return f"2026-01-31T09-30-{i:02}-idea-{i}.md"


def test_outbox_put_is_whole_and_private(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path / "outbox")
    note = outbox.put(note_name(1), "text with\nlines and café", note_id="fixed-id")
    entries = list((tmp_path / "outbox").iterdir())
    assert len(entries) == 1 and entries[0].suffix == ".json"
    assert not entries[0].name.startswith(".")
    assert stat.S_IMODE(entries[0].stat().st_mode) == 0o600
    assert json.loads(entries[0].read_text()) == {
        "note_id": "fixed-id", "filename": note_name(1), "text": "text with\nlines and café",
        "created": note.created}
    with pytest.raises(NoteError, match="invalid"):
        outbox.put("../escape.md", "x")
    with pytest.raises(NoteError, match="non-empty"):  # the whole note rule, not only the name
        outbox.put(note_name(2), " \n")
    assert list((tmp_path / "outbox").iterdir()) == entries


def test_outbox_pending_order_junk_and_done(tmp_path: Path) -> None:
    folder = tmp_path / "outbox"
    outbox = Outbox(folder)
    assert outbox.pending() == []
    ids = [outbox.put(note_name(i), f"note {i}").note_id for i in range(20)]
    (folder / "README.txt").write_text("not a note")
    (folder / ".tmp-abc.part").write_text("{}")
    (folder / ".hidden.json").write_text(json.dumps({"note_id": "h", "filename": note_name(1),
                                                     "text": "x", "created": "c"}))
    (folder / "0-broken.json").write_text("{half")
    (folder / "0-list.json").write_text("[1, 2]")
    (folder / "0-fields.json").write_text(json.dumps({"note_id": "x"}))
    (folder / "0-dir.json").mkdir()
    pending = outbox.pending()
    assert [n.note_id for _, n in pending] == ids
    assert [n.text for _, n in pending] == [f"note {i}" for i in range(20)]
    outbox.done(pending[0][0])
    outbox.done(pending[0][0])
    assert [n.note_id for _, n in outbox.pending()] == ids[1:]
    assert (folder / "0-broken.json").exists() and (folder / "README.txt").exists()


def test_holds_tells_from_the_names_whether_a_note_waits(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path / "outbox")
    assert not outbox.holds("0" * 32)  # no outbox yet
    note = outbox.put(note_name(1), "later")
    other = outbox.put(note_name(2), "later too")
    assert outbox.holds(note.note_id) and outbox.holds(other.note_id)
    assert not outbox.holds(note.note_id[:-1])  # a whole id, not a part of one
    [(path, _)] = [(p, n) for p, n in outbox.pending() if n.note_id == note.note_id]
    outbox.done(path)
    assert not outbox.holds(note.note_id) and outbox.holds(other.note_id)
