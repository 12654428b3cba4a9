"""One entry a line: plain JSON to any reader, and a rewrite reuses the lines that did not change."""

from __future__ import annotations

import json

from sharedmem import linejson


def test_round_trip_is_plain_json_with_one_entry_a_line() -> None:
    items = [("a.md", [1, "x"]), ("odd\nname \u2028 ü \"q\".md", {"k": "line\nbreak"}), ("z", None)]
    text, lines = linejson.encode({"version": 1}, "files", items, {})
    assert json.loads(text) == {"version": 1, "files": dict(items)}
    assert text.count("\n") == len(items) + 1
    value, old = linejson.decode(text, "files")
    assert value == json.loads(text)
    assert old == lines and [v for v, _ in old.values()] == [v for _, v in items]


def test_only_unchanged_values_keep_their_line() -> None:
    text, old = linejson.encode({}, "record", [("a", [1]), ("b", [2])], {})
    forged = {"a": ([1], '"a": "kept as it was"'), "b": ([3], '"b": "stale"')}
    text, _ = linejson.encode({}, "record", [("a", [1]), ("b", [2])], forged)
    assert json.loads(text) == {"record": {"a": "kept as it was", "b": [2]}}


def test_other_forms_are_read_without_lines() -> None:
    for text in ('{"files": {"a": 1, "b": 2}}', '{"files": {}}', '{"files": 3}', "[1, 2]",
                 '{"files": {\n"a": 1\n}, "extra": {\n"b": 2}\n}'):
        value, lines = linejson.decode(text, "files")
        assert value == json.loads(text) and lines == {}


def test_an_empty_mapping() -> None:
    text, lines = linejson.encode({"version": 1}, "files", [], {})
    assert json.loads(text) == {"version": 1, "files": {}} and lines == {}
    assert linejson.decode(text, "files") == ({"version": 1, "files": {}}, {})
