#!/usr/bin/env python3
"""Real-harness check: register with the real Codex CLI, Claude Code and OpenCode, and ask each.

In a temporary fake HOME (the real one is never touched) it runs install_client.py --local,
then asks every harness what it sees: `codex mcp list` and `codex mcp get shared_memories`,
`claude mcp list` (which starts the server and must say "Connected"), `opencode mcp list`. It
also checks that `--uninstall` gives each harness file back byte for byte, and that no harness
lists the server afterwards. Not part of the test suite (it needs Node.js, and the network with
--install); scripts/release_check.py runs it.

Where each harness writes memory is shown by the harness itself: each is pointed at a loopback
stand-in for its model API (which answers every request with an error), and the request it
sends names its memory folder (Codex's memory instructions, Claude Code's "persistent
file-based memory at"), or the instruction files it read (OpenCode's "Instructions from:").
Codex is run with memory version 1, 2, unset and dual write, Claude Code with and without
`autoMemoryDirectory`; each folder must be the one `sharedmem.sources.harness_memory` resolves,
and the source must publish it. A registration in Claude Code's legacy `.config.json` must be
listed by `claude mcp list`. No real API is reached and no key is needed.

  python3 scripts/interop_check.py                  # the harnesses found on PATH
  python3 scripts/interop_check.py --install        # install them from npm into a temp folder
  python3 scripts/interop_check.py --npm-prefix DIR # ones installed with npm --prefix DIR
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sharedmem.sources import harness_memory  # noqa: E402
from sharedmem.sources.kinds import SourceSpec, snapshot  # noqa: E402

INSTALLER = REPO / "install_client.py"
SERVER = "shared_memories"
PACKAGES = {"codex": "@openai/codex", "claude-code": "@anthropic-ai/claude-code",
            "opencode": "opencode-ai"}
BINARIES = {"codex": "codex", "claude-code": "claude", "opencode": "opencode"}
# Harness files as a person leaves them: comments, one-line arrays, no final newline.
SEEDS = {
    "codex": (".codex/config.toml", '# my settings\nmodel = "o3"  # fast\n\n[features]\n'
              "web_search = true\n"),
    "claude-code": (".claude.json", '{\n  "numStartups": 1,\n  "tips": ["a", "b"],\n'
                    '  "projects": {}\n}'),
    "opencode": (".config/opencode/opencode.json", '{\n  // mine\n  "$schema": '
                 '"https://opencode.ai/config.json",\n  "autoupdate": false,\n}\n'),
}
TIMEOUT = 180
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@dataclass
class Row:
    """One line of the table."""

    harness: str
    check: str
    status: str  # ok | fail | skip
    detail: str


def _run(argv: Sequence[str], env: dict[str, str], cwd: Path,
         timeout: float = TIMEOUT) -> tuple[int, str]:
    """Run a program; its exit status and its output (stdout and stderr, colours removed)."""
    try:
        done = subprocess.run(list(argv), env=env, cwd=cwd, capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        return 127, f"{argv[0]}: not found"
    except subprocess.TimeoutExpired:
        return 124, f"{' '.join(argv)}: no answer within {timeout:.0f}s"
    return done.returncode, _ANSI.sub("", done.stdout + done.stderr)


def _our_line(output: str) -> str:
    return next((line.strip() for line in output.splitlines() if SERVER in line), "")


def _tail(output: str) -> str:
    lines = [line.strip() for line in output.strip().splitlines() if line.strip()]
    return " | ".join(lines[-3:])[:300]


def npm_install(folder: Path) -> tuple[bool, str]:
    """`npm install --prefix folder` the three harnesses; (done, what happened)."""
    npm = shutil.which("npm")
    if npm is None:
        return False, "npm is not on PATH: install Node.js (npm) to fetch the harnesses"
    folder.mkdir(parents=True, exist_ok=True)
    code, out = _run([npm, "install", "--prefix", str(folder), "--no-audit", "--no-fund",
                      "--loglevel", "error", *PACKAGES.values()], dict(os.environ), folder,
                     timeout=900)
    if code != 0:
        return False, f"npm install failed (exit {code}; is the npm registry reachable?): " \
                      + _tail(out)
    return True, f"installed {', '.join(PACKAGES.values())} into {folder}"


def find_binaries(bin_dir: Path | None) -> dict[str, str | None]:
    """Each harness's program: in `bin_dir` when given, else on PATH."""
    found: dict[str, str | None] = {}
    for harness, name in BINARIES.items():
        if bin_dir is not None:
            path = bin_dir / name
            found[harness] = str(path) if path.exists() else None
        else:
            found[harness] = shutil.which(name)
    return found


