"""`demo`: the whole flow in a throw-away sandbox, so a new user sees what an agent would see.

Two machines publish sample memory into one local store through the real sync client, then the
real MCP server (a child process, started as a harness would start it) answers the four tools.
Nothing outside the sandbox is written and no harness file is touched: children run with HOME
set inside the sandbox and the installers are never called.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sharedmem.core import ConfigError, ProtocolError, TransportError
from sharedmem.program import LAUNCHER

Progress = Callable[[str], None]
MARKER = ".shared-memory-demo"
MCP_TIMEOUT = 20.0
MCP_PROTOCOL = "2025-06-18"
SHOWN_LINES = 12
_CLEARED = ("CODEX_HOME", "CLAUDE_CONFIG_DIR", "XDG_CONFIG_HOME")
# An invented, revoked-looking token, assembled at run time so no scanner mistakes this file
# for a leak; the demo shows it arriving as [REDACTED:...] on the other side.
_FAKE_TOKEN = "-".join(["sk", "demo" + "4Qx7Lr2Vn9Tb6Wm3Kc8Jh5Pz1"])

LAPTOP_FILES = {
    ".codex/memories/MEMORY.md": f"""# Memory

## billing-service
- Run the tests with `uv run pytest -q`; the slow suite is marked `@pytest.mark.slow`.
- Staging deploys: `make deploy-staging`, then check the /health page before announcing.
- Zoë owns the payment adapters: ask her before changing `adapters/`.
- An old staging key was pasted here once: export BILLING_API_KEY={_FAKE_TOKEN}
""",
    ".codex/memories/memory_summary.md": """# Summary
billing-service (Python 3.12, uv). Deploys go to staging first; retries live in
`billing/retry.py`. See rollout_summaries/ for past incidents.
""",
    ".codex/memories/rollout_summaries/2026-01-12-retry-storm.md": """# Retry storm, 12 Jan
Invoices were retried without back-off after the payment API timed out.
Fix: exponential back-off with jitter, capped at 5 tries (`billing/retry.py`).
""",
    ".codex/memories/raw_memories.md": "Raw notes: never published by the codex source.\n",
}
DESKTOP_FILES = {
    ".claude/projects/atlas-web/memory/MEMORY.md": """# atlas-web
- Front end: `pnpm dev` on port 5173; the API proxy points at staging.
- Translations live in `locales/`; keep the German strings (Grüße, Straße) in NFC.
""",
    ".claude/projects/atlas-web/memory/debugging.md": """# Debugging
Blank page after login: clear the service worker, the cached bundle is stale.
""",
    "notes/deploy-checklist.md": """# Deploy checklist
1. Green CI on main.
2. `make deploy-staging`; smoke-test staging for ten minutes.
3. Tag the release, then deploy production with a second reviewer.
""",
    "notes/ideas/café-meetup.md": """# Café meetup ideas
