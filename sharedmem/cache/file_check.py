"""The cache's files compared with the manifest by their stat, by a helper process.

Before every pull a sync makes sure the manifest is intact and each cached file is what it
records (`Cache.check_files`): SQLite's integrity check, each sha256 checked to be 64
lower-case hex digits, and one `lstat` a file. A damaged manifest is rebuilt from the files
before the sync trusts it. While the sync walks its sources, its own
process is busy and the other CPU mostly waits on ssh's handshake. So a helper process (this
file, run as a script: it needs only the standard library) reads the manifest's rows and stats
the files meanwhile, and names those whose size, time or type differ from their row. The sync
then hashes only those, as it would have. A helper that has not finished when the sync needs
its answer is waited for once it is past its start-up (`HEAD_START`), for at most
`WAIT_LIMIT`: the rest of its pass costs less than the sync's own from the start. One that
has only just started (a sync with little to walk), one past the limit and one that failed
(a damaged manifest, no interpreter to start) are stopped; the sync then checks the files
itself and finds what it always did.

A cache of fewer than `MIN_FILES` is checked by the sync itself: starting a helper costs more.
"""

from __future__ import annotations

import os
import stat
import sys
import time
from collections.abc import Iterable, Iterator

TYPE_CHECKING = False  # subprocess loads only where os.posix_spawn is missing (`start`)
if TYPE_CHECKING:
    import subprocess

MIN_FILES = 512  # below this, the sync's own check costs less than starting a helper
DAMAGED = 3  # the helper's status when the manifest is damaged: its output says why
_SEP = "\0"  # paths are separated by NUL, which no path holds
# Seconds a helper has run when its answer is due, past which the sync waits for it instead of
# stopping it: by then it has started its interpreter and opened the manifest, and the rest of
# its pass costs less than the sync's own pass from the start.
HEAD_START = 0.05
WAIT_LIMIT = 2.0  # seconds the sync waits for such a helper at most (one stalled, or starved)


def differing(root: str, rows: Iterable[tuple[str, int, int | None, str]]) -> Iterator[str]:
    """The paths of `rows` (path, size, mtime_ns, sha256) below `root` not as recorded.

    Gone, unreadable, not a regular file (a link is not followed), or of another size or
    modification time; an unknown time always differs. A row whose sha256 is not 64
    lower-case hex digits raises ValueError naming it: the manifest is damaged.
    """
    base = root + os.sep
    lstat, regular = os.lstat, stat.S_ISREG
    for path, size, mtime, sha in rows:
        if not _hex_sha256(sha):
            raise ValueError(f"the sha256 recorded for {path!r} is not 64 lower-case hex digits")
        try:
            info = lstat(base + path)
        except OSError:
            yield path
            continue
        if info.st_mtime_ns != mtime or info.st_size != size or not regular(info.st_mode):
            yield path


def _hex_sha256(text: object) -> bool:
    """Whether `text` is a sha256 as 64 lower-case hex digits (`bytes.fromhex` checks in C).

    `bytes.fromhex` refuses all but hex digits and the ASCII blanks it skips, which leave
    fewer than 32 bytes.
    """
    if type(text) is not str or len(text) != 64 or text != text.lower():
        return False
    try:
        return len(bytes.fromhex(text)) == 32
    except ValueError:
        return False


