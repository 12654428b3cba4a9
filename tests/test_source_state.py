"""A source's saved state: read back as written, lines reused, each entry checked as it is read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sharedmem.client.source_state import SourceState, encode_state, read
from sharedmem.sources.walk import Entry


def entry(path: str, sha: str, text: str | None) -> Entry:
    return Entry(path=path, sha256=sha, size=5, mtime_ns=7, text=text, disk_size=5,
                 redactions={"jwt": 1} if text else {})


def test_written_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "notes.json"
    files = [entry("a.md", "1" * 64, "hello"), entry("b/c.md", "2" * 64, "world")]
    path.write_text(encode_state(["v", 1], "d", files, {}), encoding="utf-8")
    saved, lines = read(path)
    assert saved.rules == ["v", 1] and saved.acked == "d"
    assert saved.record == {"a.md": [5, 7, "1" * 64, 5, {"jwt": 1}],
                            "b/c.md": [5, 7, "2" * 64, 5, {"jwt": 1}]}
    assert saved.acked_shas() == {"1" * 64, "2" * 64}
    assert set(lines) == {"a.md", "b/c.md"}
    assert json.loads(path.read_text()) == {
        "rules": ["v", 1], "acked": {"digest": "d"}, "record": saved.record}
    assert path.read_text().startswith('{"rules": ["v", 1], "acked": {"digest": "d"}, "record": {\n')


def test_a_file_not_read_again_keeps_its_line(tmp_path: Path) -> None:
    path = tmp_path / "notes.json"
    first = [entry("a.md", "1" * 64, "hello"), entry("b.md", "2" * 64, "world")]
    path.write_text(encode_state([1], None, first, {}), encoding="utf-8")
    _, lines = read(path)
    again = [entry("a.md", "1" * 64, None), entry("b.md", "3" * 64, "world 2")]  # a.md unread
    text = encode_state([1], None, again, lines)
    old_line = next(line for line in path.read_text().splitlines() if '"a.md"' in line)
    assert old_line in text.splitlines()  # the very line, not one made anew
    path.write_text(text, encoding="utf-8")
    saved, _ = read(path)
    assert saved.record["a.md"][2] == "1" * 64 and saved.record["b.md"][2] == "3" * 64
    assert saved.acked is None and saved.acked_shas() == set()  # recorded, never acknowledged


def test_missing_and_damaged_state_files_read_as_none(tmp_path: Path) -> None:
    assert read(tmp_path / "missing.json") == (SourceState(), {})
    (tmp_path / "bad.json").write_text("{half")
    assert read(tmp_path / "bad.json") == (SourceState(), {})
    (tmp_path / "list.json").write_text("[1]")
    assert read(tmp_path / "list.json") == (SourceState(), {})
    (tmp_path / "odd.json").write_text(json.dumps({"rules": 1, "acked": "odd", "record": []}))
    assert read(tmp_path / "odd.json")[0] == SourceState()


GOOD = [1, 2, "a" * 64, 3, {}]


@pytest.mark.parametrize("bad", [
    [1], "text", [1, 2, "a" * 64, 3], [-1, 2, "a" * 64, 3, {}], [1, 2, "A" * 64, 3, {}],
    [1, 2, "a" * 63, 3, {}], [1, 2, "g" * 64, 3, {}], [True, 2, "a" * 64, 3, {}],
    [1, 2.0, "a" * 64, 3, {}], [1, 2, "a" * 64, -3, {}], [1, 2, "a" * 64, 3, []],
    [1, 2, "a" * 64, 3, {"jwt": -1}], [1, 2, "a" * 64, 3, {"jwt": "1"}],
])
def test_an_entry_of_another_shape_is_left_out_as_it_is_read(tmp_path: Path, bad: object) -> None:
    # Left out, that file is read again by the next walk; the others are trusted as they are.
    path = tmp_path / "notes.json"
    path.write_text(json.dumps({"rules": [1], "acked": {"digest": "d"},
                                "record": {"good.md": GOOD, "bad.md": bad}}))
    saved, _ = read(path)
    assert saved.record == {"good.md": GOOD} and saved.acked_shas() == {"a" * 64}


def test_an_older_acknowledgement_listing_its_files_reads_as_none(tmp_path: Path) -> None:
    # The next manifest is then the whole file list, once.
    path = tmp_path / "notes.json"
    path.write_text(json.dumps({"rules": [1], "acked": {"files": {"good.md": "a" * 64}},
                                "record": {"good.md": GOOD}}))
    saved, _ = read(path)
    assert saved.acked is None and saved.record == {"good.md": GOOD}


# --- what the walk is given: the record as read, a malformed entry read again ----------------

def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def through_the_state_file(tmp_path: Path, record: object) -> dict:
    """The record a sync gives the walk: saved as a state file, then read back."""
    path = tmp_path / "state.json"
    path.write_text(json.dumps({"rules": [1], "acked": None, "record": record}))
    return read(path)[0].record


@pytest.mark.parametrize("previous", [
    "garbage", [1, 2], {"x.md": "bad"}, {"x.md": [1, 2]}, {"x.md": None},
    {"x.md": [10, 1, "not-a-sha", 10, {}]}, {"x.md": [True, 1, "0" * 64, 1, {}]},
    {"x.md": [9, 1, "0" * 64, 9, {"k": "v"}]},
])
def test_a_malformed_record_is_read_as_none(tmp_path: Path, previous: object) -> None:
    from sharedmem.rules import KIND_MARKDOWN
    from sharedmem.sources.kinds import SourceSpec, snapshot
    root = tmp_path / "docs"
    write(root / "x.md", "content\n")
    record = through_the_state_file(tmp_path, previous)
    snap = snapshot(SourceSpec("docs", KIND_MARKDOWN, root), previous=record)
    assert snap.files[0].text == "content\n"


@pytest.mark.parametrize("field, value", [
    (2, "not-a-sha"), (2, "g" * 64), (2, "A" * 64), (2, "0" * 62 + "  "), (2, None),
    (3, -1), (3, True), (3, 1.0),
    (4, {"k": "v"}), (4, {"k": -1}), (4, "counts"), (0, True), (1, "time"),
])
def test_a_record_that_matches_the_file_but_is_malformed_is_read(tmp_path: Path, field: int,
                                                                 value: object) -> None:
    # Its size and time are the file's, so only the record's own checks can refuse it.
    from sharedmem.rules import KIND_MARKDOWN
    from sharedmem.sources.kinds import SourceSpec, snapshot
    root = tmp_path / "docs"
    path = write(root / "x.md", "x")  # one byte: a size of True would equal it
    first = snapshot(SourceSpec("docs", KIND_MARKDOWN, root))
    record = json.loads(json.dumps(first.record()))
    intact = through_the_state_file(tmp_path, record)
    assert snapshot(first.spec, previous=intact).files[0].text is None  # intact: reused
    if field == 1 and value == "time":
        value = float(path.stat().st_mtime_ns)  # equal to the time, of another type
    record["x.md"][field] = value
    again = snapshot(first.spec, previous=through_the_state_file(tmp_path, record))
    assert [e.text for e in again.files] == ["x"]


def test_one_malformed_entry_leaves_the_rest_of_the_record_reused(tmp_path: Path) -> None:
    # Each entry is checked by itself: one that fails is read again, not the whole record.
    from sharedmem.rules import KIND_MARKDOWN
    from sharedmem.sources.kinds import SourceSpec, snapshot
    root = tmp_path / "docs"
    for name in ("a.md", "b.md", "c.md"):
        write(root / name, f"{name}\n")
    first = snapshot(SourceSpec("docs", KIND_MARKDOWN, root))
    record = json.loads(json.dumps(first.record()))
    record["b.md"][2] = "z" * 64  # not hex
    record["c.md"][4] = []  # counts that are not a mapping
    again = snapshot(first.spec, previous=through_the_state_file(tmp_path, record))
    assert [(e.path, e.text) for e in again.files] == [
        ("a.md", None), ("b.md", "b.md\n"), ("c.md", "c.md\n")]
