"""`doctor`: check a client (or a server's store) end to end and say how to fix what is wrong.

Every check is run the way production runs it: the transport through a real `Connection`, the
server's own `verify`, and the MCP server started with exactly the argv each harness registered.
The functions return data; `cli.py` prints `format_text(report)` or the JSON form.
"""

from __future__ import annotations

import shutil
import sqlite3
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sharedmem.clock import age_text, parse_utc
from sharedmem.core import ProtocolError, SharedMemoryError

OK, WARN, FAIL = "ok", "warn", "fail"
FRESH_SECONDS = 10 * 60
STALE_SECONDS = 24 * 3600
BACKUP_MAX_AGE = 2 * 24 * 3600
EXPECTED_TOOLS = frozenset({"list", "read", "search", "add_ad_hoc_note"})
REUSE = "ssh reuse"  # the name of its check


@dataclass
class Check:
    """One finding: what was checked, how it went, and the sentence that says how to fix it."""

    name: str
    status: str  # ok | warn | fail
    message: str
    fix: str = ""
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class Report:
    """Everything one `doctor` run found; `exit_code` is non-zero when any check failed."""

    subject: str
    checks: list[Check] = field(default_factory=list)

    def add(self, name: str, status: str, message: str, fix: str = "", **details: Any) -> Check:
        """Record one check and return it."""
        check = Check(name, status, message, fix, details)
        self.checks.append(check)
        return check

    @property
    def exit_code(self) -> int:
        """1 when any check failed, else 0 (warnings alone do not fail the run)."""
        return 1 if any(c.status == FAIL for c in self.checks) else 0

    def counts(self) -> dict[str, int]:
        """How many checks ended in each status."""
        return {s: sum(c.status == s for c in self.checks) for s in (OK, WARN, FAIL)}

    def failed(self) -> list[str]:
        """Names of the failed checks, so scripts and tests can tell which one broke."""
        return [c.name for c in self.checks if c.status == FAIL]

    def to_json(self) -> dict[str, Any]:
        """The form `doctor --json` prints."""
        return {"subject": self.subject, "exit_code": self.exit_code, "counts": self.counts(),
                "checks": [asdict(c) for c in self.checks]}


def format_text(report: Report) -> str:
    """The human form: one line per check, its fix below it, and a summary line."""
    width = max((len(c.name) for c in report.checks), default=0)
    lines = [f"doctor: {report.subject}"]
    for check in report.checks:
        lines.append(f"  {check.status:<4}  {check.name:<{width}}  {check.message}")
        if check.fix and check.status != OK:
            lines.append(f"        {'':<{width}}  fix: {check.fix}")
    counts = report.counts()
    verdict = "problems found" if report.exit_code else "all good"
    lines.append(f"{verdict}: {counts[OK]} ok, {counts[WARN]} warn, {counts[FAIL]} fail")
    return "\n".join(lines)


# --- doctor --config -----------------------------------------------------------------------------

def doctor(config_path: Path, env: Mapping[str, str]) -> Report:
    """Check a client: configuration, sources, transport, server, cache, MCP, harnesses, schedule."""
    from sharedmem.client import config as config_mod
    report = Report(str(config_path))
    cfg = None
    try:
        cfg = config_mod.load(config_path, env)
    except SharedMemoryError as exc:
        report.add("config", FAIL, str(exc), "fix client.json as described, or re-run "
                   "install_client.py to write a fresh one")
    if cfg is not None:
        where = (f"ssh to {cfg.transport.host}" if cfg.transport.kind == "ssh"
                 else f"local store {cfg.transport.store}")
        report.add("config", OK, f"machine {cfg.machine}, {len(cfg.sources)} source(s), {where}")
        _check_sources(report, cfg, env)
        _check_server(report, cfg)
        _check_ssh_reuse(report, cfg)
        _check_cache(report, cfg)
    _check_harnesses(report, Path(config_path), cfg, env)
    _check_schedule(report, env)
    return report


