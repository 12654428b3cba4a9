"""A real OpenSSH server on 127.0.0.1 with keys made on the spot, for tests and benchmarks.

Only loopback is used. The tests' `sshd` fixture and `scripts/bench.py sync` both start one here.
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LAUNCHER = REPO / "shared_memory.py"
SERVE = (sys.executable, "-S", str(LAUNCHER), "serve")  # as the installers write it
SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


class SshdUnavailable(RuntimeError):
    """sshd or the OpenSSH client tools are missing, or sshd would not start."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _keygen(path: Path, kind: str = "ed25519") -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", path.name, "-f", str(path)],
                   check=True, capture_output=True)
    return path.with_suffix(".pub").read_text().strip()


@dataclass
class Sshd:
    """A running sshd on 127.0.0.1 with a pinned key and an unpinned key made for the test."""

    root: Path
    port: int
    user: str
    store: Path
    pinned_key: Path
    free_key: Path
    known_hosts: Path
    config_file: Path
    process: subprocess.Popen | None = None
    serve_args: tuple[str, ...] = ()  # after `--store` in each `serve` it runs by default
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log = self.root / "sshd.log"

    def start(self) -> None:
        """Start sshd and wait until it accepts connections."""
        self.process = subprocess.Popen([SSHD, "-D", "-e", "-f", str(self.config_file)],
                                        stdout=subprocess.DEVNULL,
                                        stderr=self.log.open("ab"))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"sshd exited: {self.log.read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("sshd did not start listening in 10 s")

    def stop(self) -> None:
        """Stop sshd (connections already open end too)."""
        if self.process and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)
        self.process = None

    def hold_startup(self) -> socket.socket:
        """A connection that stays unauthenticated until it is closed: it counts for MaxStartups.

        Its banner read, sshd's child for it has started; it says nothing more. A connection
        made just before (`start`'s own check) may still count for a moment: one sshd drops
        for it is made again.
        """
        deadline = time.monotonic() + 10
        while True:
            sock = socket.create_connection(("127.0.0.1", self.port), timeout=10)
            try:
                if sock.recv(256).startswith(b"SSH-"):
                    return sock
            except OSError:
                pass
            sock.close()
            if time.monotonic() > deadline:
                raise RuntimeError("sshd sent no banner in 10 s to a connection it should count")
            time.sleep(0.05)

    def dropped(self) -> int:
        """Connections sshd dropped past MaxStartups so far (logged at LogLevel VERBOSE)."""
        return self.log.read_text(errors="replace").count("past MaxStartups")

    def transport(self, *, pinned: bool = True, store: Path | None = None,
                  remote_command: list[str] | None = None) -> dict:
        """A client.json transport section that reaches this sshd."""
        command = remote_command or [*SERVE, "--store", str(store or self.store),
                                     *self.serve_args]
        return {"kind": "ssh", "host": f"{self.user}@127.0.0.1", "port": self.port,
                "identity": str(self.pinned_key if pinned else self.free_key),
                "options": [f"UserKnownHostsFile={self.known_hosts}",
                            "GlobalKnownHostsFile=/dev/null", "LogLevel=ERROR"],
                "remote_command": command}


def pinned_line(store: Path, machine: str, key: str, serve_args: tuple[str, ...] = ()) -> str:
    """The authorized_keys line that pins `key` to `machine`, as install_server.py writes it.

    `serve_args` go after `--store` (a benchmark's `--limit NAME=VALUE` settings).
    """
    serve = " ".join(SERVE)
    extra = "".join(f" {arg}" for arg in serve_args)
    return (f'restrict,command="{serve} --store {store}{extra} '
            f'--machine {machine}" {key}')


def start_sshd(root: Path, store: Path, machine: str = "laptop",
               serve_args: tuple[str, ...] = (), max_startups: str = "50",
               log_level: str = "ERROR") -> Sshd:
    """Make keys and a config under `root`, then start sshd; raises SshdUnavailable with the reason.

    `serve_args` are added to every `serve` this sshd runs by default (`--limit` settings).
    `max_startups` is sshd's `MaxStartups` (`"1"`: a second connection still authenticating is
    dropped, as a busy server drops one); `log_level` its `LogLevel` (`VERBOSE` logs each drop
    to `sshd.log`).
    """
    if not Path(SSHD).exists():
        raise SshdUnavailable(f"OpenSSH server not installed ({SSHD}); .ci/run installs "
                              "openssh-server")
    if shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        raise SshdUnavailable("OpenSSH client (ssh, ssh-keygen) not installed")
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o700)
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    host_pub = _keygen(root / "host_ed25519")
    pinned_pub = _keygen(root / "pinned")
    free_pub = _keygen(root / "free")
    port = _free_port()
    authorized = root / "authorized_keys"
    authorized.write_text(pinned_line(store, machine, pinned_pub, serve_args) + "\n"
                          + free_pub + "\n")
    authorized.chmod(0o600)
    known = root / "known_hosts"
    known.write_text(f"[127.0.0.1]:{port} {host_pub}\n")
    # Sessions get a HOME of their own: the account's shell startup files are this machine's,
    # not the server's under test (a `~/.bashrc` that runs `pyenv init`, which bash reads for
    # every command sshd starts, cost each session here 150 ms), and nothing writes the real
    # HOME (tests never touch it).
    home = root / "home"
    home.mkdir(mode=0o700, exist_ok=True)
    config = root / "sshd_config"
    config.write_text("\n".join([
        f"Port {port}", "ListenAddress 127.0.0.1", f"HostKey {root / 'host_ed25519'}",
        f"AuthorizedKeysFile {authorized}", f"PidFile {root / 'sshd.pid'}",
        "StrictModes no", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
        "PubkeyAuthentication yes", "PermitRootLogin prohibit-password", "UsePAM no",
        f"SetEnv HOME={home}", f"LogLevel {log_level}", f"MaxStartups {max_startups}",
        "MaxSessions 50", ""]))
    server = Sshd(root, port, getpass.getuser(), store, root / "pinned", root / "free", known,
                  config, serve_args=tuple(serve_args))
    try:
        server.start()
    except RuntimeError as exc:
        raise SshdUnavailable(f"sshd cannot start here: {exc}") from None
    return server
