"""The Python that harness registrations and the sync schedule run: one a version manager leaves.

Registering `sys.executable` ties every harness to whichever interpreter ran the installer: a
virtual environment, or a pyenv, asdf, uv or mise install that the next upgrade deletes, after
which each harness fails to start the server without a word. The program needs only Python
3.11+ and its standard library, so a system interpreter running the same version serves as well
and outlives them. Each candidate is run once to learn its version, never trusted by name.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sharedmem.core import ConfigError

MIN_VERSION = (3, 11)
SYSTEM_DIRS = ("/usr/bin", "/usr/local/bin", "/opt/homebrew/bin", "/opt/local/bin")
# Path parts of interpreters that a version manager or a package upgrade removes.
_VOLATILE = (("/.pyenv/", "a pyenv install"), ("/.asdf/", "an asdf install"),
             ("/uv/python/", "a uv-managed Python"), ("/mise/installs/", "a mise install"),
             ("/.rye/", "a rye install"), ("/nix/store/", "a Nix store path"),
             ("/Cellar/", "a Homebrew Cellar path"), ("/conda/", "a conda install"),
             ("/miniconda", "a conda install"), ("/anaconda", "a conda install"),
             ("/miniforge", "a conda install"), ("/mambaforge", "a conda install"),
             ("/.virtualenvs/", "a virtual environment"), ("/pypoetry/", "a Poetry environment"),
             ("/hatch/env/", "a Hatch environment"))
_PROBE = "import sys; print(*sys.version_info[:2])"


@dataclass(frozen=True)
class Choice:
    """The interpreter to register, and what to tell the user about it (empty: nothing)."""

    path: str
    note: str = ""
    volatile: bool = False  # kept although a version manager may remove it: worth a warning


def candidates(version: tuple[int, int]) -> list[str]:
    """System interpreters to try, the same minor version first; none on Windows."""
    if os.name == "nt":
        return []
    minor = f"python{version[0]}.{version[1]}"
    return [f"{d}/{minor}" for d in SYSTEM_DIRS] + [f"{d}/python3" for d in SYSTEM_DIRS]


def probe(path: str, timeout: float = 10.0) -> tuple[int, int] | None:
    """The (major, minor) version `path` runs, or None when it does not run as a Python."""
    if not os.path.isfile(path) or not os.access(path, os.X_OK):
        return None
    try:
        done = subprocess.run([path, "-I", "-S", "-c", _PROBE], capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    parts = done.stdout.split()
    if done.returncode != 0 or len(parts) != 2 or not all(p.isdigit() for p in parts):
        return None
    return int(parts[0]), int(parts[1])


def volatile(path: str, in_venv: bool) -> str | None:
    """Why `path` may disappear under a version manager (None when it looks like it stays)."""
    if in_venv:
        return "a virtual environment"
    for part, what in _VOLATILE:
        if part in path.replace("\\", "/"):
            return what
    return None


def choose(current: str | None = None, *, in_venv: bool | None = None,
           version: tuple[int, int] | None = None,
           tried: Sequence[str] | None = None) -> Choice:
    """The interpreter to register: `current` unless it may vanish and a system one runs.

    A system interpreter of the same major.minor version is preferred; then any system
    `python3` that runs 3.11 or later; else `current` is kept, with a note saying so.
    """
    current = current or sys.executable
    in_venv = sys.prefix != sys.base_prefix if in_venv is None else in_venv
    version = version or (sys.version_info[0], sys.version_info[1])
    why = volatile(current, in_venv)
    if why is None:
        return Choice(current)
    fallback: tuple[str, tuple[int, int]] | None = None
    for path in candidates(version) if tried is None else tried:
        found = probe(path)
        if found is not None and (found == version or found >= MIN_VERSION and not fallback):
            fallback = path, found
            if found == version:
                break
    if fallback is not None:
        path, found = fallback
        return Choice(path, f"the harnesses and the schedule will run {path} (Python "
                      f"{found[0]}.{found[1]}), not {current}, which is in {why} that an "
                      "upgrade may remove")
    return Choice(current, f"the harnesses and the schedule will run {current}, which is in "
                  f"{why}: no system Python {MIN_VERSION[0]}.{MIN_VERSION[1]}+ was found in "
                  f"{', '.join(SYSTEM_DIRS)}. If it is removed they cannot start the server: "
                  "re-run install_client.py then, or now with --python PATH", volatile=True)


def given(path: str) -> Choice:
    """The interpreter named by --python, checked by running it."""
    found = probe(path)
    if found is None:
        raise ConfigError(f"--python {path}: no Python runs there; give the full path of a "
                          "Python 3.11+ interpreter, e.g. /usr/bin/python3")
    if found < MIN_VERSION:
        raise ConfigError(f"--python {path} runs Python {found[0]}.{found[1]}; this program "
                          f"needs {MIN_VERSION[0]}.{MIN_VERSION[1]} or later")
    return Choice(str(Path(path).absolute()))