def fake_home(root: Path) -> Path:
    """A HOME with each harness's folder, seeded files and one Codex memory."""
    home = root / "home"
    for rel, text in SEEDS.values():
        path = home / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    (home / ".claude").mkdir(exist_ok=True)
    memories = home / ".codex" / "memories"
    memories.mkdir(parents=True)
    (memories / "MEMORY.md").write_text("# Memory\n- interop check\n", encoding="utf-8")
    return home


def harness_env(home: Path, bins: dict[str, str | None]) -> dict[str, str]:
    """The environment every program runs with: the fake HOME, quiet and offline-minded."""
    env = {k: v for k, v in os.environ.items() if k not in (
        "CODEX_HOME", "CLAUDE_CONFIG_DIR", "XDG_CONFIG_HOME", "OPENCODE_CONFIG",
        "OPENCODE_CONFIG_DIR", "OPENCODE_CONFIG_CONTENT")}
    dirs = dict.fromkeys(str(Path(p).parent) for p in bins.values() if p)
    env.update(HOME=str(home), NO_COLOR="1", DISABLE_AUTOUPDATER="1",
               CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", OPENCODE_DISABLE_AUTOUPDATE="1",
               PATH=os.pathsep.join([*dirs, env.get("PATH", "")]))
    return env


def install(env: dict[str, str], cwd: Path, *extra: str,
            harness: str | None = None) -> tuple[int, str]:
    """install_client.py of this checkout, with every harness named (or only `harness`)."""
    harnesses = [a for h in ([harness] if harness else SEEDS) for a in ("--harness", h)]
    return _run([sys.executable, str(INSTALLER), "--machine", "interop", "--local",
                 "--schedule", "none", *harnesses, *extra], env, cwd)


def check_restore(home: Path, env: dict[str, str], cwd: Path) -> list[Row]:
    """Install, then uninstall before any harness runs: every file must have its bytes back."""
    originals = {h: (home / rel).read_bytes() for h, (rel, _) in SEEDS.items()}
    code, out = install(env, cwd)
    if code != 0:
        return [Row("all", "install", "fail", f"install_client.py exited {code}: {_tail(out)}")]
    changed = [h for h, (rel, _) in SEEDS.items() if (home / rel).read_bytes() != originals[h]]
    code, out = install(env, cwd, "--uninstall")
    if code != 0:
        return [Row("all", "uninstall", "fail", f"exited {code}: {_tail(out)}")]
    rows = []
    for harness, (rel, _) in SEEDS.items():
        now = (home / rel).read_bytes() if (home / rel).exists() else None
        if harness not in changed:
            rows.append(Row(harness, "register + uninstall", "fail", f"~/{rel} was not edited"))
        elif now == originals[harness]:
            rows.append(Row(harness, "register + uninstall", "ok",
                            f"~/{rel} back byte for byte ({len(now)} bytes)"))
        else:
            rows.append(Row(harness, "register + uninstall", "fail",
                            f"~/{rel} differs from the original after --uninstall"))
    return rows


def _expect(harness: str, check: str, code: int, output: str,
            ok: Callable[[str], bool], want: str) -> Row:
    line = _our_line(output)
    if code == 0 and ok(output):
        return Row(harness, check, "ok", line or _tail(output))
    return Row(harness, check, "fail", f"exit {code}, expected {want}; got: "
               + (line or _tail(output) or "no output"))