def _check_sources(report: Report, cfg: Any, env: Mapping[str, str]) -> None:
    from sharedmem.sources import kinds as sources
    for src in cfg.sources:
        name = f"source {src.name}"
        spec = sources.SourceSpec(src.name, src.kind, src.path)
        folders = [part.root for part in sources.parts(spec, env)]
        if not any(folder.exists() for folder in folders):
            shown = ", ".join(map(str, folders))
            what = "folder {} does" if len(folders) == 1 else "folders {} do"
            report.add(name, WARN, f"{what.format(shown)} not exist, so nothing is published "
                       f"from it", f"create {folders[0]}, or drop the source by re-running "
                       "install_client.py without it", path=str(src.path))
            continue
        snap = sources.snapshot(spec, cfg.limits, env=env)
        skipped = [{"path": s.path, "reason": s.reason, "message": s.message}
                   for s in snap.skipped]
        if snap.status != "ok":
            report.add(name, FAIL, snap.message, f"make {src.path} a readable folder",
                       path=str(src.path))
            continue
        problems = snap.problems()
        reasons: dict[str, int] = {}
        for s in snap.skipped:
            reasons[s.reason] = reasons.get(s.reason, 0) + 1
        summary = f"{len(snap.files)} file(s) publishable from {src.path}"
        if reasons:
            summary += "; skipped " + ", ".join(f"{n} {r}" for r, n in sorted(reasons.items()))
        if problems:
            first = problems[0].message
            report.add(name, WARN, f"{summary}; e.g. {first}", "fix the skipped files as each "
                       "message says; the rest still syncs", files=len(snap.files),
                       skipped=skipped)
        else:
            report.add(name, OK, summary, files=len(snap.files), skipped=skipped)


def _check_server(report: Report, cfg: Any) -> None:
    from sharedmem.client.transport import Connection
    try:
        with Connection(cfg) as conn:
            hello = conn.hello()
            report.add("transport", OK, f"reached {conn.where}", where=conn.where)
            try:
                conn.channel.send({"type": "verify"})
                verified = conn.channel.expect("verified")
            except ProtocolError as exc:
                report.add("server", FAIL, f"{hello.get('server')} did not verify its store: "
                           f"{exc}", "upgrade the server (install_server.py) so it answers "
                           "verify, then run doctor --store on the server")
                return
    except SharedMemoryError as exc:
        fix = ("start sshd on the server, check host, port and key; run the ssh command by hand "
               "once" if cfg.transport.kind == "ssh" else "check transport.store in client.json")
        report.add("transport", FAIL, str(exc), fix)
        return
    problems = list(verified.get("problems", []))
    details = {"server": hello.get("server"), "protocol": conn.version,
               "schema": verified.get("schema"), "counts": verified.get("counts", {})}
    counts = ", ".join(f"{v} {k}" for k, v in details["counts"].items())
    summary = (f"{hello.get('server')}, protocol {conn.version}, schema {details['schema']}"
               + (f", {counts}" if counts else ""))
    if problems:
        report.add("server", FAIL, f"{summary}; the store has problems: {'; '.join(problems)}",
                   "on the server run `shared_memory.py doctor --store PATH`, then restore "
                   "the newest verified backup (docs/OPERATIONS.md)", problems=problems, **details)
    else:
        report.add("server", OK, f"{summary}; store verified", **details)


def _check_ssh_reuse(report: Report, cfg: Any) -> None:
    """Whether syncs share one ssh connection, and whether its master runs (after `transport`).

    The transport check has just connected with the same options, so with reuse on a master
    should be running now; its socket's folder must exist, or every sync fails.
    """
    from sharedmem.install import ssh_reuse
    transport = cfg.transport
    if transport.kind != "ssh":
        return
    if not ssh_reuse.own_keys(transport.options):
        report.add(REUSE, OK, "off: each sync opens its own ssh connection (about ten round "
                   "trips before the first byte); install_client.py without --no-ssh-reuse "
                   "turns it on", configured=False)
        return
    found = ssh_reuse.settings(transport)
    if not found:
        report.add(REUSE, WARN, "configured, but `ssh -G` could not read the transport's "
                   "options, so whether it works is unknown", "run the sync by hand and read "
                   "what ssh says about transport.options", configured=True)
        return
    master, path = found.get("controlmaster", "no"), found.get("controlpath", "none")
    if master in ("no", "false") or path == "none":
        report.add(REUSE, OK, f"off: ssh makes ControlMaster {master}, ControlPath {path} of "
                   "transport.options", configured=False)
        return
    _check_master(report, cfg, {"configured": True, "control_path": path, "master": master,
                                "persist": found.get("controlpersist")})