- Demo the shared memory across laptop and desktop — 5 minutes, no slides.
- 日本語のメモも検索できる: search works on any UTF-8 text.
""",
}


class McpSession:
    """A running stdio MCP server and newline-delimited JSON-RPC requests to it, with timeouts.

    `doctor` uses it to start the server exactly as a harness registered it.
    """

    def __init__(self, argv: list[str], env: Mapping[str, str] | None = None,
                 timeout: float = MCP_TIMEOUT) -> None:
        self.argv = list(argv)
        self.timeout = timeout
        self._next = 0
        try:
            self.process = subprocess.Popen(
                self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                env=dict(env) if env is not None else None)
        except OSError as exc:
            raise TransportError(f"cannot start the MCP server {self.argv[0]!r}: "
                                 f"{exc.strerror or exc}") from None
        self._lines: queue.Queue[bytes] = queue.Queue()
        self._stderr: list[bytes] = []
        threading.Thread(target=self._pump, daemon=True).start()
        self._drainer = threading.Thread(target=self._drain, daemon=True)
        self._drainer.start()

    def _pump(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._lines.put(line)
        self._lines.put(b"")

    def _drain(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            if len(self._stderr) < 200:
                self._stderr.append(line)

    def stderr(self) -> str:
        """What the server logged so far (its last line explains most crashes)."""
        return b"".join(self._stderr).decode("utf-8", "replace").strip()

    def _send(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(json.dumps(message).encode("utf-8") + b"\n")
            self.process.stdin.flush()
        except OSError:
            raise self._gone("while a request was being sent") from None

    def _gone(self, when: str) -> ProtocolError:
        try:
            code = self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        # The exit can be seen before the drain thread has read the last words; a
        # grandchild holding stderr open must not hold us, hence the bound.
        self._drainer.join(timeout=2)
        said = self.stderr().splitlines()
        return ProtocolError(f"the MCP server stopped {when}: "
                             f"{said[-1] if said else f'exit status {code}'}")

    def request(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """Send a request and return its result; a JSON-RPC error or silence raises."""
        self._next += 1
        self._send({"jsonrpc": "2.0", "id": self._next, "method": method,
                    "params": params or {}})
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                line = self._lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise ProtocolError(f"the MCP server did not answer {method} within "
                                    f"{self.timeout:.0f}s") from None
            if not line:
                raise self._gone(f"before answering {method}")
            try:
                reply = json.loads(line)
            except ValueError:
                raise ProtocolError(f"the MCP server wrote a line that is not JSON-RPC to "
                                    f"stdout: {line[:120]!r}") from None
            if isinstance(reply, dict) and reply.get("id") == self._next:
                break
        if "error" in reply:
            raise ProtocolError(f"{method} failed: {reply['error'].get('message')}")
        return reply.get("result") or {}

    def initialize(self, version: str = MCP_PROTOCOL) -> dict[str, Any]:
        """The MCP handshake: initialize, then the initialized notification."""
        result = self.request("initialize", {"protocolVersion": version, "capabilities": {},
                                             "clientInfo": {"name": "sharedmem", "version": "1"}})
        self._send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return result

    def call(self, tool: str, arguments: dict[str, Any]) -> tuple[bool, Any]:
        """Call one tool: (is_error, structured result or the error text)."""
        result = self.request("tools/call", {"name": tool, "arguments": arguments})
        text = "".join(c.get("text", "") for c in result.get("content", []))
        if result.get("isError"):
            return True, text
        return False, result.get("structuredContent") or json.loads(text)

    def close(self) -> None:
        """End input so the server exits; kill it if it lingers."""
        try:
            assert self.process.stdin is not None
            self.process.stdin.close()
        except OSError:
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> McpSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _prepare(folder: Path | None) -> tuple[Path, bool]:
    """The sandbox folder and whether to remove it afterwards; a foreign folder is refused."""
    if folder is None:
        return Path(tempfile.mkdtemp(prefix="shared-memory-demo-")), True
    folder = Path(folder).expanduser().resolve()
    if folder.exists() and (not folder.is_dir() or (any(folder.iterdir())
                                                    and not (folder / MARKER).exists())):
        raise ConfigError(f"demo folder {folder} exists and is not an earlier demo sandbox: "
                          "pass --dir with a new or empty folder")
    folder.mkdir(parents=True, exist_ok=True)
    return folder, False


def _write_files(home: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        target = home / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")


def _client_config(sandbox: Path, machine: str, sources: list[dict[str, str]]) -> Path:
    path = sandbox / machine / "client.json"
    path.write_text(json.dumps({
        "version": 1, "machine": machine,
        "transport": {"kind": "local", "store": str(sandbox / "server" / "store.sqlite3")},
        "sources": sources, "cache": str(sandbox / machine / "cache"),
        "state": str(sandbox / machine / "state")}, indent=2), encoding="utf-8")
    return path


def _child_env(home: Path) -> dict[str, str]:
    """The environment for children: HOME inside the sandbox, no harness folders from outside."""
    env = {k: v for k, v in os.environ.items() if k not in _CLEARED}
    env.update(HOME=str(home), USERPROFILE=str(home), PYTHONDONTWRITEBYTECODE="1",
               PYTHONIOENCODING="utf-8")
    return env


def _sync_summary(report: dict[str, Any], cfg: Any) -> dict[str, Any]:
    """A short form of a sync report, with what the client redacted before sending."""
    from sharedmem.sources import kinds as sources
    redacted: dict[str, dict[str, int]] = {}
    for src in cfg.sources:
        snap = sources.snapshot(sources.SourceSpec(src.name, src.kind, src.path), cfg.limits)
        counts = redacted.setdefault(src.name, {})
        for entry in snap.files:
            for kind, n in entry.redactions.items():
                counts[kind] = counts.get(kind, 0) + n
    return {"machine": report["machine"], "status": report["status"],
            "error": report.get("error"),
            "sources": [{"source": s["source"], "files": s["files"], "status": s["status"],
                         "redacted": redacted.get(s["source"]) or s.get("redacted", {})}
                        for s in report["sources"]],
            "cache_files": report.get("pull", {}).get("files")}


def _render(tool: str, is_error: bool, result: Any) -> str:
    if is_error:
        return f"error: {result}"
    from sharedmem.mcp.tools import format_text as tool_text
    lines = tool_text(tool, result).splitlines()
    if len(lines) > SHOWN_LINES:
        lines = lines[:SHOWN_LINES] + [f"... ({len(lines) - SHOWN_LINES} more lines)"]
    return "\n".join(lines)


def demo(dir: Path | None = None, progress: Progress | None = None) -> dict[str, Any]:  # noqa: A002
    """Build the sandbox, sync two machines, then run the four tools through the real MCP server."""
    from sharedmem.client import config
    from sharedmem.client import sync as client
    say = progress or (lambda _msg: None)
    started = time.monotonic()
    sandbox, temporary = _prepare(dir)
    try:
        (sandbox / MARKER).write_text("made by shared_memory.py demo\n", encoding="utf-8")
        homes = {m: sandbox / m / "home" for m in ("laptop", "desktop")}
        _write_files(homes["laptop"], LAPTOP_FILES)
        _write_files(homes["desktop"], DESKTOP_FILES)
        configs = {
            "laptop": _client_config(sandbox, "laptop", [
                {"name": "codex", "kind": "codex",
                 "path": str(homes["laptop"] / ".codex" / "memories")}]),
            "desktop": _client_config(sandbox, "desktop", [
                {"name": "claude-code", "kind": "claude-code",
                 "path": str(homes["desktop"] / ".claude" / "projects")},
                {"name": "notes", "kind": "markdown", "path": str(homes["desktop"] / "notes")}]),
        }
        syncs = []
        for machine in ("laptop", "desktop", "laptop"):
            say(f"syncing {machine} into the sandbox store")
            cfg = config.load(configs[machine], _child_env(homes[machine]))
            report = client.sync(cfg)
            if report["status"] == "failed":
                raise TransportError(f"the demo sync of {machine} failed: {report['error']}")
            syncs.append(_sync_summary(report, cfg))
        say("starting the MCP server as a harness would")
        calls = _agent_session(configs["laptop"], _child_env(homes["laptop"]), say)
        return {"ok": not any(c["is_error"] for c in calls),
                "sandbox": str(sandbox), "kept": not temporary,
                "config": str(configs["laptop"]), "syncs": syncs, "calls": calls,
                "seconds": round(time.monotonic() - started, 2)}
    finally:
        if temporary:
            shutil.rmtree(sandbox, ignore_errors=True)


def _agent_session(cfg: Path, env: dict[str, str], say: Progress) -> list[dict[str, Any]]:
    """The tool calls an agent on the laptop would make, and what it would see."""
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H-%M-%S")
    note = f"{stamp}-demo-first-note.md"
    plan: list[tuple[str, dict[str, Any]]] = [
        ("list", {"path": "machines"}),
        ("search", {"queries": ["staging"], "case_sensitive": False, "max_results": 8}),
        ("read", {"path": "machines/laptop/codex/MEMORY.md"}),
        ("read", {"path": "machines/desktop/notes/ideas/café-meetup.md"}),
        ("add_ad_hoc_note", {"filename": note, "note": "Decided: staging deploys need a "
                             "second reviewer from now on (agreed with Zoë)."}),
        ("read", {"path": f"extensions/ad_hoc/notes/{note}"}),
    ]
    argv = [sys.executable, str(LAUNCHER), "mcp", "--config", str(cfg)]
    calls = []
    with McpSession(argv, env) as session:
        info = session.initialize()
        tools = [t["name"] for t in session.request("tools/list").get("tools", [])]
        calls.append({"tool": "tools/list", "arguments": {}, "is_error": False,
                      "result": {"tools": tools, "server": info.get("serverInfo")},
                      "text": "tools: " + ", ".join(tools)})
        for tool, arguments in plan:
            say(f"calling {tool}")
            is_error, result = session.call(tool, arguments)
            calls.append({"tool": tool, "arguments": arguments, "is_error": is_error,
                          "result": result, "text": _render(tool, is_error, result)})
    return calls


def format_text(result: dict[str, Any]) -> str:
    """The transcript a person reads: the syncs, then each tool call and what the agent saw."""
    out = [f"Codex Shared Memory demo, in the sandbox {result['sandbox']}", "",
           "1. Two machines publish their memory into one store (a local SQLite file):"]
    for sync in result["syncs"]:
        parts = []
        for src in sync["sources"]:
            red = ", ".join(f"{n} {k} redacted before sending"
                            for k, n in sorted(src["redacted"].items()))
            parts.append(f"{src['source']} {src['files']} files {src['status']}"
                         + (f" ({red})" if red else ""))
        out.append(f"   {sync['machine']}: sync {sync['status']} - {'; '.join(parts)}; "
                   f"cache now holds {sync['cache_files']} files")
    out += ["   (raw_memories.md on the laptop is never published.)", "",
            "2. An agent on the laptop uses the shared_memories MCP server:"]
    for call in result["calls"]:
        args = json.dumps(call["arguments"], ensure_ascii=False)
        out.append(f"\n> {call['tool']} {args}" if call["arguments"] else f"\n> {call['tool']}")
        out.extend("  " + line for line in call["text"].splitlines())
    out.append(f"\nDone in {result['seconds']}s.")
    if result["kept"]:
        out.append(f"The sandbox stays in {result['sandbox']}; try for example:\n"
                   f"  python3 {LAUNCHER} search --config {result['config']} staging\n"
                   f"  python3 {LAUNCHER} status --config {result['config']}")
    else:
        out.append("The sandbox was removed; run `shared_memory.py demo --dir DIR` to keep it "
                   "and explore it with list, read, search and status.")
    return "\n".join(out)
