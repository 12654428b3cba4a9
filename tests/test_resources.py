"""MCP resources over a real cache: URIs both ways, the offered list and its cursor, long files.

The last tests ask a real MCP server (a child process) for them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import LAB_NS, McpServer, client_with_cache

from sharedmem.cache.cache import Cache, NamespaceInfo
from sharedmem.core import SharedMemoryError
from sharedmem.hashing import sha256_text
from sharedmem.mcp import resources, tools
from sharedmem.rules import NOTES_DIR

NS = LAB_NS


def fill(root: Path, layout: dict[str, tuple[str, dict[str, str]]]) -> Cache:
    """A cache of these namespaces: key -> (kind, files)."""
    upserts, namespaces = [], {}
    for key, (kind, files) in layout.items():
        machine, source = ("lab", key.split("/")[2]) if key != NOTES_DIR else (None, "ad_hoc")
        namespaces[key] = NamespaceInfo(key, machine, source, kind, 1, "2026-01-31T09:30:00Z")
        upserts += [(f"{key}/{p}", sha256_text(t), t) for p, t in files.items()]
    cache = Cache(root)
    cache.apply(upserts, [], namespaces)
    return cache


def note(i: int) -> str:
    return f"{NOTES_DIR}/2026-01-31T{i // 3600:02d}-{i // 60 % 60:02d}-{i % 60:02d}-n.md"


@pytest.mark.parametrize("path", [
    f"{NS}/MEMORY.md",
    "machines/lab/notes/a folder/été ünïcode.md",
    "machines/lab/notes/100% sure #1.md",
    "machines/lab/notes/a+b=c;d,e@f!~'(x).md",
    note(0),
])
def test_a_path_and_its_uri_name_each_other(path: str) -> None:
    uri = resources.uri_of(path)
    assert uri.startswith("sharedmem://cache/") and uri.isascii()
    assert not {" ", "#"} & set(uri)
    assert resources.path_of(uri) == path
    assert resources.path_of(uri.replace("/", "%2F").replace("sharedmem:%2F%2Fcache%2F",
                                                             "SharedMem://cache/")) == path


@pytest.mark.parametrize("uri, message", [
    ("sharedmem://cache/", "path is empty"),
    ("sharedmem://other/machines/lab/codex/MEMORY.md", "not a shared memory resource"),
    ("sharedmem://cache/machines/lab/codex/MEMORY.txt", "does not end in .md"),
    ("sharedmem://cache/machines/lab/codex/%C3.md", "not UTF-8"),
    ("sharedmem://cache/machines/lab/codex/%G0.md", "two hex digits"),
    ("sharedmem://cache/machines/lab/codex/MEMORY.md#top", "query or fragment"),
    ("sharedmem://cache/machines/lab/codex/e%CC%81.md", "NFC"),
    (None, "uri must be a string"),
])
def test_uris_that_name_no_file_are_refused_with_the_reason(uri: object, message: str) -> None:
    with pytest.raises(SharedMemoryError, match=message):
        resources.path_of(uri)


def test_offered_the_entry_files_of_codex_and_claude_code_then_the_notes(tmp_path: Path) -> None:
    cache = fill(tmp_path, {
        NS: ("codex", {"MEMORY.md": "m\n", "memory_summary.md": "s\n",
                       "rollout_summaries/r.md": "r\n", "memories_v2/MEMORY.md": "v\n",
                       "memories_v2/rollout_summaries/r.md": "r\n"}),
        "machines/lab/claude-code": ("claude-code", {"web/MEMORY.md": "w\n", "web/x.md": "x\n"}),
        "machines/lab/notes": ("markdown", {"MEMORY.md": "mine\n", "deep/MEMORY.md": "d\n"}),
        NOTES_DIR: ("notes", {note(i).rpartition("/")[2]: f"n{i}\n" for i in range(3)}),
    })
    page = resources.list_resources(cache, None, "2024-11-05")
    assert [r["uri"].removeprefix("sharedmem://cache/") for r in page["resources"]] == [
        "machines/lab/claude-code/web/MEMORY.md", f"{NS}/MEMORY.md",
        f"{NS}/memories_v2/MEMORY.md", f"{NS}/memory_summary.md", note(0), note(1), note(2)]
    assert "nextCursor" not in page and all("title" not in r for r in page["resources"])
    assert [r["size"] for r in page["resources"]] == [2, 2, 2, 2, 3, 3, 3]
    assert "(memory version 2)" in page["resources"][2]["description"]
    assert resources.read(cache, "u", note(1)) == {
        "contents": [{"uri": "u", "mimeType": "text/markdown", "text": "n1\n"}]}


def test_the_cursor_goes_on_after_the_last_resource_sent_whatever_synced(tmp_path: Path) -> None:
    notes = {note(i).rpartition("/")[2]: "n\n" for i in range(0, 500, 2)}
    cache = fill(tmp_path, {NOTES_DIR: ("notes", notes)})
    first = resources.list_resources(cache, None, "2025-11-25")
    assert len(first["resources"]) == resources.PAGE
    last = first["resources"][-1]["uri"]
    # a sync between two pages: one sent note gone, one new note before the cursor, one after
    sent = resources.path_of(first["resources"][0]["uri"])
    cache.apply([(note(1), sha256_text("new\n"), "new\n"), (note(499), sha256_text("x\n"), "x\n")],
                [sent], {NOTES_DIR: NamespaceInfo(NOTES_DIR, None, "ad_hoc", "notes", 2, None)})
    uris, cursor = [], first["nextCursor"]
    while cursor:
        page = resources.list_resources(cache, cursor, "2025-11-25")
        uris += [r["uri"] for r in page["resources"]]
        cursor = page.get("nextCursor")
    expected = [resources.uri_of(note(i)) for i in [*range(0, 500, 2), 499]]
    assert uris == expected[expected.index(last) + 1:]
    for bad in ("", "!!", resources._encode_cursor((7, "x")), 5):
        with pytest.raises(SharedMemoryError, match="invalid cursor"):
            resources.list_resources(cache, bad, "2025-11-25")


@pytest.mark.parametrize("text", [
    "a" * 300_000 + "\nnext line\n",  # a first line longer than a result: cut at a character
    "".join(f"{i:04d} " + "é" * 995 + "\n" for i in range(400)),  # whole lines, then the rest
])
def test_a_long_file_ends_where_the_read_tool_goes_on(tmp_path: Path, text: str) -> None:
    cache = fill(tmp_path, {NS: ("codex", {"MEMORY.md": text})})
    path = f"{NS}/MEMORY.md"
    shown = resources.read(cache, "u", path)["contents"][0]["text"]
    assert len(shown.encode("utf-8")) <= tools.RESULT_MAX_BYTES
    head, marker = shown.rsplit("\n\n[shared memory: ", 1)
    assert marker.startswith(f"the rest of this {len(text.encode())}-byte file is not in")
    line = int(marker.split("line_offset ")[1].split(",")[0].rstrip("]"))
    chars = int(marker.split("char_offset ")[1].rstrip("]")) if "char_offset" in marker else 0
    rest = tools.read_file(cache, path, line_offset=line, char_offset=chars, max_lines=1)
    assert text.startswith(head + ("\n" if chars == 0 and not head.endswith("\n") else ""))
    assert text[len(head):].startswith(rest["lines"][0])
    assert rest["lines"][0]


def test_templates_and_their_cursor() -> None:
    old, = resources.templates(None, "2025-03-26")["resourceTemplates"]
    new, = resources.templates(None, "2025-06-18")["resourceTemplates"]
    assert old["uriTemplate"] == new["uriTemplate"] == "sharedmem://cache/{path}"
    assert "title" not in old and new["title"]
    with pytest.raises(SharedMemoryError, match="one page"):
        resources.templates("x", "2025-06-18")


@pytest.mark.parametrize("name", ["manifest.sqlite3"])
def test_a_damaged_cache_is_refused_as_the_tools_refuse_it(tmp_path: Path, name: str) -> None:
    from sharedmem.core import CacheError
    cache = fill(tmp_path, {"machines/lab/codex": ("codex", {"MEMORY.md": "m\n"})})
    path = "machines/lab/codex/MEMORY.md"
    assert resources.read(cache, resources.uri_of(path), path)["contents"][0]["text"] == "m\n"
    (tmp_path / ".sharedmem" / name).write_text("{", encoding="utf-8")
    for call in (lambda c: resources.list_resources(c, None, "2025-06-18"),
                 lambda c: resources.read(c, resources.uri_of(path), path)):
        with pytest.raises(CacheError) as caught:
            call(Cache(tmp_path))
        assert str(caught.value).startswith(tools.REPAIRING + "; ")


# --- through the real MCP server ------------------------------------------------------------------

def _stamp(i: int) -> str:
    """The time in a note's filename, a second apart for each i."""
    return f"2026-01-31T09-{i // 60:02d}-{i % 60:02d}"


