"""The client's commands: sync, index, status, mcp, and the four tools for people."""

from __future__ import annotations

import os
import sys

from sharedmem.cli.output import emit, load_config, progress, shown, user_path

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any



# sync --------------------------------------------------------------------------------------------

def build_sync(sub: Any) -> None:
    from sharedmem.client.lock import DEFAULT_WAIT
    p = sub.add_parser("sync", help="publish this machine's sources and refresh the cache",
                       description="Snapshot each enabled source, send it to the server, deliver "
                       "queued notes, then pull what changed into the cache. Exit status: 0 all "
                       "published, 1 partial (something skipped: a file of a source, a note, or "
                       "an item of the pull this client cannot write), 2 failed (nothing "
                       "changed).")
    p.add_argument("--config", required=True, help="path of client.json")
    p.add_argument("--json", action="store_true", help="print the whole report as JSON")
    p.add_argument("--max-protocol", type=int, choices=(2, 3), default=3,
                   help="highest protocol version to speak (2: as a 0.1.0 client does)")
    p.add_argument("--compress", choices=("auto", "on", "off"),
                   help="compress the session (protocol 3), overriding client.json's compress "
                   "(default auto: on over ssh to another machine, off for a local store or ssh to "
                   "this one)")
    p.add_argument("--wait", type=_seconds, default=DEFAULT_WAIT, metavar="SECONDS",
                   help="while another sync or a note's delivery of this machine runs, wait up "
                        f"to this long for it to finish, then run (default {DEFAULT_WAIT:g}; 0 "
                        "fails at once)")
    p.add_argument("--notes-only", action="store_true",
                   help="only deliver the queued notes and refresh the cache, publishing "
                        "nothing (what add_ad_hoc_note starts in the background)")
    p.add_argument("--index", action="store_true",
                   help="also build the search index when the cache has none (the installer's "
                        "first sync does; otherwise the first search builds it in the "
                        "background). An index that exists is always kept current by the sync")
    p.set_defaults(handler=run_sync)


def _seconds(value: str) -> float:
    import argparse
    import math
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not 0 <= seconds <= 86400:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds from 0 to 86400 "
                                         "(e.g. --wait 90, or --wait 0 to fail at once)")
    return seconds


def _waiting(message: str) -> None:
    print(f"sync: {message}", file=sys.stderr, flush=True)


def run_sync(args: Any) -> int:
    config = load_config(args.config)
    if args.notes_only:
        from sharedmem.client.note import deliver_queued
        report = deliver_queued(config, args.wait, _waiting)
        emit(report, args.json, _delivery_text(report))
        if report["status"] == "failed":
            print(f"note delivery failed: {report['error']}", file=sys.stderr)
        return {"ok": 0, "partial": 1}.get(report["status"], 2)
    from sharedmem.client import sync as client
    if args.compress is not None:
        config = config._replace(compress=args.compress)
    report = client.sync(config, max_version=args.max_protocol,
                         progress=progress(sys.stderr.isatty() and not args.json),
                         lock_wait=args.wait, waiting=_waiting, build_index=args.index)
    emit(report, args.json, _sync_text(report))
    if report["status"] == "failed":
        print(f"sync failed: {shown(report['error'])}", file=sys.stderr)
    return int(report["exit_code"])


def _delivery_text(report: dict[str, Any]) -> str:
    notes = report["notes"]
    lines = [f"notes delivered: {notes['delivered']}, still queued: {report['pending']}"
             + (f" ({report['message']})" if report.get("message") else "")]
    lines += [f"  note refused {item['filename']}: {item['message']}" for item in notes["refused"]]
    return "\n".join(lines)


