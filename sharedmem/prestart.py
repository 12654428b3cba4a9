"""Start ssh for a sync before the rest of the program has loaded.

Loading what a sync needs takes tens of milliseconds and the SSH handshake hundreds, so `cli.main`
starts ssh first, from the raw `client.json`, when its transport plainly names an ssh host.
`transport.Connection` adopts that process only when the validated configuration gives the very
same command; otherwise (or when the sync ends before connecting) the early process is stopped.
Only the standard library is imported here, and only what starting a process needs.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

SSH_BASE = ("ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
            "-o", "ConnectTimeout=15", "-o", "ServerAliveInterval=15")

_started: tuple[list[str], subprocess.Popen[bytes]] | None = None


def remote_words(command: Sequence[str]) -> str:
    """Quote a remote command for the server's shell, leaving a leading `~/` to expand there."""
    words = []
    for word in command:
        if word.startswith("~/"):
            words.append("~/" + shlex.quote(word[2:]))
        else:
            words.append(shlex.quote(word))
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
    return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=child_env(), start_new_session=True)


def start(config_path: str) -> None:
    """Start ssh for this client.json if its transport is plainly ssh.

    Anything odd is left to the validated path, which reports it.
    """
    global _started
    try:
        with open(config_path, encoding="utf-8") as handle:
            transport = json.load(handle)["transport"]
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
        _started = (argv, spawn(argv))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return


def take(argv: list[str]) -> subprocess.Popen[bytes] | None:
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


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.kill()
    process.wait()
    for stream in (process.stdin, process.stdout, process.stderr):
        if stream is not None:
            stream.close()
