"""The real MCP server as a child process: lifecycle per revision, malformed input, tools, exits.

The last part is hostile input, one table row a case, against one server over a hostile cache.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    LAB_NS,
    LAUNCHER,
    REPO,
    McpServer,
    client_with_cache,
    delivery_done,
    flip_schema_byte,
    hung_ssh,
    kill_logged,
    ssh_client,
)

from sharedmem.cache.cache import Cache
from sharedmem.cache.search_index import index_path, refresh_index
from sharedmem.mcp import server as mcp_server

NS = LAB_NS
VERSIONS = ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"]


@pytest.fixture
def config(tmp_path: Path) -> Path:
    files = {"MEMORY.md": "# Memory\nuse SessionManager for sessions\n",
             "memory_summary.md": "summary: Décision prise\n"}
    files.update({f"notes/n{i:02d}.md": f"note {i} session\n" for i in range(12)})
    return client_with_cache(tmp_path, files)


@pytest.fixture
def server(config: Path) -> Any:
    proc = McpServer(config)
    yield proc
    if proc.proc.poll() is None:
        proc.proc.kill()
        proc.proc.wait()


@pytest.mark.parametrize("version", VERSIONS + ["1999-01-01"])
def test_transcript_per_revision(config: Path, version: str) -> None:
    srv = McpServer(config)
    result = srv.init(version)
    expected = version if version in VERSIONS else "2025-11-25"
    assert result["protocolVersion"] == expected
    assert result["capabilities"] == {"tools": {"listChanged": False},
                                      "resources": {"subscribe": False, "listChanged": False}}
    assert result["serverInfo"]["name"] == "shared_memories" and result["instructions"]
    modern = expected >= "2025-06-18"
    assert ("title" in result["serverInfo"]) == modern
    srv.alive()
    offered = srv.ask("resources/list")["result"]
    assert [r["uri"] for r in offered["resources"]] == [
        f"sharedmem://cache/{NS}/MEMORY.md", f"sharedmem://cache/{NS}/memory_summary.md"]
    assert "nextCursor" not in offered
    for item in offered["resources"]:
        assert item["mimeType"] == "text/markdown" and ("title" in item) == modern
    contents = srv.ask("resources/read", {"uri": offered["resources"][1]["uri"]})["result"]
    assert contents == {"contents": [{"uri": offered["resources"][1]["uri"],
                                      "mimeType": "text/markdown",
                                      "text": "summary: Décision prise\n"}]}
    template, = srv.ask("resources/templates/list")["result"]["resourceTemplates"]
    assert template["uriTemplate"] == "sharedmem://cache/{path}"
    assert ("title" in template) == modern
    read_by_template = srv.ask("resources/read", {"uri": template["uriTemplate"].replace(
        "{path}", f"{NS}/notes/n03.md")})["result"]["contents"][0]["text"]
    assert read_by_template == "note 3 session\n"
    tools = srv.ask("tools/list")["result"]["tools"]
    assert [t["name"] for t in tools] == ["list", "read", "search", "add_ad_hoc_note"]
    for tool in tools:
        assert ("outputSchema" in tool) == modern and ("title" in tool) == modern
        assert ("annotations" in tool) == (expected >= "2025-03-26")
    listed = srv.call("list", path=NS)
    assert ("structuredContent" in listed) == modern and listed["isError"] is False
    assert [e["name"] for e in json.loads(listed["content"][0]["text"])["entries"]] == [
        "MEMORY.md", "memory_summary.md", "notes"]
    read = json.loads(srv.call("read", path=f"{NS}/MEMORY.md")["content"][0]["text"])
    assert read["lines"] == ["# Memory", "use SessionManager for sessions"]
    found = json.loads(srv.call("search", queries=["decision"], normalized=True)[
        "content"][0]["text"])
    assert [r["path"] for r in found["results"]] == [f"{NS}/memory_summary.md"]
    note = srv.call("add_ad_hoc_note", filename="bad name.md", note="x")
    assert note["isError"] and "YYYY-MM-DD" in note["content"][0]["text"]
    srv.alive()
    assert srv.close() == 0
    assert "Traceback" not in srv.stderr


def test_batches_only_in_2025_03_26(config: Path) -> None:
    srv = McpServer(config)
    srv.init("2025-03-26")
    srv.send([{"jsonrpc": "2.0", "id": 1, "method": "ping"},
              {"jsonrpc": "2.0", "method": "notifications/whatever"},
              {"jsonrpc": "2.0", "id": 2, "method": "nope"}])
    replies = srv.reply()
    assert [r["id"] for r in replies] == [1, 2] and replies[1]["error"]["code"] == -32601
    srv.send("[]")
    assert srv.reply()["error"]["code"] == -32600
    srv.alive()
    assert srv.close() == 0
    other = McpServer(config)
    other.init("2025-06-18")
    other.send([{"jsonrpc": "2.0", "id": 1, "method": "ping"}])
    assert other.reply()["error"]["code"] == -32600
    assert other.close() == 0


def test_before_initialize(server: McpServer) -> None:
    server.send({"jsonrpc": "2.0", "id": "d", "method": "server/discover"})
    answer = server.reply(timeout=5)
    assert answer["id"] == "d" and answer["error"]["code"] == -32601
    server.send({"jsonrpc": "2.0", "id": 7, "method": "tools/list"})
    assert server.reply(timeout=5)["error"]["code"] == -32601
    server.alive()
    server.init()
    assert server.ask("initialize", {"protocolVersion": "2025-06-18"})["error"]["code"] == -32600


BAD_INPUTS: list[tuple[bytes, int | None]] = [
    (b"{not json", -32700),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "pi', -32700),
    (b"42", -32600),
    (b'"just a string"', -32600),
    (b"null", -32600),
    (b"[]", -32600),
    (b'[{"jsonrpc": "2.0", "id": 1, "method": "ping"}]', -32600),
    (b'{"jsonrpc": "1.0", "id": 1, "method": "ping"}', -32600),
    (b'{"id": 1, "method": "ping"}', -32600),
    (b'{"jsonrpc": "2.0", "id": 1, "method": 5}', -32600),
    (b'{"jsonrpc": "2.0", "id": 1}', -32600),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": "x"}', -32600),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": [1]}', -32602),
    (b'{"jsonrpc": "2.0", "id": null, "method": "ping"}', -32600),
    (b'{"jsonrpc": "2.0", "id": 1.5, "method": "ping"}', -32600),
    (b'{"jsonrpc": "2.0", "id": true, "method": "ping"}', -32600),
    (b'{"jsonrpc": "2.0", "id": {"a": 1}, "method": "ping"}', -32600),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "resources/subscribe", '
     b'"params": {"uri": "sharedmem://cache/machines/lab/codex/MEMORY.md"}}', -32601),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "resources/read"}', -32602),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "resources/read", "params": {"uri": 7}}', -32602),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "resources/read", '
     b'"params": {"uri": "sharedmem://cache/machines/lab/codex/none.md"}}', -32002),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "resources/list", "params": {"cursor": "zzz"}}',
     -32602),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "resources/list", "params": {"cursor": 3}}',
     -32602),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "resources/templates/list", '
     b'"params": {"cursor": "x"}}', -32602),
    (b'{"jsonrpc": "2.0", "method": "notifications/unknown"}', None),
    (b'{"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 3}}',
     None),
    (b'{"jsonrpc": "2.0", "id": 9, "result": {}}', None),
    (b"\xff\xfe{}", -32700),
    (b'{"jsonrpc": "2.0", "id": "\xc3\x28", "method": "ping"}', -32700),
    (b"[" * 100_000 + b"]" * 100_000, -32700),
    (b'{"jsonrpc": "2.0", "id": ' + b"9" * 5000 + b', "method": "ping"}', -32700),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"x": ' + b"1" * 5000 + b"}}",
     -32700),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "rm"}}', -32602),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {}}', -32602),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", '
     b'"params": {"name": "read", "arguments": "x"}}', -32602),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"cursor": "zzz"}}',
     -32602),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"cursor": 3}}', -32602),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}', -32600),
]


def test_malformed_inputs_each_answered_and_server_survives(server: McpServer) -> None:
    server.init("2025-06-18")
    for data, code in BAD_INPUTS:
        server.send(data)
        if code is None:
            server.alive()
            continue
        answer = server.reply()
        assert answer["error"]["code"] == code, (data[:80], answer)
        if code in (-32700,) or data.startswith((b"4", b"n", b'"', b"[")):
            assert answer["id"] is None
        server.alive()
    server.send(b"x" * (5 * 1024 * 1024))
    assert server.reply()["error"]["code"] == -32600
    server.alive()
    server.send(b"   ")
    server.alive()
    assert server.close() == 0
    assert "Traceback" not in server.stderr


# (tool, arguments, what the error says, whether the arguments fit the tool's input schema)
TOOL_ERRORS = [
    ("read", {}, "needs the argument 'path'", False),
    ("read", {"path": 3}, "must be a string", False),
    ("read", {"path": "../../../etc/passwd.md"}, "component", True),
    ("read", {"path": "/etc/passwd.md"}, "absolute", True),
    ("read", {"path": ".sharedmem/manifest.json"}, "hidden", True),
    ("read", {"path": "machines/CON.md"}, "reserved", True),
    ("read", {"path": f"{NS}/missing.md"}, "no file", True),
    ("list", {"path": "machines/../.."}, "component", True),
    ("list", {"cursor": "garbage"}, "cursor", True),
    ("list", {"max_results": 0}, "max_results", True),
    ("search", {"queries": []}, "1 to 16", True),
    ("search", {"queries": "x"}, "list of strings", False),
    ("search", {"queries": ["x"], "match_mode": 1}, "must be a string", False),
    ("search", {"queries": ["x"], "extra": True}, "no argument", False),
    ("search", {"queries": 1, "nope": 2}, "no argument 'nope'; it takes", False),
    ("add_ad_hoc_note", {"filename": "2026-01-01T00-00-00-x.md"}, "needs the argument 'note'",
     False),
]


@pytest.mark.parametrize("version", VERSIONS)
def test_bad_arguments_are_reported_as_each_revision_says(server: McpServer,
                                                          version: str) -> None:
    """A value the tool refuses is a tool error (isError) in every revision; arguments that do
    not fit the input schema are one from 2025-11-25 on, and JSON-RPC invalid params before."""
    server.init(version)
    for name, args, message, fits in TOOL_ERRORS:
        answer = server.ask("tools/call", {"name": name, "arguments": args})
        if fits or version >= "2025-11-25":
            result = answer["result"]
            assert result["isError"] is True, (name, args)
            assert "structuredContent" not in result
            assert message in result["content"][0]["text"], (message, result)
        else:
            assert answer["error"]["code"] == -32602, (name, args, answer)
            assert message in answer["error"]["message"], (message, answer)
    server.alive()
    both = server.ask("tools/call", {"name": "search", "arguments": {"queries": 1, "nope": 2}})
    text = both["result"]["content"][0]["text"] if "result" in both else \
        both["error"]["message"]
    assert "no argument 'nope'" in text and "must be a list of strings" in text  # all at once


def test_pagination_over_the_protocol(server: McpServer) -> None:
    server.init()
    names, cursor = [], None
    while True:
        args: dict[str, Any] = {"path": f"{NS}/notes", "max_results": 5}
        if cursor:
            args["cursor"] = cursor
        page = server.call("list", **args)["structuredContent"]
        names += [e["name"] for e in page["entries"]]
        if not (cursor := page["next_cursor"]):
            break
    assert names == [f"n{i:02d}.md" for i in range(12)]
    hits, cursor = [], None
    while True:
        args = {"queries": ["session"], "max_results": 4}
        if cursor:
            args["cursor"] = cursor
        page = server.call("search", **args)["structuredContent"]
        hits += [(r["path"], r["line_number"]) for r in page["results"]]
        if not (cursor := page["next_cursor"]):
            break
    assert hits == [(f"{NS}/MEMORY.md", 2)] + [(f"{NS}/notes/n{i:02d}.md", 1) for i in range(12)]


def test_sigterm_and_closed_stdin_end_quietly(config: Path) -> None:
    srv = McpServer(config)
    srv.init()
    srv.call("search", queries=["x"])
    srv.proc.send_signal(signal.SIGTERM)
    assert srv.proc.wait(timeout=20) == 0
    assert b"Traceback" not in srv.proc.stderr.read()
    other = McpServer(config)
    assert other.close() == 0 and other.stderr == ""


def test_closed_stdout_ends_quietly(config: Path) -> None:
    proc = subprocess.Popen([sys.executable, str(LAUNCHER), "mcp", "--config", str(config)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()
    ping = b'{"jsonrpc": "2.0", "id": 1, "method": "ping"}\n'
    try:
        proc.stdin.write(ping * 20_000)
        proc.stdin.close()
    except BrokenPipeError:
        pass
    assert proc.wait(timeout=20) == 0
    assert b"Traceback" not in proc.stderr.read()


def test_stray_output_cannot_reach_stdout(config: Path) -> None:
    noisy = (
        "import os, sys; sys.path.insert(0, REPO_PATH)\n"
        "from sharedmem.mcp import tools\n"
        "real = tools.read_file\n"
        "def loud(*a, **k):\n"
        "    print('STRAY PRINT'); os.system('echo STRAY CHILD'); os.write(1, b'STRAY FD\\n')\n"
        "    return real(*a, **k)\n"
        "tools.read_file = loud\n"
        "from sharedmem.mcp.server import main\n"
        "sys.exit(main(sys.argv[1]))\n").replace("REPO_PATH", repr(str(REPO)))
    srv = McpServer(config, cmd=[sys.executable, "-c", noisy, str(config)])
    srv.init()
    assert srv.call("read", path=f"{NS}/MEMORY.md")["isError"] is False
    srv.alive()
    assert srv.close() == 0
    assert "STRAY PRINT" in srv.stderr and "STRAY CHILD" in srv.stderr
    assert "STRAY FD" in srv.stderr


def test_lazy_imports_until_first_tool_call(config: Path) -> None:
    probe = (
        "import sys; sys.path.insert(0, REPO_PATH)\n"
        "import sharedmem.mcp.server as m\n"
        "s = m.Server(sys.argv[1])\n"
        "m._dumps(s.handle(b'{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{}}'))\n"
        "print(sorted(n for n in ('sqlite3', 'argparse', 'sharedmem.cache.search',"
        " 'sharedmem.mcp.tools', 'sharedmem.cache.cache', 'sharedmem.client.config',"
        " 'sharedmem.redact.redactor', 'json', 're', 'pathlib', 'datetime', '_strptime',"
        " 'subprocess', 'sharedmem.client.note', 'sharedmem.client.lock')"
        " if n in sys.modules))\n"
    ).replace("REPO_PATH", repr(str(REPO)))
    out = subprocess.run([sys.executable, "-c", probe, str(config)], capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_note_is_answered_once_read_finds_it(tmp_path: Path, config: Path) -> None:
    env = {**os.environ, "HOME": str(tmp_path)}
    srv = McpServer(config, env=env)
    srv.init()
    path = "extensions/ad_hoc/notes/2026-01-31T09-30-00-e2e.md"
    started = time.monotonic()
    result = srv.call("add_ad_hoc_note", filename="2026-01-31T09-30-00-e2e.md",
                      note="remember the e2e path")
    assert result["isError"] is False, result
    outcome = result["structuredContent"]
    assert (outcome["status"], outcome["delivery"], outcome["path"]) == (
        "stored", "started", path), outcome
    assert time.monotonic() - started < 10 and path in outcome["message"]  # within NOTE_WAIT
    read = srv.call("read", path=path)  # at once: no sync run by hand, no waiting
    assert read["isError"] is False, read
    shown = read["structuredContent"]
    assert shown["lines"][-3:] == ["```", "remember the e2e path", "```"]
    assert shown["machine"] == "lab" and shown["source"] == "ad_hoc"
    assert shown["note_origin"]["entries"] == 1 and shown["note_origin"]["machines"] == ["lab"]
    assert delivery_done(tmp_path / "state")
    assert list((tmp_path / "state" / "outbox").iterdir()) == []
    assert srv.close() == 0 and "Traceback" not in srv.stderr


def _proc_syncs(config: Path, notes_only: bool) -> int:
    """Processes running `sync --config=CONFIG`, of notes only or whole (Linux /proc)."""
    count = 0
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        count += (b"sync" in argv and f"--config={config}".encode() in argv
                  and (b"--notes-only" in argv) == notes_only)
    return count


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="counts processes in /proc")
def test_quick_notes_start_one_delivery_that_takes_them_all(tmp_path: Path, config: Path) -> None:
    from sharedmem.client.lock import sync_lock
    env = {**os.environ, "HOME": str(tmp_path)}
    srv = McpServer(config, env=env)
    srv.init()
    names = [f"2026-01-31T09-30-0{i}-quick.md" for i in range(5)]
    with sync_lock(tmp_path / "state"):  # a sync runs: the delivery waits for it
        asked = [srv.start_call("add_ad_hoc_note", filename=name, note=f"quick {i}")
                 for i, name in enumerate(names)]
        deadline = time.monotonic() + 10
        while len(list((tmp_path / "state" / "outbox").glob("*.json"))) < 5:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(0.5)
        assert _proc_syncs(config, notes_only=True) == 1  # one delivery, not five
    answers = [srv.result_of(ident)["structuredContent"] for ident in asked]
    assert [a["status"] for a in answers] == ["stored"] * 5, answers
    assert sorted(a["delivery"] for a in answers) == ["already running"] * 4 + ["started"]
    for i, name in enumerate(names):  # each read back at once, none twice
        lines = srv.call("read", path=f"extensions/ad_hoc/notes/{name}")["structuredContent"]
        assert lines["lines"].count(f"quick {i}") == 1 and lines["note_origin"]["entries"] == 1
    assert delivery_done(tmp_path / "state")
    assert list((tmp_path / "state" / "outbox").iterdir()) == []
    assert srv.close() == 0 and "Traceback" not in srv.stderr


def test_a_note_waiting_on_a_hung_server_delays_no_other_request(tmp_path: Path) -> None:
    bin_dir, log = hung_ssh(tmp_path)
    client_with_cache(tmp_path / "laptop", {"MEMORY.md": "# Memory\nuse SessionManager\n"})
    cfg = ssh_client(tmp_path)  # the same cache, reached through the hung `ssh`
    env = {**os.environ, "HOME": str(tmp_path), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    srv = McpServer(cfg, env=env)
    waiting = mcp_server.NOTES_WAITING
    try:
        srv.init()
        started = time.monotonic()
        notes = [srv.start_call("add_ad_hoc_note", filename=f"2026-01-31T09-30-{i:02}-x.md",
                                note=f"note {i}") for i in range(waiting + 1)]
        for name, args in [("list", {"path": NS}), ("read", {"path": f"{NS}/MEMORY.md"}),
                           ("search", {"queries": ["SessionManager"]})] * 3:
            assert srv.call(name, **args)["isError"] is False
        srv.alive()
        assert time.monotonic() - started < 5  # none of them waited for a note
        past = srv.kept.pop(notes.pop())["result"]["structuredContent"]  # one note too many
        assert past["status"] == "queued" and "Queued: not waited for." in past["message"]
        assert not set(notes) & set(srv.kept)  # and no other note was answered yet
        answers = [srv.result_of(ident, 30)["structuredContent"] for ident in notes]
        waited = time.monotonic() - started
        assert 9 <= waited < 20, waited  # each note waited its 10 s, side by side
        assert {a["status"] for a in answers} == {"queued"}
        assert sorted(a["delivery"] for a in answers + [past]) == \
            ["already running"] * waiting + ["started"]
        assert all("the server did not answer within 10 s" in a["message"] for a in answers)
        assert len(log.read_text().split()) == 1  # one delivery, one ssh
    finally:
        kill_logged(log)  # the server end goes away: the delivery gives up
    assert delivery_done(tmp_path / "laptop" / "state")
    assert len(list((tmp_path / "laptop" / "state" / "outbox").iterdir())) == waiting + 1
    assert srv.close() == 0 and "Traceback" not in srv.stderr


def test_the_end_of_input_answers_the_notes_still_waiting(tmp_path: Path) -> None:
    bin_dir, log = hung_ssh(tmp_path)
    client_with_cache(tmp_path / "laptop", {"MEMORY.md": "# Memory\n"})
    cfg = ssh_client(tmp_path)
    env = {**os.environ, "HOME": str(tmp_path), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    srv = McpServer(cfg, env=env)
    try:
        srv.init()
        ident = srv.start_call("add_ad_hoc_note", filename="2026-01-31T09-30-00-x.md", note="x")
        assert srv.close() == 0  # stdin closed while the note waits: answered, then the end
        assert srv.result_of(ident)["structuredContent"]["status"] == "queued"
    finally:
        kill_logged(log)
    assert delivery_done(tmp_path / "laptop" / "state")


def test_a_note_the_delivery_cannot_deliver_is_answered_before_the_wait_ends(
        tmp_path: Path) -> None:
    client_with_cache(tmp_path / "laptop", {"MEMORY.md": "# Memory\n"})
    cfg = ssh_client(tmp_path)
    ssh = tmp_path / "bin" / "ssh"  # an `ssh` that fails at once, as one to a host that is down
    ssh.parent.mkdir()
    ssh.write_text("#!/bin/sh\necho 'ssh: connect to host server.invalid port 22: Connection "
                   "refused' >&2\nexit 255\n")
    ssh.chmod(0o755)
    srv = McpServer(cfg, env={**os.environ, "HOME": str(tmp_path),
                              "PATH": f"{ssh.parent}{os.pathsep}{os.environ['PATH']}"})
    srv.init()
    started = time.monotonic()
    note = srv.call("add_ad_hoc_note", filename="2026-01-31T09-30-00-x.md", note="x")
    outcome = note["structuredContent"]
    assert outcome["status"] == "queued" and time.monotonic() - started < 9, outcome  # not NOTE_WAIT
    assert "the delivery could not reach the server (" in outcome["message"]
    assert "server.invalid" in outcome["message"] and "next sync" in outcome["message"]
    assert srv.close() == 0
    assert delivery_done(tmp_path / "laptop" / "state")


def test_a_batch_stops_running_requests_past_the_reply_limit(config: Path) -> None:
    from sharedmem.mcp import server as mcp
    big = Path(json.loads(config.read_text())["cache"]) / NS / "big.md"
    big.write_text("z" * (300 * 1024) + "\n")  # read ignores the manifest: the file is the truth
    srv = mcp.Server(str(config))
    srv.handle(b'{"jsonrpc":"2.0","id":0,"method":"initialize",'
               b'"params":{"protocolVersion":"2025-03-26"}}')
    read = {"jsonrpc": "2.0", "method": "tools/call",
            "params": {"name": "read", "arguments": {"path": f"{NS}/big.md"}}}
    replies = srv.batch([{**read, "id": i} for i in range(30)]
                        + [{"jsonrpc": "2.0", "method": "notifications/initialized"}, 7])
    assert srv.initialized and replies[-1]["error"]["code"] == mcp.INVALID_REQUEST
    done = [r for r in replies[:30] if "result" in r]
    assert len(done) == mcp.MAX_REPLY_BYTES // len(mcp._dumps(done[0])) + 1
    assert all(r["error"]["code"] == mcp.REPLY_LIMIT for r in replies[len(done):30])
    assert mcp._dumps([{"id": "\ud800"}, {"id": "é"}]) == '[{"id":"\\ud800"},{"id":"é"}]'


# freshness ---------------------------------------------------------------------------------------

def test_initialize_and_the_top_level_say_how_fresh_the_cache_is(tmp_path: Path,
                                                                  config: Path) -> None:
    from sharedmem.client.outbox import Outbox
    state = tmp_path / "state"
    state.mkdir()
    (state / "last-sync.json").write_text(json.dumps({
        "status": "failed", "exit_code": 2, "finished_at": "2026-01-31T09:30:00Z",
        "error": "ssh: connect to host server.invalid port 22: Name or service not known"}))
    for i in range(2):
        Outbox(state / "outbox").put(f"2026-01-31T09-30-0{i}-later.md", f"note {i}")
    srv = McpServer(config)
    instructions = srv.init()["instructions"]
    assert "The shared memory cache was last synced at " in instructions
    assert ("The last sync attempt (2026-01-31T09:30:00Z) failed: ssh: connect to host "
            "server.invalid port 22: Name or service not known.") in instructions
    assert "2 notes wait on this machine to be delivered" in instructions
    assert "background" not in instructions  # a cache synced just now is not stale
    fresh = srv.call("list")["structuredContent"]["freshness"]
    assert fresh["last_sync"] is not None and 0 <= fresh["age_seconds"] < 120
    assert fresh["last_attempt"]["status"] == "failed" and fresh["pending_notes"] == 2
    assert "background_sync" not in fresh and "failed: ssh: connect" in fresh["summary"]
    assert "freshness" not in srv.call("list", path=NS)["structuredContent"]
    assert srv.close() == 0


def _age_cache(cache: Path, state: Path, seconds: int) -> str:
    """Make the cache's last sync and the last attempt `seconds` old; the stamp written."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - seconds))
    (cache / ".sharedmem" / "synced.json").write_text(json.dumps({"last_sync": stamp}))
    (state / "last-sync.json").write_text(json.dumps({"status": "ok", "finished_at": stamp}))
    return stamp


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="counts processes in /proc")
def test_a_stale_cache_gets_one_background_sync(tmp_path: Path) -> None:
    from sharedmem.client.lock import sync_lock
    notes_folder = tmp_path / "mine"
    notes_folder.mkdir()
    (notes_folder / "a.md").write_text("# mine\n")
    cfg = tmp_path / "client.json"
    cfg.write_text(json.dumps({
        "machine": "lab", "transport": {"kind": "local", "store": str(tmp_path / "s.sqlite3")},
        "sources": [{"name": "mine", "kind": "markdown", "path": str(notes_folder)}],
        "cache": str(tmp_path / "cache"), "state": str(tmp_path / "state")}))
    env = {**os.environ, "HOME": str(tmp_path)}
    first = subprocess.run([sys.executable, str(LAUNCHER), "sync", "--config", str(cfg)],
                           capture_output=True, text=True, env=env, timeout=120)
    assert first.returncode == 0, first.stderr
    old = _age_cache(tmp_path / "cache", tmp_path / "state", 3600)  # a laptop that slept
    (notes_folder / "b.md").write_text("# written while it slept\n")
    servers = []
    try:
        with sync_lock(tmp_path / "state"):  # a scheduled sync runs: the background one waits
            a = McpServer(cfg, env=env)
            servers.append(a)
            started = time.monotonic()
            instructions = a.init()["instructions"]
            assert "A sync is being started in the background because the cache was 1h 0m " \
                "old (unless one already runs)" in instructions, instructions
            fresh = a.call("list")["structuredContent"]["freshness"]
            assert time.monotonic() - started < 10  # nothing waited for the sync
            assert fresh["last_sync"] == old
            background = fresh["background_sync"]
            assert (background["status"], background["running"]) == ("started", True)
            assert "because the cache was 1h 0m old; it is still running" in fresh["summary"]
            b = McpServer(cfg, env=env)  # a second agent starts meanwhile
            servers.append(b)
            assert "being started in the background" in b.init()["instructions"]
            fresh = b.call("list")["structuredContent"]["freshness"]
            assert fresh["background_sync"]["status"] == "already running"
            assert "already running in the background, so none was started" in fresh["summary"]
            asked = b.start_call("add_ad_hoc_note", filename="2026-01-31T09-30-00-meanwhile.md",
                                 note="added while the background sync waited")
            time.sleep(1)
            assert _proc_syncs(cfg, notes_only=False) == 1  # one background sync
            assert _proc_syncs(cfg, notes_only=True) == 1  # and the note's own delivery
            assert time.monotonic() - started < 20  # nothing waited for the background sync
        note = b.result_of(asked, 30)["structuredContent"]  # delivered once the sync let go
        assert (note["status"], note["delivery"]) == ("stored", "started"), note
        deadline = time.monotonic() + 90
        while (fresh := a.call("list")["structuredContent"]["freshness"])["last_sync"] == old \
                or fresh["background_sync"]["running"]:
            assert time.monotonic() < deadline, fresh
            time.sleep(0.1)
        assert fresh["last_attempt"]["status"] == "ok"
        assert a.call("read", path="machines/lab/mine/b.md")["isError"] is False  # published
        assert b.call("read", path=note["path"])["isError"] is False  # and the note delivered
    finally:
        for srv in servers:
            assert srv.close() == 0 and "Traceback" not in srv.stderr
        assert delivery_done(tmp_path / "state", 90)