def _check_master(report: Report, cfg: Any, details: dict[str, Any]) -> None:
    """Whether ssh can make its socket, and whether the master connection runs now."""
    import shlex
    import stat

    from sharedmem.install import ssh_reuse
    path = details["control_path"]
    folder = Path(path).parent
    fix = (f"re-run install_client.py (it makes the folder and picks one short enough), or "
           f"remove the Control* options from transport.options in {cfg.path}")
    if len(path.encode()) + ssh_reuse.MUX_SUFFIX >= ssh_reuse.SUN_PATH_MAX:
        report.add(REUSE, FAIL, f"the socket path {path} is too long for a Unix socket "
                   f"({ssh_reuse.SUN_PATH_MAX - 1 - ssh_reuse.MUX_SUFFIX} bytes at most), so "
                   "ssh fails", fix, **details)
        return
    try:
        info = folder.stat()
    except OSError:
        report.add(REUSE, FAIL, f"the socket's folder {folder} does not exist, so ssh cannot "
                   "start a master connection and every sync fails", fix, **details)
        return
    if stat.S_IMODE(info.st_mode) & 0o022:
        report.add(REUSE, WARN, f"the socket's folder {folder} is writable by others, who could "
                   "put their own socket in its place", f"chmod 700 {folder}", **details)
        return
    running, said = ssh_reuse.check(cfg.transport)
    by_hand = shlex.join(ssh_reuse.command(cfg.transport, "-O", "check"))
    connected = any(c.name == "transport" and c.status == OK for c in report.checks)
    if running:
        report.add(REUSE, OK, f"on: {said.rstrip('.')}, socket {path}, kept "
                   f"{details['persist']} s after the last sync", **details)
    elif connected:
        report.add(REUSE, WARN, f"on, but no master connection runs right after a connection "
                   f"was made ({said}): each sync opens its own", f"run `{by_hand}` and "
                   "ssh -v by hand to see why, or turn reuse off (install_client.py "
                   "--no-ssh-reuse)", **details)
    else:
        report.add(REUSE, OK, f"on (socket {path}); no master connection runs now: {said}",
                   **details)


def _check_cache(report: Report, cfg: Any) -> None:
    from sharedmem.client.status import status
    fix = f"run `shared_memory.py sync --config {cfg.path}` and read what it says"
    if not cfg.cache.is_dir():
        report.add("cache", FAIL, f"cache folder {cfg.cache} is missing", fix)
        return
    info = status(cfg)
    last = info["last_attempt"]
    failed = (f"; the last attempt failed at {last.get('finished_at')}: {last.get('error')}"
              if last.get("status") == "failed" else "")
    pending = len(info["pending_notes"])
    waiting = f"; {pending} note(s) wait in the outbox" if pending else ""
    details = {"last_sync": info["last_sync"], "age_seconds": info["age_seconds"],
               "pending_notes": pending}
    if info["damage"]:
        report.add("cache", WARN, f"the cache's manifest in {cfg.cache} is damaged, so the tools "
                   f"refuse to answer until the next sync repairs it: {info['damage']}{failed}"
                   f"{waiting}", f"run `shared_memory.py sync --config {cfg.path}` (the "
                   "scheduled sync repairs it too)", damage=info["damage"], **details)
        return
    if info["last_sync"] is None:
        report.add("cache", FAIL, f"cache {cfg.cache} was never synced{failed}", fix, **details)
        return
    age = max(0.0, time.time() - parse_utc(info["last_sync"]))
    message = f"last sync {age_text(age)} ago ({info['last_sync']}){failed}{waiting}"
    refused = info["refused_notes_total"]
    if refused:
        message += (f"; {refused} note(s) were refused by the server, e.g. "
                    f"{info['refused_notes'][0]['filename']}: {info['refused_notes'][0]['message']}")
    if age < FRESH_SECONDS and not pending:
        report.add("cache", OK, message, **details)
    elif age < STALE_SECONDS:
        report.add("cache", WARN, message, "syncs should run every two minutes: check the "
                   "schedule and the sync log, or " + fix, **details)
    else:
        report.add("cache", FAIL, message, "the cache is over a day old: " + fix, **details)


# --- harnesses -----------------------------------------------------------------------------------