def check_harnesses(bins: dict[str, str | None], env: dict[str, str], cwd: Path,
                    launcher: str) -> list[Row]:
    """Ask each installed harness about the registration; then uninstall and ask again."""
    rows = []
    for harness, program in bins.items():
        if program is None:
            continue
        code, out = _run([program, "--version"], env, cwd, timeout=60)
        said = [ln.strip() for ln in out.splitlines() if ln.strip()
                and not ln.startswith("WARNING")]
        rows.append(Row(harness, "version", "ok" if code == 0 else "fail",
                        said[-1] if said else f"exit {code}"))
    code, out = install(env, cwd)
    if code != 0:
        return [*rows, Row("all", "install", "fail", f"exited {code}: {_tail(out)}")]
    codex, claude, opencode = bins["codex"], bins["claude-code"], bins["opencode"]
    if codex:
        code, out = _run([codex, "mcp", "list"], env, cwd)
        rows.append(_expect("codex", "mcp list", code, out, lambda o: "enabled" in _our_line(o),
                            f"a {SERVER} line that says enabled"))
        code, out = _run([codex, "mcp", "get", SERVER], env, cwd)
        rows.append(_expect("codex", "mcp get", code, out,
                            lambda o: launcher in o and "stdio" in o,
                            f"a stdio server running {launcher}"))
        if rows[-1].status == "ok":
            rows[-1].detail = next((ln.strip() for ln in out.splitlines()
                                    if ln.strip().startswith("args:")), rows[-1].detail)
    if claude:
        code, out = _run([claude, "mcp", "list"], env, cwd)
        rows.append(_expect("claude-code", "mcp list", code, out,
                            lambda o: "Connected" in _our_line(o),
                            f"a {SERVER} line that says Connected"))
    if opencode:
        code, out = _run([opencode, "mcp", "list"], env, cwd)
        rows.append(_expect("opencode", "mcp list", code, out,
                            lambda o: "connected" in _our_line(o).lower()
                            and "failed" not in _our_line(o).lower(),
                            f"a {SERVER} line that says connected"))
    code, out = install(env, cwd, "--uninstall")
    if code != 0:
        return [*rows, Row("all", "uninstall", "fail", f"exited {code}: {_tail(out)}")]
    listing = {"codex": [codex, "mcp", "list"], "claude-code": [claude, "mcp", "list"],
               "opencode": [opencode, "mcp", "list"]}
    for harness, argv in listing.items():
        if argv[0] is None:
            continue
        code, out = _run([str(a) for a in argv], env, cwd)
        gone = code == 0 and not _our_line(out)
        rows.append(Row(harness, "after uninstall", "ok" if gone else "fail",
                        "mcp list runs and no longer lists " + SERVER if gone
                        else f"exit {code}: " + (_our_line(out) or _tail(out))))
    return rows


# --- where each harness writes memory, shown by the harness itself ------------------------------

class ModelStandIn:
    """A loopback HTTP server in place of a model API: it keeps each request body it is sent and
    answers every one with an error, so a harness shows its prompt and stops."""

    def __init__(self) -> None:
        self.bodies: list[str] = []
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the name http.server calls
                size = int(self.headers.get("Content-Length") or 0)
                stand_in.bodies.append(self.rfile.read(size).decode("utf-8", "replace"))
                body = b'{"error": {"type": "invalid_request_error", "message": "stand-in"}}'
                self.send_response(400)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:  # noqa: N802
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def take(self) -> str:
        """Every body sent since the last call, as one text."""
        taken, self.bodies = self.bodies, []
        return "\n".join(taken)

    def close(self) -> None:
        """Stop serving."""
        self.server.shutdown()
        self.server.server_close()


STAND_IN_KEY = "-".join(("interop", "not", "a", "key"))  # the stand-in takes any key
CODEX_PROVIDER = """model = "gpt-5.4"
model_provider = "standin"

[model_providers.standin]
name = "stand-in"
base_url = "{url}/v1"
wire_api = "responses"
env_key = "STANDIN_KEY"
request_max_retries = 0
stream_max_retries = 0

[features]
memories = true
{memories}"""
# (what the case is, its [memories] table, the folders that exist before Codex runs)
CODEX_CASES = [
    ("memories.version unset, a new user", "", ("memories_v2",)),
    ("memories.version unset, memories/ exists", "", ("memories", "memories_v2")),
    ('memories.version = "v2"', '\n[memories]\nversion = "v2"\n', ("memories", "memories_v2")),
    ('memories.version = "v1", dual_write = true',
     '\n[memories]\nversion = "v1"\ndual_write = true\n', ("memories",)),
]