def _sync_text(report: dict[str, Any]) -> str:
    """The report for people; each text the server sent is shown on its own line, escaped."""
    lines = [f"sync {report['status']} for machine {report['machine']}"
             + (f" (protocol {report['protocol']})" if report.get("protocol") else "")]
    for src in report["sources"]:
        lines.append(f"  {src['source']}: {src['status']}, {src['files']} files"
                     + (f" - {shown(src['message'])}" if src.get("message") else ""))
        for item in src["problems"]:
            lines.append(f"    skipped {shown(item['path'])}: {shown(item['message'])}")
        for kind, count in sorted(src.get("redacted", {}).items()):
            lines.append(f"    redacted {count} x {shown(kind)}")
    notes = report.get("notes", {})
    if notes.get("delivered"):
        lines.append(f"  notes delivered: {notes['delivered']}")
    for item in notes.get("refused", []):
        lines.append(f"  note refused {item['filename']}: {shown(item['message'])}")
    if "pull" in report:
        pull = report["pull"]
        lines.append(f"  cache: {pull['files']} files ({pull['written']} written, "
                     f"{pull['removed']} removed"
                     + (f", {pull['skipped_total']} skipped" if pull["skipped_total"] else "")
                     + ")")
        repaired = (pull.get("repaired") or {}).get("files", 0)
        if repaired:
            lines.append(f"    {repaired} cache file{'s' if repaired != 1 else ''} repaired "
                         "(changed by hand or damaged, written again as the server has them)")
        for item in pull["skipped"]:
            lines.append(f"    not written {shown(item['path'])}: {shown(item['message'])}")
        if pull["skipped_total"] > len(pull["skipped"]):
            lines.append(f"    and {pull['skipped_total'] - len(pull['skipped'])} more")
    return "\n".join(lines)


# index -------------------------------------------------------------------------------------------