def _check_harnesses(report: Report, config_path: Path, cfg: Any,
                     env: Mapping[str, str]) -> None:
    from sharedmem.install import harnesses
    try:
        detected = set(harnesses.detect(env))
    except SharedMemoryError as exc:
        report.add("harnesses", FAIL, str(exc), "set HOME and run doctor again")
        return
    for name in harnesses.HARNESSES:
        path = harnesses.config_path(name, env)
        try:
            command = harnesses.registered_command(name, env)
        except SharedMemoryError as exc:
            report.add(f"registration {name}", FAIL, f"{path} cannot be read: {exc}",
                       f"repair {path} (its backup is {harnesses.backup_path(path).name} if "
                       f"the installer made one), then re-run install_client.py", path=str(path))
            continue
        if command is None:
            if name in detected:
                report.add(f"registration {name}", WARN, f"{name} is installed but "
                           f"{harnesses.SERVER_NAME} is not registered in {path}",
                           f"run install_client.py --harness {name}", path=str(path))
            continue
        _check_registration(report, name, path, command, config_path)
        _probe_mcp(report, name, command, env)
        _check_guidance(report, name, cfg, env)
    if cfg is not None:
        _check_memory(report, cfg, env, [n for n in harnesses.HARNESSES if n in detected or any(
            c.name == f"registration {n}" for c in report.checks)])
    if not any(c.name.startswith("registration ") for c in report.checks):
        report.add("registrations", WARN, f"no harness has {harnesses.SERVER_NAME} registered "
                   "(none of codex, claude-code, opencode, cursor was found)", "install a "
                   "harness, then run install_client.py --harness NAME")


def _check_memory(report: Report, cfg: Any, env: Mapping[str, str], names: list[str]) -> None:
    """Per harness: where it writes memory today (its own settings say) and which source reads it."""
    from sharedmem.install import memory_coverage
    for found in memory_coverage.coverage(cfg.sources, env, cfg.machine, names):
        report.add(f"memory {found.harness}", found.status, found.message, found.fix,
                   folders=[str(f) for f in found.folders])


def _check_registration(report: Report, name: str, path: Path, command: list[str],
                        config_path: Path) -> None:
    registered = command[command.index("--config") + 1] if "--config" in command[:-1] else None
    if registered and Path(registered).expanduser().resolve() != config_path.resolve():
        report.add(f"registration {name}", WARN, f"{path} runs the MCP server with --config "
                   f"{registered}, not {config_path}", f"re-run install_client.py --harness "
                   f"{name} if {config_path} is the configuration in use", command=command)
    else:
        report.add(f"registration {name}", OK, f"registered in {path}", command=command)


def _missing_file(command: list[str], env: Mapping[str, str]) -> str | None:
    """The program or script of `command` that does not exist, if one is missing."""
    program = command[0]
    if "/" in program or "\\" in program:
        if not Path(program).exists():
            return program
    elif shutil.which(program, path=env.get("PATH")) is None:
        return program
    script = next((a for a in command[1:] if a.endswith(".py")), None)
    if script and not Path(script).is_file():
        return script
    return None


def _probe_mcp(report: Report, name: str, command: list[str], env: Mapping[str, str]) -> None:
    check = f"mcp {name}"
    missing = _missing_file(command, env)
    if missing and missing == command[0]:
        gone = ("no longer exists" if "/" in missing or "\\" in missing
                else "is not on PATH")
        report.add(check, FAIL, f"interpreter {missing} registered for {name} {gone}: re-run "
                   "install_client.py", "re-run install_client.py: it registers a system "
                   "Python 3.11+ where there is one (a version manager or an upgrade may have "
                   "removed this one), or the one named with --python PATH", command=command,
                   missing=missing)
        return
    if missing:
        report.add(check, FAIL, f"the registered command runs {missing}, which does not exist",
                   f"re-run install_client.py --harness {name} to register the installed "
                   "launcher", command=command, missing=missing)
        return
    from sharedmem.cli.demo import McpSession
    started = time.monotonic()
    try:
        with McpSession(command, env) as session:
            info = session.initialize()
            tools = {t.get("name") for t in session.request("tools/list").get("tools", [])}
            is_error, listing = session.call("list", {"max_results": 1})
    except SharedMemoryError as exc:
        report.add(check, FAIL, f"the MCP server as {name} starts it failed: {exc}",
                   f"run `{' '.join(command)}` by hand to see the error, then re-run "
                   "install_client.py", command=command)
        return
    seconds = round(time.monotonic() - started, 2)
    if tools != EXPECTED_TOOLS:
        report.add(check, FAIL, f"the MCP server offers {sorted(tools)}, not the four tools "
                   f"{sorted(EXPECTED_TOOLS)}", "update the installation with "
                   "install_client.py", command=command)
    elif is_error:
        report.add(check, FAIL, f"the MCP server starts but its list tool fails: {listing}",
                   "fix what the message names (often client.json or the cache)",
                   command=command)
    else:
        report.add(check, OK, f"{info.get('serverInfo', {}).get('name')} answered initialize, "
                   f"tools/list and list in {seconds}s", command=command, seconds=seconds)