def test_a_cache_synced_in_the_future_gets_a_background_sync(tmp_path: Path) -> None:
    cfg = tmp_path / "client.json"
    cfg.write_text(json.dumps({
        "machine": "lab", "transport": {"kind": "local", "store": str(tmp_path / "s.sqlite3")},
        "sources": [], "cache": str(tmp_path / "cache"), "state": str(tmp_path / "state")}))
    env = {**os.environ, "HOME": str(tmp_path)}
    first = subprocess.run([sys.executable, str(LAUNCHER), "sync", "--config", str(cfg)],
                           capture_output=True, text=True, env=env, timeout=120)
    assert first.returncode == 0, first.stderr
    _age_cache(tmp_path / "cache", tmp_path / "state", 3600)  # the schedule last ran an hour ago
    future = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 10 * 86400))
    (tmp_path / "cache" / ".sharedmem" / "synced.json").write_text(
        json.dumps({"last_sync": future}))
    srv = McpServer(cfg, env=env)
    instructions = srv.init()["instructions"]
    assert f"records its last sync at {future}, a time in the future" in instructions
    assert (f"A sync is being started in the background because the cache's last sync time "
            f"({future}) is in the future") in instructions
    deadline = time.monotonic() + 90
    while (fresh := srv.call("list")["structuredContent"]["freshness"])["last_sync"] == future:
        assert fresh["background_sync"]["status"] == "started", fresh
        assert time.monotonic() < deadline, fresh
        time.sleep(0.1)
    assert fresh["age_seconds"] is not None and "last_sync_in_future" not in fresh
    assert srv.close() == 0 and "Traceback" not in srv.stderr


