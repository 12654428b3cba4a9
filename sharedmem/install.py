"""What both installers share: arguments, the installed copy of the code, the server install.

The installed copy lives in a prefix (default `~/.local/share/codex-shared-memory/`): the
launcher, the package (byte-compiled) and the guidance text. Registrations point at that copy,
so upgrading is re-running the installer: changed files are replaced atomically, files gone
from the release are removed, and unchanged files are left alone (a re-run writes nothing).
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn, TextIO

from sharedmem import authkeys
from sharedmem.config import expand
from sharedmem.core import ConfigError, InstallError, SharedMemoryError, atomic_write, name_problem

SOURCE_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PREFIX = "~/.local/share/codex-shared-memory"
LAUNCHER_NAME = "shared_memory.py"
PACKAGE = "sharedmem"
GUIDANCE_FILE = "docs/AGENT-GUIDANCE.md"
STORE_NAME = "store.sqlite3"


class Console:
    """Progress and warnings on stderr, the summary on stdout; counts warnings for the exit code."""

    def __init__(self, out: TextIO | None = None, err: TextIO | None = None) -> None:
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.warnings = 0

    def progress(self, message: str) -> None:
        """One progress line on stderr."""
        self.err.write(f"... {message}\n")
        self.err.flush()

    def warn(self, message: str) -> None:
        """A problem that did not stop the install; it makes the exit status 1."""
        self.warnings += 1
        self.err.write(f"warning: {message}\n")
        self.err.flush()

    def say(self, text: str) -> None:
        """Summary text on stdout."""
        self.out.write(text.rstrip("\n") + "\n")
        self.out.flush()


class Parser(argparse.ArgumentParser):
    """argparse that raises ConfigError instead of exiting, so one message lists the problem."""

    def error(self, message: str) -> NoReturn:
        """Turn a syntax error into a ConfigError that points at --help."""
        raise ConfigError(f"{message} (see {self.prog} --help)")


def fail_if(problems: list[str], prog: str) -> None:
    """Raise one ConfigError listing every argument problem."""
    if problems:
        listing = "\n  - ".join(problems)
        raise ConfigError(f"{len(problems)} problem(s) with the arguments:\n  - {listing}\n"
                          f"(see {prog} --help)")


def user_path(value: str, env: Mapping[str, str]) -> Path:
    """An absolute path from a command-line value; `~` is env's HOME, not the process's."""
    return Path(os.path.abspath(expand(value, env)))


def prefix_path(value: str | None, env: Mapping[str, str]) -> Path:
    """The install prefix, default `~/.local/share/codex-shared-memory` under env's HOME."""
    if value is None and not env.get("HOME"):
        raise InstallError("HOME is not set: set it to the account's home folder, or pass "
                           "--prefix")
    return user_path(value or DEFAULT_PREFIX, env)


def run_main(body: Any, argv: Sequence[str], console: Console, prog: str) -> int:
    """Run an installer body; our errors become one message on stderr and exit status 2."""
    try:
        return int(body(list(argv)))
    except SharedMemoryError as exc:
        console.err.write(f"{prog}: error: {exc}\n")
        return exc.exit_code
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    except KeyboardInterrupt:
        console.err.write(f"{prog}: interrupted\n")
        return 130


# --- the installed copy of the code -------------------------------------------------------------

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


# --- the server -----------------------------------------------------------------------------------

def server_parser() -> Parser:
    """Arguments of install_server.py."""
    p = Parser(prog="install_server.py", description=(
        "Install Codex Shared Memory on the server: copy the code into the prefix, create the "
        "SQLite store, and optionally pin a client's SSH key to a machine name in "
        "~/.ssh/authorized_keys. Re-running upgrades in place."),
        epilog="Example: install_server.py --authorize laptop --key ~/laptop_id_ed25519.pub")
    p.add_argument("--prefix", help=f"where to install (default {DEFAULT_PREFIX})")
    p.add_argument("--store", help=f"the SQLite store (default PREFIX/{STORE_NAME})")
    p.add_argument("--authorize", metavar="NAME",
                   help="pin --key to this machine name in ~/.ssh/authorized_keys")
    p.add_argument("--key", metavar="PUBKEY",
                   help="the client's public key: its text, or the path of its .pub file")
    p.add_argument("--repin", action="store_true",
                   help="move a key already pinned to another machine to NAME")
    p.add_argument("--dry-run", action="store_true", help="show what would change; write nothing")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    return p


def _create_store(store: Path, console: Console, dry_run: bool) -> str:
    from sharedmem.backup import migration_hook
    from sharedmem.store import Store
    existed = store.exists()
    if dry_run:
        return "exists" if existed else "would be created"
    console.progress(f"opening the store {store}")
    with Store.open(store, before_migrate=migration_hook):
        pass
    os.chmod(store, 0o600)
    (store.parent / "backups").mkdir(mode=0o700, exist_ok=True)
    return "exists" if existed else "created"