def test_resources_list_the_entry_files_then_the_notes_page_by_page(tmp_path: Path) -> None:
    fill(tmp_path / "cache", {
        "machines/lab/codex": ("codex", {"MEMORY.md": "m\n", "memory_summary.md": "s\n",
                                         "rollout_summaries/r.md": "r\n"}),
        "machines/lab/claude-code": ("claude-code", {"web/MEMORY.md": "w\n", "web/x.md": "x\n",
                                                     "api/MEMORY.md": "a\n"}),
        "machines/lab/notes": ("markdown", {"MEMORY.md": "not an agent's\n"}),
        NOTES_DIR: ("notes", {f"{_stamp(i)}-n{i}.md": f"note {i}\n" for i in range(150)}),
    })
    cfg = tmp_path / "client.json"
    cfg.write_text(json.dumps({
        "machine": "lab", "transport": {"kind": "local", "store": str(tmp_path / "s.sqlite3")},
        "sources": [], "cache": str(tmp_path / "cache"), "state": str(tmp_path / "state")}))
    srv = McpServer(cfg)
    srv.init("2025-11-25")
    uris, cursor, pages = [], None, 0
    while True:
        page = srv.ask("resources/list", {"cursor": cursor} if cursor else {})["result"]
        uris += [r["uri"] for r in page["resources"]]
        pages += 1
        if not (cursor := page.get("nextCursor")):
            break
    assert pages == 2
    entries = ["machines/lab/claude-code/api/MEMORY.md", "machines/lab/claude-code/web/MEMORY.md",
               "machines/lab/codex/MEMORY.md", "machines/lab/codex/memory_summary.md"]
    notes = [f"{NOTES_DIR}/{_stamp(i)}-n{i}.md" for i in range(150)]
    assert uris == [f"sharedmem://cache/{p}" for p in entries + notes]
    first = srv.ask("resources/list")["result"]["resources"][0]
    assert first["title"] == "MEMORY.md of lab (claude-code/api)"
    assert "Claude Code memory index of machine lab, synced 2026-01-31T09:30:00Z" in \
        first["description"]
    last = srv.ask("resources/read", {"uri": uris[-1]})["result"]["contents"]
    assert last == [{"uri": uris[-1], "mimeType": "text/markdown", "text": "note 149\n"}]
    escaped = "sharedmem://cache/machines%2Flab%2Fcodex%2Fmemory_summary.md"  # {path} expanded
    assert srv.ask("resources/read", {"uri": escaped})["result"]["contents"][0]["text"] == "s\n"
    assert srv.close() == 0