def _published_folders(kind: str, root: Path, env: dict[str, str]) -> set[str]:
    """The first folder of each path the source publishes."""
    snap = snapshot(SourceSpec(kind, kind, root), env=env)
    return {e.path.split("/")[0] if "/" in e.path else "" for e in snap.files}


def check_codex_memory(codex: str, env: dict[str, str], root: Path,
                       stand_in: ModelStandIn) -> list[Row]:
    """Codex's memory folder for each memory setting: the one it reads is ours, and published."""
    rows = []
    for number, (case, table, folders) in enumerate(CODEX_CASES):
        home = root / f"codex-memory-{number}"
        home.mkdir()
        (home / "config.toml").write_text(CODEX_PROVIDER.format(url=stand_in.url,
                                                                memories=table))
        for folder in folders:
            (home / folder).mkdir()
            (home / folder / "memory_summary.md").write_text(f"# interop {folder}\n")
        run_env = {**env, "CODEX_HOME": str(home), "STANDIN_KEY": STAND_IN_KEY}
        stand_in.take()
        code, out = _run([codex, "exec", "--skip-git-repo-check", "say hi"], run_env, root,
                         timeout=120)
        sent = stand_in.take()
        # Codex's memory instructions name the folder it reads, in version 1's words or version
        # 2's (its consolidation, which may run too, names the folders it writes)
        read = sorted(set(re.findall(rf"{re.escape(str(home))}/(memories(?:_v2)?)/(?:"
                                     r"memory_summary\.md \(already provided|"
                                     r"rollout_summaries/` when its)", sent)))
        ours = harness_memory.codex_memory(home, run_env)
        wrote = [f for f in ("memories", "memories_v2")
                 if (home / f).is_dir() and f not in folders]
        published = _published_folders("codex", home / "memories", run_env)
        prefix = {"memories": "", "memories_v2": "memories_v2"}
        if not sent:
            rows.append(Row("codex", f"memory: {case}", "fail", f"exit {code}: Codex sent no "
                            f"request to the stand-in: {_tail(out)}"))
        elif read != [ours.roots[0][0]] or not set(wrote) <= {n for n, _ in ours.roots}:
            rows.append(Row("codex", f"memory: {case}", "fail", f"Codex reads {read}, wrote "
                            f"{wrote}; we resolve {[n for n, _ in ours.roots]} ({ours.why})"))
        elif prefix[read[0]] not in published:
            rows.append(Row("codex", f"memory: {case}", "fail", f"the codex source does not "
                            f"publish {read[0]}/ (it publishes {sorted(published)})"))
        else:
            extra = f", also wrote {', '.join(wrote)}/" if wrote else ""
            rows.append(Row("codex", f"memory: {case}", "ok", f"Codex reads {read[0]}/{extra}; "
                            f"the codex source publishes {', '.join(n for n, _ in ours.roots)}"))
    return rows


CLAUDE_SAYS = re.compile(r"persistent file-based memory at `([^`]+)`")


