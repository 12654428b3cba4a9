"""How a client reaches `serve`: a local child process, or `ssh` to the server.

Either way the session is the same newline-delimited JSON over the child's stdin and stdout,
compressed after the hellos when both offer it (version 3). A sync that remembers the server's
hello (`state/server.json`) goes on as soon as its own hello is sent, and checks the answer
before it uses any other reply (docs/PROTOCOL.md "Optimistic hello").

Every wait on the server has a deadline (deadlines.py). An ssh connection that sshd
resets before authentication (a busy server's MaxStartups) is started again, a few times, with
everything sent so far sent again: nothing of it reached the server.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import threading
import time
from collections.abc import Iterator

from sharedmem import __version__
from sharedmem.client.config import ClientConfig, Transport
from sharedmem.client.deadlines import Watch
from sharedmem.client.early_ssh import spawn, ssh_argv, take
from sharedmem.core import ProtocolError, SharedMemoryError, TransportError
from sharedmem.files import atomic_write
from sharedmem.program import LAUNCHER, PYTHON_FLAGS
from sharedmem.protocol import COMPRESSIONS, VERSIONS, Channel, PeerError, printable

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

LEFT_MESSAGES = 64  # what a server end that went away may have said first, read for its error
SERVER_RECORD = "server.json"  # in the state folder: the last server hello a sync took
REMEMBERED = ("version", "compress", "ahead_bytes", "server")  # of that hello
# Written to the server end a slice at a time, so a long line on a slow link shows as progress
# while it drains (`Watch`); read through a buffer of a pipe's capacity.
WRITE_SLICE = 64 * 1024
READ_BUFFER = 64 * 1024
RESET_EXIT_WAIT = 5.0  # seconds ssh has to exit once its output ended, for a reset to be retried
BUSY_PAUSE = 1.0  # seconds before the first retry of a busy sshd: doubled each time, jittered
BUSY_PAUSE_MAX = 16.0
# What ssh says when the server's sshd drops the connection before its banner (MaxStartups),
# or closes it before authentication; and what rules a retry out.
RESET_SIGNS = ("exchange_identification", "Connection reset by", "Connection closed by")
NOT_A_RESET = ("Permission denied", "Host key verification failed", "host key",
               "Could not resolve", "Connection refused", "timed out",
               "Too many authentication failures")


class HelloChanged(ProtocolError):
    """The server's hello is not the one remembered: the sync starts again, not optimistic."""


def _timeout() -> type[Exception]:
    """`subprocess.TimeoutExpired`, loaded only once a wait has run out.

    An ssh sync whose process started early never loads `subprocess` otherwise.
    """
    import subprocess
    return subprocess.TimeoutExpired


def ssh_command(transport: Transport) -> list[str]:
    """The ssh invocation for a transport; OpenSSH reads its own files, so options pass through."""
    return ssh_argv(str(transport.host), transport.port,
                    None if transport.identity is None else str(transport.identity),
                    transport.options, transport.remote_command)


def server_command(config: ClientConfig, max_version: int | None = None) -> list[str]:
    """The argv that starts the server end for this configuration."""
    if config.transport.kind == "local":
        argv = [sys.executable, *PYTHON_FLAGS, str(LAUNCHER), "serve", "--store",
                str(config.transport.store)]
        if max_version is not None:
            argv += ["--max-protocol", str(max_version)]
        return argv
    return ssh_command(config.transport)


def refused_before_authentication(stderr: str) -> bool:
    """Whether ssh's complaint is a connection the server reset or closed before authentication.

    sshd past `MaxStartups` drops a new connection before it sends its banner
    (`kex_exchange_identification: read: Connection reset by peer`, or `... Connection closed
    by remote host`); a refused key, an unknown host key or a name that does not resolve is no
    such thing, and is not retried.
    """
    return any(sign in stderr for sign in RESET_SIGNS) and not any(
        other in stderr for other in NOT_A_RESET)


