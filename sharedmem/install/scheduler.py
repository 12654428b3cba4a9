"""The two-minute sync job, with its output appended to one log file.

Linux gets a systemd user timer (or a crontab line), macOS a LaunchAgent, Windows a Task
Scheduler task. Each machine runs at its own second of the period (`spread`, from its name,
the same every time), so a team's machines do not all reach the server's sshd at once.

Every command that touches the system goes through one `Runner` (argv, stdin text), so tests
can stand in for the operating system with a recorder, and dry-run can list what would run.
"""

from __future__ import annotations

import hashlib
import os
import plistlib
import shlex
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sharedmem.clock import SYNC_INTERVAL_SECONDS
from sharedmem.core import InstallError
from sharedmem.files import atomic_write

UNIT_NAME = "codex-shared-memory-sync"
SERVICE = f"{UNIT_NAME}.service"
TIMER = f"{UNIT_NAME}.timer"
CRON_TAG = "# codex-shared-memory"
LAUNCHD_LABEL = "com.codex-shared-memory.sync"
TASK_NAME = "CodexSharedMemorySync"
INTERVAL_SECONDS = SYNC_INTERVAL_SECONDS  # the MCP server judges a cache's age by it too
SCHTASKS_TR_MAX = 261  # schtasks refuses a longer /TR; then a .cmd wrapper runs the command
WRAPPER_NAME = f"{UNIT_NAME}.cmd"

Runner = Callable[[list[str], str | None], subprocess.CompletedProcess[str]]