def check_claude_memory(claude: str, env: dict[str, str], root: Path,
                        stand_in: ModelStandIn) -> list[Row]:
    """Claude Code's memory folder with and without autoMemoryDirectory, as it tells its model."""
    rows = []
    for case, setting in (("default place", None), ("autoMemoryDirectory", "~/notes/claude")):
        home = root / f"claude-memory-{len(rows)}"
        config = home / ".claude"
        project = home / "project"
        project.mkdir(parents=True)
        config.mkdir()
        if setting is not None:
            (config / "settings.json").write_text(json.dumps({"autoMemoryDirectory": setting}))
            (home / "notes" / "claude").mkdir(parents=True)
            (home / "notes" / "claude" / "MEMORY.md").write_text("# interop\n")
        run_env = {**env, "HOME": str(home), "ANTHROPIC_BASE_URL": stand_in.url,
                   "ANTHROPIC_API_KEY": STAND_IN_KEY}
        stand_in.take()
        code, out = _run([claude, "-p", "say hi"], run_env, project, timeout=120)
        said = sorted(set(CLAUDE_SAYS.findall(stand_in.take())))
        ours = harness_memory.claude_memory(config, run_env)
        want = (f"{ours.relocated}/" if ours.relocated else
                f"{config / 'projects'}/{re.sub('[^A-Za-z0-9]', '-', str(project))}/memory/")
        if said != [want]:
            rows.append(Row("claude-code", f"memory: {case}", "fail", f"exit {code}: Claude Code "
                            f"writes {said or 'nothing it said'}; we resolve {want}: "
                            + _tail(out)))
            continue
        detail = f"Claude Code writes {said[0]}"
        if ours.relocated is not None:
            published = _published_folders("claude-code", config / "projects", run_env)
            if "auto-memory" not in published:
                rows.append(Row("claude-code", f"memory: {case}", "fail",
                                f"{detail}, but the claude-code source does not publish it"))
                continue
            detail += ", published as auto-memory/"
        rows.append(Row("claude-code", f"memory: {case}", "ok", detail))
    return rows


def check_claude_legacy(claude: str, env: dict[str, str], root: Path) -> list[Row]:
    """A non-empty ~/.claude/.config.json: the entry goes there, and Claude Code lists it."""
    home = root / "claude-legacy"
    legacy = home / ".claude" / ".config.json"
    legacy.parent.mkdir(parents=True)
    legacy.write_text('{\n  "numStartups": 2\n}\n')
    run_env = {**env, "HOME": str(home)}
    code, out = install(run_env, root, harness="claude-code")
    if code != 0:
        return [Row("claude-code", "legacy .config.json", "fail", f"install exited {code}: "
                    + _tail(out))]
    code, out = _run([claude, "mcp", "list"], run_env, root)
    row = _expect("claude-code", "legacy .config.json", code, out,
                  lambda o: "Connected" in _our_line(o), f"a {SERVER} line that says Connected")
    install(run_env, root, "--uninstall", harness="claude-code")
    gone_code, gone = _run([claude, "mcp", "list"], run_env, root)
    left = SERVER in legacy.read_text() or (home / ".claude.json").exists() and SERVER in (
        home / ".claude.json").read_text()
    if row.status == "ok" and (gone_code != 0 or _our_line(gone) or left):
        row = Row("claude-code", "legacy .config.json", "fail", f"{SERVER} is still there after "
                  f"--uninstall (exit {gone_code}): " + (_our_line(gone) or _tail(gone)))
    elif row.status == "ok":  # Claude Code rewrites the file itself: its bytes are its own
        row.detail += "; registered in ~/.claude/.config.json, gone after --uninstall"
    return [row]


def check_opencode_guidance(opencode: str, env: dict[str, str], root: Path,
                            stand_in: ModelStandIn) -> list[Row]:
    """OpenCode reads our guidance file and still the user's ~/.claude/CLAUDE.md."""
    home = root / "opencode-guidance"
    folder = home / ".config" / "opencode"
    folder.mkdir(parents=True)
    (home / ".claude").mkdir()
    (home / ".claude" / "CLAUDE.md").write_text("# the user's own Claude rules\n")
    (folder / "opencode.json").write_text(json.dumps({
        "$schema": "https://opencode.ai/config.json", "model": "standin/m",
        "provider": {"standin": {"npm": "@ai-sdk/openai-compatible", "models": {"m": {}},
                                 "options": {"baseURL": f"{stand_in.url}/v1",
                                             "apiKey": STAND_IN_KEY}}}}, indent=2))
    run_env = {**env, "HOME": str(home)}
    code, out = install(run_env, root, harness="opencode")
    if code != 0:
        return [Row("opencode", "guidance", "fail", f"install exited {code}: {_tail(out)}")]
    project = home / "project"
    project.mkdir()
    stand_in.take()
    code, out = _run([opencode, "run", "say hi"], run_env, project, timeout=180)
    sent = stand_in.take()
    read = set(re.findall(r"Instructions from: ([^\\\n\"]+)", sent))
    want = {str(home / ".claude" / "CLAUDE.md"), str(folder / "shared-memories.md")}
    if not sent:
        return [Row("opencode", "guidance", "skip", f"OpenCode sent no request (exit {code}; "
                    "it fetches its provider package from npm first): " + _tail(out))]
    if not want <= read:
        return [Row("opencode", "guidance", "fail", f"OpenCode read {sorted(read)}, not "
                    f"{sorted(want)}")]
    return [Row("opencode", "guidance", "ok", "OpenCode reads ~/.claude/CLAUDE.md and our "
                "shared-memories.md (named in opencode.json's instructions)")]