def test_a_cache_never_synced_gets_no_background_sync(tmp_path: Path) -> None:
    cfg = tmp_path / "client.json"
    cfg.write_text(json.dumps({
        "machine": "lab", "transport": {"kind": "local", "store": str(tmp_path / "s.sqlite3")},
        "sources": [], "cache": str(tmp_path / "cache"), "state": str(tmp_path / "state")}))
    srv = McpServer(cfg, env={**os.environ, "HOME": str(tmp_path)})
    assert "No sync has completed into the shared memory cache yet" in srv.init()["instructions"]
    fresh = srv.call("list")["structuredContent"]["freshness"]
    assert fresh["last_sync"] is None and "background_sync" not in fresh
    assert srv.close() == 0
    assert not (tmp_path / "s.sqlite3").exists() and not (tmp_path / "state" / "delivery.lock").exists()


# --- hostile input, one table row a case ---------------------------------------------------------

# A row is (name, message, check): the JSON-RPC message sent (a tool call from `call`, any other
# message, a batch as a list, or raw bytes) and what the reply must show. Every row runs against
# one server over one hostile cache; after each row the server must still answer a ping, and at
# the end its stderr must hold no traceback and no tool must have failed unexpectedly.

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
def hostile_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[McpServer]:
    """One server over the hostile cache for every row, negotiated to accept batches."""
    srv = McpServer(build_hostile_cache(tmp_path_factory.mktemp("hostile")),
                 env={**os.environ, "HOME": str(tmp_path_factory.mktemp("home"))})
    srv.init("2025-03-26")
    yield srv
    if srv.proc.poll() is None:
        assert srv.close() == 0
        assert "Traceback" not in srv.stderr and "crashed" not in srv.stderr, srv.stderr


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs POSIX links and FIFOs")
@pytest.mark.parametrize("name, message, check", CASES, ids=[c[0] for c in CASES])
def test_hostile_request(hostile_server: McpServer, name: str, message: Any, check: Check) -> None:
    server = hostile_server
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
    grew = _peak_rss_mib(srv.proc.pid) - before  # a guard: any machine may publish such a file
    assert grew < 16, f"a read of a 40 MiB file took {grew:.0f} MiB more"
    assert srv.close() == 0
