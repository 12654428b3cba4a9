"""The installed copy of the code in a prefix (default `~/.local/share/codex-shared-memory/`).

The prefix holds the launcher, the package (byte-compiled) and the guidance text. Registrations
point at that copy, so upgrading is re-running the installer: changed files are replaced
atomically, files gone from the release are removed (an old layout's modules too, with their
compiled files and the folders they leave empty), and unchanged files are left alone (a re-run
writes nothing).
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


def _write_order(rel: str) -> tuple[bool, int, str]:
    """Modules before the `__init__.py` of their package, deepest packages first.

    A folder without `__init__.py` does not shadow a module of the same name (the flat layout's
    `cli.py` beside a new `cli/`), so a package appears only once its modules are in place.
    """
    return rel.endswith("/__init__.py"), -rel.count("/"), rel


def _stale(prefix: Path, wanted: Mapping[str, Path]) -> list[Path]:
    """Our files in the prefix that the release no longer has, then the folders left empty.

    Ours are .py files, and compiled files whose module is not in the release (even if its .py
    went long ago). The list is bottom-up: removing it in order empties each folder before its
    turn. A folder with anything else in it stays, as do the release's folders.
    """
    package = prefix / PACKAGE
    keep = {(prefix / rel).parent for rel in wanted}
    keep |= {folder / "__pycache__" for folder in keep}
    stale: list[Path] = []
    emptied: set[Path] = set()
    for top, dirs, names in os.walk(package, topdown=False):
        folder = Path(top)
        gone = []
        for name in sorted(names):
            if folder.name == "__pycache__":
                module = folder.parent / f"{name.split('.')[0]}.py"
                ours = name.endswith(".pyc")
            else:
                module = folder / name
                ours = name.endswith(".py")
            if ours and module.relative_to(prefix).as_posix() not in wanted:
                gone.append(folder / name)
        stale += gone
        if folder not in keep and len(gone) == len(names) and all(folder / d in emptied
                                                                  for d in dirs):
            stale.append(folder)
            emptied.add(folder)
    return stale


def install_code(prefix: Path, console: Console, *, dry_run: bool) -> list[str]:
    """Copy launcher, package and guidance into `prefix` and byte-compile; the changed paths.

    The order is for processes that start meanwhile: new files go in before stale ones go out,
    and the launcher is replaced last, so the new launcher only ever meets the whole new package.
    The list of changes follows that order.
    """
    if prefix.resolve() == SOURCE_ROOT:
        console.progress(f"{prefix} is this checkout itself: nothing to copy")
        return []
    wanted = release_files()
    changed: list[str] = []
    try:
        data = {rel: source.read_bytes() for rel, source in wanted.items()}
        updates = [rel for rel in sorted(wanted, key=_write_order)
                   if not ((prefix / rel).is_file() and (prefix / rel).read_bytes() == data[rel])]
        stale = _stale(prefix, wanted)
        if not prefix.exists() and not dry_run:
            prefix.mkdir(parents=True, mode=0o700)
        for rel in [r for r in updates if r != LAUNCHER_NAME]:
            changed.append(rel)
            if not dry_run:
                atomic_write(prefix / rel, data[rel], mode=0o644)
        for path in stale:
            folder = path.is_dir()
            changed.append(f"{path.relative_to(prefix).as_posix()}{'/' if folder else ''} "
                           "(removed)")
            if not dry_run:
                path.rmdir() if folder else path.unlink()
        if LAUNCHER_NAME in updates:
            changed.append(LAUNCHER_NAME)
            if not dry_run:
                atomic_write(prefix / LAUNCHER_NAME, data[LAUNCHER_NAME], mode=0o755)
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