def explain_ssh(stderr: str, transport: Transport, tries: int = 1) -> str:
    """Turn ssh's complaint into a sentence that says how to fix it.

    `tries`: how many connections were started, each reset before authentication.
    """
    host = transport.host
    port = f" -p {transport.port}" if transport.port else ""
    text = stderr.strip().splitlines()[-1] if stderr.strip() else "ssh exited with no message"
    tried = f" ({tries} tries)" if tries > 1 else ""
    if "exchange_identification" in stderr and refused_before_authentication(stderr):
        return (f"the server refused the connection while busy (sshd MaxStartups): {host}{port} "
                f"closed it before authentication{tried} ({text}), so nothing was sent. The next "
                "sync tries again; if this happens often, raise MaxStartups in the server's "
                "sshd_config or spread the machines' schedules (docs/OPERATIONS.md \"Many "
                "machines on one server: ssh\"). sshd's PerSourcePenalties or a hosts.deny rule "
                "refuse connections the same way")
    if "Host key verification failed" in stderr or "No ED25519 host key is known" in stderr \
            or "host key for" in stderr.lower() and "not known" in stderr.lower():
        return (f"the host key of {host} is not known (or changed), and strict checking is on: "
                f"run `ssh{port} {host} true` once by hand to check and accept the key, or add it "
                f"to ~/.ssh/known_hosts with ssh-keyscan{port} {host}")
    if "Permission denied" in stderr:
        return (f"{host} refused this client's key ({text}): non-interactive SSH needs a key in "
                f"the server's ~/.ssh/authorized_keys (install_server.py --authorize NAME --key "
                f"PUBKEY prints the line), or pass --ssh-identity with the right private key")
    if "Connection refused" in stderr or "Could not resolve" in stderr or "timed out" in stderr:
        return f"cannot reach {host}{port} ({text}): check the host name, port and that sshd runs"
    return f"ssh to {host} failed{tried}: {text}"