def build_index(sub: Any) -> None:
    p = sub.add_parser("index", help="bring the cache's search index up to date",
                       description="Re-index the cached files whose content changed since the "
                       "last refresh. Searches scan whatever files the index does not cover, so "
                       "results never depend on it; a search that finds no usable index (none "
                       "yet, an older version, or damaged) starts this in the background.")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--config", help="path of client.json (its cache is indexed)")
    where.add_argument("--cache", help="the cache folder itself")
    p.add_argument("--background", action="store_true",
                   help="run only on idle CPU time and print nothing (how search starts it)")
    p.add_argument("--after", type=int, metavar="PID",
                   help="first wait until process PID has ended (how a sync starts it)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=run_index)


def run_index(args: Any) -> int:
    from sharedmem.cache import search_index
    from sharedmem.cache.cache import Cache
    from sharedmem.core import ConfigError
    root = load_config(args.config).cache if args.config else user_path(args.cache)
    if not Cache(root).exists():
        raise ConfigError(f"{root} is not a synced cache (no .sharedmem/manifest.sqlite3): run "
                          "`shared_memory.py sync --config PATH` first")
    if args.after is not None and os.name != "nt":
        search_index.wait_for_exit(args.after, search_index.BACKGROUND_WAIT)
    if args.background:
        _lowest_priority()
    result = search_index.refresh_index(Cache(root), search_index.BACKGROUND_WAIT
                                        if args.background else search_index.WRITER_WAIT)
    if not args.background:
        emit(result, args.json, f"index: {result['changed']} files refreshed, "
                                 f"{result['files']} indexed")
    return 0


def _lowest_priority() -> None:
    """Run only on CPU time nothing else wants (SCHED_IDLE on Linux, else the highest nice)."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # type: ignore[attr-defined]
    except (AttributeError, OSError):
        if hasattr(os, "nice"):
            os.nice(19)


# status ------------------------------------------------------------------------------------------

def build_status(sub: Any) -> None:
    p = sub.add_parser("status", help="what the cache holds, its age, and pending notes",
                       description="Machines and sources in the cache with file counts and sync "
                       "times, the age of the last successful sync, and notes in the outbox.")
    p.add_argument("--config", required=True, help="path of client.json")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=run_status)


def run_status(args: Any) -> int:
    from sharedmem.client.status import status
    info = status(load_config(args.config))
    lines = [f"machine {info['machine']}, cache {info['cache']}",
             f"last successful sync: {info['last_sync'] or 'never'}"
             + (f" ({info['age']} ago)" if info["age"] else "")]
    if info["damage"]:
        lines.append(f"the cache is damaged and will be repaired by the next sync (run "
                     f"`shared_memory.py sync --config {args.config}` now to repair it): "
                     f"{shown(info['damage'])}")
    last = info["last_attempt"]
    if last.get("status") == "failed":
        lines.append(f"last attempt failed at {shown(last.get('finished_at'))}: "
                     f"{shown(last.get('error'))}")
    for ns in info["namespaces"]:
        lines.append(f"  {shown(ns['key'])}: {ns['files']} files, synced {shown(ns['synced_at'])}")
    lines.append(f"pending notes: {len(info['pending_notes'])}"
                 + "".join(f"\n  {n}" for n in info["pending_notes"]))
    if info["refused_notes_total"]:
        lines.append(f"refused notes: {info['refused_notes_total']} (kept in "
                     f"{shown(os.path.dirname(info['refused_notes'][0]['file']))})")
        lines += [f"  {shown(n['filename'])}: {shown(n['message'])}"
                  for n in info["refused_notes"]]
        if info["refused_notes_total"] > len(info["refused_notes"]):
            lines.append(f"  and {info['refused_notes_total'] - len(info['refused_notes'])} more")
    emit(info, args.json, "\n".join(lines))
    return 0


# mcp ---------------------------------------------------------------------------------------------

def build_mcp(sub: Any) -> None:
    p = sub.add_parser("mcp", help="the stdio MCP server over the cache (run by a harness)",
                       description="Serve the MCP tools list, read, search and add_ad_hoc_note "
                       "over the client's cache, as newline-delimited JSON-RPC on stdin/stdout.")
    p.add_argument("--config", required=True, help="path of client.json")
    p.set_defaults(handler=run_mcp)


def run_mcp(args: Any) -> int:
    from sharedmem.mcp import server as mcp
    return mcp.main(args.config)


# the tools, for people ---------------------------------------------------------------------------

def build_tools(sub: Any) -> None:
    p = sub.add_parser("list", help="list cached files and folders",
                       description="List files and folders in the cache, with provenance.")
    p.add_argument("--config", required=True, help="path of client.json")
    p.add_argument("path", nargs="?", default="", help="folder to list (default: the root)")
    p.add_argument("--cursor", help="cursor from a previous page")
    p.add_argument("--max-results", type=int, default=200, help="entries per page (max 2000)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=run_tool, tool="list")

    p = sub.add_parser("read", help="read a cached file",
                       description="Print lines of a cached file, with its provenance.")
    p.add_argument("--config", required=True, help="path of client.json")
    p.add_argument("path", help="published path, e.g. machines/laptop/codex/MEMORY.md")
    p.add_argument("--line-offset", type=int, default=1, help="first line, 1-based")
    p.add_argument("--max-lines", type=int, help="how many lines at most")
    p.add_argument("--char-offset", type=int,
                   help="characters of the first line to skip: the rest of a line cut at the "
                        "256 KiB a result holds")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=run_tool, tool="read")

    p = sub.add_parser("search", help="search the cache",
                       description="Substring search over the cache, most relevant first.")
    p.add_argument("--config", required=True, help="path of client.json")
    p.add_argument("queries", nargs="+", help="1 to 16 substrings")
    p.add_argument("--match-mode", choices=("any", "all"), default="any",
                   help="any: lines matching any query; all: files matching every query")
    p.add_argument("--path", help="limit to this folder")
    p.add_argument("--cursor", help="cursor from a previous page")
    p.add_argument("--context-lines", type=int, default=0, help="lines of context (0-10)")
    p.add_argument("--ignore-case", action="store_true", help="case-insensitive matching")
    p.add_argument("--normalized", action="store_true",
                   help="fold case, accents, Unicode forms and whitespace")
    p.add_argument("--max-results", type=int, default=50, help="results per page (max 200)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=run_tool, tool="search")

    p = sub.add_parser("note", help="add an append-only ad-hoc note",
                       description="Send a note to the server (queued if it is unreachable).")
    p.add_argument("--config", required=True, help="path of client.json")
    p.add_argument("filename", help="YYYY-MM-DDTHH-MM-SS-<slug>.md")
    p.add_argument("text", nargs="?", help="the note text; read from stdin when omitted")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=run_tool, tool="add_ad_hoc_note")


def run_tool(args: Any) -> int:
    from functools import partial

    from sharedmem.cache.cache import Cache
    from sharedmem.client import note
    from sharedmem.mcp import tools
    config = load_config(args.config)
    if args.tool == "list":
        params = {"path": args.path, "cursor": args.cursor, "max_results": args.max_results}
    elif args.tool == "read":
        params = {"path": args.path, "line_offset": args.line_offset, "max_lines": args.max_lines,
                  "char_offset": args.char_offset}
    elif args.tool == "search":
        params = {"queries": args.queries, "match_mode": args.match_mode, "path": args.path,
                  "cursor": args.cursor, "context_lines": args.context_lines,
                  "case_sensitive": not args.ignore_case, "normalized": args.normalized,
                  "max_results": args.max_results}
    else:
        text = args.text if args.text is not None else sys.stdin.read()
        params = {"filename": args.filename, "note": text}
    params = {k: v for k, v in params.items() if v is not None}
    result = tools.call(args.tool, params, Cache(config.cache),
                        lambda: partial(note.submit_note, config))
    emit(result, args.json, tools.format_text(args.tool, result))
    return 0


BUILDERS = [build_sync, build_index, build_mcp, build_status, build_tools]
