"""The installed copy of the code in a prefix (default `~/.local/share/codex-shared-memory/`).

The prefix holds the launcher, the package (byte-compiled) and the guidance text. Registrations
point at that copy, so upgrading is re-running the installer: changed files are replaced
atomically, files gone from the release are removed (an old layout's modules too), and unchanged
files are left alone (a re-run writes nothing).
"""

from __future__ import annotations

import compileall
import os
from collections.abc import Mapping
from pathlib import Path

from sharedmem.client.config import expand
from sharedmem.core import InstallError
from sharedmem.files import atomic_write
from sharedmem.install.console import Console
from sharedmem.program import ROOT as SOURCE_ROOT

DEFAULT_PREFIX = "~/.local/share/codex-shared-memory"
LAUNCHER_NAME = "shared_memory.py"
PACKAGE = "sharedmem"
GUIDANCE_FILE = "docs/AGENT-GUIDANCE.md"
STORE_NAME = "store.sqlite3"


def user_path(value: str, env: Mapping[str, str]) -> Path:
    """An absolute path from a command-line value; `~` is env's HOME, not the process's."""
    return Path(os.path.abspath(expand(value, env)))


def prefix_path(value: str | None, env: Mapping[str, str]) -> Path:
    """The install prefix, default `~/.local/share/codex-shared-memory` under env's HOME."""
    if value is None and not env.get("HOME"):
        raise InstallError("HOME is not set: set it to the account's home folder, or pass "
                           "--prefix")
    return user_path(value or DEFAULT_PREFIX, env)


def release_files(root: Path = SOURCE_ROOT) -> dict[str, Path]:
    """Every file the prefix needs, by its path relative to the prefix."""
    files = {LAUNCHER_NAME: root / LAUNCHER_NAME, GUIDANCE_FILE: root / GUIDANCE_FILE}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        if "__pycache__" not in path.parts:
            files[path.relative_to(root).as_posix()] = path
    return files


def _stale(prefix: Path, wanted: Mapping[str, Path]) -> list[Path]:
    """Our .py files in the prefix that the release no longer has."""
    package = prefix / PACKAGE
    if not package.is_dir():
        return []
    return [p for p in sorted(package.rglob("*.py")) if "__pycache__" not in p.parts
            and p.relative_to(prefix).as_posix() not in wanted]


def install_code(prefix: Path, console: Console, *, dry_run: bool) -> list[str]:
    """Copy launcher, package and guidance into `prefix` and byte-compile; the changed paths."""
    if prefix.resolve() == SOURCE_ROOT:
        console.progress(f"{prefix} is this checkout itself: nothing to copy")
        return []
    wanted = release_files()
    changed: list[str] = []
    try:
        if not prefix.exists() and not dry_run:
            prefix.mkdir(parents=True, mode=0o700)
        for rel, source in wanted.items():
            data = source.read_bytes()
            target = prefix / rel
            if target.is_file() and target.read_bytes() == data:
                continue
            changed.append(rel)
            if not dry_run:
                atomic_write(target, data, mode=0o755 if rel == LAUNCHER_NAME else 0o644)
        for path in _stale(prefix, wanted):
            changed.append(f"{path.relative_to(prefix).as_posix()} (removed)")
            if not dry_run:
                path.unlink()
                for compiled in (path.parent / "__pycache__").glob(f"{path.stem}.*.pyc"):
                    compiled.unlink()
    except OSError as exc:
        raise InstallError(f"cannot install the code into {prefix}: {exc}; check that the "
                           "folder is writable, or pass another --prefix") from None
    verb = "would update" if dry_run else "updated"
    console.progress(f"{verb} {len(changed)} file(s) in {prefix}" if changed
                     else f"the code in {prefix} is up to date")
    if not dry_run and not compileall.compile_dir(str(prefix / PACKAGE), quiet=2,
                                                  force=bool(changed)):
        raise InstallError(f"byte-compiling {prefix / PACKAGE} failed: re-run the installer "
                           "from an intact copy of the release")
    return changed
