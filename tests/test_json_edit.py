"""json_edit: a member set or removed in JSON text changes only that member's bytes.

Each shape is a real file layout a harness or a person writes; setting our member and removing
it again must give the original bytes back, and what lies around it must stay byte for byte.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sharedmem.core import InstallError
from sharedmem.install.json_edit import Document

PATH = Path("/home/me/.claude.json")
KEYS = ("mcpServers", "shared_memories")
ENTRY = {"type": "stdio", "command": "/usr/bin/python3", "args": ["/p/shared_memory.py", "mcp",
                                                                   "--config", "/p/client.json"]}

ONE_LINE_ARRAYS = """{
  "numStartups": 7,
  "tips": ["a", "b", "c"],
  "mcpServers": {
    "alpha": {"command": "a", "args": ["x", "y"]}
  },
  "projects": {"/src": {"allowedTools": [], "history": [1, 2, 3]}}
}
"""

SHAPES = {
    "one-line arrays": (ONE_LINE_ARRAYS, False),
    "tabs": ('{\n\t"mcpServers": {\n\t\t"alpha": {\n\t\t\t"command": "a"\n\t\t}\n\t},\n'
             '\t"x": [1,2]\n}\n', False),
    "crlf": ('{\r\n  "theme": "dark",\r\n  "mcpServers": {\r\n    "alpha": {}\r\n  }\r\n}\r\n',
             False),
    "no trailing newline": ('{\n    "mcpServers": {\n        "a": 1\n    }\n}', False),
    "unicode escapes": ('{\n  "n\\u00e4me": "caf\\u00e9 \\ud83d\\ude00",\n  "mcp\\u0053ervers"'
                        ': {\n    "\\u00fc": {"command": "\\u00fc"}\n  }\n}\n', False),
    "raw unicode": ('{\n  "name": "café ☕",\n  "mcpServers": {"ünï": {"command": "x"}}\n}\n',
                    False),
    "compact one line": ('{"a":1,"mcpServers":{"b":{"command":"x","args":[]}},"c":[1,2]}',
                         False),
    "spaced one line": ('{"a": 1, "mcpServers": {"b": {"command": "x"}}}\n', False),
    "empty container": ('{\n  "numStartups": 1,\n  "mcpServers": {},\n  "z": null\n}\n', False),
    "empty container, compact": ('{"numStartups":1,"mcpServers":{}}', False),
    "no container": ('{\n  "numStartups": 1,\n  "projects": {\n    "/x": {}\n  }\n}\n', False),
    "no container, one line": ('{"numStartups": 1}\n', False),
    "empty root": ("{}\n", False),
    "empty root, no newline": ("{}", False),
    "nested servers": ('{\n  "mcpServers": {\n    "a": {\n      "command": "x",\n      "env": {\n'
                       '        "K": {"deep": [{"x": 1}]}\n      }\n    }\n  }\n}\n', False),
    "byte order mark": ('\ufeff{\n  "mcpServers": {\n    "a": {}\n  }\n}\n', False),
    "odd spacing": ('{ "mcpServers" :  { "a" : 1 } , "b" : 2 }', False),
    "jsonc comments": ('{\n  // my servers\n  "mcpServers": {\n    /* first */\n    "a": 1, '
                       '// trailing\n    "b": [1, 2,], // why\n  },\n}\n', True),
    "jsonc comment in empty container": ('{\n  "mcpServers": { /* none yet */ }\n}\n', True),
    "jsonc url in a string": ('{\n  "u": "http://x/*y*/",\n  "mcpServers": {"a": "//"}\n}\n',
                              True),
}


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_set_then_remove_gives_the_bytes_back(name: str) -> None:
    text, jsonc = SHAPES[name]
    doc = Document(PATH, text, jsonc=jsonc)
    added = doc.set(KEYS, ENTRY)
    after = Document(PATH, added, jsonc=jsonc)
    assert after.get(KEYS) == ENTRY
    expected = json.loads(json.dumps(doc.data))
    expected.setdefault("mcpServers", {})["shared_memories"] = ENTRY
    assert after.data == expected
    removed = after.remove(KEYS)
    if "mcpServers" in doc.data:
        assert removed == text
    else:  # the container we added stays, empty, until it is removed too
        assert Document(PATH, removed, jsonc=jsonc).remove(("mcpServers",)) == text


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_what_we_insert_follows_the_file(name: str) -> None:
    text, jsonc = SHAPES[name]
    added = Document(PATH, text, jsonc=jsonc).set(KEYS, ENTRY)
    ours = added[added.index('"shared_memories"'):]
    if "\r\n" in text:
        assert "\n" not in ours.replace("\r\n", "")
    if "\t" in text:
        assert "\n  " not in ours and "\n\t\t\t" in ours
    if "\n" not in text.strip() and text.strip() != "{}":
        assert "\n" not in added.strip()  # a one-line file stays one line
    assert added.endswith("\n") == text.endswith("\n")
    assert added.startswith("\ufeff") == text.startswith("\ufeff")


def test_one_line_arrays_stay_on_one_line() -> None:
    added = Document(PATH, ONE_LINE_ARRAYS).set(KEYS, ENTRY)
    for line in ('  "tips": ["a", "b", "c"],\n',
                 '    "alpha": {"command": "a", "args": ["x", "y"]},\n',
                 '  "projects": {"/src": {"allowedTools": [], "history": [1, 2, 3]}}\n'):
        assert line in added
    entry_lines = len(json.dumps(ENTRY, indent=2).splitlines())
    assert added.count("\n") == ONE_LINE_ARRAYS.count("\n") + entry_lines


@pytest.mark.parametrize(("position", "text", "left"), [
    ("only", '{\n  "mcpServers": {\n    "shared_memories": {"command": "x"}\n  }\n}\n',
     '{\n  "mcpServers": {}\n}\n'),
    ("first", '{"mcpServers": {"shared_memories": {"command": "x"}, "b": 2, "c": 3}}',
     '{"mcpServers": {"b": 2, "c": 3}}'),
    ("middle", '{\n  "mcpServers": {\n    "a": 1,\n    "shared_memories": {\n      "command": '
     '"x"\n    },\n    "c": 3\n  }\n}', '{\n  "mcpServers": {\n    "a": 1,\n    "c": 3\n  }\n}'),
    ("last", '{"mcpServers": {"a": 1, "shared_memories": []}}', '{"mcpServers": {"a": 1}}'),
    ("last, crlf", '{\r\n "mcpServers": {\r\n  "a": 1,\r\n  "shared_memories": 2\r\n }\r\n}',
     '{\r\n "mcpServers": {\r\n  "a": 1\r\n }\r\n}'),
])
def test_remove_our_member_wherever_it_is(position: str, text: str, left: str) -> None:
    assert Document(PATH, text).remove(KEYS) == left


@pytest.mark.parametrize(("text", "left"), [
    ('{"mcp": {\n  // keep me\n  "shared_memories": 1\n}}', '{"mcp": {\n  // keep me\n}}'),
    ('{"mcp": {"a": 1, /* keep */ "shared_memories": 1}}', '{"mcp": {"a": 1 /* keep */}}'),
    ('{"mcp": {"shared_memories": 1, // keep\n "b": 2}}', '{"mcp": {// keep\n "b": 2}}'),
    ('{"mcp": {"a": 1, "shared_memories": 1,}}', '{"mcp": {"a": 1,}}'),
])
def test_remove_keeps_comments(text: str, left: str) -> None:
    assert Document(PATH, text, jsonc=True).remove(("mcp", "shared_memories")) == left


def test_replace_changes_only_the_value() -> None:
    text = ('{\n\t"mcpServers": {\n\t\t"shared_memories": {"command": "old", "args": []},\n'
            '\t\t"z": [1, 2]\n\t}\n}\n')
    replaced = Document(PATH, text).set(KEYS, ENTRY)
    assert replaced == text.replace('{"command": "old", "args": []}', json.dumps(
        ENTRY, ensure_ascii=False))  # a one-line entry stays one line
    pretty = '{\n  "mcpServers": {\n    "shared_memories": {\n      "command": "old"\n    }\n  }\n}'
    replaced = Document(PATH, pretty).set(KEYS, ENTRY)
    assert replaced.startswith('{\n  "mcpServers": {\n    "shared_memories": {\n      "type"')
    assert Document(PATH, replaced).data == {"mcpServers": {"shared_memories": ENTRY}}


def test_deeper_keys_and_missing_objects_on_the_way() -> None:
    text = '{\n  "mcp": {\n    "servers": {\n      "x": {"type": "remote"}\n    }\n  }\n}\n'
    keys = ("mcp", "servers", "shared_memories")
    added = Document(PATH, text).set(keys, {"a": 1})
    assert '      "x": {"type": "remote"},\n      "shared_memories": {\n        "a": 1\n      }' \
        in added
    created = Document(PATH, '{"theme": 1}').set(("a", "b", "c"), 2)
    assert created == '{"theme": 1, "a": {"b": {"c": 2}}}'


@pytest.mark.parametrize(("text", "jsonc", "why"), [
    ('{\n  // a comment\n  "mcpServers": {}\n}', False, "a comment at line 2, column 3"),
    ('{"mcpServers": {}, /* c */ "a": 1}', False, "comments are not allowed"),
    ('{"mcpServers": {"a": 1,}}', False, "Expecting property name"),
    ('{"mcpServers": {,}}', True, "Expecting property name"),
    ('{"a": NaN}', False, "unexpected character 'N'"),
    ('{"a": "open', False, "unterminated string at line 1, column 7"),
    ('{"a": 1 /* open', True, "unterminated comment"),
    ("{'a': 1}", False, "unexpected character"),
    ('{"a": 1} {"b": 2}', False, "Extra data"),
    ('{"a": "tab\there"}', False, "Invalid control character"),
    ("", False, "Expecting value"),
    ("  \n", True, "Expecting value"),
    ('[{"mcpServers": {}}]', False, "does not hold a JSON object"),
    ('"text"', False, "does not hold a JSON object"),
    ('{"a": 01}', False, "Expecting ',' delimiter"),
    ("[" * 100_000 + "]" * 100_000, False, "nested too deeply"),
])
def test_text_that_is_not_json_is_refused_naming_the_file(text: str, jsonc: bool,
                                                          why: str) -> None:
    with pytest.raises(InstallError) as exc:
        Document(PATH, text, jsonc=jsonc)
    assert str(PATH) in str(exc.value) and why in str(exc.value)
    assert "left untouched" in str(exc.value)


@pytest.mark.parametrize(("text", "why"), [
    ('{"mcpServers": []}', "mcpServers is not a JSON object"),
    ('{"mcpServers": "x"}', "mcpServers is not a JSON object"),
    ('{"mcpServers": {}, "mcpServers": {}}', "has mcpServers 2 times"),
    ('{"mcpServers": {"shared_memories": 1, "shared_memories": 2}}',
     "has mcpServers.shared_memories 2 times"),
])
def test_shapes_we_cannot_edit_safely_are_refused(text: str, why: str) -> None:
    doc = Document(PATH, text)
    for edit in (lambda: doc.set(KEYS, ENTRY), lambda: doc.remove(KEYS)):
        with pytest.raises(InstallError, match=why):
            edit()


def test_large_file_is_read_in_reasonable_time() -> None:
    projects = {f"/src/p{i}": {"history": [{"display": "x" * 40, "n": i}] * 5,
                               "allowedTools": []} for i in range(2500)}
    text = json.dumps({"projects": projects, "mcpServers": {}}, indent=2)
    assert len(text) > 1_000_000
    added = Document(PATH, text).set(KEYS, ENTRY)
    assert added.startswith(text[:-3])


@pytest.mark.parametrize("text", [
    '{"instructions": []}',
    '{"instructions": [ ]}',
    '{\n  "instructions": ["a.md"], "x": 1\n}',
    '{\n  "instructions": [\n    "a.md",\n    "b.md"\n  ]\n}\n',
    '{\n\t"instructions": [\n\t\t"a.md"\n\t]\n}',
    '{\n  // mine\n  "instructions": [\n    "a.md", // keep\n  ],\n}\n',
])
def test_an_item_appended_to_an_array_comes_out_byte_for_byte(text: str) -> None:
    doc = Document(Path("opencode.json"), text, jsonc=True)
    after = doc.append(("instructions",), "/p/ours.md")
    added = Document(Path("opencode.json"), after, jsonc=True)
    assert added.get(("instructions",))[-1] == "/p/ours.md"
    if "\n    " in text:  # a list laid out a line an item keeps its layout
        assert '\n    "/p/ours.md"' in after
    assert added.remove_item(("instructions",), "/p/ours.md") == text
    assert doc.remove_item(("instructions",), "/p/absent.md") == text


def test_array_edits_refuse_what_is_not_an_array() -> None:
    doc = Document(Path("f.json"), '{"instructions": "a.md"}')
    with pytest.raises(InstallError, match="instructions is not a JSON array"):
        doc.append(("instructions",), "x")
    with pytest.raises(InstallError, match="missing is not a JSON array"):
        doc.remove_item(("missing",), "x")
