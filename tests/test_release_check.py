"""scripts/release_check.py: each check fails on a planted problem, and the real repo passes.

The script runs as a real subprocess against a small git repository made under tmp_path, so every
check sees real files and a real `git`; HOME points into tmp_path.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "release_check.py"


def _env(tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"), GIT_CONFIG_NOSYSTEM="1",
               GIT_AUTHOR_NAME="Test", GIT_AUTHOR_EMAIL="test@example.com",
               GIT_COMMITTER_NAME="Test", GIT_COMMITTER_EMAIL="test@example.com",
               UV_OFFLINE="1")
    return env


def _git(root: Path, env: dict[str, str], *args: str) -> None:
    subprocess.run(["git", *args], cwd=root, env=env, check=True, capture_output=True)


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A clean, committed repository that passes every content check."""
    env = _env(tmp_path)
    root = tmp_path / "repo"
    (root / "sharedmem").mkdir(parents=True)
    (root / "docs").mkdir()
    (root / "pyproject.toml").write_text('[project]\nname = "demo"\nversion = "1.2.3"\n')
    (root / "sharedmem" / "__init__.py").write_text('"""Demo."""\n\n__version__ = "1.2.3"\n')
    (root / "README.md").write_text(
        "# Demo\n\nInstall into `/home/me/.local/share/x` or `/Users/alice/x` or "
        "`C:\\Users\\user\\x`; reach `me@server` or `example.local`, or `~/.local/share`.\n")
    (root / "docs" / "GUIDE.md").write_text("Addresses like 192.0.2.10 are documentation ones.\n")
    (root / "CHANGELOG.md").write_text("# Changelog\n\n## 1.2.3 - 2025-01-01\n\n- First.\n")
    _git(root, env, "init", "-q")
    _git(root, env, "add", "-A")
    _git(root, env, "commit", "-q", "-m", "start")
    return root, env


def check(root: Path, env: dict[str, str], *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), "--root", str(root), "--skip-tools",
                           *extra], env=env, capture_output=True, text=True, timeout=120)


def test_a_clean_tree_passes_even_as_a_public_release(tree: tuple[Path, dict[str, str]]) -> None:
    root, env = tree
    done = check(root, env, "--public-release")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "all passed" in done.stdout


def test_a_planted_token_fails_without_printing_it(tree: tuple[Path, dict[str, str]]) -> None:
    root, env = tree
    planted = "gh" + "p_" + "Zq7" * 12  # built from pieces: this file holds no token
    (root / "notes.md").write_text(f"one\ntwo\nuse {planted} here\n")
    done = check(root, env)
    assert done.returncode == 1
    assert "credential: notes.md:3: kind github-token" in done.stdout
    assert planted not in done.stdout + done.stderr
    assert "Zq7Zq7" not in done.stdout + done.stderr


def test_the_allowlist_accepts_a_named_file_and_kind_only(tree: tuple[Path, dict[str, str]]) -> None:
    root, env = tree
    planted = "gh" + "p_" + "Zq7" * 12
    (root / "notes.md").write_text(f"use {planted} here\n")
    (root / "other.md").write_text(f"and {planted} there\n")
    (root / ".release-allowlist").write_text("# invented\nnotes.md:github-token\n")
    done = check(root, env)
    assert done.returncode == 1
    assert "other.md:1" in done.stdout and "notes.md:1" not in done.stdout
    (root / "other.md").unlink()
    assert check(root, env).returncode == 0


def test_a_tracked_file_is_scanned_even_when_ignored_later(tree: tuple[Path, dict[str, str]]) -> None:
    root, env = tree
    (root / "kept.txt").write_text("AKIA" + "Q" * 15 + "7\n")
    _git(root, env, "add", "kept.txt")
    (root / ".gitignore").write_text("kept.txt\n")
    done = check(root, env)
    assert "credential: kept.txt:1: kind aws-access-key" in done.stdout


@pytest.mark.parametrize(("text", "kind"), [
    ("see /home/carol/project\n", "home-path"),
    ("see /Users/dave/project\n", "home-path"),
    ("see C:\\Users\\erin\\project\n", "home-path"),
    ("ssh build.corp\n", "private-host"),
    ("ssh nas.lan or db.internal\n", "private-host"),
    ("ssh myserver.local\n", "private-host"),
    ("at 10.1.2.3\n", "private-address"),
    ("at 172.20.0.5\n", "private-address"),
    ("at 192.168.1.20\n", "private-address"),
])
def test_private_names_in_docs_fail(tree: tuple[Path, dict[str, str]], text: str, kind: str) -> None:
    root, env = tree
    (root / "docs" / "GUIDE.md").write_text("fine\n" + text)
    done = check(root, env)
    assert done.returncode == 1, done.stdout
    assert f"{kind}: docs/GUIDE.md:2:" in done.stdout


