"""The server's commands: serve (the server end of a sync), and backup, forget and export of its store.

One builder and one handler per command, data to stdout, errors raised for `cli.main` to report.
"""

from __future__ import annotations

from sharedmem.cli.output import emit, user_path

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


# serve -------------------------------------------------------------------------------------------

def build_serve(sub: Any) -> None:
    p = sub.add_parser("serve", help="the server end of a sync, on stdin/stdout (run by ssh)",
                       description="Speak the sync protocol (docs/PROTOCOL.md) on stdin/stdout "
                       "over one SQLite store. Clients run this through ssh or as a local child.")
    p.add_argument("--store", required=True, help="path of the SQLite store (created if absent)")
    p.add_argument("--machine", help="pin the session to this machine name (SSH forced command)")
    p.add_argument("--max-protocol", type=int, choices=(1, 2, 3), default=3,
                   help="highest protocol version to speak (1 to serve old clients only)")
    p.add_argument("--limit", action="append", default=[], metavar="NAME=VALUE",
                   help="a server limit other than its default, e.g. machine_bytes=1073741824 "
                   "(repeatable; names and defaults in docs/CONFIGURATION.md)")
    p.set_defaults(handler=run_serve)


def run_serve(args: Any) -> int:
    from sharedmem.rules import Limits
    from sharedmem.server.store import plain_path
    settings = getattr(args, "limit", None)  # the quick parse of a forced command has none
    limits = Limits.parse(settings) if settings else Limits()
    # A plain path is the Path it would make, as the store opens it: no pathlib before the hello.
    store = args.store if plain_path(args.store) else user_path(args.store)
    if not _slot(store, limits.sessions):
        return 1
    from sharedmem.server import session as server
    return server.serve(store, args.machine, max_version=args.max_protocol, limits=limits)


def _slot(store: Any, count: int) -> bool:
    """Take one of the store's session slots for this process, lean, before the session loads.

    A session waiting for a slot holds no more than the interpreter and this module. One turned
    away answers `busy` in place of a hello and ends; the client says so. The slot is this
    process's until it exits. A store whose folder cannot hold the slots runs without one: the
    session's opening of the store then says what is wrong with it.
    """
    import sys

    from sharedmem.server import session_slots
    try:
        session_slots.take(store, count)
    except session_slots.Busy as exc:
        from sharedmem.fastjson import dumps
        sys.stderr.write(f"serve: {exc}\n")
        line = dumps({"type": "error", "code": "busy", "message": str(exc)}) + "\n"
        try:
            sys.stdout.buffer.write(line.encode("utf-8"))
            sys.stdout.buffer.flush()
        except OSError:
            pass
        return False
    except OSError:
        pass
    return True


# backup ------------------------------------------------------------------------------------------

def build_backup(sub: Any) -> None:
    p = sub.add_parser("backup", help="backups of the server's store: create, list, verify, prune, "
                       "restore", description="Online, verified backups of the SQLite store, kept "
                       "in backups/ beside it with a manifest of checksums.")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)

    def common(q: Any, dest: bool = True) -> None:
        q.add_argument("--store", required=True, help="path of the SQLite store")
        if dest:
            q.add_argument("--dest", help="folder for archives (default: backups/ beside the store)")
        q.add_argument("--json", action="store_true", help="print JSON")

    q = actions.add_parser("create", help="take a verified online backup, also during syncs")
    common(q)
    q.add_argument("--label", default="", help="short name added to the archive file name, e.g. "
                   "before-upgrade")
    q.add_argument("--protect", action="store_true", help="never remove this archive when pruning")
    q = actions.add_parser("list", help="archives with time, size, protected flag and checksum "
                           "state (ok, mismatch, missing, unlisted)")
    common(q)
    q = actions.add_parser("verify", help="re-hash archives against the manifest and re-check "
                           "integrity and the note chain; non-zero exit on any problem")
    common(q)
    q.add_argument("archives", nargs="*", metavar="ARCHIVE",
                   help="archives to check (default: every archive in the manifest)")
    q = actions.add_parser("prune", help="remove old archives: keep the newest, 7 daily and 4 "
                           "weekly by default; never a protected or unlisted one")
    common(q)
    q.add_argument("--keep-last", type=int, default=1, help="always keep the N newest")
    q.add_argument("--daily", type=int, default=7, help="keep the newest of each of the last N days")
    q.add_argument("--weekly", type=int, default=4,
                   help="keep the newest of each of the last N weeks")
    q.add_argument("--dry-run", action="store_true", help="list what would be removed, remove none")
    q = actions.add_parser("restore", help="replace the store with a verified archive (stop syncs "
                           "first); the current store is kept as a protected backup")
    common(q, dest=False)
    q.add_argument("archive", metavar="ARCHIVE", help="the archive to restore")
    q.add_argument("--force", action="store_true", help="restore even if the store is newer than "
                   "the archive or unreadable (a store in use is always refused)")
    p.set_defaults(handler=run_backup)