def _check_guidance(report: Report, name: str, cfg: Any, env: Mapping[str, str]) -> None:
    from sharedmem.install import guidance, harnesses
    path = guidance.read_by(name, env)
    if path is None:
        return
    fix = f"run install_client.py --harness {name} to add the guidance block"
    try:
        text = harnesses.read_text(path) or ""
        unread = name == "opencode" and path.exists() and not guidance.opencode_lists(env)
    except SharedMemoryError as exc:
        report.add(f"guidance {name}", FAIL, str(exc), f"repair {path}", path=str(path))
        return
    if unread:
        report.add(f"guidance {name}", WARN, f"{path} holds the guidance, but the instructions "
                   f"list of {harnesses.config_path(name, env)} does not name it, so OpenCode "
                   "never reads it", fix.replace("add", "list"), path=str(path))
        return
    block = guidance.extract_block(text)
    if block is None:
        if harnesses.SERVER_NAME in text or "shared memory" in text.lower():
            report.add(f"guidance {name}", OK, f"{path} has its own shared-memory policy")
        else:
            report.add(f"guidance {name}", WARN, f"no shared-memory guidance in {path}", fix,
                       path=str(path))
        return
    try:
        current = guidance.guidance_block(cfg.cache) if cfg is not None else block
    except SharedMemoryError:
        current = block
    if block.replace("\r\n", "\n") != current:
        report.add(f"guidance {name}", WARN, f"the guidance block in {path} is out of date",
                   fix.replace("add", "refresh"), path=str(path))
    else:
        report.add(f"guidance {name}", OK, f"guidance block present in {path}")


def _check_schedule(report: Report, env: Mapping[str, str]) -> None:
    from sharedmem.install import scheduler
    try:
        installed, message = scheduler.status(env)
    except SharedMemoryError as exc:
        installed, message = False, str(exc)
    if installed:
        report.add("schedule", OK, message)
    else:
        report.add("schedule", WARN, message, "run install_client.py (without --schedule none) "
                   "so the cache refreshes every two minutes")


# --- doctor --store ------------------------------------------------------------------------------

def doctor_store(store: Path, repair: bool = False) -> Report:
    """Check a server's store: integrity, note chain, schema, unused bodies and backups.

    Read-only, unless `repair`: then, once the store verifies, the bodies no file or live
    session uses and the tombstones past their retention are collected first (after migrating
    an older schema, with its backup), and the checks report the store as it is afterwards.
    """
    from sharedmem.server.store import MIGRATIONS, Store
    store = Path(store)
    report = Report(str(store))
    if not store.is_file():
        report.add("store", FAIL, f"store {store} does not exist", "pass the right --store, or "
                   "create it with install_server.py")
        return report
    if repair:
        _repair(report, store)
    try:
        conn = sqlite3.connect(f"{store.resolve().as_uri()}?mode=ro", uri=True)
        try:
            opened = Store(store, conn)
            version = opened.schema_version()
            try:
                problems, counts = opened.verify(), opened.counts()
            except sqlite3.Error as exc:  # an older schema lacks what verify reads
                if version == len(MIGRATIONS):
                    raise
                problems, counts = [], {}
                report.add("store", WARN, f"schema {version} can only be fully checked once "
                           f"migrated ({exc})", "run a sync (it migrates after a backup)")
        finally:
            conn.close()
    except (sqlite3.Error, UnicodeDecodeError) as exc:  # SQLite quoting damaged bytes
        report.add("store", FAIL, f"store {store} cannot be read as SQLite ({exc})",
                   "restore the newest verified backup (docs/OPERATIONS.md)")
        return report
    if problems:
        report.add("store", FAIL, "; ".join(problems), "stop syncs, then restore the newest "
                   "verified backup (docs/OPERATIONS.md)", problems=problems)
    elif counts:  # empty when the schema was too old to verify (warned above)
        listed = ", ".join(f"{v} {k}" for k, v in counts.items())
        report.add("store", OK, "integrity, foreign keys and note chain verified"
                   + (f" ({listed})" if listed else ""), counts=counts)
    if _check_schema(report, version, len(MIGRATIONS)) and not problems:
        _check_bodies(report, store, version)
    _check_backups(report, store)
    return report


