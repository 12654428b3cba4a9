"""install_client.py: configuration, connection check, first sync, harnesses, the schedule.

The steps run in an order that fails early: every argument is checked first (one error lists
them all), then the connection, and only then is anything written. `--uninstall` undoes the
registrations, guidance blocks and schedule; `--purge` also removes the prefix's client files.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from sharedmem.client import config as config_mod
from sharedmem.client.config import ClientConfig, SourceConfig, Transport
from sharedmem.core import InstallError, SharedMemoryError
from sharedmem.files import atomic_write
from sharedmem.install import (
    guidance,
    harnesses,
    interpreter,
    memory_coverage,
    scheduler,
    ssh_reuse,
)
from sharedmem.install.console import Console, Parser, fail_if, run_main
from sharedmem.install.prefix import (
    DEFAULT_PREFIX,
    GUIDANCE_FILE,
    LAUNCHER_NAME,
    PACKAGE,
    SOURCE_ROOT,
    STORE_NAME,
    install_code,
    prefix_path,
    user_path,
)
from sharedmem.program import PYTHON_FLAGS
from sharedmem.rules import (
    KIND_MARKDOWN,
    SOURCE_CLAUDE,
    SOURCE_CODEX,
    check_markdown_source_name,
    name_problem,
)
from sharedmem.sources import kinds as sources

DRYRUN_ENV = "SHAREDMEM_SCHEDULER_DRYRUN"
CURSOR_SHOWN = "cursor-rules.md"  # in the state folder: the block Cursor was last shown
SOURCES = (SOURCE_CODEX, SOURCE_CLAUDE)


def parser() -> Parser:
    """Arguments of install_client.py."""
    p = Parser(prog="install_client.py", description=(
        "Install Codex Shared Memory on a client: write PREFIX/client.json, check the "
        "connection to the server, run the first sync, register the shared_memories MCP server "
        "with each coding-agent harness (plus agent guidance), and sync every two minutes. "
        "Re-running with the same arguments changes nothing."),
        epilog="Examples:\n  install_client.py --machine laptop --ssh-host me@server\n"
               "  install_client.py --machine laptop --local\n"
               "  install_client.py --uninstall [--purge]",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--machine", help="this machine's name (lower-case letters, digits, . _ -)")
    where = p.add_argument_group("where the store is (one of)")
    where.add_argument("--ssh-host", metavar="HOST", help="reach the server with ssh HOST")
    where.add_argument("--local", action="store_true", help="the store is on this machine")
    p.add_argument("--store", help=f"with --local: the store (default PREFIX/{STORE_NAME})")
    _ssh_arguments(p.add_argument_group("ssh (OpenSSH reads its own files from the account's home)"))
    p.add_argument("--prefix", help=f"where to install here (default {DEFAULT_PREFIX})")
    p.add_argument("--source", action="append", default=[], metavar="codex|claude-code",
                   help="publish this source (repeatable; default: each whose folder exists)")
    p.add_argument("--markdown", action="append", default=[], metavar="NAME=PATH",
                   help="publish a folder of .md files as NAME (repeatable)")
    p.add_argument("--harness", action="append", default=[],
                   metavar="codex|claude-code|opencode|cursor",
                   help="register with this harness (repeatable; default: each one detected)")
    p.add_argument("--python", metavar="PATH",
                   help="the Python 3.11+ the harnesses and the schedule run (default: a "
                        "system one of this version, else this one)")
    p.add_argument("--cursor-rules", action="store_true",
                   help="print the Cursor rules block even when it has not changed")
    p.add_argument("--schedule", default="auto", metavar="auto|none",
                   help="auto: sync every two minutes (systemd, cron, launchd or schtasks); "
                        f"none: do not. Testing aid: {DRYRUN_ENV}=1 only shows the schedule")
    p.add_argument("--dry-run", action="store_true",
                   help="show what would change (files, diffs, schedule); write nothing")
    p.add_argument("--uninstall", action="store_true",
                   help="remove registrations, guidance and the schedule (the cache stays)")
    p.add_argument("--purge", action="store_true",
                   help="with --uninstall: also remove client.json, cache, state and the code")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    return p


def _ssh_arguments(ssh: Any) -> None:
    """The options of an ssh transport."""
    ssh.add_argument("--ssh-port", metavar="N", help="the server's SSH port")
    ssh.add_argument("--ssh-identity", metavar="FILE", help="the private key to use")
    ssh.add_argument("--ssh-option", metavar="OPT", action="append", default=[],
                     help="an ssh -o option, e.g. ConnectTimeout=10 (repeatable)")
    ssh.add_argument("--no-ssh-reuse", action="store_true",
                     help="open a new ssh connection for every sync, instead of keeping one "
                          f"open for {ssh_reuse.PERSIST_SECONDS // 60} minutes after each "
                          "(ControlMaster, ControlPersist)")
    ssh.add_argument("--remote-python", metavar="CMD",
                     help="python on the server (default python3; a pinned key ignores it)")
    ssh.add_argument("--remote-prefix", metavar="DIR",
                     help=f"the server's install prefix (default {DEFAULT_PREFIX})")


def _validate(args: Any, env: Mapping[str, str]) -> list[str]:
    """Every problem with the arguments, so the user fixes them in one go."""
    problems: list[str] = []
    bad = [h for h in args.harness if h not in harnesses.HARNESSES]
    if bad:
        problems.append(f"--harness {', '.join(bad)}: use {', '.join(harnesses.HARNESSES)}")
    if args.schedule not in ("auto", "none"):
        problems.append(f"--schedule {args.schedule!r}: use auto or none")
    if args.purge and not args.uninstall:
        problems.append("--purge only goes with --uninstall")
    if args.uninstall:
        return problems
    if args.python:
        try:
            interpreter.given(args.python)
        except SharedMemoryError as exc:
            problems.append(str(exc))
    if args.machine is None:
        problems.append("--machine NAME is required: name this machine, e.g. --machine laptop")
    elif problem := name_problem(args.machine, "--machine"):
        problems.append(problem)
    if bool(args.ssh_host) == bool(args.local):
        problems.append("give exactly one of --ssh-host HOST (store on a server) or --local "
                        "(store on this machine)")
    if args.ssh_host and (args.ssh_host.startswith("-") or any(c.isspace() for c in args.ssh_host)):
        problems.append(f"--ssh-host {args.ssh_host!r} is not a host name such as me@server")
    if args.store and not args.local:
        problems.append("--store only goes with --local (over SSH the server's store is used)")
    if args.local:
        given = [f"--{n.replace('_', '-')}" for n in ("ssh_port", "ssh_identity",
                 "remote_python", "remote_prefix") if getattr(args, n)]
        given += ["--ssh-option"] if args.ssh_option else []
        given += ["--no-ssh-reuse"] if args.no_ssh_reuse else []
        if given:
            problems.append(f"{', '.join(given)}: only for --ssh-host, not with --local")
    if args.ssh_port is not None and (not args.ssh_port.isdigit()
                                      or not 0 < int(args.ssh_port) < 65536):
        problems.append(f"--ssh-port {args.ssh_port!r} must be a port number 1-65535")
    if args.ssh_identity and not user_path(args.ssh_identity, env).is_file():
        problems.append(f"--ssh-identity {args.ssh_identity}: no such file (give the private "
                        "key, e.g. ~/.ssh/id_ed25519)")
    problems += [f"--ssh-option {o!r} must look like Name=value" for o in args.ssh_option
                 if "=" not in o or o.startswith("-")]
    return problems + _source_problems(args, env)


def _source_problems(args: Any, env: Mapping[str, str]) -> list[str]:
    """What is wrong with the sources named."""
    problems = [f"--source {s!r}: use codex or claude-code (name other folders with "
                "--markdown NAME=PATH)" for s in args.source if s not in SOURCES]
    for spec in args.markdown:
        name, sep, path = spec.partition("=")
        try:
            check_markdown_source_name(name)
        except SharedMemoryError as exc:
            problems.append(f"--markdown {spec!r}: {exc}")
        if not sep or not path:
            problems.append(f"--markdown {spec!r} must be NAME=PATH")
        elif not user_path(path, env).is_dir():
            problems.append(f"--markdown {spec!r}: {user_path(path, env)} is not a folder")
    return problems


def _sources(args: Any, env: Mapping[str, str], console: Console) -> tuple[SourceConfig, ...]:
    """The sources named on the command line, else each default one whose harness has memory.

    A harness has memory when one of the folders it writes to today exists (Codex's
    `memories_v2` for a version 2 user, Claude Code's relocated or subagent memory too).
    """
    out: list[SourceConfig] = []
    named = bool(args.source or args.markdown)
    for kind in SOURCES:
        root = sources.default_root(kind, env)
        folders = [p.root for p in sources.parts(sources.SourceSpec(kind, kind, root), env)]
        exists = any(f.is_dir() for f in folders)
        if kind in args.source or (not named and exists):
            if not exists:
                console.warn(f"{kind}: none of its memory folders exists yet "
                             f"({', '.join(map(str, folders))}): the source is enabled and "
                             "publishes nothing until one does")
            out.append(SourceConfig(kind, kind, root))
    for spec in dict.fromkeys(args.markdown):
        name, _, path = spec.partition("=")
        out.append(SourceConfig(name, KIND_MARKDOWN, user_path(path, env)))
    return tuple(out)


def reuse_plan(args: Any, env: Mapping[str, str], prefix: Path) -> ssh_reuse.Plan | None:
    """Connection reuse for an ssh transport: its socket's folder, or why it stays off."""
    if args.local:
        return None
    return ssh_reuse.plan(prefix / "state", env, args.ssh_option, not args.no_ssh_reuse)


def build_config(args: Any, env: Mapping[str, str], prefix: Path,
                 console: Console) -> ClientConfig:
    """The configuration to write; an existing client.json's limits, compress and timeouts kept.

    The installer has no options for them.

    An ssh transport's options are the user's `--ssh-option` values, then connection reuse's.
    """
    path = prefix / "client.json"
    if args.local:
        store = user_path(args.store, env) if args.store else prefix / STORE_NAME
        transport = Transport("local", store=store)
    else:
        reuse = reuse_plan(args, env, prefix)
        assert reuse is not None
        remote = (args.remote_prefix or DEFAULT_PREFIX).rstrip("/") or "/"
        command = (args.remote_python or "python3", *PYTHON_FLAGS,
                   f"{remote}/{LAUNCHER_NAME}", "serve", "--store", f"{remote}/{STORE_NAME}")
        identity = user_path(args.ssh_identity, env) if args.ssh_identity else None
        transport = Transport("ssh", host=args.ssh_host, port=int(args.ssh_port)
                              if args.ssh_port else None, identity=identity,
                              options=(*args.ssh_option, *reuse.options), remote_command=command)
    cfg = ClientConfig(path, args.machine, transport, _sources(args, env, console),
                       prefix / "cache", prefix / "state")
    if path.exists():
        try:
            old = config_mod.load(path, env)
            cfg = cfg._replace(limits=old.limits, compress=old.compress, timeouts=old.timeouts)
        except SharedMemoryError as exc:
            console.warn(f"the existing {path} is replaced: {exc}")
    return cfg


def check_connection(cfg: ClientConfig, console: Console) -> dict[str, Any]:
    """Open a session and say hello, so a broken transport stops the install before it writes.

    Without connection reuse: its socket's folder may not exist before the install writes it.
    """
    if cfg.transport.kind == "ssh":
        cfg = cfg._replace(transport=cfg.transport._replace(options=tuple(
            o for o in cfg.transport.options if not ssh_reuse.own_keys([o]))))
    from sharedmem.client.transport import Connection
    where = f"ssh {cfg.transport.host}" if cfg.transport.kind == "ssh" else "the local store"
    console.progress(f"checking the connection to {where}")
    conn = Connection(cfg)
    try:
        return conn.hello()
    except SharedMemoryError as exc:
        raise InstallError(f"the connection check failed: {exc}. Nothing was installed; fix "
                           "that and re-run install_client.py") from None
    finally:
        conn.close()


def _reuse_summary(reuse: ssh_reuse.Plan, cfg: ClientConfig) -> dict[str, Any]:
    """What the summary says about connection reuse."""
    on = reuse.folder is not None
    return {"on": on, "folder": str(reuse.folder) if on else None,
            "control_path": ssh_reuse.control_path(cfg.transport.options),
            "persist_seconds": ssh_reuse.PERSIST_SECONDS if on else None,
            "reason": reuse.reason}


def _installed(path: Path, env: Mapping[str, str]) -> ClientConfig | None:
    """The client.json in place (about to be replaced or removed); None without a readable one."""
    try:
        return config_mod.load(path, env)
    except SharedMemoryError:
        return None


def _stop_master(installed: ClientConfig, env: Mapping[str, str]) -> bool:
    """Close the master connection an installed configuration's reuse options keep open.

    Only for our own options: a ControlPath the user named may serve their other sessions.
    """
    transport = installed.transport
    if transport.kind != "ssh" or not ssh_reuse.ours(transport.options, installed.state, env):
        return False
    return ssh_reuse.stop(transport)


def _diff(path: Path, before: str | None, after: str | None) -> str:
    lines = difflib.unified_diff((before or "").splitlines(keepends=True),
                                 (after or "").splitlines(keepends=True),
                                 fromfile=f"{path} (now)", tofile=f"{path} (after)")
    return "".join(lines)


def _change(change: harnesses.Change) -> dict[str, Any]:
    return {"harness": change.harness, "path": str(change.path), "action": change.action,
            "message": change.message}


def _pretend(argv: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """A scheduler runner that runs nothing and reports success (SHAREDMEM_SCHEDULER_DRYRUN)."""
    return subprocess.CompletedProcess(argv, 0, "", "")


def _schedule(install: bool, prefix: Path, env: Mapping[str, str], console: Console, run: Any,
              platform: str | None, dry_run: bool,
              python: str = sys.executable, machine: str = "") -> dict[str, Any] | None:
    """Install or remove the two-minute job; a failure is a warning, not the end of the install."""
    pretend = env.get(DRYRUN_ENV) == "1"
    runner = _pretend if pretend else (run or scheduler.default_run)
    dry = dry_run or pretend
    try:
        if install:
            command = [python, *PYTHON_FLAGS, str(prefix / LAUNCHER_NAME), "sync", "--config",
                       str(prefix / "client.json")]
            plan = scheduler.install(command, prefix / "sync.log", env, machine=machine,
                                     platform=platform, run=runner, dry_run=dry)
        else:
            plan = scheduler.uninstall(env, platform=platform, run=runner, dry_run=dry)
    except SharedMemoryError as exc:
        console.warn(f"the sync schedule could not be {'installed' if install else 'removed'}: "
                     f"{exc}")
        return {"kind": "failed", "message": str(exc), "files": [], "commands": []}
    return {"kind": plan.kind, "message": plan.message, "dry_run": dry,
            "files": [str(f) for f in plan.files], "commands": plan.commands}


def body(argv: list[str], env: Mapping[str, str], console: Console, run: Any,
         platform: str | None) -> int:
    """The whole client install (or uninstall); returns 0, or 1 when something needs a look."""
    args = parser().parse_args(argv)
    fail_if(_validate(args, env), "install_client.py")
    prefix = prefix_path(args.prefix, env)
    if args.uninstall:
        return _uninstall(args, env, prefix, console, run, platform)
    dry = args.dry_run
    cfg = build_config(args, env, prefix, console)
    summary: dict[str, Any] = {"dry_run": dry, "prefix": str(prefix), "config": str(cfg.path),
                               "machine": cfg.machine,
                               "sources": [{"name": s.name, "kind": s.kind, "path": str(s.path)}
                                           for s in cfg.sources]}
    python = interpreter.given(args.python) if args.python else interpreter.choose()
    if python.volatile:
        console.warn(python.note, counts=False)
    elif python.note:
        console.progress(python.note)
    summary["python"] = python.path
    if not dry or cfg.transport.kind == "ssh":
        summary["server"] = check_connection(cfg, console).get("server")
    summary["files"] = install_code(prefix, console, dry_run=dry)
    diffs = _write_config(args, env, prefix, cfg, summary, console)
    if not dry:
        summary["sync"] = _sync(cfg, env, console)
    mcp = [python.path, *PYTHON_FLAGS, str(prefix / LAUNCHER_NAME), "mcp", "--config",
           str(cfg.path)]
    names = list(dict.fromkeys(args.harness)) or harnesses.detect(env)
    diffs += _register(names, mcp, cfg, env, dry, summary, console)
    summary["memory"] = []
    for found in memory_coverage.coverage(cfg.sources, env, cfg.machine, names):
        summary["memory"].append({"harness": found.harness, "status": found.status,
                                  "message": found.message, "fix": found.fix,
                                  "folders": [str(f) for f in found.folders]})
        if found.status != memory_coverage.OK:  # a choice the user may have made: exit stays 0
            console.warn(f"{found.harness}: {found.message}. Fix: {found.fix}", counts=False)
    summary["cursor_block_shown"] = _show_cursor_block(summary, cfg.state, args.cursor_rules, dry)
    if args.schedule == "auto":
        summary["schedule"] = _schedule(True, prefix, env, console, run, platform, dry,
                                        python.path, cfg.machine)
    summary["diffs"] = [d for d in diffs if d]
    _report(summary, args.json, console)
    return 1 if console.warnings else 0


def _write_config(args: Any, env: Mapping[str, str], prefix: Path, cfg: ClientConfig,
                  summary: dict[str, Any], console: Console) -> list[str]:
    """Write client.json (and ready connection reuse's folder); a dry run's diff instead."""
    text = config_mod.dumps(cfg)
    old = cfg.path.read_text(encoding="utf-8") if cfg.path.exists() else None
    summary["config_action"] = "unchanged" if old == text else ("updated" if old else "added")
    reuse = reuse_plan(args, env, prefix)
    if reuse is not None:
        summary["ssh_reuse"] = _reuse_summary(reuse, cfg)
    if args.dry_run:
        return [_diff(cfg.path, old, text)]
    before = _installed(cfg.path, env) if old != text else None
    if reuse is not None and reuse.folder is not None:  # before client.json names it
        try:
            ssh_reuse.prepare(reuse.folder)
        except OSError as exc:
            raise InstallError(f"cannot make {reuse.folder} for ssh's connection socket: "
                               f"{exc}; fix its permissions, or pass --no-ssh-reuse") from None
    if old != text:
        atomic_write(cfg.path, text.encode("utf-8"), mode=0o600)
    for folder in (cfg.cache, cfg.state):
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    if before is not None and before.transport != cfg.transport and _stop_master(before, env):
        summary.setdefault("ssh_reuse", {"on": False, "reason": "local store"})[
            "stopped_old"] = True  # else the master for the old options would linger
    return []


def _register(names: list[str], mcp: list[str], cfg: ClientConfig, env: Mapping[str, str],
              dry: bool, summary: dict[str, Any], console: Console) -> list[str]:
    """Register the MCP server and add guidance with each harness; a dry run's diffs."""
    diffs = []
    summary["harnesses"], summary["guidance"], summary["cursor_block"] = [], [], None
    for name in names:
        console.progress(f"registering {harnesses.SERVER_NAME} with {name}")
        changes = [(harnesses.register(name, mcp, env, dry_run=dry), "harnesses")]
        changes += [(c, "guidance") for c in guidance.add_guidance(name, cfg.cache, env,
                                                                    dry_run=dry)]
        for change, key in changes:
            summary[key].append(_change(change))
            if change.action == "manual":
                summary["cursor_block"] = change.after
            elif dry and change.before != change.after:
                diffs.append(_diff(change.path, change.before, change.after))
    return diffs


def _cache_files(cache: Path) -> dict[str, str]:
    """Each cached path and its sha256, from the cache's manifest ({} without a cache)."""
    from sharedmem.cache.cache import Cache
    try:
        reader = Cache(cache)
        manifest = reader.load()
        if reader.damage is not None:  # an older version's manifest, which the sync rebuilds
            manifest = reader.manifest_of(reader.rebuild())  # the files hashed as they are
        return {path: meta.sha256 for path, meta in manifest.files.items()}
    except (SharedMemoryError, OSError, ValueError):
        return {}


def _sync(cfg: ClientConfig, env: Mapping[str, str], console: Console) -> dict[str, Any]:
    """Run a sync and count what it truly moved: own files published, others pulled."""
    from sharedmem.client import sync as client
    first = not (cfg.state / "last-sync.json").exists()
    where = f"ssh {cfg.transport.host}" if cfg.transport.kind == "ssh" else "the local store"
    console.progress(("running the first sync with " if first else "syncing with ") + where)
    before = _cache_files(cfg.cache)
    report = client.sync(config_mod.load(cfg.path, env), build_index=True)
    after = _cache_files(cfg.cache)
    published_sources = {s["source"] for s in report.get("sources", [])
                         if s.get("status") == "published"}
    own = f"machines/{cfg.machine}/"
    published = pulled = 0
    for path, sha in after.items():
        if before.get(path) == sha:
            continue
        source = path[len(own):].split("/", 1)[0] if path.startswith(own) else None
        if source in published_sources:
            published += 1
        else:
            pulled += 1
    report["first"] = first
    report["counts"] = {"published": published, "pulled": pulled,
                        "removed": len(before.keys() - after.keys()), "cached": len(after)}
    if report["status"] != "ok":
        console.warn(f"the {'first ' if first else ''}sync was {report['status']}: "
                     f"{report.get('error') or 'some files were skipped (see the report)'}")
    return report


def _show_cursor_block(summary: dict[str, Any], state: Path, asked: bool, dry: bool) -> bool:
    """Whether to print Cursor's rules block: when asked, or when it differs from the last one.

    Cursor has no instructions file to write, so the block shown last is kept in the state
    folder; a re-run that would show the very same block again says so in one line instead.
    """
    block = summary.get("cursor_block")
    if block is None:
        return False
    record = state / CURSOR_SHOWN
    try:
        shown = record.read_text(encoding="utf-8")
    except OSError:
        shown = None
    if shown != block and not dry:
        atomic_write(record, block.encode("utf-8"), mode=0o600)
    return asked or shown != block


def _uninstall(args: Any, env: Mapping[str, str], prefix: Path, console: Console, run: Any,
               platform: str | None) -> int:
    """Take out what the install put into other programs' files; the cache stays."""
    dry = args.dry_run
    names = list(dict.fromkeys(args.harness)) or list(harnesses.HARNESSES)
    summary: dict[str, Any] = {"dry_run": dry, "uninstall": True, "prefix": str(prefix),
                               "harnesses": [], "guidance": [], "removed": []}
    for name in names:
        console.progress(f"removing {harnesses.SERVER_NAME} from {name}")
        change = harnesses.unregister(name, env, dry_run=dry)
        summary["harnesses"].append(_change(change))
        if name != "cursor" or change.action == "removed" or args.harness:
            summary["guidance"] += [_change(c) for c in guidance.remove_guidance(name, env,
                                                                                 dry_run=dry)]
    summary["schedule"] = _schedule(False, prefix, env, console, run, platform, dry)
    installed = _installed(prefix / "client.json", env)
    if installed is not None and not dry:
        summary["ssh_master_stopped"] = _stop_master(installed, env)
    if args.purge:
        summary["removed"] = _purge(prefix, console, dry)
    _report(summary, args.json, console)
    return 1 if console.warnings else 0


def _purge(prefix: Path, console: Console, dry_run: bool) -> list[str]:
    """Remove the client's files and our code from the prefix; a store and its backups stay."""
    targets = ["client.json", "cache", "state", "sync.log"]
    if prefix.resolve() == SOURCE_ROOT:
        console.warn(f"{prefix} is this checkout: its code is left in place")
    else:
        targets += [LAUNCHER_NAME, PACKAGE, GUIDANCE_FILE]
    removed = []
    for rel in targets:
        path = prefix / rel
        if not path.exists():
            continue
        removed.append(str(path))
        if dry_run:
            continue
        try:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        except OSError as exc:
            raise InstallError(f"cannot remove {path}: {exc}; remove it by hand") from None
    for folder in (prefix / "docs", prefix):
        if not dry_run and folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
    return removed


def _report(summary: dict[str, Any], as_json: bool, console: Console) -> None:
    """The final summary on stdout: JSON, or lines a person reads."""
    if as_json:
        console.say(json.dumps(summary, indent=2, ensure_ascii=False, default=str))
        return
    dry = summary["dry_run"]
    verb = "uninstall" if summary.get("uninstall") else "install"
    lines = [f"dry run of the client {verb}: nothing was written" if dry
             else f"client {verb} done ({summary['prefix']})"]
    if "config" in summary:
        lines.append(f"  machine {summary['machine']}, configuration {summary['config']} "
                     f"({summary['config_action']})")
        lines += [f"  source {s['name']} ({s['kind']}): {s['path']}" for s in summary["sources"]]
        if not summary["sources"]:
            lines.append("  no sources: this machine only reads the shared memory")
        lines.append(f"  code: {len(summary['files'])} file(s) changed")
        lines.append(f"  python: {summary['python']} (what the harnesses and the schedule run)")
    if "ssh_reuse" in summary:
        lines.append("  " + _reuse_line(summary["ssh_reuse"]))
    if "sync" in summary:
        lines.append("  " + _sync_line(summary["sync"]))
    lines += _harness_lines(summary)
    lines += [f"  memory {m['harness']}: {m['message']}"
              + (f" (fix: {m['fix']})" if m["fix"] else "") for m in summary.get("memory", [])]
    for path in summary.get("removed", []):
        lines.append(f"  {'would remove' if dry else 'removed'} {path}")
    schedule = summary.get("schedule")
    if schedule:
        lines.append(f"  schedule: {schedule['message']}"
                     + (" (dry run)" if schedule.get("dry_run") else ""))
        lines += [f"    {'would run' if schedule.get('dry_run') else 'ran'}: {' '.join(c)}"
                  for c in schedule["commands"]]
    elif schedule is None and not summary.get("uninstall"):
        lines.append("  schedule: none (run `shared_memory.py sync --config ...` yourself)")
    if summary.get("cursor_block_shown"):
        lines += ["", "Cursor has no global instructions file: paste this block into Cursor "
                  "Settings > Rules > User Rules:", "", summary["cursor_block"]]
    elif summary.get("cursor_block"):
        lines.append("  cursor: the rules block to paste into Cursor Settings > Rules > User "
                     "Rules is the one shown before (--cursor-rules prints it again)")
    elif summary.get("uninstall") and any(i["harness"] == "cursor"
                                          for i in summary["guidance"]):
        lines.append("  cursor: remove the shared-memory block from Cursor Settings > Rules > "
                     "User Rules by hand")
    if summary.get("diffs"):
        lines += ["", "What would change:", *summary["diffs"]]
    console.say("\n".join(lines))


def _reuse_line(reuse: dict[str, Any]) -> str:
    """Whether syncs share one ssh connection, where its socket is, and how to change that."""
    stopped = "; the previous master connection was closed" if reuse.get("stopped_old") else ""
    if reuse["on"]:
        return (f"ssh: connection reuse on (socket {reuse['control_path']}, kept "
                f"{reuse['persist_seconds'] // 60} minutes after each sync; --no-ssh-reuse turns "
                f"it off){stopped}")
    return f"ssh: connection reuse off ({reuse['reason']}){stopped}"


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _sync_line(sync: dict[str, Any]) -> str:
    """What the install's sync did, in true numbers."""
    label = "first sync" if sync.get("first") else "sync"
    if sync["status"] == "failed":
        return f"{label}: failed - {sync.get('error')}"
    counts = sync.get("counts", {})
    moved = [f"{_plural(counts.get('published', 0), 'file')} published",
             f"{counts.get('pulled', 0)} pulled"]
    if counts.get("removed"):
        moved.append(f"{counts['removed']} removed")
    if not any(counts.get(k) for k in ("published", "pulled", "removed")):
        moved = ["nothing changed"]
    problems = sum(len(s.get("problems", [])) for s in sync.get("sources", []))
    tail = f"; {_plural(problems, 'file')} skipped, see --json" if problems else ""
    return (f"{label}: {sync['status']} ({', '.join(moved)}; "
            f"{_plural(counts.get('cached', 0), 'file')} in the cache{tail})")


def _harness_lines(summary: dict[str, Any]) -> list[str]:
    """One line per harness when nothing changed for it, else one per file that changed."""
    if summary.get("uninstall"):
        return [f"  {i['harness']}: {i['message']}" for i in summary["harnesses"]
                + summary["guidance"] if i["action"] != "manual"]
    lines = []
    for item in summary["harnesses"]:
        guides = [g for g in summary["guidance"] if g["harness"] == item["harness"]
                  and g["action"] != "manual"]
        if item["action"] == "unchanged" and all(g["action"] in ("unchanged", "skipped")
                                                 for g in guides):
            where = ", guidance in ".join([item["path"], *(g["path"] for g in guides[:1])])
            lines.append(f"  {item['harness']}: already registered, unchanged ({where})")
            continue
        lines += [f"  {i['harness']}: {i['message']}" for i in (item, *guides)]
    return lines


def client_main(argv: Sequence[str], env: Mapping[str, str] | None = None, *,
                run: Any = None, platform: str | None = None, out: TextIO | None = None,
                err: TextIO | None = None) -> int:
    """Entry point of install_client.py; `run` and `platform` stand in for the OS scheduler."""
    console = Console(out, err)
    environ = dict(os.environ if env is None else env)
    return run_main(lambda a: body(a, environ, console, run, platform), argv,
                    console, "install_client.py")