def test_placeholders_and_public_addresses_pass(tree: tuple[Path, dict[str, str]]) -> None:
    root, env = tree
    (root / "docs" / "GUIDE.md").write_text(
        "/home/you/x /home/bob/y /Users/me/z bob.local 172.32.0.1 8.8.8.8 10.0.0 "
        "version 110.1.2.3\n")
    done = check(root, env)
    assert done.returncode == 0, done.stdout


def test_a_version_mismatch_fails(tree: tuple[Path, dict[str, str]]) -> None:
    root, env = tree
    (root / "sharedmem" / "__init__.py").write_text('__version__ = "1.2.4"\n')
    done = check(root, env)
    assert done.returncode == 1
    assert "pyproject.toml says 1.2.3, sharedmem.__version__ says 1.2.4" in done.stdout


def test_public_release_needs_a_changelog_entry(tree: tuple[Path, dict[str, str]]) -> None:
    root, env = tree
    (root / "CHANGELOG.md").write_text("# Changelog\n\n## 1.2.2\n\n- Older. Mentions 1.2.3.\n")
    _git(root, env, "commit", "-q", "-am", "older changelog")
    assert check(root, env).returncode == 0  # only a public release needs the entry
    done = check(root, env, "--public-release")
    assert done.returncode == 1
    assert "CHANGELOG.md has no `## 1.2.3` heading" in done.stdout
    assert "ok   git: clean tree" in done.stdout


def test_public_release_needs_a_clean_tree(tree: tuple[Path, dict[str, str]]) -> None:
    root, env = tree
    (root / "README.md").write_text("# Demo, edited\n")
    done = check(root, env, "--public-release")
    assert done.returncode == 1
    assert "git: the tree is not clean" in done.stdout


def test_every_problem_is_reported_in_one_run(tree: tuple[Path, dict[str, str]]) -> None:
    root, env = tree
    (root / "sharedmem" / "__init__.py").write_text('__version__ = "9"\n')
    (root / "docs" / "GUIDE.md").write_text("/home/carol/\n")
    done = check(root, env)
    assert done.returncode == 1
    assert "2 problem(s)" in done.stdout


def test_lint_failure_is_reported(tree: tuple[Path, dict[str, str]]) -> None:
    root, env = tree
    (root / "bad.py").write_text("import os\n")
    done = subprocess.run([sys.executable, str(SCRIPT), "--root", str(root), "--skip-tests"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1
    assert "FAIL lint:" in done.stdout and "F401" in done.stdout


def test_the_real_repository_passes() -> None:
    """The real checkout, tools included (tests skipped); an uncommitted tree is fine here."""
    done = subprocess.run([sys.executable, str(SCRIPT), "--skip-tests"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ok   interop: " in done.stdout  # the real harness check ran (or skipped each one)


def test_interop_check_help() -> None:
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "interop_check.py"), "--help"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    for option in ("--install", "--npm-prefix", "--json", "--keep"):
        assert option in done.stdout, option
    assert "npm install --prefix" in done.stdout


STAND_IN = '''import json
import sys
from pathlib import Path

status = Path(sys.argv[0] + ".status").read_text().strip()
print(json.dumps({"ok": status == "ok", "rows": [
    {"harness": "codex", "check": "mcp list", "status": status, "detail": " ".join(sys.argv[1:])},
    {"harness": "opencode", "check": "found", "status": "skip", "detail": "not on PATH"}]}))
'''


def test_release_check_runs_the_interop_check(tree: tuple[Path, dict[str, str]]) -> None:
    """A stand-in interop_check.py in the checked tree: its rows become the check's result."""
    root, env = tree
    script = root / "scripts" / "interop_check.py"
    script.parent.mkdir()
    script.write_text(STAND_IN)
    (root / "scripts" / "interop_check.py.status").write_text("ok")
    done = check_with_tools(root, env)
    assert "ok   interop: 1 checks passed (opencode not found: skipped" in done.stdout
    (root / "scripts" / "interop_check.py.status").write_text("fail")
    done = check_with_tools(root, env, "--public-release")
    assert done.returncode == 1
    assert "FAIL interop: codex mcp list: --json --install" in done.stdout
    done = check_with_tools(root, env, "--skip-interop")
    assert "ok   interop" not in done.stdout and "FAIL interop" not in done.stdout


def check_with_tools(root: Path, env: dict[str, str], *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--root", str(root), "--skip-tests",
                           *extra], env=env, capture_output=True, text=True, timeout=300)