def run_backup(args: Any) -> int:
    from sharedmem.server import backup, catalog
    store = user_path(args.store)
    folder = user_path(args.dest) if getattr(args, "dest", None) else \
        catalog.backups_folder(store)
    if args.action == "create":
        info = backup.create(store, dest=folder, protect=args.protect, label=args.label)
        emit(info.to_json(), args.json, f"created {info.path} ({info.size} bytes, sha256 "
              f"{info.sha256[:12]}..., verified)")
        return 0
    if args.action == "list":
        items = catalog.list_backups(folder)
        emit([i.to_json() for i in items], args.json, "\n".join(
            f"{i.created}  {i.size:>12,}  {i.state:<8} {'protected' if i.protected else '':<9} "
            f"{i.path.name}" for i in items) or f"no backups in {folder}")
        return 0
    if args.action == "verify":
        targets = [user_path(a) for a in args.archives] or [
            i.path for i in catalog.list_backups(folder)]
        results = {str(t): backup.verify(t) for t in targets}
        emit(results, args.json, "\n".join(
            f"{t}: {'ok' if not p else 'FAILED'}" + "".join(f"\n  - {x}" for x in p)
            for t, p in results.items()) or f"no backups in {folder}")
        return 1 if any(results.values()) else 0
    if args.action == "prune":
        removed = catalog.prune(folder, keep_last=args.keep_last, daily=args.daily,
                                weekly=args.weekly, dry_run=args.dry_run)
        verb = "would remove" if args.dry_run else "removed"
        emit([str(p) for p in removed], args.json,
              "\n".join(f"{verb} {p}" for p in removed) or "nothing to remove")
        return 0
    done = backup.restore(user_path(args.archive), store, force=args.force)
    emit({"store": str(store), "replaced_store_kept_at": str(done.kept) if done.kept else None,
          "generation": done.generation, "clients_pull_whole": True}, args.json,
          f"restored {store} from {args.archive}"
          + (f"; the replaced store is kept at {done.kept}" if done.kept else "")
          + f". Its generations now start at {done.generation}, past every one a client holds: "
          "each client's next sync pulls every file and note whole and drops what the store "
          "no longer has (notes written after the backup are gone from the store)")
    return 0


# forget and export --------------------------------------------------------------------------------

def build_forget(sub: Any) -> None:
    p = sub.add_parser("forget", help="remove a machine's published files from the store",
                       description="Remove a machine's namespaces (all, or one source) from the "
                       "store in one transaction and record it. Notes are append-only and stay. "
                       "The machine's next sync publishes again unless its key is removed.")
    p.add_argument("--store", required=True, help="path of the SQLite store")
    p.add_argument("--machine", required=True, help="machine name to forget")
    p.add_argument("--source", help="forget only this source of the machine")
    p.add_argument("--reason", default="", help="free text recorded with the removal")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=run_forget)


def run_forget(args: Any) -> int:
    from sharedmem.server.store import Store
    with Store.open(user_path(args.store), create=False) as store:
        removed = store.forget(args.machine, args.source, args.reason)
    what = f"{args.machine}" + (f"/{args.source}" if args.source else "")
    emit({"machine": args.machine, "source": args.source, "files_removed": removed}, args.json,
          f"forgot {what}: {removed} files removed; notes are append-only and were kept")
    return 0


def build_export(sub: Any) -> None:
    p = sub.add_parser("export", help="write the store's published tree as plain Markdown",
                       description="Write every published file and note as plain Markdown in the "
                       "same layout as a client cache, for moving to another server or leaving.")
    p.add_argument("--store", required=True, help="path of the SQLite store")
    p.add_argument("--out", required=True, help="folder to write (created; must be empty or an "
                   "earlier export)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=run_export)


def run_export(args: Any) -> int:
    from sharedmem.cache.cache import Cache, NamespaceInfo
    from sharedmem.core import SharedMemoryError as Refused
    from sharedmem.server.store import Store
    out = user_path(args.out)
    if out.exists() and any(out.iterdir()) and not (out / ".sharedmem").is_dir():
        raise Refused(f"export folder {out} is not empty: pass a new or empty folder")
    with Store.open(user_path(args.store), create=False) as store:
        namespaces = {ns.key: NamespaceInfo.listed(ns) for ns in store.namespaces().every()}
        done = Cache(out).apply(store.export(), [], namespaces, whole=namespaces)  # streamed
    emit({"out": str(out), **done}, args.json, f"exported {done['files']} files to {out}")
    return 0


BUILDERS = [build_serve, build_backup, build_forget, build_export]