def _check_schema(report: Report, version: int, latest: int) -> bool:
    """The store's schema against this software's (`latest`); whether this software knows it."""
    if version > latest:
        report.add("schema", FAIL, f"schema {version} is newer than this software ({latest})",
                   "upgrade codex-shared-memory on this server")
    elif version < latest:
        report.add("schema", WARN, f"schema {version}; this software uses {latest}",
                   "the next sync migrates it after taking a verified backup")
    else:
        report.add("schema", OK, f"schema {version} (current)")
    return version <= latest


def _repair(report: Report, store: Path) -> None:
    """Collect what nothing keeps, once the store verifies: it is never written otherwise."""
    from sharedmem.server.backup import migration_hook
    from sharedmem.server.store import Store
    fix = "restore the newest verified backup (docs/OPERATIONS.md), then run --repair again"
    try:
        with Store.open(store, create=False, before_migrate=migration_hook) as opened:
            problems = opened.verify()
            if problems:
                report.add("repair", FAIL, "not repaired: " + "; ".join(problems), fix,
                           problems=problems)
                return
            done = opened.collect(strays=True)
    except SharedMemoryError as exc:
        report.add("repair", FAIL, f"not repaired: {exc}", "fix what the message says, then "
                   "run --repair again")
        return
    except sqlite3.Error as exc:
        report.add("repair", FAIL, f"not repaired: store {store} cannot be written ({exc})",
                   fix)
        return
    assert done is not None  # not `when_due`: a collection always runs
    report.add("repair", OK, f"deleted {done.bodies} unused bod{'y' if done.bodies == 1 else 'ies'}"
               f" ({done.bytes} bytes), released {done.sessions} ended session(s), compacted "
               f"{done.tombstones} tombstone(s)", **done.to_json())


def _check_bodies(report: Report, store: Path, version: int) -> None:
    """Bodies no file uses: kept for a live session or a grace, or orphans to collect."""
    from sharedmem.server import blob_lifecycle
    conn = sqlite3.connect(f"{store.resolve().as_uri()}?mode=ro", uri=True)
    try:
        details = blob_lifecycle.census(conn, version, int(time.time()))
    except sqlite3.Error as exc:
        report.add("bodies", WARN, f"unused bodies could not be counted ({exc})",
                   "run `doctor --store` again; if it persists, restore a verified backup")
        return
    finally:
        conn.close()
    unused, size = details["unused"], details["unused_bytes"]
    kept = (f"{unused} bod{'y' if unused == 1 else 'ies'} no file uses ({size} bytes)"
            if unused else "every body is used by a file")
    if details["orphans"]:
        report.add("bodies", WARN, f"{kept}; {details['orphans']} of them "
                   f"({details['orphan_bytes']} bytes) are orphans nothing will collect",
                   f"run `shared_memory.py doctor --store {store} --repair`", **details)
        return
    held, waiting, dead = details["claimed"], details["waiting"], details["killed_sessions"]
    parts = [f"{held} claimed by running sessions" if held else "",
             f"{waiting} kept for an hour after their last file went, or released by a session "
             "that ended" if waiting else "",
             f"{dead} session(s) ended without cleaning up, collected by the next session or "
             "--repair" if dead else "", f"{details['tombstones']} tombstone(s)"]
    report.add("bodies", OK, "; ".join([kept, *filter(None, parts)]), **details)


def _check_backups(report: Report, store: Path) -> None:
    folder = store.parent / "backups"
    fix = f"run `shared_memory.py backup create --store {store}` and schedule it daily"
    from sharedmem.server import catalog
    try:
        found = [(i.path, parse_utc(i.created), i.state) for i in catalog.list_backups(folder)]
    except SharedMemoryError as exc:
        report.add("backups", WARN, str(exc), fix)
        return
    if not found:
        report.add("backups", WARN, f"no backups in {folder}", fix, count=0)
        return
    newest, when, _ = max(found, key=lambda item: item[1])
    age = max(0.0, time.time() - when)
    bad = [p.name for p, _, state in found if state != "ok"]
    message = f"{len(found)} backup(s); newest {newest.name}, {age_text(age)} old"
    details = {"count": len(found), "newest": str(newest), "age_seconds": int(age), "bad": bad}
    if bad:
        report.add("backups", WARN, f"{message}; {len(bad)} do not match their manifest: "
                   f"{', '.join(bad[:5])}", "check them with `shared_memory.py backup verify`",
                   **details)
    elif age > BACKUP_MAX_AGE:
        report.add("backups", WARN, f"{message}: older than two days", fix, **details)
    else:
        report.add("backups", OK, message, **details)
