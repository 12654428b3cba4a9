"""The sync job on every platform: generated texts, merges, and installs through a recorder.

The recorder below stands in for the operating system (systemctl, crontab, launchctl,
schtasks): it records each argv and answers like the real tool would. The real Linux install
runs only with SHAREDMEM_TEST_REAL_SCHEDULE=1, because it touches the real user's systemd
manager or crontab.
"""

from __future__ import annotations

import os
import plistlib
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sharedmem.core import InstallError
from sharedmem.install import scheduler as s

CMD = ["/usr/bin/python3", "/home/u/.local/share/codex-shared-memory/shared_memory.py", "sync",
       "--config", "/home/u/my files/client.json"]
LOG = Path("/home/u/.local/share/codex-shared-memory/sync.log")
PROBES = {"show-environment", "show", "is-enabled", "is-active", "-l", "print", "/Query"}


class Recorder:
    """Stands in for the operating system: records argv and stdin, answers like the tools."""

    def __init__(self, *, systemd: bool = False, unit_path: str = "", cron: bool = True,
                 crontab: str | None = None, loaded: bool = False, task: bool = False) -> None:
        self.systemd, self.unit_path, self.cron, self.crontab = systemd, unit_path, cron, crontab
        self.loaded, self.task, self.enabled = loaded, task, False
        self.calls: list[list[str]] = []
        self.stdins: list[str | None] = []

    def __call__(self, argv: list[str], stdin: str | None = None) -> subprocess.CompletedProcess:
        self.calls.append(list(argv))
        self.stdins.append(stdin)
        rc, out, err = self.answer(argv, stdin)
        return subprocess.CompletedProcess(argv, rc, out, err)

    def answer(self, argv: list[str], stdin: str | None) -> tuple[int, str, str]:
        tool, verb = argv[0], argv[1] if len(argv) > 1 else ""
        if tool == "systemctl":
            verb = argv[2]
            if not self.systemd:
                return 1, "", "Failed to connect to bus: No medium found"
            if verb == "show":
                return 0, self.unit_path + "\n", ""
            if verb in ("enable", "disable"):
                self.enabled = verb == "enable"
            if verb in ("is-enabled", "is-active"):
                return (0, "enabled\n", "") if self.enabled else (1, "disabled\n", "")
            return 0, "", ""
        if tool == "crontab":
            if not self.cron:
                return 127, "", "crontab: command not found"
            if verb == "-l":
                if self.crontab is None:
                    return 1, "", "no crontab for u\n"
                return 0, self.crontab, ""
            self.crontab = stdin
            return 0, "", ""
        if tool == "launchctl":
            if verb == "print":
                return (0, "state = waiting", "") if self.loaded else (113, "", "not found")
            self.loaded = verb == "bootstrap"
            return 0, "", ""
        if tool == "schtasks":
            if verb == "/Query":
                return (0, TASK_LISTING, "") if self.task else (1, "", "ERROR: cannot find")
            self.task = verb == "/Create"
            return 0, "SUCCESS", ""
        raise AssertionError(f"unexpected command {argv}")

    def changes(self) -> list[list[str]]:
        return [c for c in self.calls if not PROBES & set(c[1:3])]


TASK_LISTING = "TaskName  Next Run Time  Status\n\\CodexSharedMemorySync  N/A  Ready\n"


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "home").mkdir()
    return {"HOME": str(tmp_path / "home")}


# --- generated texts ---------------------------------------------------------------------------

def test_systemd_units_content() -> None:
    tricky = ["/opt/py thon/python3", 'say "hi"', "50% of $HOME", "back\\slash"]
    service, timer = s.systemd_units(tricky, Path("/var/log/50%.log"))
    lines = service.splitlines()
    assert "Type=oneshot" in lines
    assert ('ExecStart="/opt/py thon/python3" "say \\"hi\\"" "50%% of $$HOME" "back\\\\slash"'
            in lines)
    assert "StandardOutput=append:/var/log/50%%.log" in lines
    assert "StandardError=append:/var/log/50%%.log" in lines
    timer_lines = timer.splitlines()
    for wanted in ("OnActiveSec=0s", "OnUnitActiveSec=120s", "AccuracySec=1s",
                   "Unit=codex-shared-memory-sync.service", "WantedBy=timers.target"):
        assert wanted in timer_lines
    assert "OnActiveSec=95s" in s.systemd_units(tricky, LOG, 95)[1].splitlines()
    with pytest.raises(InstallError, match="line breaks"):
        s.systemd_units(["/bin/x", "a\nb"], LOG)
    for bad in (-1, 120, 1.5, True):
        with pytest.raises(InstallError, match="offset must be a whole number of seconds"):
            s.systemd_units(CMD, LOG, bad)


