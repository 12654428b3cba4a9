"""fastjson against json itself: the same values and text, our error for what is not JSON."""

from __future__ import annotations

import json
import math
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sharedmem import fastjson
from sharedmem.core import JSONError, SharedMemoryError

REPO = Path(__file__).resolve().parent.parent

# Texts json takes: each must decode to the very value (and types) json gives.
VALID = [
    "0", "-0", "1", "-12", "1.5", "-2e3", "1E+2", "0.1e-7", "true", "false", "null",
    '""', '"plain"', '"é\\u00e9\\n\\t\\"\\\\\\/"', '"\\ud83d\\ude00"', '"\\ud800"', '"\\udfff x"',
    '"\U0001f600 raw"', "[]", "{}", "[1,[2,[3,[4,{}]]]]", '{"a":{"b":{"c":[null,true,false]}}}',
    '  \n\t\r{"a" : 1 , "b" : [ 2 , 3 ] }\r\n ', '{"a":1,"a":2}', "123456789012345678901234567890",
    "-" + "9" * 4000, "1e400", "-1e400", "NaN", "Infinity", "-Infinity", "[NaN,1]",
    '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18"}}',
    '{"transport": {"kind": "ssh", "port": 22, "x": [1.5, -2e3, true, false, null, "é"]}}',
]

# Texts json refuses: each must be our error, saying what json says.
INVALID = [
    "", " ", "{", "}", "[1,]", '{"a":1,}', "{'a': 1}", '{"a": 01}', "01", "1.", ".5", "+1",
    '{"a":1 "b":2}', '{"a" 1}', '{"a":1} {"b":2}', '{"a":1} x', "[1] [2]", "nul", "tru",
    '"unterminated', '"bad \\x escape"', '"control \x01 char"', "\ufeff{}", "[" * 3 + "]",
    "1" * 5000,
]


def same(a: object, b: object) -> bool:
    """Equal with the same types all the way down; NaN equals NaN."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return a == b or (math.isnan(a) and math.isnan(b))  # type: ignore[arg-type]
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))  # type: ignore[arg-type]
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)  # type: ignore[call-overload]
    return a == b


@pytest.mark.parametrize("text", VALID)
def test_loads_agrees_with_json(text: str) -> None:
    assert same(fastjson.loads(text), json.loads(text))


@pytest.mark.parametrize("text", INVALID)
def test_loads_refuses_what_json_refuses_with_our_error(text: str) -> None:
    with pytest.raises(ValueError) as theirs:
        json.loads(text)
    with pytest.raises(JSONError) as ours:
        fastjson.loads(text)
    assert isinstance(ours.value, SharedMemoryError) and str(ours.value) == str(theirs.value)


def test_too_deep_nesting_is_our_error() -> None:
    for text in ("[" * 100_000 + "]" * 100_000, '{"a":' * 100_000 + "1" + "}" * 100_000):
        with pytest.raises(JSONError, match="nested too deeply"):
            fastjson.loads(text)


def test_random_texts_decode_as_json_does() -> None:
    rng = random.Random(3)
    alphabet = '{}[]":,0123456789-.eEtruefalsnNI \\u"ab\u0663'
    taken = 0
    for _ in range(30_000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 14)))
        try:
            expected = json.loads(text)
        except ValueError:
            with pytest.raises(JSONError):
                fastjson.loads(text)
            continue
        taken += 1
        assert same(fastjson.loads(text), expected), text
    assert taken > 100


# Values to encode: each must give json's text, with and without escapes for non-ASCII.
VALUES = [
    None, True, False, 0, -1, 10**30, -(10**400), 1.5, -0.0, 1e300, float("inf"), float("nan"),
    "", "plain", "é \"q\" \\ / \n\t\x00\x1f\x7f", "\U0001f600", "\ud800", "lone \udfff",
    [], {}, [1, [2, [3, {"a": [None]}]]], {"a": {"b": {"c": [True, False, "é"]}}},
    {"jsonrpc": "2.0", "id": 1, "result": {"ok": True, "n": None, "list": [1, "x", 2.5]}},
    {7: "int key", 2.5: "float key", True: "bool key", None: "null key"}, ("a", "tuple"),
]


@pytest.mark.parametrize("value", VALUES, ids=range(len(VALUES)))
@pytest.mark.parametrize("ascii_only", [False, True])
def test_dumps_agrees_with_json(value: object, ascii_only: bool) -> None:
    assert fastjson.dumps(value, ascii_only=ascii_only) == json.dumps(
        value, ensure_ascii=ascii_only, separators=(",", ":"))


def test_what_json_cannot_write_is_our_error() -> None:
    loop: list[object] = []
    loop.append(loop)
    deep: list[object] = []
    for _ in range(100_000):
        deep = [deep]
    for value, message in (({1, 2}, "Object of type set is not JSON serializable"),
                           ({"a": b"x"}, "Object of type bytes is not JSON serializable"),
                           (loop, "Circular reference detected"), (deep, "nested too deeply")):
        with pytest.raises(JSONError, match=message):
            fastjson.dumps(value)


def fresh_python(code: str) -> str:
    """What `code` prints in a new interpreter (no site) that has only imported fastjson."""
    probe = f"import sys; sys.path.insert(0, {str(REPO)!r})\nfrom sharedmem import fastjson\n{code}"
    return subprocess.run([sys.executable, "-S", "-c", probe], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_neither_json_nor_re_is_loaded_for_valid_json() -> None:
    assert fresh_python(
        "v = fastjson.loads(' {\"a\": [1, 2.5, \"\\\\u00e9\", null, true, {}]} ')\n"
        "assert fastjson.dumps(v) == '{\"a\":[1,2.5,\"\\u00e9\",null,true,{}]}', fastjson.dumps(v)\n"
        "print(sorted(n for n in ('json', 're') if n in sys.modules))\n") == "[]"


def test_a_malformed_text_is_our_error_before_json_is_loaded() -> None:
    """Python 3.11's C scanner cannot raise json's error while `json` is not loaded."""
    assert fresh_python(
        "from sharedmem.core import JSONError\n"
        "assert 'json.decoder' not in sys.modules\n"
        "try:\n"
        "    fastjson.loads('{\"machine\": \"a\" \"transport\": {}}')\n"
        "except JSONError as exc:\n"
        "    print(exc)\n") == "Expecting ',' delimiter: line 1 column 17 (char 16)"


@pytest.mark.parametrize(("text", "lone"), [
    ('"\\ud800"', "U+D800"), ('{"a": ["x", "y\\udfff"]}', "U+DFFF"), ('{"k\\uDbFf": 1}', "U+DBFF"),
    ('["\\ud83d\\ude00", "\\ude00\\ud83d"]', "U+DE00"),  # a pair the wrong way round is two
])
def test_unicode_only_refuses_a_lone_surrogate_anywhere(text: str, lone: str) -> None:
    assert json.loads(text) == fastjson.loads(text)  # taken as json takes it, by default
    with pytest.raises(JSONError, match=re.escape(f"lone surrogate ({lone})")):
        fastjson.loads(text, unicode_only=True)


@pytest.mark.parametrize("text", [
    '"\\ud83d\\ude00"', '"\\\\ud800"', '{"a": "\\u00e9", "b": "\\ud7ff\\ue000"}', '[1, 2.5, null]',
])
def test_unicode_only_takes_every_text_that_has_a_utf8_form(text: str) -> None:
    assert same(fastjson.loads(text, unicode_only=True), json.loads(text))
