#!/usr/bin/env python3
"""Release check: lint, tests, lock file, real harnesses, secrets, private paths, version, changelog.

Every check runs, every problem is printed (file, line and kind; never a secret's text), and the
exit status is 1 when there was any problem, 0 otherwise. See docs/CONTRIBUTING.md.

  python3 scripts/release_check.py                    # before merging
  python3 scripts/release_check.py --public-release   # before tagging: also a clean tree, a
                                                      # CHANGELOG.md entry for the version, and
                                                      # the harnesses fresh from npm
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator, Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from sharedmem.redact.redactor import find  # noqa: E402  (the project's own detector)

ALLOWLIST = ".release-allowlist"
# Names that are obviously stand-ins in examples: /home/me/, /Users/alice/, bob.local ...
PLACEHOLDERS = frozenset({"me", "you", "user", "alice", "bob", "example"})
_HOME_PATHS = (
    ("home-path", re.compile(r"(?<![\w.])/home/([A-Za-z0-9._-]+)")),
    ("home-path", re.compile(r"(?<![\w.])/Users/([A-Za-z0-9._ -]+?)(?=/|\s|$|`)")),
    ("home-path", re.compile(r"(?<![A-Za-z])[A-Za-z]:\\+Users\\+([^\\\s`'\"<>]+)", re.IGNORECASE)),
)
_PRIVATE_HOST = re.compile(
    r"(?<![\w./-])([A-Za-z0-9][A-Za-z0-9-]*)(?:\.[A-Za-z0-9-]+)*\.(?:local|internal|lan|corp)(?![\w-])",
    re.IGNORECASE)
_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
_PRIVATE_IP = re.compile(
    rf"(?<![\w.])(?:10\.{_OCTET}\.{_OCTET}\.{_OCTET}|172\.(?:1[6-9]|2\d|3[01])\.{_OCTET}\.{_OCTET}"
    rf"|192\.168\.{_OCTET}\.{_OCTET})(?![\w]|\.\d)")


class Report:
    """Collects problems so that every check runs and all of them are shown together."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def problem(self, text: str) -> None:
        """Record and print one problem."""
        self.problems.append(text)
        print(f"FAIL {text}", flush=True)

    def ok(self, text: str) -> None:
        """Print a check that passed."""
        print(f"ok   {text}", flush=True)


def run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run a tool, its output captured so only a failure's tail is shown."""
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)


def tool_check(report: Report, name: str, argv: list[str], cwd: Path) -> None:
    """One external tool; a non-zero exit is a problem, with the last lines of its output."""
    if shutil.which(argv[0]) is None:
        report.problem(f"{name}: `{argv[0]}` is not on PATH: install uv (see docs/CONTRIBUTING.md)")
        return
    done = run(argv, cwd)
    if done.returncode == 0:
        report.ok(f"{name}: {' '.join(argv)}")
        return
    tail = (done.stdout + done.stderr).strip().splitlines()[-15:]
    report.problem(f"{name}: `{' '.join(argv)}` exited {done.returncode}:\n       "
                   + "\n       ".join(tail))


def check_interop(report: Report, root: Path, install: bool) -> None:
    """scripts/interop_check.py: the real Codex CLI, Claude Code and OpenCode against this code.

    Harnesses not found on PATH are skipped (a note, not a problem); a public release installs
    them from npm first (--install).
    """
    script = root / "scripts" / "interop_check.py"
    if not script.is_file():
        print(f"note interop: {script} does not exist; skipped")
        return
    done = run([sys.executable, str(script), "--json", *(["--install"] if install else [])],
               root)
    try:
        rows = json.loads(done.stdout)["rows"]
    except (ValueError, KeyError, TypeError):
        tail = (done.stdout + done.stderr).strip().splitlines()[-10:]
        report.problem(f"interop: {script.name} exited {done.returncode}:\n       "
                       + "\n       ".join(tail))
        return
    failed = [r for r in rows if r["status"] == "fail"]
    for row in failed:
        report.problem(f"interop: {row['harness']} {row['check']}: {row['detail']}")
    skipped = sorted({r["harness"] for r in rows if r["status"] == "skip"})
    if not failed:
        report.ok(f"interop: {sum(r['status'] == 'ok' for r in rows)} checks passed"
                  + (f" ({', '.join(skipped)} not found: skipped; --public-release installs "
                     "them from npm)" if skipped else ""))