def test_resources_without_a_configuration_say_why(tmp_path: Path) -> None:
    srv = McpServer(tmp_path / "missing.json")
    result = srv.init()
    assert result["instructions"].endswith("when the user asks you to remember something.")
    assert srv.ask("resources/templates/list")["result"]["resourceTemplates"]
    for method, params in [("resources/list", {}),
                           ("resources/read", {"uri": f"sharedmem://cache/{NS}/MEMORY.md"})]:
        error = srv.ask(method, params)["error"]
        assert error["code"] == -32603 and "missing.json does not exist: run install_client.py" \
            in error["message"], error
    assert srv.close() == 0


@pytest.mark.parametrize("name", ["manifest.sqlite3"])
def test_resources_of_a_damaged_cache_say_it_is_being_repaired(tmp_path: Path, name: str) -> None:
    from sharedmem.mcp.tools import REPAIRING
    uri = f"sharedmem://cache/{NS}/MEMORY.md"
    config = client_with_cache(tmp_path, {"MEMORY.md": "# Memory\nuse SessionManager for sessions\n"})
    srv = McpServer(config)
    srv.init("2025-11-25")
    assert srv.ask("resources/list")["result"]["resources"]
    (config.parent / "cache" / ".sharedmem" / name).write_text("{", encoding="utf-8")
    for method, params in [("resources/list", {}), ("resources/read", {"uri": uri})]:
        error = srv.ask(method, params)["error"]
        assert error["code"] == -32603 and error["message"].startswith(REPAIRING + "; "), error
    assert srv.call("list", path="")["isError"] is True  # as the tools answer
    srv.alive()
    assert srv.close() == 0
