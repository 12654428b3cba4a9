"""The real MCP server as a child process: lifecycle per revision, malformed input, tools, exits."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
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
    hung_ssh,
    kill_logged,
    ssh_client,
)

from sharedmem.cache.cache import Cache, NamespaceInfo
from sharedmem.hashing import sha256_text
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
    assert time.monotonic() - started < 10 and path in outcome["message"]
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
    assert outcome["status"] == "queued" and time.monotonic() - started < 9, outcome
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
            assert time.monotonic() - started < 20
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


# resources ---------------------------------------------------------------------------------------

def _stamp(i: int) -> str:
    """The time in a note's filename, a second apart for each i."""
    return f"2026-01-31T09-{i // 60:02d}-{i % 60:02d}"


def test_resources_list_the_entry_files_then_the_notes_page_by_page(tmp_path: Path) -> None:
    from sharedmem.rules import NOTES_DIR
    layout = {
        "machines/lab/codex": ("codex", {"MEMORY.md": "m\n", "memory_summary.md": "s\n",
                                         "rollout_summaries/r.md": "r\n"}),
        "machines/lab/claude-code": ("claude-code", {"web/MEMORY.md": "w\n", "web/x.md": "x\n",
                                                     "api/MEMORY.md": "a\n"}),
        "machines/lab/notes": ("markdown", {"MEMORY.md": "not an agent's\n"}),
        NOTES_DIR: ("notes", {f"{_stamp(i)}-n{i}.md": f"note {i}\n" for i in range(150)}),
    }
    upserts, namespaces = [], {}
    for key, (kind, files) in layout.items():
        machine, source = ("lab", key.split("/")[2]) if key != NOTES_DIR else (None, "ad_hoc")
        namespaces[key] = NamespaceInfo(key, machine, source, kind, 1, "2026-01-31T09:30:00Z")
        upserts += [(f"{key}/{p}", sha256_text(t), t) for p, t in files.items()]
    Cache(tmp_path / "cache").apply(upserts, [], namespaces)
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
    note = srv.ask("resources/read", {"uri": uris[-1]})["result"]["contents"]
    assert note == [{"uri": uris[-1], "mimeType": "text/markdown", "text": "note 149\n"}]
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
def test_resources_of_a_damaged_cache_say_it_is_being_repaired(config: Path, name: str) -> None:
    from sharedmem.mcp.tools import REPAIRING
    uri = f"sharedmem://cache/{NS}/MEMORY.md"
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
