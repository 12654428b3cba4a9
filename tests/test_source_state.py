"""A source's saved record: read back as written, lines reused, older forms understood."""

from __future__ import annotations

from pathlib import Path

from sharedmem.client import source_state as records
from sharedmem.sources.walk import Entry


def entry(path: str, sha: str, text: str | None) -> Entry:
    return Entry(path=path, sha256=sha, size=5, mtime_ns=7, text=text, disk_size=5,
                 redactions={"jwt": 1} if text else {})


def test_written_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "notes.json"
    files = [entry("a.md", "1" * 64, "hello"), entry("b/c.md", "2" * 64, "world")]
    path.write_text(records.encode(["v", 1], {"digest": "d"}, files, {}), encoding="utf-8")
    saved, lines = records.read(path)
    assert saved["rules"] == ["v", 1] and saved["acked"] == {"digest": "d"}
    assert saved["record"] == {"a.md": [5, 7, "1" * 64, 5, {"jwt": 1}],
                               "b/c.md": [5, 7, "2" * 64, 5, {"jwt": 1}]}
    assert records.acked_files(saved) == {"a.md": "1" * 64, "b/c.md": "2" * 64}
    assert set(lines) == {"a.md", "b/c.md"}


def test_a_file_not_read_again_keeps_its_line(tmp_path: Path) -> None:
    path = tmp_path / "notes.json"
    first = [entry("a.md", "1" * 64, "hello"), entry("b.md", "2" * 64, "world")]
    path.write_text(records.encode([1], None, first, {}), encoding="utf-8")
    _, lines = records.read(path)
    again = [entry("a.md", "1" * 64, None), entry("b.md", "3" * 64, "world 2")]  # a.md unread
    text = records.encode([1], None, again, lines)
    old_line = next(line for line in path.read_text().splitlines() if '"a.md"' in line)
    assert old_line in text.splitlines()  # the very line, not one made anew
    path.write_text(text, encoding="utf-8")
    saved, _ = records.read(path)
    assert saved["record"]["a.md"][2] == "1" * 64 and saved["record"]["b.md"][2] == "3" * 64


def test_missing_damaged_and_older_records(tmp_path: Path) -> None:
    assert records.read(tmp_path / "missing.json") == ({}, {})
    (tmp_path / "bad.json").write_text("{half")
    assert records.read(tmp_path / "bad.json") == ({}, {})
    (tmp_path / "list.json").write_text("[1]")
    assert records.read(tmp_path / "list.json") == ({}, {})
    assert records.acked_files({}) is None  # never acknowledged: no delta
    assert records.acked_files({"acked": {"digest": "d"}}) is None  # and no record to name files
    assert records.acked_files({"acked": {"files": {"a.md": "1"}}}) == {"a.md": "1"}  # older
    assert records.acked_files({"acked": {"digest": "d"},
                                "record": {"a.md": [1, 2, "s", 3, {}], "odd": [1]}}) == {
        "a.md": "s"}
