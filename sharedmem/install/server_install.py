"""install_server.py: the code into the prefix, the store, and an optional pinned key."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from sharedmem.core import InstallError, SharedMemoryError
from sharedmem.install import authorized_keys as authkeys
from sharedmem.install import interpreter
from sharedmem.install.console import Console, Parser, fail_if, run_main
from sharedmem.install.prefix import (
    DEFAULT_PREFIX,
    LAUNCHER_NAME,
    STORE_NAME,
    install_code,
    prefix_path,
    user_path,
)
from sharedmem.rules import name_problem


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
    p.add_argument("--python", metavar="PATH",
                   help="the Python 3.11+ a pinned key's command runs (default: the one a "
                        "working pinned line already names, else a system one of this "
                        "version, else this one)")
    p.add_argument("--dry-run", action="store_true", help="show what would change; write nothing")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    return p


def _create_store(store: Path, console: Console, dry_run: bool) -> str:
    from sharedmem.server.backup import migration_hook
    from sharedmem.server.store import Store
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
                pinned: bool, python: str) -> str:
    """The install_client.py command to run on the client."""
    words = ["python3", "install_client.py", "--machine", machine or "NAME",
             "--ssh-host", "USER@HOST"]
    if prefix != user_path(DEFAULT_PREFIX, env):
        words += ["--remote-prefix", str(prefix)]
    python3 = shutil.which("python3")
    if not pinned and (python3 is None or Path(python3).resolve() != Path(python).resolve()):
        words += ["--remote-python", python]
    return " ".join(words)


def _python(args: Any, keys_file: Path | None, key: authkeys.PublicKey | None,
            launcher: Path, store: Path, console: Console) -> str:
    """The interpreter a pinned key's command runs, chosen as the client installer chooses.

    --python PATH wins. Else a pinned line that already runs this very command keeps its
    interpreter while that still runs Python 3.11+ (an upgrade leaves a working line alone).
    Else interpreter.py's stable choice: this one, unless a version manager may remove it and
    a system Python of the same version runs.
    """
    if args.python:
        return interpreter.given(args.python).path
    if key is not None and keys_file is not None:
        pinned = authkeys.pinned_python(keys_file, key, args.authorize, launcher, store)
        found = interpreter.probe(pinned) if pinned else None
        if pinned and found is not None and found >= interpreter.MIN_VERSION:
            return pinned
    choice = interpreter.choose()
    if key is not None and choice.note:
        note = choice.note.replace("the harnesses and the schedule", "the pinned command")
        if choice.volatile:
            console.warn(note, counts=False)
        else:
            console.progress(note)
    return choice.path


def server_body(argv: list[str], env: Mapping[str, str], console: Console) -> int:
    """install_server.py: code, store, and the optional pinned key."""
    args = server_parser().parse_args(argv)
    key = _checked(args, env)
    prefix = prefix_path(args.prefix, env)
    store = user_path(args.store, env) if args.store else prefix / STORE_NAME
    keys_file = Path(env["HOME"]) / ".ssh" / "authorized_keys" if key is not None else None
    python = _python(args, keys_file, key, prefix / LAUNCHER_NAME, store, console)
    if key is not None and keys_file is not None:  # refuse a conflicting key before writing
        command = authkeys.forced_command(python, prefix / LAUNCHER_NAME, store,
                                          args.authorize)
        authkeys.authorize(keys_file, key, args.authorize, command, repin=args.repin,
                           dry_run=True)
    changed = install_code(prefix, console, dry_run=args.dry_run)
    summary: dict[str, Any] = {"dry_run": args.dry_run, "prefix": str(prefix),
                               "launcher": str(prefix / LAUNCHER_NAME), "files": changed,
                               "store": str(store),
                               "store_status": _create_store(store, console, args.dry_run)}
    summary["python"] = python
    if key is not None and keys_file is not None:
        summary["authorized_keys"] = _pin(keys_file, key, args, command, console)
    summary["client_command"] = client_hint(prefix, env, args.authorize, key is not None, python)
    if args.json:
        console.say(json.dumps(summary, indent=2))
    else:
        _report(summary, console)
    return 1 if console.warnings else 0


def _checked(args: Any, env: Mapping[str, str]) -> authkeys.PublicKey | None:
    """Every problem with the arguments at once; the key to pin, if one was given."""
    problems: list[str] = []
    if (args.authorize is None) != (args.key is None):
        problems.append("--authorize NAME and --key PUBKEY go together: give both or neither")
    if args.authorize is not None and (problem := name_problem(args.authorize, "--authorize")):
        problems.append(problem)
    if args.repin and args.authorize is None:
        problems.append("--repin needs --authorize NAME --key PUBKEY")
    if args.python:
        try:
            interpreter.given(args.python)
        except SharedMemoryError as exc:
            problems.append(str(exc))
    key = None
    if args.key is not None:
        try:
            key = authkeys.parse_key(args.key, env)
        except InstallError as exc:
            problems.append(str(exc))
    fail_if(problems, "install_server.py")
    return key


def _pin(path: Path, key: authkeys.PublicKey, args: Any, command: str,
         console: Console) -> dict[str, Any]:
    """Pin the key to its machine in authorized_keys; what the summary says of it."""
    console.progress(f"pinning key {key.fingerprint} to machine {args.authorize} in {path}")
    outcome = authkeys.authorize(path, key, args.authorize, command, repin=args.repin,
                                 dry_run=args.dry_run)
    if outcome.message:
        console.progress(outcome.message)
    for warning in outcome.warnings:
        console.warn(warning)
    return {"path": str(path), "action": outcome.action, "line": outcome.line,
            "machine": args.authorize, "fingerprint": key.fingerprint,
            "backup": str(outcome.backup) if outcome.backup else None}


def _report(summary: dict[str, Any], console: Console) -> None:
    """The summary as lines a person reads, with the command to run on the client."""
    head = "dry run: nothing was written" if summary["dry_run"] else "server installed"
    lines = [f"{head}", f"  code:  {summary['prefix']} ({len(summary['files'])} file(s) changed)",
             f"  store: {summary['store']} ({summary['store_status']})"]
    if "authorized_keys" in summary:
        auth = summary["authorized_keys"]
        lines.append(f"  authorized_keys: {auth['action']} ({auth['path']}), key "
                     f"{auth['fingerprint']} pinned to machine {auth['machine']}")
        if auth["backup"]:
            lines.append(f"  previous authorized_keys kept as {auth['backup']}")
    lines += ["", "On the client, from a checkout of this release, run (replace USER@HOST with "
              "how it reaches this server):", f"  {summary['client_command']}"]
    console.say("\n".join(lines))


def server_main(argv: Sequence[str], env: Mapping[str, str] | None = None, *,
                out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Entry point of install_server.py; returns the exit status."""
    console = Console(out, err)
    environ = dict(os.environ if env is None else env)
    return run_main(lambda a: server_body(a, environ, console), argv, console,
                    "install_server.py")