class Check:
    """One helper at work: its answer is taken once (`answer`), or it is stopped (`discard`)."""

    def __init__(self, pid: int | None, output: int, process: subprocess.Popen[bytes] | None
                 ) -> None:
        self._pid, self._output, self._process = pid, output, process
        self._started = time.monotonic()
        self.damage: str | None = None  # why the manifest is damaged, if the helper found it

    def answer(self, *, wait: bool = False) -> list[str] | None:
        """The paths the helper found differing if it has finished well, else None.

        A helper that found the manifest damaged answers None, and `damage` says why.

        With `wait`, it is waited for however long it takes. Otherwise one still at work is
        waited for up to `WAIT_LIMIT` if it is past `HEAD_START`, and stopped if not (or past
        the limit): the sync then checks the files itself, as it did before helpers. One with
        little to walk gets there before a helper could do much.
        """
        if wait:
            data = self._read()  # all of it first: a helper blocked on a full pipe never ends
            code = self._reap(True)
        else:
            code, data = self._reap(False), None
            if code is None and time.monotonic() - self._started >= HEAD_START:
                data = self._read_by(time.monotonic() + WAIT_LIMIT)
                if data is not None:  # its output ended: it is exiting
                    code = self._reap(True)
            if code is None:
                self.discard()
                return None
            if data is None:
                data = self._read()  # it has ended: the pipe holds all it wrote
        if code == DAMAGED and data:
            self.damage = data.decode("utf-8", "replace")
            return None
        if code != 0 or data is None:  # an answer cut short ends so too
            return None
        return data.decode("utf-8").split(_SEP)[:-1]

    def discard(self) -> None:
        """Stop a helper whose answer will not be read, and reap it."""
        if self._pid is None and self._process is None:
            return
        try:
            if self._process is not None:
                self._process.kill()
            else:
                assert self._pid is not None
                os.kill(self._pid, 9)  # SIGKILL on every POSIX system; signal would load enum
        except OSError:
            pass
        self._reap(True)
        self._read()

    def _read(self) -> bytes | None:
        """Everything in the pipe up to its end; None when it cannot be read."""
        if self._output < 0:
            return None
        chunks = []
        try:
            while chunk := os.read(self._output, 1 << 16):
                chunks.append(chunk)
        except OSError:
            return None
        finally:
            os.close(self._output)
            self._output = -1
        return b"".join(chunks)

    def _read_by(self, deadline: float) -> bytes | None:
        """Everything in the pipe up to its end if that comes by `deadline`, else None.

        None at once where a pipe cannot be waited on with a timeout (Windows): the helper is
        stopped there, as before helpers were waited for.
        """
        if self._output < 0 or os.name == "nt":
            return None
        import select  # loaded only here: a sync that finds its helper done never needs it
        chunks = []
        try:
            while (left := deadline - time.monotonic()) > 0:
                if not select.select([self._output], [], [], left)[0]:
                    return None
                chunk = os.read(self._output, 1 << 16)
                if not chunk:
                    os.close(self._output)
                    self._output = -1
                    return b"".join(chunks)
                chunks.append(chunk)
        except OSError:
            return None
        return None

    def _reap(self, wait: bool) -> int | None:
        """The helper's exit status once it has ended (reaped then); None while it runs."""
        pid, process = self._pid, self._process
        if process is not None:
            code = process.wait() if wait else process.poll()
        elif pid is None:
            return -1
        else:
            try:
                done, status = os.waitpid(pid, 0 if wait else os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: its answer says whether it ended well
                done, status = pid, 0
            code = os.waitstatus_to_exitcode(status) if done else None
        if code is not None:
            self._pid = self._process = None
        return code


def start(root: str, manifest: str, query: str, check: str) -> Check | None:
    """A helper checking the files below `root` against the rows `query` reads from `manifest`.

    `check` is the statement that checks the manifest's pages first (it answers "ok").
    None when it cannot start: the sync then checks every file itself.
    """
    argv = [sys.executable, "-I", "-S", os.path.abspath(__file__), root, manifest, query, check]
    read, write = os.pipe()  # neither end is inherited unless handed to the helper
    try:
        if hasattr(os, "posix_spawn"):  # without loading subprocess (and its 8 imports)
            pid = os.posix_spawn(argv[0], argv, os.environ, file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, write, 1),
                (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0)])
            return Check(pid, read, None)
        import subprocess
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=write,
                                   stderr=subprocess.DEVNULL)
        return Check(None, read, process)
    except (OSError, ValueError):
        os.close(read)
        return None
    finally:
        os.close(write)


def _uri(path: str) -> str:
    """A read-only SQLite URI of `path`, so that the helper never makes a file that is gone."""
    path = os.path.abspath(path).replace(os.sep, "/")
    quoted = "".join(f"%{ord(c):02x}" if c in "%?#" else c for c in path)
    return f"file:{'' if quoted.startswith('/') else '/'}{quoted}?mode=ro"


def main(argv: list[str]) -> int:
    """Print the differing paths, each followed by a NUL; 0 once all are written.

    A damaged manifest prints why instead, status DAMAGED.
    """
    import sqlite3
    root, manifest, query, check = argv
    status = 0
    try:
        conn = sqlite3.connect(_uri(manifest), uri=True)
        try:  # streamed: no row is held (100,000 of them would be tens of megabytes)
            problems = [str(row[0]) for row in conn.execute(check)]
            if problems != ["ok"]:
                found = f"{manifest} is damaged ({'; '.join(problems[:3])})"
                status = DAMAGED
            else:
                found = "".join(p + _SEP for p in differing(root, conn.execute(query)))
        except ValueError as exc:
            found, status = f"{manifest} is damaged: {exc}", DAMAGED
        finally:
            conn.close()
    except sqlite3.Error:
        return 1  # the sync reads the rows itself, and reports damage as damage
    data = found.encode("utf-8")
    try:
        while data:
            data = data[os.write(1, data):]
    except OSError:
        return 1  # the sync is gone
    return status


if __name__ == "__main__":
    import gc
    gc.disable()  # it makes no cycles: collections over its rows would free nothing
    if hasattr(os, "nice"):  # ssh's handshake, on the same CPU, is what the sync waits for
        os.nice(19)
    sys.exit(main(sys.argv[1:]))
