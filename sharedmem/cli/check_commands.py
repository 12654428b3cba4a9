"""The commands that prove the chain works: doctor (a client or a store) and demo."""

from __future__ import annotations

import os
import sys

from sharedmem.cli.output import emit, progress, user_path

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any



# doctor and demo ---------------------------------------------------------------------------------

def build_doctor(sub: Any) -> None:
    p = sub.add_parser("doctor", help="check a client or a server's store, and say how to fix it",
                       description="Check everything a client depends on: client.json, each "
                       "source, the SSH or local transport, the server's store (its own verify), "
                       "the age of the cache, the MCP server started exactly as each harness "
                       "registered it, the registrations, the agent guidance and the sync "
                       "schedule. With --store, check a server's store and its backups instead "
                       "(read-only unless --repair). Exit status: 0 nothing failed (warnings "
                       "allowed), 1 a check failed.")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--config", help="path of client.json: check this client end to end")
    which.add_argument("--store", help="path of the server's SQLite store: check it and its "
                       "backups")
    p.add_argument("--repair", action="store_true", help="with --store: first delete the bodies "
                   "no file or running session uses (orphans of killed sessions) and tombstones "
                   "past their retention; safe while clients sync")
    p.add_argument("--json", action="store_true", help="print every check as JSON")
    p.set_defaults(handler=run_doctor)


def run_doctor(args: Any) -> int:
    from sharedmem.cli import doctor
    if args.repair and not args.store:
        from sharedmem.core import SharedMemoryError
        raise SharedMemoryError("--repair works on a server's store: pass --store PATH with it "
                                "(it has nothing to repair with --config)")
    report = (doctor.doctor_store(user_path(args.store), repair=args.repair) if args.store
              else doctor.doctor(user_path(args.config), os.environ))
    emit(report.to_json(), args.json, doctor.format_text(report))
    return report.exit_code


def build_demo(sub: Any) -> None:
    p = sub.add_parser("demo", help="the whole flow in a sandbox: two machines, one store, MCP",
                       description="Build a sandbox with sample memory from two machines, sync "
                       "both into a local store, then call list, search, read and "
                       "add_ad_hoc_note through the real MCP server and print what an agent would "
                       "see. Writes nothing outside the sandbox and touches no harness "
                       "configuration.")
    p.add_argument("--dir", help="build the sandbox in this new or empty folder and keep it "
                   "(default: a temporary folder, removed at the end)")
    p.add_argument("--json", action="store_true", help="print the transcript as JSON")
    p.set_defaults(handler=run_demo)


def run_demo(args: Any) -> int:
    from sharedmem.cli import demo
    result = demo.demo(user_path(args.dir) if args.dir else None,
                       progress=progress(sys.stderr.isatty() and not args.json))
    emit(result, args.json, demo.format_text(result))
    return 0 if result["ok"] else 1


BUILDERS = [build_doctor, build_demo]
