#!/usr/bin/env python3
"""Real-harness check: register with the real Codex CLI, Claude Code and OpenCode, and ask each.

In a temporary fake HOME (the real one is never touched) it runs install_client.py --local,
then asks every harness what it sees: `codex mcp list` and `codex mcp get shared_memories`,
`claude mcp list` (which starts the server and must say "Connected"), `opencode mcp list`. It
also checks that `--uninstall` gives each harness file back byte for byte, and that no harness
lists the server afterwards. Not part of the test suite (it needs Node.js, and the network with
--install); scripts/release_check.py runs it.

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
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
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


def install(env: dict[str, str], cwd: Path, *extra: str) -> tuple[int, str]:
    """install_client.py of this checkout, with every harness named."""
    harnesses = [a for h in SEEDS for a in ("--harness", h)]
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