def test_each_machine_has_its_own_second_of_the_period() -> None:
    """Fixed by the name, so a re-install keeps it; spread over the period for a team."""
    assert s.spread("laptop") == s.spread("laptop") == 95 and s.spread("desk") == 72
    team = [s.spread(f"dev-{i:02}") for i in range(1, 41)]
    assert all(0 <= second < 120 for second in team)
    assert len(set(team)) >= 30 and min(team) < 20 and max(team) > 100
    assert sum(second < 60 for second in team) in range(10, 31)  # both minutes of the two



@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze here")
def test_systemd_units_verify(tmp_path: Path) -> None:
    """systemd itself parses the units: a program path with a space must stay one word."""
    program = tmp_path / "py thon" / "python3"
    program.parent.mkdir()
    program.symlink_to(sys.executable)
    service, timer = s.systemd_units([str(program), "-c", 'print("50% $HOME")'],
                                     tmp_path / "my log.log", 95)
    (tmp_path / "codex-shared-memory-sync.service").write_text(service)
    (tmp_path / "codex-shared-memory-sync.timer").write_text(timer)
    result = subprocess.run(["systemd-analyze", "verify", "codex-shared-memory-sync.service",
                             "codex-shared-memory-sync.timer"], cwd=tmp_path,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    (tmp_path / "codex-shared-memory-sync.service").write_text(
        service.replace(f'"{program}"', str(program)))  # unquoted: the space splits the path
    result = subprocess.run(["systemd-analyze", "verify", "codex-shared-memory-sync.service"],
                            cwd=tmp_path, capture_output=True, text=True)
    assert "not executable" in result.stderr

def test_cron_line_runs_under_a_real_shell(tmp_path: Path) -> None:
    log = tmp_path / "my logs" / "sync.log"
    log.parent.mkdir()
    command = [sys.executable, "-c", "import sys; print('50% done', sys.argv[1:])", "it's", "$X"]
    assert s.cron_line(command, log).startswith("0-59/2 * * * * " + shlex.quote(sys.executable))
    line = s.cron_line(command, log, 61)  # the odd minutes, one second into them
    assert line.startswith("1-59/2 * * * * sleep 1; ") and line.endswith(" # codex-shared-memory")
    assert "50\\% done" in line  # a bare % would end the command under cron
    body = line[len("1-59/2 * * * * "):-len(" # codex-shared-memory")].replace("\\%", "%")
    subprocess.run(["/bin/sh", "-c", body], check=True, env={"X": "expanded"})
    subprocess.run(["/bin/sh", "-c", body], check=True)
    assert log.read_text() == "50% done [\"it's\", '$X']\n" * 2


def test_merge_crontab_replaces_only_ours() -> None:
    others = "MAILTO=me\n# a comment\n0 3 * * * /usr/bin/backup\n"
    old = others.replace("# a comment\n", "# a comment\n*/5 * * * * old-sync # codex-shared-memory\n")
    merged = s.merge_crontab(old, "NEW # codex-shared-memory")
    assert merged == others.replace("# a comment\n", "# a comment\nNEW # codex-shared-memory\n")
    assert s.merge_crontab(merged, None) == others
    assert s.merge_crontab("", "L # codex-shared-memory") == "L # codex-shared-memory\n"
    assert s.merge_crontab("x", None) == "x\n"


def test_launchd_plist_content() -> None:
    data = plistlib.loads(s.launchd_plist(CMD, LOG))
    assert data == {"Label": "com.codex-shared-memory.sync", "ProgramArguments": CMD,
                    "StartCalendarInterval": [{"Minute": m} for m in range(0, 60, 2)],
                    "RunAtLoad": True, "ProcessType": "Background",
                    "StandardOutPath": str(LOG), "StandardErrorPath": str(LOG)}
    late = plistlib.loads(s.launchd_plist(CMD, LOG, 95))
    assert late["StartCalendarInterval"] == [{"Minute": m} for m in range(1, 60, 2)]
    assert late["ProgramArguments"] == ["/bin/sh", "-c", f"sleep 35; exec {shlex.join(CMD)}"]


def test_launchd_program_sleeps_then_runs_the_command_under_a_real_shell(tmp_path: Path) -> None:
    command = [sys.executable, "-c", "import sys; print(sys.argv[1:])", "it's", "$X", "a b"]
    program = plistlib.loads(s.launchd_plist(command, LOG, 61))["ProgramArguments"]
    started = time.monotonic()
    done = subprocess.run(program, capture_output=True, text=True, check=True)
    assert done.stdout == "[\"it's\", '$X', 'a b']\n" and time.monotonic() - started >= 1


def test_schtasks_argv() -> None:
    win = ["C:\\Python311\\python.exe", "C:\\csm\\shared_memory.py", "sync", "--config",
           "C:\\csm\\client.json"]
    argv = s.schtasks_create(win, Path("C:\\csm\\sync.log"))
    assert argv[:12] == ["schtasks", "/Create", "/F", "/SC", "MINUTE", "/MO", "2", "/ST", "00:00",
                         "/TN", "CodexSharedMemorySync", "/TR"]
    assert argv[12] == ('cmd /c "C:\\Python311\\python.exe C:\\csm\\shared_memory.py sync '
                        '--config C:\\csm\\client.json >> C:\\csm\\sync.log 2>&1"')
    late = s.schtasks_create(win, Path("C:\\csm\\sync.log"), 95)
    assert late[7:9] == ["/ST", "00:01"]  # the odd minutes
    assert late[12] == ('cmd /c "C:\\Python311\\python.exe -c __import__(\'time\').sleep(35) & '
                        'C:\\Python311\\python.exe C:\\csm\\shared_memory.py sync '
                        '--config C:\\csm\\client.json >> C:\\csm\\sync.log 2>&1"')
    spaced = ["C:\\Program Files\\Python\\python.exe", "x"]
    assert '"C:\\Program Files\\Python\\python.exe" x >> ' in s.schtasks_create(spaced, LOG)[12]


# --- Linux ---------------------------------------------------------------------------------------

def test_systemd_install_idempotent_and_uninstall(tmp_path: Path, env: dict[str, str]) -> None:
    env = {**env, "XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    folder = tmp_path / "xdg" / "systemd" / "user"
    log = tmp_path / "prefix" / "sync.log"
    rec = Recorder(systemd=True, unit_path=f"/etc/systemd/user {folder}")
    plan = s.install(CMD, log, env, machine="laptop", platform="linux", run=rec)
    assert plan.kind == "systemd"
    assert plan.files == [folder / "codex-shared-memory-sync.service",
                          folder / "codex-shared-memory-sync.timer"]
    assert (plan.files[0].read_text(), plan.files[1].read_text()) == s.systemd_units(
        CMD, log, s.spread("laptop"))
    assert "OnActiveSec=95s" in plan.files[1].read_text().splitlines()
    assert log.parent.is_dir()
    assert rec.changes() == [["systemctl", "--user", "daemon-reload"],
                             ["systemctl", "--user", "enable", "--now",
                              "codex-shared-memory-sync.timer"]]
    assert s.status(env, platform="linux", run=rec)[0] is True

    rec.calls.clear()
    again = s.install(CMD, log, env, machine="laptop", platform="linux", run=rec)
    assert again.commands == [["systemctl", "--user", "enable", "--now",
                                "codex-shared-memory-sync.timer"]]

    rec.calls.clear()
    gone = s.uninstall(env, platform="linux", run=rec)
    assert gone.kind == "systemd" and not folder.joinpath("codex-shared-memory-sync.timer").exists()
    assert ["systemctl", "--user", "disable", "--now", "codex-shared-memory-sync.timer"] in rec.calls
    installed, why = s.status(env, platform="linux", run=rec)
    assert installed is False and "no sync job" in why


def test_a_timer_installed_before_is_restarted_on_its_new_second(tmp_path: Path,
                                                                env: dict[str, str]) -> None:
    env = {**env, "XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    folder = tmp_path / "xdg" / "systemd" / "user"
    folder.mkdir(parents=True)
    service, timer = s.systemd_units(CMD, LOG, 0)
    (folder / "codex-shared-memory-sync.service").write_text(service)
    (folder / "codex-shared-memory-sync.timer").write_text(  # as an older release wrote it
        timer.replace("OnActiveSec=0s", "OnBootSec=2min"))
    rec = Recorder(systemd=True, unit_path=str(folder))
    s.install(CMD, LOG, env, machine="desk", platform="linux", run=rec)
    assert "OnActiveSec=72s" in (folder / "codex-shared-memory-sync.timer").read_text()
    assert rec.changes() == [["systemctl", "--user", "daemon-reload"],
                             ["systemctl", "--user", "enable", "--now",
                              "codex-shared-memory-sync.timer"],
                             ["systemctl", "--user", "restart", "codex-shared-memory-sync.timer"]]
    rec.calls.clear()
    s.install(CMD, LOG, env, machine="desk", platform="linux", run=rec)  # the same: no restart
    assert rec.changes() == [["systemctl", "--user", "enable", "--now",
                              "codex-shared-memory-sync.timer"]]


def test_systemd_links_when_manager_does_not_see_folder(env: dict[str, str]) -> None:
    rec = Recorder(systemd=True, unit_path="/real/home/.config/systemd/user")
    plan = s.install(CMD, LOG.with_name("x.log"), env, machine="laptop", platform="linux",
                     run=rec, dry_run=True)
    folder = Path(env["HOME"]) / ".config" / "systemd" / "user"
    assert plan.commands[1:] == [
        ["systemctl", "--user", "link", str(folder / "codex-shared-memory-sync.service")],
        ["systemctl", "--user", "enable", "--now", str(folder / "codex-shared-memory-sync.timer")]]
    assert rec.changes() == [] and not folder.exists()  # dry run: nothing written or run
    s.install(CMD, LOG.with_name("x.log"), env, machine="laptop", platform="linux", run=rec)
    rec.calls.clear()
    s.uninstall(env, platform="linux", run=rec)
    assert rec.changes() == [
        ["systemctl", "--user", "disable", "--now", "codex-shared-memory-sync.timer"],
        ["systemctl", "--user", "disable", "codex-shared-memory-sync.service"],
        ["systemctl", "--user", "daemon-reload"]]
    assert not any(folder.iterdir())


def test_cron_install_merge_and_uninstall(tmp_path: Path, env: dict[str, str]) -> None:
    others = "MAILTO=me\n0 3 * * * /usr/bin/backup\n"
    rec = Recorder(crontab=others + "*/9 * * * * stale # codex-shared-memory\n")
    log = tmp_path / "sync.log"
    plan = s.install(CMD, log, env, machine="laptop", platform="linux", run=rec)
    assert plan.kind == "cron" and plan.commands == [["crontab", "-"]]
    assert rec.crontab == others + s.cron_line(CMD, log, s.spread("laptop")) + "\n"
    assert s.cron_line(CMD, log, 95).startswith("1-59/2 * * * * sleep 35; ")
    assert s.status(env, platform="linux", run=rec) == (
        True, "crontab line tagged '# codex-shared-memory' is installed")

    rec.calls.clear()
    assert s.install(CMD, log, env, machine="laptop", platform="linux", run=rec).commands == []
    assert rec.changes() == []

    plan = s.uninstall(env, platform="linux", run=rec)
    assert plan.kind == "cron" and rec.crontab == others
    assert s.uninstall(env, platform="linux", run=rec).commands == []


def test_cron_dry_run_and_no_scheduler(env: dict[str, str]) -> None:
    rec = Recorder(crontab=None)
    plan = s.install(CMD, LOG, env, machine="laptop", platform="linux", run=rec, dry_run=True)
    assert plan.commands == [["crontab", "-"]] and rec.changes() == [] and rec.crontab is None
    with pytest.raises(InstallError, match="neither `systemctl --user` nor `crontab`"):
        s.install(CMD, LOG, env, machine="laptop", platform="linux", run=Recorder(cron=False))


# --- macOS and Windows -------------------------------------------------------------------------

def test_launchd_install_reinstall_uninstall(tmp_path: Path, env: dict[str, str]) -> None:
    log = tmp_path / "sync.log"
    rec = Recorder()
    plan = s.install(CMD, log, env, machine="laptop", platform="darwin", run=rec)
    path = Path(env["HOME"]) / "Library" / "LaunchAgents" / "com.codex-shared-memory.sync.plist"
    domain = f"gui/{os.getuid()}"
    assert plan.files == [path] and path.read_bytes() == s.launchd_plist(CMD, log, 95)
    assert rec.changes() == [["launchctl", "bootstrap", domain, str(path)]]
    assert s.status(env, platform="darwin", run=rec)[0] is True

    rec.calls.clear()
    assert s.install(CMD, log, env, machine="laptop", platform="darwin", run=rec).commands == []

    moved = [*CMD[:-1], "/elsewhere/client.json"]
    s.install(moved, log, env, machine="laptop", platform="darwin", run=rec)
    assert rec.changes() == [["launchctl", "bootout", f"{domain}/com.codex-shared-memory.sync"],
                             ["launchctl", "bootstrap", domain, str(path)]]
    assert plistlib.loads(path.read_bytes())["ProgramArguments"][-1].endswith(
        "sync --config /elsewhere/client.json")

    plan = s.uninstall(env, platform="darwin", run=rec)
    assert not path.exists() and plan.files == [path]
    assert s.status(env, platform="darwin", run=rec)[0] is False


def test_schtasks_install_and_uninstall(tmp_path: Path, env: dict[str, str]) -> None:
    rec = Recorder()
    log = tmp_path / "sync.log"
    plan = s.install(CMD, log, env, machine="laptop", platform="win32", run=rec)
    assert plan.kind == "schtasks" and rec.changes() == [s.schtasks_create(CMD, log, 95)]
    assert s.status(env, platform="win32", run=rec)[0] is True
    s.uninstall(env, platform="win32", run=rec)
    assert rec.changes()[-1] == ["schtasks", "/Delete", "/F", "/TN", "CodexSharedMemorySync"]
    assert s.status(env, platform="win32", run=rec)[0] is False


def test_schtasks_long_command_uses_wrapper(tmp_path: Path, env: dict[str, str]) -> None:
    long_cmd = [*CMD[:-1], "C:\\" + "very-long-folder\\" * 20 + "client.json"]
    log = tmp_path / "sync.log"
    rec = Recorder()
    plan = s.install(long_cmd, log, env, machine="laptop", platform="win32", run=rec)
    wrapper = tmp_path / "codex-shared-memory-sync.cmd"
    assert plan.files == [wrapper]
    assert rec.calls[-1][-1] == str(wrapper)
    text = wrapper.read_bytes().decode()
    assert text.startswith("@echo off\r\n") and subprocess.list2cmdline(long_cmd) in text
    assert ">> " in text and "2>&1" in text


def test_unknown_platform(env: dict[str, str]) -> None:
    with pytest.raises(InstallError, match="aix"):
        s.install(CMD, LOG, env, machine="laptop", platform="aix", run=Recorder())


# --- the real thing (opt-in) -------------------------------------------------------------------

REAL = os.environ.get("SHAREDMEM_TEST_REAL_SCHEDULE") == "1"
OPT_IN = "touches the real user's scheduler: set SHAREDMEM_TEST_REAL_SCHEDULE=1 to run it"


def _systemd_user_works() -> bool:
    return shutil.which("systemctl") is not None and s.default_run(
        ["systemctl", "--user", "show-environment"], None).returncode == 0


@pytest.mark.skipif(not REAL, reason=OPT_IN)
@pytest.mark.skipif(sys.platform != "linux", reason="systemd is Linux only")
def test_real_systemd(tmp_path: Path, env: dict[str, str]) -> None:
    if not _systemd_user_works():
        pytest.skip("`systemctl --user` does not work here (no user manager or bus)")
    log = tmp_path / "sync.log"
    command = [sys.executable, "-c", "print('tick')"]
    try:
        assert s.install(command, log, env, machine="laptop", platform="linux").kind == "systemd"
        assert s.status(env, platform="linux")[0] is True
        deadline = time.monotonic() + 60
        while not (log.exists() and "tick" in log.read_text()) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert "tick" in log.read_text()
    finally:
        s.uninstall(env, platform="linux")
    assert s.status(env, platform="linux")[0] is False


@pytest.mark.skipif(not REAL, reason=OPT_IN)
@pytest.mark.skipif(sys.platform != "linux", reason="cron path is tested on Linux")
def test_real_crontab(tmp_path: Path, env: dict[str, str]) -> None:
    if shutil.which("crontab") is None:
        pytest.skip("no `crontab` binary on this machine")
    if _systemd_user_works():
        pytest.skip("`systemctl --user` works here, so install would choose systemd")
    listing = s.default_run(["crontab", "-l"], None)
    original = listing.stdout if listing.returncode == 0 else None
    try:
        s.install([sys.executable, "-c", "pass"], tmp_path / "sync.log", env, machine="laptop",
                  platform="linux")
        now = s.default_run(["crontab", "-l"], None).stdout
        assert s.cron_line([sys.executable, "-c", "pass"], tmp_path / "sync.log",
                           s.spread("laptop")) in now
        assert s.merge_crontab(now, None) == s.merge_crontab(original or "", None)
        s.uninstall(env, platform="linux")
        after = s.default_run(["crontab", "-l"], None).stdout
        assert "# codex-shared-memory" not in after
    finally:
        if original is not None:
            s.default_run(["crontab", "-"], original)
        else:
            s.default_run(["crontab", "-r"], None)


def test_shlex_quoting_round_trips() -> None:
    line = s.cron_line(CMD, LOG)
    words = shlex.split(line[len("0-59/2 * * * * "):-len(" # codex-shared-memory")])
    assert words == [*CMD, ">>", str(LOG), "2>&1"]
