"""`history` and `show`: the previous versions of a published file the server keeps, to recover.

Each works on the server with `--store`, or from a client (`--config`, by default the installed
client.json) over the sync protocol. `history --store` also shows and sets how long they are
kept. One builder and one handler per command, data to stdout, errors raised for `cli.main`.
"""

from __future__ import annotations

import sys

from sharedmem.cli.output import emit, load_config, user_path

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

DEFAULT_CONFIG = "~/.local/share/codex-shared-memory/client.json"  # install/prefix.py's prefix
EXAMPLE = "machines/laptop/codex/memory_summary.md"


def _where(p: Any) -> None:
    """--store or --config: the store on this server, or a client's server over the protocol."""
    where = p.add_mutually_exclusive_group()
    where.add_argument("--store", help="on the server: path of the SQLite store")
    where.add_argument("--config", help=f"on a client: path of client.json (default "
                       f"{DEFAULT_CONFIG}); asks its server over the sync protocol")
    p.add_argument("--json", action="store_true", help="print JSON")


# history -----------------------------------------------------------------------------------------

def build_history(sub: Any) -> None:
    p = sub.add_parser("history", help="the versions the server keeps of a published file",
                       description="List the versions the store keeps of one published file, "
                       "oldest first and the current one last, each with the time it was "
                       "replaced, its size and sha256. A version's number is the generation "
                       "that wrote it: give it to `show PATH@VERSION`. Previous versions are "
                       "kept for a number of days after they were replaced (30 unless set). "
                       "With --store and no PATH: that retention and what history holds.")
    p.add_argument("path", nargs="?", metavar="PATH", help=f"the published path, e.g. {EXAMPLE}")
    _where(p)
    p.add_argument("--retention-days", type=_days, metavar="N",
                   help="with --store: keep previous versions N days after they were replaced "
                   "(0 keeps none); older ones are deleted now")
    p.set_defaults(handler=run_history)


def _days(value: str) -> int:
    import argparse

    from sharedmem.server.store import MAX_HISTORY_DAYS
    if not (value.isascii() and value.isdigit()) or int(value) > MAX_HISTORY_DAYS:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number of days from 0 to "
                                         f"{MAX_HISTORY_DAYS} (e.g. --retention-days 30)")
    return int(value)


def run_history(args: Any) -> int:
    from sharedmem.core import ConfigError
    if args.retention_days is not None and (not args.store or args.path):
        raise ConfigError("--retention-days is set on the server, on its own: pass --store PATH "
                          "with it and no file PATH (a client cannot change it)")
    if args.store:
        from sharedmem.server.backup import migration_hook
        from sharedmem.server.store import Store
        with Store.open(user_path(args.store), create=False,
                        before_migrate=migration_hook) as store:
            if args.retention_days is not None:
                was = store.history_days()
                pruned = store.set_history_days(args.retention_days)
                emit({"retention_days": args.retention_days, "was": was, "pruned": pruned},
                     args.json, f"history: previous versions are kept {args.retention_days} "
                     f"days (was {was}); {pruned} older version(s) deleted")
                return 0
            if not args.path:
                summary = store.history_summary()
                emit(summary, args.json, _summary_text(summary, args.store))
                return 0
            found = store.history(args.path)
    elif not args.path:
        raise ConfigError(f"history needs the PATH of a published file from a client, e.g. "
                          f"`shared_memory.py history {EXAMPLE}`")
    else:
        from sharedmem.client import history
        found = history.history(load_config(args.config or DEFAULT_CONFIG), args.path)
    emit(found, args.json, _history_text(found))
    return 0


def _history_text(found: dict[str, Any]) -> str:
    path = found["path"]
    versions = found["versions"]
    lines = [f"{path}: {len(versions)} version(s); previous versions are kept "
             f"{found.get('retention_days')} days",
             f"  {'version':>8}  {'replaced at':<20}  {'bytes':>9}  sha256"]
    for item in versions:
        when = "current" if item.get("current") else str(item.get("replaced_at"))
        lines.append(f"  {item.get('version'):>8}  {when:<20}  {item.get('size'):>9,}  "
                     f"{str(item.get('sha256'))[:12]}")
    if versions and not versions[-1].get("current"):
        lines.append(f"  (no current file: removed or renamed at {versions[-1].get('replaced_at')})")
    previous = [item for item in versions if not item.get("current")]
    if previous:
        lines.append(f"recover one: shared_memory.py show {path}@{previous[-1].get('version')} "
                     "> FILE")
    return "\n".join(lines)


def _summary_text(summary: dict[str, Any], store: str) -> str:
    days = summary["retention_days"]
    kept = (f"previous versions of files are kept {days} days after they were replaced"
            if days else "no previous versions are kept (retention 0)")
    lines = [f"history: {kept} (set with `shared_memory.py history --store {store} "
             "--retention-days N`)",
             f"  {summary['versions']} previous version(s) of {summary['files']} file(s); "
             f"{summary['bodies']} bodies ({summary['bytes']:,} bytes) kept only for them"]
    if summary["oldest_replaced_at"]:
        lines.append(f"  oldest replaced at {summary['oldest_replaced_at']}")
    return "\n".join(lines)


# show --------------------------------------------------------------------------------------------

def build_show(sub: Any) -> None:
    p = sub.add_parser("show", help="print one version of a published file, to recover it",
                       description="Print the text of one version of a published file, exactly "
                       "as stored, to stdout (redirect it to a file to recover it: `show "
                       "PATH@VERSION > FILE`). VERSION is a number `history PATH` lists.")
    p.add_argument("spec", metavar="PATH@VERSION", help=f"e.g. {EXAMPLE}@12")
    _where(p)
    p.set_defaults(handler=run_show)


def split_spec(spec: str) -> tuple[str, int]:
    """PATH@VERSION as (path, version); a path may hold '@', so the last one splits."""
    from sharedmem.core import ConfigError
    path, at, number = spec.rpartition("@")
    if not at or not path or not number.isdigit() or not number.isascii():
        raise ConfigError(f"{spec!r} names no version: write PATH@VERSION with a version number "
                          f"that `shared_memory.py history PATH` lists, e.g. {EXAMPLE}@12")
    return path, int(number)


def run_show(args: Any) -> int:
    path, number = split_spec(args.spec)
    if args.store:
        from sharedmem.server.backup import migration_hook
        from sharedmem.server.store import Store
        with Store.open(user_path(args.store), create=False,
                        before_migrate=migration_hook) as store:
            found = store.version(path, number)
    else:
        from sharedmem.client import history
        found = history.show(load_config(args.config or DEFAULT_CONFIG), path, number)
    if args.json:
        emit(found, True, "")
    else:  # the stored bytes, as they are: `> FILE` recovers the file
        sys.stdout.flush()
        sys.stdout.buffer.write(found["text"].encode("utf-8"))
        sys.stdout.buffer.flush()
    return 0


BUILDERS = [build_history, build_show]
