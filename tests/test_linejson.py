"""One entry a line: plain JSON to any reader, and a rewrite reuses the lines that did not change."""

from __future__ import annotations

import json

from sharedmem import linejson


def test_round_trip_is_plain_json_with_one_entry_a_line() -> None:
    items = [("a.md", [1, "x"]), ("odd\nname \u2028 ü \"q\".md", {"k": "line\nbreak"}), ("z", None)]
    text = linejson.rewrite({"version": 1}, "files", [(n, v, False) for n, v in items], {})
    assert json.loads(text) == {"version": 1, "files": dict(items)}
    assert text.count("\n") == len(items) + 1
    value, old = linejson.decode(text, "files")
    assert value == json.loads(text)
    assert [v for v, _ in old.values()] == [v for _, v in items]
    assert linejson.rewrite({"version": 1}, "files", [(n, v, True) for n, v in items],
                            old) == text  # every line taken as read


def test_only_kept_items_keep_their_line() -> None:
    forged = {"a": ([1], '"a": "kept as it was"'), "b": ([3], '"b": "stale"')}
    text = linejson.rewrite({}, "record", [("a", [1], True), ("b", [2], False)], forged)
    assert json.loads(text) == {"record": {"a": "kept as it was", "b": [2]}}


def test_other_forms_are_read_without_lines() -> None:
    for text in ('{"files": {"a": 1, "b": 2}}', '{"files": {}}', '{"files": 3}', "[1, 2]",
                 '{"files": {\n"a": 1\n}, "extra": {\n"b": 2}\n}'):
        value, lines = linejson.decode(text, "files")
        assert value == json.loads(text) and lines == {}


def test_an_empty_mapping() -> None:
    text = linejson.rewrite({"version": 1}, "files", [], {})
    assert json.loads(text) == {"version": 1, "files": {}}
    assert linejson.decode(text, "files") == ({"version": 1, "files": {}}, {})


def test_many_arrays_are_encoded_in_bulk_as_json_dumps_would_one_by_one() -> None:
    import random
    rng = random.Random(4)
    pieces = ["a", "é", '"', '", "', "], [", "\\", "\n", "\u2028", "[", "]", ",", " ", "日"]

    def text() -> str:
        return "".join(rng.choice(pieces) for _ in range(rng.randint(0, 6)))

    def value(nested: bool) -> object:
        kind = rng.choice((0, 1, 2, 3) if nested else (0, 1, 3))
        if kind == 0:
            return [rng.randrange(10**12), text(), {text(): 1}]
        if kind == 1:
            return (text(), rng.randrange(100), None, True)
        if kind == 2:
            return [[1], [text()]]  # a "], [" of its own: the count is off, one by one then
        return []

    for round_ in range(40):
        items = [(f"{i}-{text()}", value(round_ % 2 == 1)) for i in range(rng.randint(60, 200))]
        expected = [f"{json.dumps(k, ensure_ascii=False)}: {json.dumps(v, ensure_ascii=False)}"
                    for k, v in items]
        assert linejson._lines(items) == expected
    plain = [(f"n{i}", [i, "x" * (i % 3)]) for i in range(100)]
    assert linejson._lines(plain) == [f"{json.dumps(k)}: {json.dumps(v)}" for k, v in plain]


def test_a_rewrite_of_some_items_is_the_text_of_all_of_them_written_anew() -> None:
    # `rewrite` takes a kept item's line as it was read, and encodes the rest: the text is the
    # one written with nothing kept, when the kept values are the old ones.
    items = [(f"f{i:03}.md", [i, i * 7, "ab" * 32, i, {"jwt": 1} if i % 7 == 0 else {}])
             for i in range(200)]
    text = linejson.rewrite({"rules": [1]}, "record", [(n, v, False) for n, v in items], {})
    read, old = linejson.decode(text, "record")
    changed = [(n, [v[0] + 1, *v[1:]] if i % 10 == 0 else read["record"][n])
               for i, (n, v) in enumerate(items) if i != 5] + [("new.md", [1, 2, "cd" * 32, 3, {}])]
    kept = [(n, v, n in read["record"] and v == read["record"][n]) for n, v in changed]
    want = linejson.rewrite({"rules": [2]}, "record", [(n, v, False) for n, v in changed], {})
    assert json.loads(want) == {"rules": [2], "record": dict(changed)}
    assert linejson.rewrite({"rules": [2]}, "record", kept, old) == want
    assert linejson.rewrite({"rules": [2]}, "record", kept, dict(old)) == want
    assert linejson.rewrite({"rules": [2]}, "record", kept, {}) == want  # no lines: all encoded
    edited = text.replace('"f001.md": [1, 7,', '"f001.md":  [1, 7,')  # a hand edit, same value
    _, lines = linejson.decode(edited, "record")
    assert '"f001.md":  [1, 7,' in linejson.rewrite({"rules": [2]}, "record", kept, lines)


def test_a_rewrite_makes_the_values_of_the_items_it_encodes_only() -> None:
    # With `value`, an item is what the caller holds and its value is made only to encode it.
    text = linejson.rewrite({}, "record", [("a", 1, False), ("b", 2, False)], {}, lambda n: [n])
    _, old = linejson.decode(text, "record")
    made: list[int] = []

    def value(n: int) -> list[int]:
        made.append(n)
        return [n * 10]

    again = linejson.rewrite({}, "record", [("a", 1, True), ("b", 2, False), ("c", 3, True)],
                             old, value)
    assert made == [2, 3]  # b changed; c is kept but has no line to keep
    assert json.loads(again) == {"record": {"a": [1], "b": [20], "c": [30]}}