def default_run(argv: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run `argv` for real; a missing program is exit code 127, as a shell would report it."""
    try:
        if stdin is None:
            return subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True,
                                  text=True, check=False, timeout=60)
        return subprocess.run(argv, input=stdin, capture_output=True, text=True, check=False,
                              timeout=60)
    except FileNotFoundError:
        return subprocess.CompletedProcess(argv, 127, "", f"{argv[0]}: command not found")
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, 124, "", f"{argv[0]} timed out after 60s")


@dataclass
class Schedule:
    """What was (or, in a dry run, would be) installed or removed."""

    kind: str  # "systemd" | "cron" | "launchd" | "schtasks" | "none"
    files: list[Path] = field(default_factory=list)
    commands: list[list[str]] = field(default_factory=list)
    message: str = ""


# --- the generated texts -------------------------------------------------------------------------

def spread(machine: str) -> int:
    """This machine's second of the period, from 0 to INTERVAL_SECONDS - 1: fixed by its name.

    A hash of the name, so machines named alike (`laptop-1`, `laptop-2`) still fall apart,
    and a re-install keeps the second it had.
    """
    digest = hashlib.sha256(machine.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % INTERVAL_SECONDS


def _minute_and_second(offset: int) -> tuple[int, int]:
    """Which minute of the two-minute period (0 even, 1 odd) and which second of it."""
    if not (type(offset) is int and 0 <= offset < INTERVAL_SECONDS):
        raise InstallError(f"the schedule's offset must be a whole number of seconds from 0 to "
                           f"{INTERVAL_SECONDS - 1}, not {offset!r}")
    return divmod(offset, 60)

def _check_command(command: list[str], log: Path) -> None:
    parts = [*command, str(log)]
    if not command or not all(isinstance(p, str) and p for p in command) or any(
            c in p for p in parts for c in "\n\r\x00"):
        raise InstallError(f"sync command {command!r} (log {log}) must be non-empty strings "
                           "without line breaks")


def _systemd_quote(arg: str) -> str:
    """Quote one ExecStart word: C escapes inside double quotes, `%` and `$` doubled."""
    escaped = (arg.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")
               .replace("$", "$$"))
    return f'"{escaped}"'


def systemd_units(command: list[str], log: Path, offset: int = 0) -> tuple[str, str]:
    """The service and timer unit texts; the first run `offset` seconds after the timer starts.

    `KillMode=process`: the ssh master connection a sync leaves open for the next one (see
    ssh_reuse.py) is a process of the unit's cgroup, which systemd would otherwise kill as soon
    as the sync ends. It has left the sync's session; it ends itself when idle.

    The timer counts on the monotonic clock, from its start (login, boot, install) and then
    from each run: machines that start together run `offset` apart, and a suspend pauses the
    count, so laptops woken together keep their seconds apart too (a wall-clock time, or
    `RandomizedDelaySec`, which draws anew each run, would bunch them on waking).
    `AccuracySec=1s` keeps systemd from moving the runs to coalesce them.
    """
    _check_command(command, log)
    _minute_and_second(offset)
    target = str(log).replace("%", "%%")
    service = (
        "[Unit]\nDescription=Codex Shared Memory sync\n\n"
        "[Service]\nType=oneshot\nKillMode=process\n"
        f"ExecStart={' '.join(_systemd_quote(a) for a in command)}\n"
        f"StandardOutput=append:{target}\nStandardError=append:{target}\n")
    timer = (
        "[Unit]\nDescription=Run Codex Shared Memory sync every two minutes\n\n"
        f"[Timer]\nOnActiveSec={offset}s\nOnUnitActiveSec={INTERVAL_SECONDS}s\nAccuracySec=1s\n"
        f"Unit={SERVICE}\n\n[Install]\nWantedBy=timers.target\n")
    return service, timer


def cron_line(command: list[str], log: Path, offset: int = 0) -> str:
    """Our crontab line; `%` is escaped because cron turns a bare one into a line break.

    It runs in the even or odd minutes, and sleeps into its second of the minute first.
    """
    _check_command(command, log)
    minute, second = _minute_and_second(offset)
    wait = f"sleep {second}; " if second else ""
    body = f"{wait}{shlex.join(command)} >> {shlex.quote(str(log))} 2>&1".replace("%", "\\%")
    return f"{minute}-59/2 * * * * {body} {CRON_TAG}"


def merge_crontab(current: str, line: str | None) -> str:
    """`current` with our line replaced by `line` (in place) or removed when None."""
    out: list[str] = []
    placed = False
    for existing in current.splitlines():
        if existing.rstrip().endswith(CRON_TAG):
            if line and not placed:
                out.append(line)
                placed = True
            continue
        out.append(existing)
    if line and not placed:
        out.append(line)
    return "".join(f"{entry}\n" for entry in out)


def launchd_plist(command: list[str], log: Path, offset: int = 0) -> bytes:
    """The LaunchAgent property list: the even or odd minutes, each run sleeping into its second.

    launchd starts a run the machine slept through once it wakes; the sleep keeps machines
    woken together apart, and is short enough that a run ends before the next is due.
    """
    _check_command(command, log)
    minute, second = _minute_and_second(offset)
    program = (["/bin/sh", "-c", f"sleep {second}; exec {shlex.join(command)}"] if second
               else list(command))
    return plistlib.dumps({
        "Label": LAUNCHD_LABEL, "ProgramArguments": program,
        "StartCalendarInterval": [{"Minute": m} for m in range(minute, 60, 2)],
        "RunAtLoad": True, "ProcessType": "Background",
        "StandardOutPath": str(log), "StandardErrorPath": str(log)}, sort_keys=False)


def _windows_plan(command: list[str], log: Path,
                  offset: int = 0) -> tuple[list[str], str | None]:
    """The schtasks argv and, when /TR would be too long, the text of a .cmd wrapper.

    The task starts at 00:00 or 00:01 and repeats every two minutes: the even or odd minutes.
    Each run first sleeps into its second with the same Python (`command[0]`), as `timeout`
    refuses to run without a console.
    """
    _check_command(command, log)
    minute, second = _minute_and_second(offset)
    wait = "" if not second else subprocess.list2cmdline(
        [command[0], "-c", f"__import__('time').sleep({second})"]) + " & "
    inner = (f"{wait}{subprocess.list2cmdline(command)} >> "
             f"{subprocess.list2cmdline([str(log)])} 2>&1")
    action, wrapper = f'cmd /c "{inner}"', None
    if len(action) > SCHTASKS_TR_MAX:
        wrapper = "@echo off\r\n" + inner.replace("%", "%%") + "\r\n"
        action = subprocess.list2cmdline([str(log.parent / WRAPPER_NAME)])
    return ["schtasks", "/Create", "/F", "/SC", "MINUTE", "/MO", "2", "/ST", f"00:0{minute}",
            "/TN", TASK_NAME, "/TR", action], wrapper


def schtasks_create(command: list[str], log: Path, offset: int = 0) -> list[str]:
    """The `schtasks /Create` argv; output goes through `cmd /c` to reach the log."""
    return _windows_plan(command, log, offset)[0]


# --- helpers --------------------------------------------------------------------------------------

def _platform(platform: str | None) -> str:
    name = platform or sys.platform
    for known in ("linux", "darwin", "win32"):
        if name.startswith(known):
            return known
    raise InstallError(f"no scheduler support for platform {name!r}: run `sync` every two "
                       "minutes with the system's own scheduler")


def _home(env: Mapping[str, str]) -> Path:
    if not env.get("HOME"):
        raise InstallError("HOME is not set: set it to the account's home folder and re-run")
    return Path(env["HOME"])


def _unit_dir(env: Mapping[str, str]) -> Path:
    return Path(env.get("XDG_CONFIG_HOME") or _home(env) / ".config") / "systemd" / "user"


def _plist_path(env: Mapping[str, str]) -> Path:
    return _home(env) / "Library" / "LaunchAgents" / f"{LAUNCHD_LABEL}.plist"


def _domain() -> str:
    return f"gui/{getattr(os, 'getuid', lambda: 0)()}"


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def _write(path: Path, data: bytes, mode: int = 0o644) -> None:
    try:
        atomic_write(path, data, mode=mode)
    except OSError as exc:
        raise InstallError(f"cannot write {path}: {exc}; check the folder's permissions") from exc


def _must(run: Runner, argv: list[str], stdin: str | None = None) -> str:
    result = run(argv, stdin)
    if result.returncode != 0:
        detail = (result.stderr or result.stdout or "").strip()
        raise InstallError(f"`{shlex.join(argv)}` failed (exit {result.returncode}): "
                           f"{detail or 'no output'}")
    return result.stdout or ""


def _systemd_works(run: Runner) -> bool:
    return run(["systemctl", "--user", "show-environment"], None).returncode == 0


def _manager_sees(folder: Path, run: Runner) -> bool:
    """Whether the user manager loads units from `folder` (not so when HOME is not its own)."""
    result = run(["systemctl", "--user", "show", "--property=UnitPath", "--value"], None)
    paths = (result.stdout or "").split() if result.returncode == 0 else []
    return not paths or any(Path(p) == folder for p in paths)


def _crontab(run: Runner) -> str | None:
    """The current crontab ('' when there is none), or None when cron is not installed."""
    result = run(["crontab", "-l"], None)
    if result.returncode == 0:
        return result.stdout or ""
    if result.returncode == 127:
        return None
    if "no crontab" in (result.stderr or "").lower():
        return ""
    raise InstallError(f"`crontab -l` failed: {(result.stderr or '').strip()}; check cron")


def _same_crontab(old: str, new: str) -> bool:
    return new == old or new == old + "\n"


# --- install, uninstall, status -------------------------------------------------------------------

def _do(plan: Schedule, run: Runner, dry_run: bool, argv: list[str],
        stdin: str | None = None) -> None:
    plan.commands.append(argv)
    if not dry_run:
        _must(run, argv, stdin)


def install(command: list[str], log: Path, env: Mapping[str, str], *, machine: str,
            platform: str | None = None, run: Runner = default_run,
            dry_run: bool = False) -> Schedule:
    """Install (or refresh) the job that runs `command` every two minutes; idempotent.

    It runs at `machine`'s own second of the period (`spread`).
    """
    system = _platform(platform)
    _check_command(command, log)
    offset = spread(machine)
    if not dry_run:
        log.parent.mkdir(parents=True, exist_ok=True)
    if system == "darwin":
        return _install_launchd(command, log, env, run, dry_run, offset)
    if system == "win32":
        argv, wrapper = _windows_plan(command, log, offset)
        plan = Schedule("schtasks", message=f"Task Scheduler task {TASK_NAME} runs sync every "
                        f"two minutes; output goes to {log}")
        if wrapper is not None:
            plan.files.append(log.parent / WRAPPER_NAME)
            if not dry_run:
                _write(log.parent / WRAPPER_NAME, wrapper.encode("utf-8"))
        _do(plan, run, dry_run, argv)
        return plan
    if _systemd_works(run):
        return _install_systemd(command, log, env, run, dry_run, offset)
    current = _crontab(run)
    if current is None:
        raise InstallError("neither `systemctl --user` nor `crontab` works on this machine: "
                           f"run `{shlex.join(command)}` every two minutes some other way")
    merged = merge_crontab(current, cron_line(command, log, offset))
    plan = Schedule("cron", message=f"crontab line tagged '{CRON_TAG}' runs sync every two "
                    f"minutes; output goes to {log}")
    if not _same_crontab(current, merged):
        _do(plan, run, dry_run, ["crontab", "-"], merged)
    return plan


def _install_systemd(command: list[str], log: Path, env: Mapping[str, str], run: Runner,
                     dry_run: bool, offset: int) -> Schedule:
    folder = _unit_dir(env)
    service, timer = systemd_units(command, log, offset)
    units = {folder / SERVICE: service, folder / TIMER: timer}
    plan = Schedule("systemd", list(units), message=f"systemd user timer {TIMER} runs sync "
                    f"every two minutes; output goes to {log}")
    changed = [p for p, text in units.items() if _read(p) != text.encode("utf-8")]
    replaced = folder / TIMER in changed and _read(folder / TIMER) is not None
    if not dry_run:
        for path in changed:
            _write(path, units[path].encode("utf-8"))
    if changed:
        _do(plan, run, dry_run, ["systemctl", "--user", "daemon-reload"])
    if _manager_sees(folder, run):
        _do(plan, run, dry_run, ["systemctl", "--user", "enable", "--now", TIMER])
    else:
        _do(plan, run, dry_run, ["systemctl", "--user", "link", str(folder / SERVICE)])
        _do(plan, run, dry_run, ["systemctl", "--user", "enable", "--now", str(folder / TIMER)])
    if replaced:  # a timer already running counts from its old settings until it starts again
        _do(plan, run, dry_run, ["systemctl", "--user", "restart", TIMER])
    return plan


def _install_launchd(command: list[str], log: Path, env: Mapping[str, str], run: Runner,
                     dry_run: bool, offset: int) -> Schedule:
    path, data = _plist_path(env), launchd_plist(command, log, offset)
    plan = Schedule("launchd", [path], message=f"LaunchAgent {LAUNCHD_LABEL} runs sync every "
                    f"two minutes; output goes to {log}")
    loaded = run(["launchctl", "print", f"{_domain()}/{LAUNCHD_LABEL}"], None).returncode == 0
    if _read(path) == data and loaded:
        return plan
    if not dry_run:
        _write(path, data)
    if loaded:
        _do(plan, run, dry_run, ["launchctl", "bootout", f"{_domain()}/{LAUNCHD_LABEL}"])
    _do(plan, run, dry_run, ["launchctl", "bootstrap", _domain(), str(path)])
    return plan


def _remove(plan: Schedule, path: Path, dry_run: bool) -> None:
    if path.exists():
        plan.files.append(path)
        if not dry_run:
            path.unlink()


def uninstall(env: Mapping[str, str], *, platform: str | None = None,
              run: Runner = default_run, dry_run: bool = False) -> Schedule:
    """Remove our job (and only ours) wherever it was installed."""
    system = _platform(platform)
    if system == "darwin":
        plan = Schedule("launchd", message=f"LaunchAgent {LAUNCHD_LABEL} removed")
        target = f"{_domain()}/{LAUNCHD_LABEL}"
        if run(["launchctl", "print", target], None).returncode == 0:
            _do(plan, run, dry_run, ["launchctl", "bootout", target])
        _remove(plan, _plist_path(env), dry_run)
        return plan
    if system == "win32":
        plan = Schedule("schtasks", message=f"Task Scheduler task {TASK_NAME} removed")
        if run(["schtasks", "/Query", "/TN", TASK_NAME], None).returncode == 0:
            _do(plan, run, dry_run, ["schtasks", "/Delete", "/F", "/TN", TASK_NAME])
        return plan
    plan = Schedule("none", message="no sync job was installed")
    folder = _unit_dir(env)
    if (folder / TIMER).exists() or (folder / SERVICE).exists():
        plan.kind, plan.message = "systemd", f"systemd user timer {TIMER} removed"
        systemd = _systemd_works(run)
        if systemd:  # disable also removes what `link` made; a unit not loaded is fine
            plan.commands.append(["systemctl", "--user", "disable", "--now", TIMER])
            if not _manager_sees(folder, run):
                plan.commands.append(["systemctl", "--user", "disable", SERVICE])
            for argv in plan.commands if not dry_run else []:
                run(argv, None)
        _remove(plan, folder / TIMER, dry_run)
        _remove(plan, folder / SERVICE, dry_run)
        if systemd:
            _do(plan, run, dry_run, ["systemctl", "--user", "daemon-reload"])
    current = _crontab(run)
    if current and not _same_crontab(current, merge_crontab(current, None)):
        plan.kind = "cron" if plan.kind == "none" else plan.kind
        plan.message += f"; crontab line tagged '{CRON_TAG}' removed"
        _do(plan, run, dry_run, ["crontab", "-"], merge_crontab(current, None))
    return plan


def status(env: Mapping[str, str], *, platform: str | None = None,
           run: Runner = default_run) -> tuple[bool, str]:
    """Whether the sync job is installed and active, and a sentence saying what was found."""
    system = _platform(platform)
    if system == "darwin":
        path = _plist_path(env)
        if run(["launchctl", "print", f"{_domain()}/{LAUNCHD_LABEL}"], None).returncode == 0:
            return True, f"LaunchAgent {LAUNCHD_LABEL} is loaded ({path})"
        if path.exists():
            return False, (f"{path} exists but is not loaded: run `launchctl bootstrap "
                           f"{_domain()} {path}`")
        return False, f"no LaunchAgent {LAUNCHD_LABEL}: re-run the client installer"
    if system == "win32":
        if run(["schtasks", "/Query", "/TN", TASK_NAME], None).returncode == 0:
            return True, f"Task Scheduler task {TASK_NAME} exists"
        return False, f"no Task Scheduler task {TASK_NAME}: re-run the client installer"
    if _systemd_works(run):
        enabled = run(["systemctl", "--user", "is-enabled", TIMER], None).returncode == 0
        active = run(["systemctl", "--user", "is-active", TIMER], None).returncode == 0
        if enabled and active:
            return True, f"systemd user timer {TIMER} is enabled and active"
        if enabled or (_unit_dir(env) / TIMER).exists():
            return False, (f"systemd user timer {TIMER} is not running: run `systemctl --user "
                           f"enable --now {TIMER}`")
    current = _crontab(run)
    if current and not _same_crontab(current, merge_crontab(current, None)):
        return True, f"crontab line tagged '{CRON_TAG}' is installed"
    return False, "no sync job is installed: re-run the client installer"