def check_memory(bins: dict[str, str | None], env: dict[str, str], root: Path) -> list[Row]:
    """Each harness's memory and guidance, shown by the harness itself."""
    stand_in = ModelStandIn()
    rows: list[Row] = []
    try:
        if bins["codex"]:
            rows += check_codex_memory(bins["codex"], env, root, stand_in)
        if bins["claude-code"]:
            rows += check_claude_memory(bins["claude-code"], env, root, stand_in)
            rows += check_claude_legacy(bins["claude-code"], env, root)
        if bins["opencode"]:
            rows += check_opencode_guidance(bins["opencode"], env, root, stand_in)
    finally:
        stand_in.close()
    return rows


def table(rows: list[Row]) -> str:
    """The rows as aligned text."""
    widths = [max([len(h)] + [len(getattr(r, h)) for r in rows]) for h in ("harness", "check",
                                                                          "status")]
    lines = [f"{'harness':<{widths[0]}}  {'check':<{widths[1]}}  {'status':<{widths[2]}}  detail"]
    lines += [f"{r.harness:<{widths[0]}}  {r.check:<{widths[1]}}  {r.status:<{widths[2]}}  "
              f"{r.detail}" for r in rows]
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    """Options of the interop check."""
    p = argparse.ArgumentParser(prog="interop_check.py", description=__doc__.splitlines()[0],
                                epilog="Exit status: 0 when every check that ran passed (a "
                                       "harness not found is skipped), 1 otherwise.")
    p.add_argument("--install", action="store_true",
                   help=f"install {', '.join(PACKAGES.values())} with `npm install --prefix "
                        "TMP` first (needs the npm registry)")
    p.add_argument("--npm-prefix", metavar="DIR",
                   help="use the harnesses installed with `npm install --prefix DIR`")
    p.add_argument("--keep", action="store_true",
                   help="keep the temporary folder (fake HOME, npm packages) and print it")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    return p


def main(argv: Sequence[str]) -> int:
    """Run every check; 1 if any failed."""
    args = parser().parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="sharedmem-interop-"))
    rows: list[Row] = []
    try:
        bin_dir = Path(args.npm_prefix) / "node_modules" / ".bin" if args.npm_prefix else None
        if args.install:
            done, what = npm_install(root / "npm")
            rows.append(Row("all", "npm install", "ok" if done else "fail", what))
            bin_dir = root / "npm" / "node_modules" / ".bin"
        bins = find_binaries(bin_dir)
        where = f"in {bin_dir}" if bin_dir else "on PATH"
        rows += [Row(h, "found", "skip", f"`{BINARIES[h]}` is not {where} (--install fetches "
                     f"{PACKAGES[h]} from npm)") for h, p in bins.items() if p is None]
        home = fake_home(root)
        env = harness_env(home, bins)
        rows += check_restore(home, env, root)
        if any(bins.values()):
            launcher = str(home / ".local" / "share" / "codex-shared-memory" / "shared_memory.py")
            rows += check_harnesses(bins, env, root, launcher)
            rows += check_memory(bins, env, root)
    finally:
        if args.keep:
            print(f"kept {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    failed = [r for r in rows if r.status == "fail"]
    if args.json:
        print(json.dumps({"ok": not failed, "rows": [asdict(r) for r in rows]}, indent=2))
    else:
        print(table(rows))
        ran = sum(r.status == "ok" for r in rows)
        print(f"\ninterop check: {ran} ok, {len(failed)} failed, "
              f"{sum(r.status == 'skip' for r in rows)} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
