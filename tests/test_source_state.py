"""A source's saved state: read back as written, lines reused, older forms understood."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sharedmem.client.source_state import Acked, SourceState, encode_state, read
from sharedmem.sources.walk import Entry


def entry(path: str, sha: str, text: str | None) -> Entry:
    return Entry(path=path, sha256=sha, size=5, mtime_ns=7, text=text, disk_size=5,
                 redactions={"jwt": 1} if text else {})


def encode(rules: list, acked: Acked | None, files: list[Entry], old: dict) -> str:
    return encode_state(rules, acked, files, old)


def test_written_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "notes.json"
    files = [entry("a.md", "1" * 64, "hello"), entry("b/c.md", "2" * 64, "world")]
    path.write_text(encode(["v", 1], Acked("d"), files, {}), encoding="utf-8")
    saved, lines = read(path)
    assert saved.rules == ["v", 1] and saved.acked == Acked("d")
    assert saved.record == {"a.md": [5, 7, "1" * 64, 5, {"jwt": 1}],
                            "b/c.md": [5, 7, "2" * 64, 5, {"jwt": 1}]}
    assert saved.acked_files() == {"a.md": "1" * 64, "b/c.md": "2" * 64}
    assert set(lines) == {"a.md", "b/c.md"}
    assert json.loads(path.read_text()) == saved.to_row() == {
        "rules": ["v", 1], "acked": {"digest": "d"}, "record": saved.record}
    assert path.read_text().startswith('{"rules": ["v", 1], "acked": {"digest": "d"}, "record": {\n')


def test_a_file_not_read_again_keeps_its_line(tmp_path: Path) -> None:
    path = tmp_path / "notes.json"
    first = [entry("a.md", "1" * 64, "hello"), entry("b.md", "2" * 64, "world")]
    path.write_text(encode([1], None, first, {}), encoding="utf-8")
    _, lines = read(path)
    again = [entry("a.md", "1" * 64, None), entry("b.md", "3" * 64, "world 2")]  # a.md unread
    text = encode([1], None, again, lines)
    old_line = next(line for line in path.read_text().splitlines() if '"a.md"' in line)
    assert old_line in text.splitlines()  # the very line, not one made anew
    path.write_text(text, encoding="utf-8")
    saved, _ = read(path)
    assert saved.record is not None
    assert saved.record["a.md"][2] == "1" * 64 and saved.record["b.md"][2] == "3" * 64


def test_missing_damaged_and_older_records(tmp_path: Path) -> None:
    assert read(tmp_path / "missing.json") == (SourceState(), {})
    (tmp_path / "bad.json").write_text("{half")
    assert read(tmp_path / "bad.json") == (SourceState(), {})
    (tmp_path / "list.json").write_text("[1]")
    assert read(tmp_path / "list.json") == (SourceState(), {})
    assert SourceState().acked_files() is None  # never acknowledged: no delta
    # acknowledged, but no record to name the files
    assert SourceState.from_row({"acked": {"digest": "d"}}).acked_files() is None
    older = SourceState.from_row({"acked": {"files": {"a.md": "1"}}})
    assert older.acked == Acked(None, {"a.md": "1"}) and older.acked_files() == {"a.md": "1"}
    assert SourceState.from_row({"acked": {"digest": "d"},
                                 "record": {"a.md": [1, 2, "s", 3, {}], "odd": [1]}}
                                ).acked_files() == {"a.md": "s"}


@pytest.mark.parametrize("row", [
    {},
    {"acked": {"digest": "d"}},
    {"acked": {"files": {"a.md": "1", "b.md": "1", "c.md": "2"}}},
    {"acked": {"digest": "d"}, "record": {"a.md": [1, 2, "s", 3, {}], "odd": [1],
                                          "b.md": [1, 2, "t", 3, {}], "c.md": [1, 2, "s", 3, {}]}},
    {"record": {"a.md": [1, 2, "s", 3, {}]}},  # recorded, never acknowledged
])
def test_the_acknowledged_sha256s_are_the_acknowledged_files_values(row: dict) -> None:
    state = SourceState.from_row(row)
    assert state.acked_shas() == set((state.acked_files() or {}).values())
    assert SourceState.from_row({"rules": 1, "acked": "odd", "record": []}) == SourceState(1)
