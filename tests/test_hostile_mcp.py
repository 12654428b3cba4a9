"""Hostile input at the MCP boundary: the real server over stdio, one table row a case.

A row is (name, message, check): the JSON-RPC message sent (a tool call from `call`, any other
message, a batch as a list, or raw bytes) and what the reply must show. Every row runs against
one server over one hostile cache; after each row the server must still answer a ping, and at
the end its stderr must hold no traceback and no tool must have failed unexpectedly.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import LAB_NS, McpServer, client_with_cache, flip_schema_byte

from sharedmem.cache.cache import Cache
from sharedmem.cache.search_index import index_path, refresh_index

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs POSIX links and FIFOs")
NS = LAB_NS
Check = Callable[[Any, int], None]  # the parsed reply and the length of its line in bytes


def call(tool: str, **arguments: Any) -> dict[str, Any]:
    """A tools/call request; the runner gives it an id."""
    return {"jsonrpc": "2.0", "method": "tools/call",
            "params": {"name": tool, "arguments": arguments}}


def rpc(method: str, **fields: Any) -> dict[str, Any]:
    """Any other JSON-RPC request (fields such as id and params as given)."""
    return {"jsonrpc": "2.0", "method": method, **fields}


def _text(reply: dict[str, Any]) -> str:
    """The text content of a tool call's result."""
    assert "result" in reply, reply
    return reply["result"]["content"][0]["text"]


def tool_error(fragment: str) -> Check:
    """The tool call ends in an isError result whose text holds `fragment`."""
    def check(reply: Any, _size: int) -> None:
        assert reply["result"]["isError"] is True, reply
        assert fragment in _text(reply), _text(reply)[:500]
    return check


def short(check: Check, most: int = 1000) -> Check:
    """`check`, and the reply is at most `most` bytes: it names the size, not the text."""
    def both(reply: Any, size: int) -> None:
        check(reply, size)
        assert size <= most, size
    return both


def rpc_error(code: int, fragment: str = "") -> Check:
    """The request gets a JSON-RPC error with `code` and `fragment` in its message."""
    def check(reply: Any, _size: int) -> None:
        assert reply["error"]["code"] == code and fragment in reply["error"]["message"], reply
    return check


def returns(predicate: Callable[[Any], bool]) -> Check:
    """The tool call succeeds and `predicate` holds for its JSON payload."""
    def check(reply: Any, _size: int) -> None:
        assert reply["result"]["isError"] is False, _text(reply)[:500]
        payload = json.loads(_text(reply))
        assert predicate(payload), json.dumps(payload)[:1000]
    return check


def answers(predicate: Callable[[Any], bool]) -> Check:
    """`predicate` holds for the whole parsed reply."""
    def check(reply: Any, _size: int) -> None:
        assert predicate(reply), json.dumps(reply)[:1000]
    return check


def utf8(lines: list[str]) -> int:
    """Bytes of the lines as UTF-8: what the result cap counts."""
    return sum(len(line.encode("utf-8")) for line in lines)


def search_text(r: dict[str, Any]) -> int:
    """Bytes of a search page's lines and context."""
    return sum(utf8([h["line"], *h["context_before"], *h["context_after"]]) for h in r["results"])


def batch_capped(replies: Any, size: int) -> None:
    """A batch of 40 large reads: answers up to the reply limit, then errors, none run."""
    assert [r["id"] for r in replies] == list(range(1, 41))
    done = [r for r in replies if "result" in r]
    refused = [r for r in replies if "error" in r]
    assert 8 <= len(done) < 40 and replies[:len(done)] == done, len(done)
    assert all(r["error"]["code"] == -32001 and "reply limit reached" in r["error"]["message"]
               for r in refused)
    assert size <= REPLY + 2 * CAP, size


def resource(uri: Any) -> dict[str, Any]:
    """A resources/read request for `uri`; the runner gives it an id."""
    return rpc("resources/read", params={"uri": uri})


def resource_text(predicate: Callable[[str], bool]) -> Check:
    """resources/read answers one text content for which `predicate` holds."""
    def check(reply: Any, _size: int) -> None:
        assert "result" in reply, reply
        content, = reply["result"]["contents"]
        assert content["mimeType"] == "text/markdown" and predicate(content["text"]), \
            content["text"][-300:]
    return check