class Connection:
    """A running server end and the channel to it; closing it ends the child cleanly."""

    def __init__(self, config: ClientConfig, max_version: int = max(VERSIONS)) -> None:
        self.config = config
        self.versions = [v for v in VERSIONS if v <= max_version]
        self.argv = server_command(config, max_version if max_version < max(VERSIONS) else None)
        self.where = (f"ssh {config.transport.host}" if config.transport.kind == "ssh"
                      else f"the local store {config.transport.store}")
        try:
            process = take(self.argv) or spawn(self.argv)  # ssh may have started before we loaded
        except OSError as exc:
            raise TransportError(f"cannot start {self.argv[0]!r} to reach {self.where}: {exc}; "
                                 "install OpenSSH's client or fix the transport") from None
        self._carried = 0  # bytes moved by the server ends before this one (`moved`)
        self._open(process)
        self.channel: _ServerChannel = _ServerChannel(self, self._input_stream, self._output)
        # Until the server's first byte, every line sent is kept: an ssh connection reset before
        # authentication is started again and they go again (`_restart`). ssh reads nothing
        # of its input before authentication, so the lines kept then are a pipe's worth.
        self._replay: list[tuple[bytes, bool]] | None = (
            [] if config.transport.kind == "ssh" and config.timeouts.busy_retries else None)
        self._tries = 1  # server ends started
        self._generation = 0  # how many times the server end was started again
        self._sending = threading.RLock()  # one line at a time, and no line during a restart
        self._closing = False
        self.last_sent = "hello"  # the type of the last line sent, as a deadline names it
        self._gone: SharedMemoryError | None = None
        self.version = 0
        self.server: dict[str, Any] = {}
        self.early: dict[str, Any] | None = None  # the server's hello, once it has come
        # Offered in the hello (version 3 only): the client compresses when the server says so.
        self.compress = config.compresses and max(self.versions) >= 3
        self.record = config.state / SERVER_RECORD
        self.key = {"transport": config.to_json()["transport"], "versions": self.versions,
                    "compress": self.compress}
        self.assumed: dict[str, Any] | None = None  # the remembered hello, until checked
        self.changed = False  # the real hello was not the one remembered
        self.remembers = False  # a sync's session (`handshake`) keeps the hello for the next
        self.recorded: dict[str, Any] | None = None  # the record as `handshake` read it
        # A sync's session reads the server's hello on a thread, and after it the `received`
        # reports (`_read_start`); the answer, and what the thread read past the reports, wait
        # for the first read of this thread (`_ServerChannel.receive`).
        self._starter: threading.Thread | None = None
        self._answer: list[dict[str, Any] | ProtocolError] = []
        self._hello_read = threading.Event()
        self._held: list[dict[str, Any] | None | ProtocolError] = []
        self.watch = Watch(config.timeouts, self.where, config.path, self.moved, self.stop_server)

    def _open(self, process: Any) -> None:
        """Take a started server end: its pipes, counted, and a thread reading its stderr."""
        assert process.stdin is not None and process.stdout is not None
        self.process = process
        self._input = _Received(process.stdout.fileno())
        self._input_stream = io.BufferedReader(self._input, READ_BUFFER)
        self._output = _Sent(process.stdin.fileno())
        self._stderr: list[bytes] = []
        self._stderr_reader = threading.Thread(target=self._drain, args=(process, self._stderr),
                                               daemon=True)
        self._stderr_reader.start()

    def moved(self) -> int:
        """Bytes moved between this client and the server ends so far, both ways, on the wire."""
        return self._carried + self._input.count + self._output.count

    @staticmethod
    def _drain(process: Any, kept: list[bytes]) -> None:
        assert process.stderr is not None
        for line in process.stderr:
            if sum(map(len, kept)) < 64 * 1024:
                kept.append(line)

    def stderr(self) -> str:
        """What the server end (or ssh) said on stderr so far."""
        return b"".join(self._stderr).decode("utf-8", "replace")

    def hello(self) -> dict[str, Any]:
        """Open the session; a dead transport becomes a TransportError that says how to fix it."""
        self._send_hello()
        answer: list[dict[str, Any] | ProtocolError] = []
        self._read_hello(answer)
        return self._accept(answer[0])

    @contextlib.contextmanager
    def handshake(self, *, expect: bool = False) -> Iterator[None]:
        """Open the session while the body of the `with` runs, so local work overlaps SSH's.

        The hello goes out first; a thread reads the answer meanwhile, so `early` holds it as
        soon as it comes and the body may start sending then (send_ahead.py). The answer is
        taken and checked once the body is done.
        """
        self.remembers = True
        self.recorded = self.remembered()
        remembered = self.recorded or (self.expected() if expect else None)
        self._send_hello(reports=True)
        if remembered is not None:  # the answer is checked before the first other reply
            self._assume(remembered)
        self._starter = threading.Thread(target=self._read_start, args=(remembered is None,),
                                         daemon=True, name="sharedmem-hello")
        self._starter.start()
        if remembered is not None:
            yield
            return
        try:
            yield
        except PeerError:
            raise
        except ProtocolError:  # a body sent ahead found the server end gone
            with self.watch.waiting("its answer to its hello"):
                self._hello_read.wait()
            raise self.failure() from None
        with self.watch.waiting("its answer to its hello"):  # not on other errors, above:
            self._hello_read.wait()  # the hello may be slow to come, or never
        self._accept(self._answer[0])

    def _send_hello(self, *, reports: bool = False) -> None:
        hello: dict[str, Any] = {"type": "hello", "versions": self.versions,
                                 "client": f"sharedmem/{__version__}",
                                 "machine": self.config.machine}
        if self.compress:
            hello["compress"] = list(COMPRESSIONS)
            if reports:  # a sync's: how fast the link takes its stream (`_read_start`)
                hello["reports"] = True
        try:
            self.channel.send(hello)
        except PeerError:
            raise
        except ProtocolError:
            raise self.failure() from None

    def _read_hello(self, answer: list[dict[str, Any] | ProtocolError],
                    early: bool = True) -> None:
        try:
            reply = self.channel.expect("hello")
        except ProtocolError as exc:
            answer.append(exc)
            return
        answer.append(reply)
        if reply.get("compress") is not None and self._compressed(reply):
            if not self.channel.compressing:  # before `early`: bodies ahead go compressed
                self.channel.compress_output()
            self.channel.decompress_input()
        if early:  # not while a remembered hello stands in for it: `check_hello` sets it
            self.early = reply

    def _read_start(self, early: bool) -> None:
        """On a thread: read the hello, then the server's `received` reports while bodies go.

        The reports (version 3, compressed, when the hello says `reports`) come until one says
        `last`, which the server sends before it answers anything; each tells the channel how
        fast the link takes this side's stream (`Channel.arrived`). Anything else read here
        (an `error`, the end of input, a malformed report) is held for the first read of the
        sync's own thread.
        """
        try:
            self._read_hello(self._answer, early)
        finally:
            self._hello_read.set()
        reply = self._answer[0]
        if isinstance(reply, ProtocolError) or reply.get("reports") is not True or (
                not self._compressed(reply)):
            return
        while True:
            try:
                message = Channel.receive(self.channel)
            except ProtocolError as exc:
                self._held.append(exc)
                return
            if message is None or message["type"] != "received":
                self._held.append(message)
                return
            wire, at, last = message.get("bytes"), message.get("seconds"), message.get("last")
            if (type(wire) is not int or wire < 0 or type(at) not in (int, float)
                    or last not in (None, True)):
                self._held.append(self.malformed("received", "bytes must be a count, seconds "
                                                 "a number and last true if present"))
                return
            self.channel.arrived(wire, float(at))
            if last:
                return

    def _started(self) -> list[dict[str, Any] | None | ProtocolError]:
        """Wait for the thread that reads the hello and the reports; what it held past them."""
        starter, self._starter = self._starter, None
        if starter is None:
            return []
        starter.join()
        held, self._held = self._held, []
        return held

    def _compressed(self, reply: dict[str, Any]) -> bool:
        """Whether the server's hello turns compression on, as this client offered it."""
        return self.compress and reply.get("version") == 3 and reply.get("compress") in COMPRESSIONS

    def remembered(self) -> dict[str, Any] | None:
        """The server's hello as the last sync over this very transport took it, or None."""
        try:
            record = json.loads(self.record.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(record, dict) or record.get("key") != self.key:
            return None
        hello = record.get("hello")
        if (not isinstance(hello, dict) or hello.get("version") not in self.versions
                or hello.get("compress") not in (None, *COMPRESSIONS)
                or hello.get("compress") is not None and not self.compress
                or type(hello.get("ahead_bytes")) not in (int, type(None))):
            return None
        return hello

    def expected(self) -> dict[str, Any] | None:
        """With no record, what a server of this version answers by default, over ssh.

        A first sync then sends while ssh opens the session and the server starts. An older
        server, or one with a smaller namespace quota, costs that first sync one reconnect,
        after which the record says what it answers. Not over ssh to this machine
        (`Transport.loopback`): there the hello comes at once, and bodies sent before it
        made a first sync of 10,000 files slower (2.50 s against 2.25 s).
        """
        transport = self.config.transport
        if transport.kind != "ssh" or transport.loopback or max(self.versions) < 3:
            return None
        expected: dict[str, Any] = {"version": max(self.versions),
                                    "ahead_bytes": self.config.limits.namespace_bytes}
        if self.compress:
            expected["compress"] = COMPRESSIONS[0]
        return expected

    def _assume(self, hello: dict[str, Any]) -> None:
        """Go on as if the server had answered `hello` again; `check_hello` reads the real one."""
        self.assumed = hello
        self.version = hello["version"]
        self.server = {"type": "hello", **hello}
        if hello.get("compress") is not None:
            self.channel.compress_output()
        self.early = self.server

    def check_hello(self) -> None:
        """Read the server's real hello, once, before any other reply is used.

        One that disagrees with what was assumed (an older server, compression refused, less
        room ahead, no raw bodies where they were assumed) forgets the record and ends this
        try: the sync runs again, not optimistic.
        """
        assumed, self.assumed = self.assumed, None
        if assumed is None:
            return
        self._hello_read.wait()  # `handshake`'s thread reads it, as it does every sync's
        reply = self._accept(self._answer[0])
        ahead, was = reply.get("ahead_bytes"), assumed.get("ahead_bytes")
        if (reply.get("version") != assumed["version"]
                or reply.get("compress") != assumed.get("compress")
                or (was is not None and (ahead is None or ahead < was))):
            self.changed = True
            self.forget()
            raise HelloChanged(
                f"the server at {self.where} answered protocol version {reply.get('version')}, "
                f"compression {reply.get('compress')!r} and ahead_bytes {ahead!r}, not what "
                "the last sync recorded; the record is forgotten and the sync runs again")
        self.early = reply

    def forget(self) -> None:
        """Drop the remembered hello: the next session waits for the server's answer."""
        with contextlib.suppress(OSError):
            self.record.unlink()

    def remember(self) -> None:
        """Keep a sync's hello for the next sync over the same transport, if it changed.

        Only a sync writes it: `history`, `doctor` and the rest leave the state folder alone.
        """
        if not self.remembers or not self.server or self.assumed is not None or self.changed:
            return
        hello = {k: self.server[k] for k in REMEMBERED if self.server.get(k) is not None}
        record = {"key": self.key, "hello": hello}
        if self.recorded == hello:  # as read when the session began: nothing to write
            return
        with contextlib.suppress(OSError):  # a full disk: the next sync only waits a round trip
            self.record.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(self.record, json.dumps(record).encode("utf-8"), mode=0o600,
                         durable=False)

    def _accept(self, reply: dict[str, Any] | ProtocolError) -> dict[str, Any]:
        """Take the server's answer to the hello: the version it chose, or why it refused."""
        if isinstance(reply, PeerError):
            raise reply
        if isinstance(reply, ProtocolError):
            raise self.failure() from None
        version, server, ahead = reply.get("version"), reply.get("server"), reply.get("ahead_bytes")
        if type(version) is not int:
            raise self.malformed("hello", "version must be an integer")
        if version not in self.versions:
            raise ProtocolError(f"the server chose protocol version {version!r}, which this "
                                f"client does not speak ({self.versions})")
        if not (server is None or type(server) is str) or not (
                ahead is None or type(ahead) is int):
            raise self.malformed("hello", "server must be a string and ahead_bytes an integer")
        if reply.get("compress") is not None and not self._compressed(reply):
            raise self.malformed("hello", f"compress {reply.get('compress')!r} was not offered "
                                 "(only version 3 compresses, and only what the client offers)")
        self.version = version
        self.server = reply
        if version >= 3:  # a `files` message's texts follow its line, raw
            self.channel.take_raw_texts("files")
        return reply

    def malformed(self, kind: str, detail: str) -> ProtocolError:
        """The error for a reply of the right type whose fields are missing or of the wrong shape.

        One line naming the server and the message: a sync that meets one changes nothing here.
        """
        return ProtocolError(
            f"the server ({self.where}) sent a malformed {kind} message: {detail}. The cache "
            "was left as it was; run the same sharedmem release on the server as here, or find "
            "out what answers in its place")

    def explain(self, exc: PeerError) -> PeerError:
        """The server's `error` reply as this side says it: a full disk names the server and the fix.

        Other errors are the server's own words. `store` with SQLite's "disk is full" is how a
        server from before `disk-full` says it.
        """
        said = " ".join(printable(str(exc)).split())  # one line, whatever the server sent
        if exc.code != "disk-full" and not (exc.code == "store" and "disk is full" in said):
            return exc
        if len(said) > 1000:
            said = said[:1000] + "..."
        return PeerError(exc.code, f"the server's disk is full ({self.where}), so the server "
                         "stored nothing more, and this machine's cache and the notes waiting to "
                         f"go are as they were. The server says: {said}", remote=True)

    def gone(self) -> SharedMemoryError:
        """Why the server end stopped reading while this side wrote: its `error`, if it sent one.

        A server that fails (a full disk, say) answers an error and ends while the client may
        still be sending (bodies ahead): that write finds the pipe closed, and the answer waits
        unread behind it. Once the server end has exited, what it wrote is read for it. A
        server end stopped past a deadline is said as that.
        """
        if (expired := self.expired()) is not None:
            return expired
        if self._gone is None:
            reason = self.failure()  # the process is gone, or stopped: its stdout ends
            try:
                self._gone = self._left_error() or ProtocolError(str(reason))
            except HelloChanged as exc:  # an older server refused what was sent optimistically
                self._gone = exc
        return self._gone

    def _left_error(self) -> PeerError | None:
        try:
            self.check_hello()
        except HelloChanged:
            raise
        except PeerError as exc:
            return exc if exc.remote else None
        except SharedMemoryError:  # no hello came: the server end's exit says why (`failure`)
            return None
        try:
            for _ in range(LEFT_MESSAGES):
                if self.channel.receive() is None:
                    return None
        except PeerError as exc:
            return exc if exc.remote else None
        except (ProtocolError, OSError, ValueError):
            return None
        return None

    def failure(self) -> TransportError:
        """Why the server end went away, as an error with a fix."""
        if (expired := self.expired()) is not None:
            return expired
        try:
            code = self.process.wait(timeout=20)
        except _timeout():
            self.process.kill()
            code = self.process.wait()
        self._stderr_reader.join(timeout=5)
        if (expired := self.expired()) is not None:  # it ran out while this waited
            return expired
        said = self.stderr()
        if self.config.transport.kind == "ssh" and code == 255:
            return TransportError(explain_ssh(said, self.config.transport, self._tries))
        last = said.strip().splitlines()[-1] if said.strip() else f"exit status {code}"
        return TransportError(f"the server end at {self.where} stopped: {last}")

    def expired(self) -> TransportError | None:
        """The error of a session stopped past a deadline (`Watch`), or None."""
        reason = self.watch.reason
        return None if reason is None else TransportError(reason)

    def stop_server(self) -> None:
        """Kill the server end and what it started (it leads a session of its own: ssh, serve)."""
        process = self.process
        if process.poll() is not None:
            return
        if hasattr(os, "killpg"):
            import signal
            with contextlib.suppress(OSError):
                os.killpg(process.pid, signal.SIGKILL)
                return
        process.kill()

    def write(self, data: bytes) -> None:
        """Send one line on the channel; one ssh reset before authentication starts it again.

        The lines sent before the server's first byte are kept (`_replay`) until then.
        """
        with self._sending:
            self.last_sent = _kind(data)
            replay = self._replay
            if replay is not None:
                if self._input.count:  # the server has answered: nothing to send again
                    self._replay = replay = None
                else:
                    replay.append((data, self.channel.compressing))
            generation = self._generation
            try:
                with self.watch.waiting(f"its {self.last_sent} message", sending=True):
                    Channel.send_line(self.channel, data)
                return
            except ProtocolError:
                if self._restart(generation):  # this line went again, after those before it
                    return
        raise self.gone() from None

    def restarted(self, generation: int) -> bool:
        """Whether the server end of `generation` was replaced: now, after a reset, or already.

        Only an ssh connection that sshd reset or closed before authentication, before the
        server said anything, is started again, at most `timeouts.busy_retries` times.
        """
        if generation != self._generation:
            return True
        if self._replay is None or self._input.count:
            return False
        with self._sending:
            return self._restart(generation)

    def _restart(self, generation: int) -> bool:
        """`restarted`, with the sending lock held: start ssh again and send the kept lines."""
        if generation != self._generation:
            return True
        while (self._replay is not None and not self._closing and self.watch.reason is None
               and self._tries <= self.config.timeouts.busy_retries
               and self._reset_before_authentication()):
            with self.watch.paused():
                time.sleep(busy_pause(self._tries))
                self._tries += 1
                try:
                    process = spawn(self.argv)
                except OSError:
                    return False
            self._retire()
            self._open(process)
            self._generation += 1
            self.channel = _ServerChannel(self, self._input_stream, self._output)
            try:
                for line, compressed in self._replay:
                    if compressed and not self.channel.compressing:
                        self.channel.compress_output()
                    Channel.send_line(self.channel, line)
            except ProtocolError:
                continue  # reset again: the loop looks at why
            return True
        return False

    def _reset_before_authentication(self) -> bool:
        """Whether this ssh exited as one the server reset before authentication does."""
        if self.config.transport.kind != "ssh" or self._input.count:
            return False
        try:
            code = self.process.wait(timeout=RESET_EXIT_WAIT)
        except _timeout():
            return False
        self._stderr_reader.join(timeout=5)
        return code == 255 and refused_before_authentication(self.stderr())

    def _retire(self) -> None:
        """Let go of a server end that has exited, before another takes its place."""
        self._carried += self._input.count + self._output.count
        self._output.close()
        for stream in (self.process.stdin, self.process.stdout, self.process.stderr):
            with contextlib.suppress(OSError):
                stream.close()

    def close(self) -> None:
        """Say bye and reap the child; kill it if it does not go."""
        self._closing = True  # a bye is not worth starting ssh again
        with contextlib.suppress(SharedMemoryError):
            self.channel.send({"type": "bye"})
        self.watch.stop()
        self._output.close()
        with contextlib.suppress(OSError):
            self.process.stdin.close()
        if self.process.poll() is None:
            threading.Thread(target=self._reap, daemon=True).start()
        else:
            self._reap()

    def _reap(self) -> None:
        """Wait for the child to finish its exit (everything is committed by now); kill a hung one.

        Runs in the background, so a sync does not wait for the far end's interpreter shutdown.
        """
        try:
            self.process.wait(timeout=30)
        except _timeout():
            self.process.kill()
            self.process.wait()
        assert self.process.stdout is not None
        self.process.stdout.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        if kind is None:
            self.remember()
        self.close()


class _ServerChannel(Channel):
    """The channel to the server end, whose `error` replies and going away `Connection` explains.

    Its lines go through `Connection.write`; its waits for the server are watched
    (`Connection.watch`). A server end started again after a reset gets a new one, to which a
    read begun on this one goes on.
    """

    def __init__(self, conn: Connection, reader: Any, writer: Any) -> None:
        super().__init__(reader, writer, "server")
        self.conn = conn
        self.awaited = "its next message"  # what `expect` waits for, as a deadline names it

    def expect(self, *types: str) -> dict[str, Any]:
        self.awaited = " or ".join(types)
        return super().expect(*types)

    def receive(self) -> dict[str, Any] | None:
        conn = self.conn
        if threading.current_thread() is conn._starter:  # the hello's own thread: not a wait
            return self._next_message()
        with conn.watch.waiting(f"its answer to its {conn.last_sent} ({self.awaited})"):
            try:
                if conn.assumed is not None:
                    conn.check_hello()
                for held in conn._started():  # what the hello's thread read past the reports
                    if isinstance(held, PeerError) and held.remote:
                        raise conn.explain(held)
                    if isinstance(held, ProtocolError):
                        raise held
                    return held
                return self._next_message()
            except ProtocolError:
                if (expired := conn.expired()) is not None:
                    raise expired from None
                raise

    def _next_message(self) -> dict[str, Any] | None:
        """The next message, from the server end started again if this one was reset."""
        conn = self.conn
        generation = conn._generation
        try:
            message = super().receive()
        except PeerError as exc:
            if exc.remote:
                raise conn.explain(exc) from None
            raise
        if message is None:
            if conn.expired() is not None:
                raise conn.expired()  # type: ignore[misc]
            if conn.restarted(generation):
                return conn.channel._next_message()
        return message

    def send_line(self, data: bytes) -> None:
        self.conn.write(data)

    def ended(self, types: tuple[str, ...]) -> ProtocolError:
        """Why the server end stopped in mid-session: its last words on stderr, or its status."""
        return ProtocolError(f"{super().ended(types)}; {self.conn.failure()}")


def _kind(line: bytes) -> str:
    """The type of an encoded message, read from its start, for what a deadline names."""
    start = line.find(b'"type":"', 0, 64)
    end = line.find(b'"', start + 8, start + 40) if start >= 0 else -1
    return line[start + 8:end].decode("ascii", "replace") if end > 0 else "next"


def busy_pause(tries: int) -> float:
    """Seconds to wait before the next connection to a busy server: growing, and jittered.

    Half the step is fixed and half random, so machines reset together come back apart.
    """
    import random
    step = min(BUSY_PAUSE_MAX, BUSY_PAUSE * 2 ** (tries - 1))
    return step / 2 + random.uniform(0, step / 2)


class _Received(io.FileIO):
    """The server end's output, counting the bytes read from it (`Connection.moved`)."""

    def __init__(self, fd: int) -> None:
        super().__init__(fd, "rb", closefd=False)
        self.count = 0

    def readinto(self, buffer: Any) -> int | None:
        n = super().readinto(buffer)
        if n:
            self.count += n
        return n


class _Sent:
    """The server end's input: written a slice at a time, counting the bytes it took.

    Nothing is buffered here, so nothing is left to write once it is closed; after that a
    write fails instead of reaching whatever file reused the descriptor.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.count = 0

    def write(self, data: Any) -> int:
        view = memoryview(data)
        while view:
            n = os.write(self.fd, view[:WRITE_SLICE])
            self.count += n
            view = view[n:]
        return len(data)

    def flush(self) -> None:
        """Each write has reached the pipe when it returns."""

    def close(self) -> None:
        """Write no more; the process's own stream object closes the descriptor."""
        self.fd = -1