def repo_files(root: Path) -> list[str]:
    """Tracked files plus untracked ones git does not ignore: what a commit could contain."""
    done = run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], root)
    if done.returncode != 0:
        raise SystemExit(f"release_check: {root} is not a git checkout ({done.stderr.strip()}): "
                         "pass --root with the repository's folder")
    return sorted({name for name in done.stdout.split("\0") if name})


def read_allowlist(root: Path) -> set[tuple[str, str]]:
    """`path:kind` lines of .release-allowlist ('#' starts a comment)."""
    path = root / ALLOWLIST
    entries: set[tuple[str, str]] = set()
    if not path.is_file():
        return entries
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, kind = line.rpartition(":")
        if not sep or not name or not kind:
            raise SystemExit(f"release_check: {ALLOWLIST} line {number} is not `path:kind`")
        entries.add((name.strip(), kind.strip()))
    return entries


def text_of(path: Path) -> str | None:
    """A file's text, or None for a binary, unreadable or missing file."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if b"\0" in data:
        return None
    return data.decode("utf-8", "replace")


def check_secrets(report: Report, root: Path, files: Sequence[str]) -> None:
    """Every credential shape sharedmem.redact.redactor knows, in every file a commit could hold."""
    allowed = read_allowlist(root)
    used: set[tuple[str, str]] = set()
    found = 0
    for name in files:
        text = text_of(root / name)
        if text is None:
            continue
        for finding in find(text):
            if (name, finding.kind) in allowed:
                used.add((name, finding.kind))
                continue
            found += 1
            report.problem(f"credential: {name}:{finding.line}: kind {finding.kind} (remove "
                           f"it, build test tokens from pieces, or add `{name}:{finding.kind}` "
                           f"to {ALLOWLIST} if it is invented)")
    for name, kind in sorted(allowed - used):
        print(f"note {ALLOWLIST}: `{name}:{kind}` matched nothing; it can be removed")
    if not found:
        report.ok(f"credentials: {len(files)} files scanned, {len(used)} allowlisted finding kinds")


def doc_files(root: Path) -> list[Path]:
    """README.md, CHANGELOG.md and every Markdown file under docs/."""
    out = [root / n for n in ("README.md", "CHANGELOG.md") if (root / n).is_file()]
    return out + sorted((root / "docs").rglob("*.md"))


def private_names(text: str) -> Iterator[tuple[int, str, str]]:
    """(line, kind, text) of home-folder paths, private host names and private addresses."""
    for number, line in enumerate(text.splitlines(), 1):
        for kind, pattern in _HOME_PATHS:
            for m in pattern.finditer(line):
                if m.group(1).strip().lower() not in PLACEHOLDERS:
                    yield number, kind, m.group(0)
        for m in _PRIVATE_HOST.finditer(line):
            if m.group(1).lower() not in PLACEHOLDERS:
                yield number, "private-host", m.group(0)
        for m in _PRIVATE_IP.finditer(line):
            yield number, "private-address", m.group(0)


def check_private(report: Report, root: Path) -> None:
    """No real home folders, private host names or RFC 1918 addresses in the documentation."""
    docs = doc_files(root)
    bad = 0
    for path in docs:
        rel = path.relative_to(root).as_posix()
        for number, kind, text in private_names(path.read_text(encoding="utf-8", errors="replace")):
            bad += 1
            report.problem(f"{kind}: {rel}:{number}: {text!r} (use a placeholder such as "
                           f"/home/me/, me@server or example.local)")
    if not bad:
        report.ok(f"private names: {len(docs)} documents clean")


def package_version(root: Path) -> str | None:
    """`__version__` of sharedmem/__init__.py in `root`, read without importing it."""
    path = root / "sharedmem" / "__init__.py"
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError):
        return None
    for node in tree.body:
        if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__version__"
                                                 for t in node.targets)
                and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
            return node.value.value
    return None


def project_version(root: Path) -> str | None:
    """[project].version of pyproject.toml in `root`."""
    try:
        data = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError):
        return None
    version = data.get("project", {}).get("version")
    return version if isinstance(version, str) else None


def check_version(report: Report, root: Path) -> str | None:
    """pyproject.toml and sharedmem.__version__ agree; returns the version."""
    project, package = project_version(root), package_version(root)
    if project is None:
        report.problem("version: pyproject.toml has no readable [project] version")
    elif package is None:
        report.problem("version: sharedmem/__init__.py has no literal __version__ = \"...\"")
    elif project != package:
        report.problem(f"version: pyproject.toml says {project}, sharedmem.__version__ says "
                       f"{package}: make them equal")
    else:
        report.ok(f"version: {project}")
    return project


def check_public(report: Report, root: Path, version: str | None) -> None:
    """A public release needs a clean tree and a changelog entry for its version."""
    done = run(["git", "status", "--porcelain"], root)
    if done.returncode != 0 or done.stdout.strip():
        changed = done.stdout.strip().splitlines()
        report.problem(f"git: the tree is not clean ({len(changed)} changed or untracked paths, "
                       f"e.g. {changed[:3]}): commit or remove them")
    else:
        report.ok("git: clean tree")
    changelog = root / "CHANGELOG.md"
    text = changelog.read_text(encoding="utf-8") if changelog.is_file() else ""
    if version and re.search(rf"^#+\s*\[?v?{re.escape(version)}\]?(?:\s|$)", text, re.MULTILINE):
        report.ok(f"changelog: entry for {version}")
    else:
        report.problem(f"changelog: CHANGELOG.md has no `## {version}` heading: describe the "
                       "release there")


def parser() -> argparse.ArgumentParser:
    """Options of the release check."""
    p = argparse.ArgumentParser(prog="release_check.py", description=__doc__.splitlines()[0])
    p.add_argument("--root", default=str(REPO), help="the repository to check (default: this one)")
    p.add_argument("--skip-tests", action="store_true", help="do not run the test suite")
    p.add_argument("--skip-tools", action="store_true",
                   help="run none of ruff, pytest and `uv lock --check` (content checks only)")
    p.add_argument("--skip-interop", action="store_true",
                   help="do not run scripts/interop_check.py (the real harnesses)")
    p.add_argument("--public-release", action="store_true",
                   help="also require a clean git tree and a CHANGELOG.md entry for the version, "
                        "and check the harnesses installed fresh from npm")
    return p


def main(argv: Sequence[str]) -> int:
    """Run every check; 1 if any failed."""
    args = parser().parse_args(argv)
    root = Path(args.root).resolve()
    report = Report()
    if not args.skip_tools:
        tools = ["uv", "run", "--locked", "--project", str(REPO)]  # this checkout's ruff and pytest
        tool_check(report, "lint", [*tools, "ruff", "check", "."], root)
        tool_check(report, "lock", ["uv", "lock", "--check", "--offline"], root)
        if not args.skip_tests:
            tool_check(report, "tests", [*tools, "pytest", "-q"], root)
        if not args.skip_interop:
            check_interop(report, root, install=args.public_release)
    files = repo_files(root)
    check_secrets(report, root, files)
    check_private(report, root)
    version = check_version(report, root)
    if args.public_release:
        check_public(report, root, version)
    if report.problems:
        print(f"\nrelease check: {len(report.problems)} problem(s)")
        return 1
    print("\nrelease check: all passed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