def client_hint(prefix: Path, env: Mapping[str, str], machine: str | None,
                pinned: bool) -> str:
    """The install_client.py command to run on the client."""
    words = ["python3", "install_client.py", "--machine", machine or "NAME",
             "--ssh-host", "USER@HOST"]
    if prefix != user_path(DEFAULT_PREFIX, env):
        words += ["--remote-prefix", str(prefix)]
    python3 = shutil.which("python3")
    if not pinned and (python3 is None or Path(python3).resolve() != Path(sys.executable).resolve()):
        words += ["--remote-python", sys.executable]
    return " ".join(words)


def server_body(argv: list[str], env: Mapping[str, str], console: Console) -> int:
    """install_server.py: code, store, and the optional pinned key."""
    args = server_parser().parse_args(argv)
    problems: list[str] = []
    if (args.authorize is None) != (args.key is None):
        problems.append("--authorize NAME and --key PUBKEY go together: give both or neither")
    if args.authorize is not None and (problem := name_problem(args.authorize, "--authorize")):
        problems.append(problem)
    if args.repin and args.authorize is None:
        problems.append("--repin needs --authorize NAME --key PUBKEY")
    key = None
    if args.key is not None:
        try:
            key = authkeys.parse_key(args.key, env)
        except InstallError as exc:
            problems.append(str(exc))
    fail_if(problems, "install_server.py")
    prefix = prefix_path(args.prefix, env)
    store = user_path(args.store, env) if args.store else prefix / STORE_NAME
    if key is not None:  # refuse a conflicting key before anything is written
        keys_file = Path(env["HOME"]) / ".ssh" / "authorized_keys"
        command = authkeys.forced_command(sys.executable, prefix / LAUNCHER_NAME, store,
                                          args.authorize)
        authkeys.authorize(keys_file, key, args.authorize, command, repin=args.repin,
                           dry_run=True)
    changed = install_code(prefix, console, dry_run=args.dry_run)
    summary: dict[str, Any] = {"dry_run": args.dry_run, "prefix": str(prefix),
                               "launcher": str(prefix / LAUNCHER_NAME), "files": changed,
                               "store": str(store),
                               "store_status": _create_store(store, console, args.dry_run)}
    if key is not None:
        path = keys_file
        console.progress(f"pinning key {key.fingerprint} to machine {args.authorize} in {path}")
        outcome = authkeys.authorize(path, key, args.authorize, command, repin=args.repin,
                                     dry_run=args.dry_run)
        if outcome.message:
            console.progress(outcome.message)
        for warning in outcome.warnings:
            console.warn(warning)
        summary["authorized_keys"] = {
            "path": str(path), "action": outcome.action, "line": outcome.line,
            "machine": args.authorize, "fingerprint": key.fingerprint,
            "backup": str(outcome.backup) if outcome.backup else None}
    summary["client_command"] = client_hint(prefix, env, args.authorize, key is not None)
    if args.json:
        console.say(json.dumps(summary, indent=2))
        return 1 if console.warnings else 0
    head = "dry run: nothing was written" if args.dry_run else "server installed"
    lines = [f"{head}", f"  code:  {prefix} ({len(changed)} file(s) changed)",
             f"  store: {store} ({summary['store_status']})"]
    if "authorized_keys" in summary:
        auth = summary["authorized_keys"]
        lines.append(f"  authorized_keys: {auth['action']} ({auth['path']}), key "
                     f"{auth['fingerprint']} pinned to machine {auth['machine']}")
        if auth["backup"]:
            lines.append(f"  previous authorized_keys kept as {auth['backup']}")
    lines += ["", "On the client, from a checkout of this release, run (replace USER@HOST with "
              "how it reaches this server):", f"  {summary['client_command']}"]
    console.say("\n".join(lines))
    return 1 if console.warnings else 0


def server_main(argv: Sequence[str], env: Mapping[str, str] | None = None, *,
                out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Entry point of install_server.py; returns the exit status."""
    console = Console(out, err)
    environ = dict(os.environ if env is None else env)
    return run_main(lambda a: server_body(a, environ, console), argv, console,
                    "install_server.py")


def client_main(argv: Sequence[str], env: Mapping[str, str] | None = None, *,
                run: Any = None, platform: str | None = None, out: TextIO | None = None,
                err: TextIO | None = None) -> int:
    """Entry point of install_client.py; `run` and `platform` stand in for the OS scheduler."""
    from sharedmem import client_install
    console = Console(out, err)
    environ = dict(os.environ if env is None else env)
    return run_main(lambda a: client_install.body(a, environ, console, run, platform), argv,
                    console, "install_client.py")