SURROGATE = "\ud800"
CAP, REPLY, BIG = 256 * 1024, 4 * 1024 * 1024, 20 * 1024 * 1024
R = "sharedmem://cache/"
CASES: list[tuple[str, Any, Check]] = [
    ("lone surrogate in a query", call("search", queries=[SURROGATE]),
     rpc_error(-32602, "argument 'queries' of search is not valid UTF-8 text")),
    ("low surrogate after text in a query", call("search", queries=["ok", "a\udcff"]),
     rpc_error(-32602, "argument 'queries' of search is not valid UTF-8 text")),
    ("lone surrogate in a search path", call("search", queries=["x"], path=SURROGATE),
     rpc_error(-32602, "argument 'path' of search is not valid UTF-8 text")),
    ("lone surrogate in a search cursor", call("search", queries=["x"], cursor=SURROGATE),
     rpc_error(-32602, "argument 'cursor' of search is not valid UTF-8 text")),
    ("lone surrogate in a read path", call("read", path=f"{NS}/{SURROGATE}.md"),
     rpc_error(-32602, "argument 'path' of read is not valid UTF-8 text")),
    ("lone surrogate in a list path", call("list", path=SURROGATE),
     rpc_error(-32602, "argument 'path' of list is not valid UTF-8 text")),
    ("lone surrogate in a list cursor", call("list", cursor=SURROGATE),
     rpc_error(-32602, "argument 'cursor' of list is not valid UTF-8 text")),
    ("lone surrogate in a note filename",
     call("add_ad_hoc_note", filename=f"2026-01-31T09-30-00-{SURROGATE}.md", note="x"),
     rpc_error(-32602, "argument 'filename' of add_ad_hoc_note is not valid UTF-8 text")),
    ("lone surrogate in a note", call("add_ad_hoc_note",
                                      filename="2026-01-31T09-30-00-x.md", note=SURROGATE),
     rpc_error(-32602, "argument 'note' of add_ad_hoc_note is not valid UTF-8 text")),
    ("lone surrogate as an argument name", call("search", **{SURROGATE: 1}),
     rpc_error(-32602, "has no argument")),
    ("lone surrogate as a tool name", call(SURROGATE), rpc_error(-32602, "unknown tool")),
    ("a query of 512 KiB", call("search", queries=["ok", "q" * (2 * CAP)]),
     short(tool_error(f"query 2 is {2 * CAP} characters, over the 1000 a query may have"))),
    ("queries long, with line breaks and empty", call("search", queries=[
        "q" * (2 * CAP), "a\n" * CAP, ""]), short(tool_error("query 3 is empty"))),
    ("an argument name of 256 KiB", call("search", queries=["x"], **{"k" * CAP: 1}),
     short(rpc_error(-32602, "search has no argument 'kkk"))),
    ("a tool name of 256 KiB", call("t" * CAP), short(rpc_error(-32602, "unknown tool 'ttt"))),
    ("a read path of 512 KiB", call("read", path="a/" * CAP + "x.md"),
     short(tool_error(f"path is {2 * CAP + 4} characters, longer than any published path"))),
    ("a list path of 512 KiB", call("list", path="a/" * CAP),
     short(tool_error("longer than"))),
    ("lone surrogate as a method", rpc(SURROGATE, id=1), rpc_error(-32601)),
    ("lone surrogate as an id", rpc("ping", id=SURROGATE),
     answers(lambda r: r["id"] == SURROGATE and r["result"] == {})),
    ("read through a link to outside", call("read", path=f"{NS}/linked.md"),
     tool_error("links in the cache are never followed")),
    ("read through a link inside the cache", call("read", path=f"{NS}/alias.md"),
     tool_error("links in the cache are never followed")),
    ("read through a linked folder", call("read", path=f"{NS}/elsewhere/inner.md"),
     tool_error("links in the cache are never followed")),
    ("read a FIFO", call("read", path=f"{NS}/pipe.md"), tool_error("not a regular file")),
    ("search skips every link and the FIFO", call("search", queries=["TOPSECRET", "harmless"]),
     returns(lambda r: r["results"] == [])),
    ("search what links point at", call("search", queries=["SessionManager"]),
     returns(lambda r: [h["path"] for h in r["results"]] == [f"{NS}/MEMORY.md"])),
    ("search in a linked folder", call("search", queries=["TOPSECRET"], path=f"{NS}/elsewhere"),
     tool_error("links in the cache are never followed")),
    ("list a linked folder", call("list", path=f"{NS}/elsewhere"),
     tool_error("links in the cache are never followed")),
    ("read one line of 20 MiB", call("read", path=f"{NS}/big.md", max_lines=1),
     returns(lambda r: r["lines"] == ["y" * CAP] and r["capped"] and r["truncated"]
             and (r["next_offset"], r["next_char_offset"]) == (1, CAP))),
    ("read on in a cut line", call("read", path=f"{NS}/big.md", char_offset=CAP),
     returns(lambda r: r["lines"] == ["y" * CAP] and r["next_char_offset"] == 2 * CAP)),
    ("read the end of a cut line", call("read", path=f"{NS}/big.md", char_offset=BIG - 5),
     returns(lambda r: r["lines"] == ["y" * 5] and not r["truncated"] and not r["capped"]
             and r["next_offset"] is None and r["next_char_offset"] is None)),
    ("char_offset past the line", call("read", path=f"{NS}/big.md", char_offset=BIG + 1),
     tool_error(f"char_offset {BIG + 1} is past the end of line 1")),
    ("read a line of characters beyond U+FFFF", call("read", path=f"{NS}/emoji.md"),
     returns(lambda r: r["lines"] == ["\U0001f600" * (CAP // 4)]
             and r["next_char_offset"] == CAP // 4)),
    ("read 2000 long lines", call("read", path=f"{NS}/wide.md", max_lines=2000),
     returns(lambda r: 200 < len(r["lines"]) < 2000 and utf8(r["lines"]) <= CAP
             and r["capped"] and r["next_offset"] == len(r["lines"]) + 1
             and r["next_char_offset"] is None)),
    ("search long lines with context", call("search", queries=["wide"], context_lines=10,
                                            max_results=200),
     returns(lambda r: 0 < len(r["results"]) < 200 and search_text(r) <= CAP and r["capped"]
             and r["next_cursor"])),
    ("search a line of 20 MiB", call("search", queries=["yyy"]),
     returns(lambda r: [h["line"] for h in r["results"]] == ["y" * 1000 + "…"])),
    ("a batch of 40 reads of a 20 MiB line", [call("read", path=f"{NS}/big.md")] * 40,
     batch_capped),
    ("list gives no time of a link's target", call("list", path=NS),
     returns(lambda r: {e["name"] for e in r["entries"] if e["type"] == "file"
                        and e["modified"] is None} == {"alias.md", "linked.md"})),
    ("resource uri with '..'", resource(f"{R}machines/../../../etc/passwd.md"),
     rpc_error(-32602, "component")),
    ("resource uri with escaped '..'", resource(f"{R}machines/%2E%2E/%2e%2e/etc/passwd.md"),
     rpc_error(-32602, "component")),
    ("resource uri with an absolute path", resource(f"{R}/etc/passwd.md"),
     rpc_error(-32602, "absolute")),
    ("resource uri with an escaped absolute path", resource(f"{R}%2Fetc%2Fpasswd.md"),
     rpc_error(-32602, "absolute")),
    ("resource uri of another scheme", resource("file:///etc/passwd"),
     rpc_error(-32602, "is not a shared memory resource")),
    ("resource uri of the cache's own files", resource(f"{R}.sharedmem/manifest.json"),
     rpc_error(-32602, "hidden")),
    ("resource uri with a query", resource(f"{R}{NS}/MEMORY.md?x=1"),
     rpc_error(-32602, "query or fragment")),
    ("resource uri with a lone surrogate", resource(f"{R}{NS}/{SURROGATE}.md"),
     rpc_error(-32602, "lone surrogate (U+D800)")),
    ("resource uri with escapes that are not UTF-8", resource(f"{R}{NS}/%FF%FE.md"),
     rpc_error(-32602, "not UTF-8")),
    ("resource uri with an escaped NUL", resource(f"{R}{NS}/a%00.md"),
     rpc_error(-32602, "NUL")),
    ("resource uri with a stray %", resource(f"{R}{NS}/100%.md"),
     rpc_error(-32602, "two hex digits")),
    ("resource uri that is not a string", resource([f"{R}{NS}/MEMORY.md"]),
     rpc_error(-32602, "uri must be a string")),
    ("resource not in the cache", resource(f"{R}{NS}/missing.md"),
     answers(lambda r: r["error"]["code"] == -32002
             and r["error"]["message"].startswith("Resource not found: no file")
             and r["error"]["data"] == {"uri": f"{R}{NS}/missing.md"})),
    ("resource through a link to outside", resource(f"{R}{NS}/linked.md"),
     rpc_error(-32002, "links in the cache are never followed")),
    ("resource through a link inside the cache", resource(f"{R}{NS}/alias.md"),
     rpc_error(-32002, "links in the cache are never followed")),
    ("resource in a linked folder", resource(f"{R}{NS}/elsewhere/inner.md"),
     rpc_error(-32002, "links in the cache are never followed")),
    ("resource that is a FIFO", resource(f"{R}{NS}/pipe.md"),
     rpc_error(-32002, "not a regular file")),
    ("resource of 20 MiB in one line", resource(f"{R}{NS}/big.md"),
     resource_text(lambda t: utf8([t]) <= CAP and t.startswith("y" * (CAP - 1000))
                   and t.endswith(f"goes on with path \"{NS}/big.md\", line_offset 1, "
                                  f"char_offset {t.index(chr(10))}]"))),
    ("resource of characters beyond U+FFFF", resource(f"{R}{NS}/emoji.md"),
     resource_text(lambda t: utf8([t]) <= CAP and t.startswith("\U0001f600" * 1000)
                   and "char_offset" in t)),
    ("resource of many long lines", resource(f"{R}{NS}/wide.md"),
     resource_text(lambda t: utf8([t]) <= CAP and t.endswith(
         f"line_offset {t.count(chr(10)) - 1}]"))),
    ("a batch of 40 resource reads of 20 MiB", [resource(f"{R}{NS}/big.md")] * 40,
     batch_capped),
    ("resources listed from the manifest, links and all", rpc("resources/list"),
     answers(lambda r: [x["uri"] for x in r["result"]["resources"]] == [f"{R}{NS}/MEMORY.md"])),
    ("resources listed from a cursor of another list", rpc("resources/list", params={
        "cursor": "eyJmIjoiMDAwMCIsIm8iOjF9"}), rpc_error(-32602, "invalid cursor")),
]


def build_hostile_cache(root: Path) -> Path:
    """A cache with hostile content in it; the client.json that names it.

    Someone with write access to the cache replaced listed files with a link to a file outside
    (`linked.md`), a link to another cached file (`alias.md`), a FIFO (`pipe.md`), and a folder
    with a link to a folder outside (`elsewhere/`).
    """
    config = client_with_cache(root, {
        "MEMORY.md": "# Memory\nuse SessionManager for sessions\n", "linked.md": "harmless\n",
        "alias.md": "harmless\n", "pipe.md": "harmless\n", "elsewhere/inner.md": "harmless\n",
        "big.md": "y" * BIG + "\n", "wide.md": f"{'w' * 900} wide\n" * 2000,
        "emoji.md": "\U0001f600" * (CAP // 2) + "\n"})
    outside = root / "outside"
    (outside / "folder").mkdir(parents=True)
    (outside / "secret.md").write_text("TOPSECRET outside the cache\n")
    (outside / "folder" / "inner.md").write_text("TOPSECRET in a linked folder\n")
    ns = root / "cache" / NS
    for name in ("linked.md", "alias.md", "pipe.md", "elsewhere/inner.md"):
        (ns / name).unlink()
    (ns / "elsewhere").rmdir()
    (ns / "linked.md").symlink_to(outside / "secret.md")
    (ns / "alias.md").symlink_to("MEMORY.md")
    os.mkfifo(ns / "pipe.md")
    (ns / "elsewhere").symlink_to(outside / "folder", target_is_directory=True)
    return config


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[McpServer]:
    """One server over the hostile cache for every row, negotiated to accept batches."""
    srv = McpServer(build_hostile_cache(tmp_path_factory.mktemp("hostile")),
                 env={**os.environ, "HOME": str(tmp_path_factory.mktemp("home"))})
    srv.init("2025-03-26")
    yield srv
    if srv.proc.poll() is None:
        assert srv.close() == 0
        assert "Traceback" not in srv.stderr and "crashed" not in srv.stderr, srv.stderr


@pytest.mark.parametrize("name, message, check", CASES, ids=[c[0] for c in CASES])
def test_hostile_request(server: McpServer, name: str, message: Any, check: Check) -> None:
    if isinstance(message, dict) and "id" not in message:
        server.next_id += 1
        message = {**message, "id": server.next_id}
    elif isinstance(message, list):
        message = [{**m, "id": i} for i, m in enumerate(message, 1)]
    server.send(message if isinstance(message, bytes) else json.dumps(message))
    line = server.lines.get(timeout=60)
    assert line, f"{name}: the server closed its output"
    reply = json.loads(line)
    check(reply, len(line))
    assert "failed unexpectedly" not in line.decode("utf-8", "replace"), name
    server.alive()


def test_search_over_a_damaged_index_then_rebuilt(tmp_path: Path) -> None:
    """A byte of the index's schema flipped: MCP search scans meanwhile, the index is rebuilt."""
    files = {f"n{i:03d}.md": f"note {i}\nneedle {i % 7}\n" for i in range(80)}
    config = client_with_cache(tmp_path, files)
    cache = Cache(tmp_path / "cache")
    refresh_index(cache)
    flip_schema_byte(index_path(cache))
    srv = McpServer(config)
    srv.init()
    found = srv.call("search", queries=["needle 3"], max_results=200)
    assert found["isError"] is False, found
    expected = [(f"{NS}/n{i:03d}.md", 2) for i in range(80) if i % 7 == 3]
    assert [(r["path"], r["line_number"]) for r in found["structuredContent"]["results"]] == \
        expected
    deadline = time.monotonic() + 30  # the search started `index --background`
    while not index_readable(index_path(cache)):
        assert time.monotonic() < deadline, "the damaged index was not rebuilt"
        time.sleep(0.1)
    again = srv.call("search", queries=["needle 3"], max_results=200)["structuredContent"]
    assert [(r["path"], r["line_number"]) for r in again["results"]] == expected
    assert srv.close() == 0 and "Traceback" not in srv.stderr


def index_readable(path: Path) -> bool:
    """True once the index holds a committed generation."""
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            return conn.execute("SELECT value FROM meta WHERE key='generation'").fetchone() \
                is not None
        finally:
            conn.close()
    except (sqlite3.Error, ValueError):
        return False


def _peak_rss_mib(pid: int) -> float:
    """The highest resident set size the process has had, in MiB (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
@pytest.mark.parametrize("name, text", [
    ("breaks.md", "\n" * (40 << 20)),  # 40 MiB of empty lines
    ("line.md", "é" * (20 << 20) + "\n"),  # one line of 40 MiB
])
def test_a_read_holds_what_it_returns_not_the_file(tmp_path: Path, name: str, text: str) -> None:
    """`read` and `resources/read` of a 40 MiB file: the server grows by what they return."""
    config = client_with_cache(tmp_path, {"MEMORY.md": "# Memory\n"})
    (tmp_path / "cache" / NS / name).write_text(text, encoding="utf-8")
    srv = McpServer(config)
    srv.init()
    assert srv.call("read", path=f"{NS}/MEMORY.md")["isError"] is False  # the tools loaded
    before = _peak_rss_mib(srv.proc.pid)
    for args in ({}, {"line_offset": (40 << 20) - 5}, {"char_offset": 5 << 20}):
        if name == "line.md" and "line_offset" in args or name == "breaks.md" and args:
            continue
        read = srv.call("read", path=f"{NS}/{name}", max_lines=2000, **args)
        assert read["isError"] is False, read
    shown = srv.ask("resources/read", {"uri": f"{R}{NS}/{name}"})["result"]["contents"][0]
    assert shown["text"].endswith("]") and utf8([shown["text"]]) <= CAP  # says where to go on
    grew = _peak_rss_mib(srv.proc.pid) - before
    assert grew < 16, f"a read of a 40 MiB file took {grew:.0f} MiB more"
    assert srv.close() == 0
