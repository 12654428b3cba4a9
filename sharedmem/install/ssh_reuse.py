"""ssh connection reuse: one master connection to the server, kept between scheduled syncs.

A sync over a new ssh connection spends about ten round trips on TCP and the SSH handshake
before the first byte of the exchange: most of a no-change sync over a real network. OpenSSH's
connection sharing (`ControlMaster=auto`) lets the first sync leave its connection open
(`ControlPersist`, longer than the schedule's period, so the next run finds it) and every later
sync open a session on it. The options are written into `transport.options` of client.json,
where every sync passes them to ssh as `-o`; removing them (or `--no-ssh-reuse`) turns it off.

The socket is `sharedmem-%C` (%C hashes the local host, the server, its port and the user) in
a folder only this account reaches: the client's state folder, which every sync creates if it
is gone, else `~/.ssh`. A Unix socket's path is at most 103 bytes on macOS and the BSDs (107 on Linux),
and OpenSSH first binds the path plus 17 bytes of a random suffix, so a folder whose path would
not fit is passed over; with none, reuse stays off and the installer says why.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from sharedmem.client.config import Transport
from sharedmem.client.early_ssh import ssh_argv
from sharedmem.clock import SYNC_INTERVAL_SECONDS

PERSIST_SECONDS = 3 * SYNC_INTERVAL_SECONDS  # a run missed or late still finds the connection
KEYS = ("ControlMaster", "ControlPath", "ControlPersist")
SOCKET = "sharedmem-%C"  # %C: 40 hex digits
SOCKET_BYTES = len("sharedmem-") + 40
SUN_PATH_MAX = 104  # sockaddr_un.sun_path on macOS and the BSDs, with its NUL (108 on Linux)
MUX_SUFFIX = 17  # OpenSSH binds "<path>.<16 random characters>", then renames it to <path>
HOME_FOLDER = ".ssh"


@dataclass(frozen=True)
class Plan:
    """Whether this install turns reuse on, the folder of its socket, and why not if not."""

    folder: Path | None
    reason: str = ""  # why reuse is off ("" when it is on)

    @property
    def options(self) -> list[str]:
        """The ssh -o values that turn reuse on (none when it is off)."""
        return [] if self.folder is None else options(self.folder)


def fits(folder: Path) -> bool:
    """Whether a socket in `folder` (and OpenSSH's temporary name for it) fits a Unix socket.

    A path OpenSSH's configuration parser would split or expand (white space, quotes, `%`) is
    refused too: this folder comes from a prefix or a home, not from the user's ssh options.
    """
    text = str(folder)
    if any(c.isspace() or c in "\"'\\%" for c in text):
        return False
    return len(os.fsencode(text)) + 1 + SOCKET_BYTES + MUX_SUFFIX < SUN_PATH_MAX


def candidates(state: Path, env: Mapping[str, str]) -> list[Path]:
    """The folders tried for the socket, in order: the state folder, then `~/.ssh`."""
    home = env.get("HOME")
    return [state, *([Path(home) / HOME_FOLDER] if home else [])]


def options(folder: Path) -> list[str]:
    """The three options, as client.json's `transport.options` holds them."""
    return ["ControlMaster=auto", f"ControlPath={folder}/{SOCKET}",
            f"ControlPersist={PERSIST_SECONDS}"]


def own_keys(given: Sequence[str]) -> list[str]:
    """The connection-sharing options among `given` (the user's own `--ssh-option` values)."""
    return [o for o in given if o.split("=", 1)[0].strip().lower() in
            {k.lower() for k in KEYS}]


def plan(state: Path, env: Mapping[str, str], given: Sequence[str], wanted: bool) -> Plan:
    """Where the socket goes, or why reuse stays off."""
    if not wanted:
        return Plan(None, "turned off with --no-ssh-reuse")
    if os.name == "nt":
        return Plan(None, "OpenSSH for Windows cannot share connections")
    if own := own_keys(given):
        return Plan(None, f"your --ssh-option {own[0]} decides")
    for folder in candidates(state, env):
        if fits(folder):
            return Plan(folder)
    tried = " or ".join(str(f) for f in candidates(state, env))
    return Plan(None, f"a socket in {tried} would pass the {SUN_PATH_MAX - 1}-byte limit of a "
                "Unix socket's path (or the path has spaces, quotes or %): install with a "
                "shorter --prefix to have it")


def prepare(folder: Path) -> None:
    """Make the socket's folder exist with mode 0700, or take others' write access away.

    Others reading the folder is harmless (ssh makes the socket 0600); others writing to it
    could swap the socket for their own.
    """
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = folder.stat()
    if (not hasattr(os, "getuid") or info.st_uid == os.getuid()) and info.st_mode & 0o022:
        os.chmod(folder, 0o700)


def ours(given: Sequence[str], state: Path, env: Mapping[str, str]) -> bool:
    """Whether `given` holds the reuse options an installer wrote for this state folder."""
    return any(set(options(f)) <= set(given) for f in candidates(state, env))


def control_path(given: Sequence[str]) -> str | None:
    """The ControlPath value among ssh options, as written (None when there is none)."""
    for option in given:
        key, _, value = option.partition("=")
        if key.strip().lower() == "controlpath":
            return value.strip()
    return None


def command(transport: Transport, *words: str) -> list[str]:
    """The ssh argv with the very options a sync uses (so `%C` names the same socket), and `words`."""
    argv = ssh_argv(str(transport.host), transport.port,
                    None if transport.identity is None else str(transport.identity),
                    transport.options, ())
    return [*argv[:-3], *words, "--", str(transport.host)]  # without "--", host, command


def _run(argv: list[str], timeout: float = 15.0) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        return subprocess.CompletedProcess(argv, 127, "", f"{argv[0]}: not found")
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, 124, "", f"{argv[0]} timed out")


def settings(transport: Transport) -> dict[str, str]:
    """What ssh makes of this transport's options (`ssh -G`): lower-case keys, expanded values.

    Empty when ssh cannot say (not installed, or an option it refuses).
    """
    done = _run(command(transport, "-G"))
    if done.returncode != 0:
        return {}
    found: dict[str, str] = {}
    for line in done.stdout.splitlines():
        key, _, value = line.partition(" ")
        found.setdefault(key, value)
    return found


def check(transport: Transport) -> tuple[bool, str]:
    """Whether a master connection runs for this transport (`ssh -O check`), and ssh's words."""
    done = _run(command(transport, "-O", "check"))
    said = (done.stderr.strip() or done.stdout.strip()).splitlines()
    return done.returncode == 0, said[-1] if said else f"exit status {done.returncode}"


def stop(transport: Transport) -> bool:
    """Close a running master connection (`ssh -O exit`); True when one was stopped."""
    return _run(command(transport, "-O", "exit")).returncode == 0
