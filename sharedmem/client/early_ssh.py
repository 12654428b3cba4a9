"""Start ssh for a sync before the rest of the program has loaded.

Loading what a sync needs takes tens of milliseconds and the SSH handshake hundreds, so `cli.main`
starts ssh first, from the raw `client.json`, when its transport plainly names an ssh host.
`transport.Connection` adopts that process only when the validated configuration gives the very
same command; otherwise (or when the sync ends before connecting) the early process is stopped.
Only the standard library and the base are imported here, and only what starting a process
needs: this module reads the file with the C JSON of fastjson.py and, where it can, starts ssh
with `os.posix_spawnp`, because `json`, `shlex` and `subprocess` (and the `re`, `enum`,
`signal` and `threading` they bring in) would delay the handshake.
"""

from __future__ import annotations

import os

from sharedmem.core import JSONError
from sharedmem.fastjson import loads

TYPE_CHECKING = False
if TYPE_CHECKING:
    import subprocess
    from collections.abc import Sequence
    from typing import IO

SSH_BASE = ("ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
            "-o", "ConnectTimeout=15", "-o", "ServerAliveInterval=15")

_started: tuple[list[str], subprocess.Popen[bytes] | Spawned] | None = None
# What shlex.quote leaves unquoted: ASCII word characters and these.
_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_@%+=:,./-")
_KILL = 9  # SIGKILL on every POSIX system; the signal module would load enum


def quote(word: str) -> str:
    """`shlex.quote`, to the byte, without loading `re`."""
    if not word:
        return "''"
    if all(c in _SAFE for c in word):
        return word
    return "'" + word.replace("'", "'\"'\"'") + "'"


def remote_words(command: Sequence[str]) -> str:
    """Quote a remote command for the server's shell, leaving a leading `~/` to expand there."""
    words = []
    for word in command:
        if word.startswith("~/"):
            words.append("~/" + quote(word[2:]))
        else:
            words.append(quote(word))
    return " ".join(words)


def ssh_argv(host: str, port: int | None, identity: str | None, options: Sequence[str],
             remote_command: Sequence[str]) -> list[str]:
    """The ssh invocation; OpenSSH reads its own files, so options pass through."""
    argv = list(SSH_BASE)
    if port is not None:
        argv += ["-p", str(port)]
    if identity is not None:
        argv += ["-i", identity, "-o", "IdentitiesOnly=yes"]
    for option in options:
        argv += ["-o", option]
    return [*argv, "--", host, remote_words(remote_command)]


def child_env() -> dict[str, str]:
    """The environment of the server end: ours, with UTF-8 standard streams for Python."""
    env = dict(os.environ)
    env.setdefault("PYTHONIOENCODING", "utf-8")
    return env


def spawn(argv: list[str]) -> subprocess.Popen[bytes]:
    """Start the server end with pipes on all three streams, in a session of its own."""
    import subprocess
    return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=child_env(), start_new_session=True)


class Spawned:
    """A child started by `os.posix_spawnp`: the part of `subprocess.Popen` the transport uses.

    The same pipes, session and environment as `spawn`, without loading `subprocess`.
    """

    def __init__(self, argv: list[str]) -> None:
        ends = [os.pipe() for _ in range(3)]  # stdin, stdout, stderr; not inherited by default
        child = (ends[0][0], ends[1][1], ends[2][1])
        try:
            self.pid = os.posix_spawnp(
                argv[0], argv, child_env(), setsid=True,
                file_actions=[(os.POSIX_SPAWN_DUP2, fd, n) for n, fd in enumerate(child)])
        except BaseException:
            for pair in ends:
                for fd in pair:
                    os.close(fd)
            raise
        for fd in child:
            os.close(fd)
        self.args = argv
        self.returncode: int | None = None
        self.stdin: IO[bytes] = os.fdopen(ends[0][1], "wb")
        self.stdout: IO[bytes] = os.fdopen(ends[1][0], "rb")
        self.stderr: IO[bytes] = os.fdopen(ends[2][0], "rb")

    def poll(self) -> int | None:
        """The exit status if the child has ended (it is then reaped), else None."""
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere (SIGCHLD ignored): gone, as Popen says
                pid, status = self.pid, 0
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the exit status; past `timeout` seconds, `subprocess.TimeoutExpired`."""
        if timeout is None:
            if self.returncode is None:
                try:
                    status = os.waitpid(self.pid, 0)[1]
                except ChildProcessError:
                    status = 0
                self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode
        import time
        deadline = time.monotonic() + timeout
        while (code := self.poll()) is None:
            if time.monotonic() >= deadline:
                import subprocess
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.005)
        return code

    def kill(self) -> None:
        """Kill the child unless it has been reaped (its pid may be another's by then)."""
        if self.returncode is None:
            try:
                os.kill(self.pid, _KILL)
            except ProcessLookupError:
                pass


def _spawn_early(argv: list[str]) -> subprocess.Popen[bytes] | Spawned:
    """`Spawned` where `os.posix_spawnp` can start a new session, else `spawn`."""
    if hasattr(os, "posix_spawnp") and hasattr(os, "POSIX_SPAWN_DUP2"):
        try:
            return Spawned(argv)
        except (NotImplementedError, TypeError):  # no setsid in this system's posix_spawn
            pass
    return spawn(argv)


def start(config_path: str) -> None:
    """Start ssh for this client.json if its transport is plainly ssh.

    Anything odd is left to the validated path, which reports it.
    """
    global _started
    try:
        with open(config_path, encoding="utf-8") as handle:
            transport = loads(handle.read())["transport"]
        identity = transport.get("identity")
        if transport.get("kind") != "ssh" or not (
                identity is None or isinstance(identity, str) and os.path.isabs(identity)
                and "$" not in identity and os.path.normpath(identity) == identity):
            return
        host, port = transport["host"], transport.get("port")
        options, command = transport.get("options", []), transport["remote_command"]
        if not (isinstance(host, str) and (port is None or type(port) is int)
                and isinstance(options, list) and isinstance(command, list)
                and all(isinstance(word, str) for word in options + command)):
            return
        argv = ssh_argv(host, port, identity, options, command)
        _started = (argv, _spawn_early(argv))
    except (OSError, ValueError, JSONError, KeyError, TypeError, AttributeError):
        return


def take(argv: list[str]) -> subprocess.Popen[bytes] | Spawned | None:
    """The process started early for exactly `argv`, or None (a different one is stopped)."""
    global _started
    started, _started = _started, None
    if started is None:
        return None
    if started[0] == argv:
        return started[1]
    _stop(started[1])
    return None


def discard() -> None:
    """Stop an early process that nothing adopted: the sync ended before connecting."""
    take([])


def _stop(process: subprocess.Popen[bytes] | Spawned) -> None:
    process.kill()
    process.wait()
    for stream in (process.stdin, process.stdout, process.stderr):
        if stream is not None:
            stream.close()
