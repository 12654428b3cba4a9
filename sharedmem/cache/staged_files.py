"""Cache files written ahead by a helper process, while the sync is still reading and sending.

A sync knows the text of every file it publishes. Writing those files into the cache is the
slowest part of a large sync (creating a file costs the kernel more than reading and redacting
it), and it has to wait for the server's answer, because a failed sync must leave the cache as
it was. So a helper process (this file, run as a script: it needs only the standard library)
writes them into `<cache>/.sharedmem/staging/` on the other CPU while the sync walks, redacts
and sends. `Cache.apply` then moves each one into place with one rename (its pre-staged
writer, writers.py), and only when the pull says that very path holds that very sha256. The
files of a namespace the cache does not have yet are staged at their own cache paths, so that
the whole namespace can move in with one rename of its folder; the others as `<n>.part`, which
makes no folders. A thread would not do: the walk holds the GIL.

Fewer than `MIN_FILES` are not staged at all: starting a helper costs more than the pull's
own writes of so few. What is not used is deleted. A sync that was killed leaves the folder;
the next one empties it before staging anything.

The texts the server sends in a pull are staged here too, by the sync itself as each `files`
message arrives (`put`), so a pull holds one message of texts at a time, not all of them, and
the cache still changes only once the whole answer has come and been checked. A text of a
namespace the cache does not have (`pull_trees`: all of a first pull's) is staged at its own
cache path, so the commit moves the whole namespace in with one rename of its folder instead of
one a file (`move_tree`); any other is named by a hash of its cache path and sha256
(`<hash>.pull`). Either way finding it again needs no record kept here: a first pull of 100,000
files holds no Python object per file for its staging.
"""

from __future__ import annotations

import errno
import io
import os
import stat
import sys
import threading
from array import array
from pathlib import Path
from queue import SimpleQueue

TYPE_CHECKING = False  # subprocess loads only when a helper starts (`Staging._start`)
if TYPE_CHECKING:
    import subprocess
    from collections.abc import Callable
    from typing import BinaryIO, TextIO

STAGING_DIR = "staging"
BATCH_BYTES = 1 << 20  # texts go to the helper in batches: one GIL hand-off per batch
MIN_FILES = 256  # below this, starting a helper costs more than apply's own writes
FULL = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}  # no room: the disk or a quota
TOO_LARGE = {errno.EFBIG}  # past a file size limit (the file system's, or `ulimit -f`)
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)  # a file made here


def write_failure(path: str, exc: OSError) -> str:
    """What went wrong writing `path` and what to do, alike for a full disk, quota or size limit.

    The cache and its staging folder share a disk, so the fix is the same for each: the
    staging, the cache's commit (cache.py) and the sync's own records (sync.py) say it so.
    """
    reason = exc.strerror or str(exc)
    if exc.errno in FULL:
        return (f"no space left on device writing {path} ({reason}): free space on that disk "
                "(`df -h` shows it), then sync again")
    if exc.errno in TOO_LARGE:
        return (f"file too large writing {path} ({reason}): that disk, or this process's file "
                "size limit (`ulimit -f`), allows no more; free space or raise the limit, then "
                "sync again")
    return (f"cannot write {path} ({reason}): check that folder's permissions and free space, "
            "then sync again")


class Staging:
    """The staged files of one sync, each by its cache path and sha256.

    The files the helper writes (the sync's own, whose texts it holds anyway) are kept by
    number: by path, their sha256, size and name. The pull's texts (`put`) keep nothing: each
    file's name is its cache path (in a namespace of `pull_trees`, put once) or derived from
    its path and sha256 (`_pull_name`), and the file is the record. Only counts by namespace
    are kept, for `move_tree`.
    """

    def __init__(self, meta: Path, new_namespaces: frozenset[str] = frozenset(),
                 min_files: int = MIN_FILES) -> None:
        self.folder = meta / STAGING_DIR
        self._base = os.path.join(self.folder, "")  # a name below it is this and the name
        self.min_files = min_files
        self.new_namespaces = new_namespaces  # the sync's own files there: staged as a tree
        self.numbers: dict[str, int] = {}  # by cache path: its latest number
        self.shas: list[str] = []  # by number
        self.sizes: array[int] = array("q")  # by number
        self.names: dict[int, str] = {}  # by number: below the folder, or <n>.part
        self.written: set[int] = set()  # by the helper; a `.pull` is written when staged
        # By number: each written file's time as the helper found it once closed (-1: none).
        # A rename keeps it, so the commit records a file moved in without a stat of its own.
        self.mtimes: array[int] = array("q")
        self.pull_trees: frozenset[str] = frozenset()  # pulled texts staged as a tree (put)
        self._tree_files: dict[str, int] = {}  # by namespace: texts staged in its tree
        self._own_tree_files: dict[str, int] = {}  # by namespace: paths `add`ed to its tree
        self._mixed: set[str] = set()  # namespaces where a path was put twice: not moved whole
        self._made: set[str] = set()  # folders made for the trees
        # Not yet handed to a helper: numbers from `_first` on, each name and text in order.
        self._first = 0
        self._pending: list[str] = []
        self._texts: list[bytes] = []
        self._size = 0
        self._child: subprocess.Popen[bytes] | None = None
        self._queue: SimpleQueue[bytes | None] = SimpleQueue()
        self._feeder: threading.Thread | None = None
        self._failed = False
        self._ready = False  # the folder holds only this sync's files (a killed one's are gone)

    def add(self, path: str, sha: str, data: bytes) -> None:
        """Queue one file, its text in UTF-8; the helper starts once there are `min_files`.

        A sync stages its own files while it walks, before any text of the pull is put here,
        so only what was queued already is looked for, with no stat of the disk.
        """
        if self._failed or self.queued(path, sha):
            return
        number = len(self.sizes)
        key = _namespace(path)
        tree = key in self.new_namespaces
        if tree and path not in self.numbers:
            self._own_tree_files[key] = self._own_tree_files.get(key, 0) + 1
        self.numbers[path] = number
        self.shas.append(sha)
        self.sizes.append(len(data))
        name = path if tree else f"{number}.part"
        self.names[number] = name
        if not self._pending:
            self._first = number  # numbers are given in order: a batch holds a run of them
        self._pending.append(name)
        self._texts.append(data)
        self._size += len(data)
        if self._child is None and (len(self.numbers) < self.min_files or not self._start()):
            return
        if self._size >= BATCH_BYTES:
            self.flush()

    def flush(self) -> None:
        """Hand what is queued to the helper now (the caller is about to wait on the server).

        Without a helper, what is queued stays for `write_few`: too few files to be worth a
        helper. If nothing writes them, the pull does.
        """
        if self._child is not None and self._pending:
            self._queue.put(self._frame())
            self._pending, self._texts, self._size = [], [], 0

    def _frame(self) -> bytes:
        """What is queued, as one frame for `_write_frames`."""
        first = self._first
        return _batch(first, self._pending, self.sizes[first:first + len(self._pending)],
                      self._texts)

    def write_few(self) -> None:
        """Write here and now the few files queued with no helper, as the helper would.

        A version 3 sync does it while the server's answer is on its way, so the pull moves
        them in, as it does the helper's files, instead of writing each once the answer has
        come (a 1% sync of 10,000 files: 100 files). One that fails to be written is written
        by the pull, as before.
        """
        if self._child is not None or self._failed or not self._pending:
            return
        frame = self._frame()
        self._pending, self._texts, self._size = [], [], 0
        try:
            if not self._ready:
                self._make_folder()
        except OSError:
            return
        self._take_report(_write_frames(str(self.folder), io.BytesIO(frame))[0])

    def _make_folder(self) -> None:
        """An empty staging folder, for this sync's files only (a killed one's are removed)."""
        self._remove_folder()
        self.folder.mkdir(parents=True, exist_ok=True)
        self._ready = True

    def _start(self) -> bool:
        self._queue = SimpleQueue()
        try:
            self._make_folder()
            import subprocess  # here: a sync that stages nothing never loads it
            self._child = subprocess.Popen(
                [sys.executable, "-I", "-S", os.path.abspath(__file__), str(self.folder)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        except OSError:
            self._failed = True  # nothing staged: apply writes every file itself
            self._pending, self._texts, self._size = [], [], 0
            return False
        self._feeder = threading.Thread(target=self._feed, daemon=True, name="sharedmem-staging")
        self._feeder.start()
        return True

    def _feed(self) -> None:
        assert self._child is not None and self._child.stdin is not None
        pipe = self._child.stdin
        try:
            while (chunk := self._queue.get()) is not None:
                pipe.write(chunk)
            pipe.close()
        except OSError:
            pass  # the helper stopped (a full disk?): what it did not write is written by apply

    def wait(self) -> None:
        """Let the helper finish; then `move` may take any file written."""
        if self._child is None or self._feeder is None:
            return
        self.flush()
        self._queue.put(None)
        assert self._child.stdout is not None
        self._feeder.join()
        self._feeder = None
        report = self._child.stdout.read()  # ends when the helper closes it, before it exits
        self._take_report(report.decode("ascii", "replace").split("\n"))

    def _take_report(self, lines: list[str]) -> None:
        """Record the files a helper wrote from its lines: each one's number and time."""
        mtimes = self.mtimes
        if len(mtimes) < len(self.sizes):
            mtimes.extend([-1] * (len(self.sizes) - len(mtimes)))
        for line in lines:
            number, _, mtime = line.partition(" ")
            if number.isdigit() and int(number) < len(mtimes):
                self.written.add(int(number))
                if mtime.isdigit():
                    mtimes[int(number)] = int(mtime)

    def queued(self, path: str, sha: str) -> bool:
        """Whether `path` at `sha` was handed to the helper (`add`), written yet or not."""
        return self._number(path, sha) is not None

    def _number(self, path: str, sha: str) -> int | None:
        number = self.numbers.get(path)
        return number if number is not None and self.shas[number] == sha else None

    def put_trees(self, namespaces: frozenset[str]) -> None:
        """Stage the pull's texts of these namespaces (new to the cache) as trees (`put`)."""
        self.pull_trees = namespaces

    def _tree(self, path: str) -> str | None:
        """The namespace whose tree `path` is staged in when put first, or None."""
        if not self.pull_trees:
            return None
        key = _namespace(path)
        return key if key in self.pull_trees and key not in self.new_namespaces else None

    def put(self, path: str, sha: str, data: bytes) -> None:
        """Write a text of the pull (UTF-8) into the folder now, for `move` or `move_tree`.

        At its cache path below the folder when its namespace is in `pull_trees` and the path
        was not put before; else as `<hash>.pull`. Written by this process, while the helper
        may still write its own files beside it (as `<n>.part` or below the folder, in other
        namespaces). A `<hash>.pull` there already is this sync's own, written whole: its name
        says the same path and sha256. A failure to write is the sync's failure: nothing is in
        the cache.
        """
        if self._number(path, sha) is not None:
            return  # the helper's
        key = self._tree(path)
        if key is not None and key in self._mixed:
            key = None
        name = path if key is not None else _pull_name(path, sha)
        try:
            if not self._ready:
                self._make_folder()
            if key is not None:
                parent = path.rpartition("/")[0]
                if parent not in self._made:  # the paths passed the path rule: no `..`
                    os.makedirs(_below(str(self.folder), parent), exist_ok=True)
                    self._made.add(parent)
            flags = _NEW
            try:
                fd = os.open(self._base + name if os.sep == "/" else
                             _below(str(self.folder), name), flags, 0o600)
            except FileExistsError:
                if key is None:
                    return  # staged already, by this sync
                self._mixed.add(key)  # put twice (or two names that the disk calls one)
                key, name = None, _pull_name(path, sha)
                try:
                    fd = os.open(self._base + name, flags, 0o600)
                except FileExistsError:
                    return
            try:
                view = memoryview(data)
                while view:  # a short write goes on, so a full disk says ENOSPC
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)
        except OSError as exc:
            self.discard()  # its room is needed, and this sync ends here
            from sharedmem.core import CacheError  # not at the top: the helper runs as a script
            raise CacheError(f"{write_failure(str(self.folder / name), exc)}; the cache was "
                             f"left as it was ({path!r} was being staged)") from None
        if key is not None:
            self._tree_files[key] = self._tree_files.get(key, 0) + 1

    def _in_tree(self, path: str, sha: str) -> bool:
        """Whether the tree holds `path` at `sha`: hashed, as it may hold another put of it."""
        if self._tree(path) is None:
            return False
        from sharedmem.hashing import sha256_file  # the sync's side: the helper never calls it
        try:
            with open(_below(str(self.folder), path), "rb") as handle:
                return sha256_file(handle) == sha
        except OSError:
            return False

    def move(self, path: str, sha: str, target: str, *, taken: bool = True) -> bool:
        """Rename the staged text of `path` at `sha` onto `target`; False when there is none.

        A text in a tree is moved alone only when its namespace was not moved whole, and only
        after its bytes are found to be that sha256; `taken` False (the caller has the text
        itself) leaves the tree alone.
        """
        number = self._number(path, sha)
        if number is not None:
            if number not in self.written:
                return False
            name = self.names[number]
        elif self._ready:
            name = _pull_name(path, sha)
        else:
            return False
        try:
            os.replace(self._base + name if number is None else
                       _below(str(self.folder), name), target)
        except OSError:
            if number is not None or not taken or not self._in_tree(path, sha):
                return False
            try:
                os.replace(_below(str(self.folder), path), target)
            except OSError:
                return False
            return True
        if number is not None:
            self.written.discard(number)
        return True

    def move_tree(self, namespace: str, files: int, target: str) -> bool:
        """Rename the pulled tree of `namespace` onto `target` (absent) if it holds just `files`.

        `files` is how many texts of the namespace the pull writes from what it staged. Each
        path was put once (else the namespace is mixed), so as many files as that are exactly
        those texts, each at the sha256 it was put with: the one the pull records.
        """
        if namespace not in self.pull_trees or namespace in self._mixed \
                or namespace in self.new_namespaces or not files \
                or self._tree_files.get(namespace) != files:
            return False
        try:
            os.rename(_below(str(self.folder), namespace), target)
        except OSError:
            return False
        self._tree_files.pop(namespace)
        return True

    def check_folder(self, namespace: str,
                     pulled: dict[str, str]) -> dict[str, tuple[int, int, str, str]]:
        """What `move_folder` would move of `namespace`, without moving it; once the helper is done.

        `pulled` maps each cache path of the namespace to its sha256. Only if every one is staged
        and written at that sha256, and nothing else is staged there, may the folder move in
        one rename. Returns each such file (none if it may not) with its manifest row but the
        path: its size and time as the rename keeps them (-1: unknown), namespace and sha256.
        """
        if self._own_tree_files.get(namespace, 0) != len(pulled):
            return {}  # as many paths staged in its tree as pulled: each pulled one, just so
        numbers, names, written, shas = self.numbers, self.names, self.written, self.shas
        sizes, mtimes, timed = self.sizes, self.mtimes, len(self.mtimes)
        moved: dict[str, tuple[int, int, str, str]] = {}
        for path, sha in pulled.items():  # one pass: the first sync's every file
            number = numbers.get(path)
            if (number is None or names[number] != path or number not in written
                    or shas[number] != sha):
                return {}
            moved[path] = (sizes[number], mtimes[number] if number < timed else -1, namespace,
                           sha)
        return moved

    def move_folder(self, namespace: str, checked: dict[str, tuple[int, int, str, str]],
                    target: str) -> bool:
        """Rename the staged folder of `namespace` onto `target` (absent), as `check_folder` found.

        `checked` is what it returned, not empty; False when the rename failed.
        """
        try:
            os.rename(_below(str(self.folder), namespace), target)
        except OSError:
            return False
        self.written.difference_update(self.numbers[path] for path in checked)
        return True

    def discard(self) -> None:
        """Stop the helper and remove every staged file, also a killed sync's."""
        if self._child is not None:
            if self._child.poll() is None:
                self._child.kill()
            self._child.wait()
        if self._feeder is not None:
            self._queue.put(None)
            self._feeder.join()
        self._child, self._feeder = None, None
        self.numbers.clear()
        self.shas.clear()
        self.sizes = array("q")
        self.mtimes = array("q")
        self.names.clear()
        self.written.clear()
        self._tree_files.clear()
        self._own_tree_files.clear()
        self._mixed.clear()
        self._made.clear()
        self._pending, self._texts, self._size = [], [], 0
        self._remove_folder()
        self._ready = False

    def _remove_folder(self) -> None:
        """Remove the folder, unless it or the metadata folder is a link: never through one."""
        for path in (self.folder.parent, self.folder):
            try:
                if stat.S_ISLNK(os.lstat(path).st_mode):
                    return
            except OSError:
                break
        _remove(self.folder)


def _remove(folder: Path) -> None:
    """Remove a folder of ours and what is in it; gone already is fine."""
    try:
        os.rmdir(folder)  # the usual case: it is empty
    except FileNotFoundError:
        pass
    except OSError:
        import shutil
        shutil.rmtree(folder, ignore_errors=True)


def _below(folder: str, path: str) -> str:
    """The staged file (or folder) of a cache path: the same path below the staging folder."""
    return os.path.join(folder, *path.split("/"))


def _pull_name(path: str, sha: str) -> str:
    """The staged file of a pulled text: named by its cache path and sha256, nothing kept.

    A cache path may be long and hold any character the rules allow; a hash of it is a
    short, plain name. blake2b with 128 bits: no two of a pull's files meet by chance.
    """
    import hashlib  # here: a sync that pulls no text never loads it
    key = f"{path}\0{sha}".encode("utf-8", "surrogatepass")
    return hashlib.blake2b(key, digest_size=16).hexdigest() + ".pull"


def _batch(first: int, names: list[str], sizes: array[int], texts: list[bytes]) -> bytes:
    """Files numbered from `first` on, for the helper: one frame, whatever their count.

    `<first> <count> <names bytes> <texts bytes>`, a newline, then each text's size (`sizes`,
    8 bytes each, this machine's order: the helper runs here), the names in UTF-8 each ended
    by a NUL (no path holds one), then the texts. No Python object or formatting per file.
    """
    encoded = "\0".join(names).encode("utf-8") + b"\0"
    total = sum(sizes)
    parts = [b"%d %d %d %d\n" % (first, len(names), len(encoded), total), sizes.tobytes(),
             encoded]
    parts += texts
    return b"".join(parts)


# Each staged file is made relative to its folder, opened once, where the system allows it:
# the kernel then resolves one name per file instead of the whole path below the cache.
_BY_FOLDER = {os.open, os.stat, os.mkdir} <= os.supports_dir_fd
_DIR = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)
_FOLDER = _DIR | getattr(os, "O_NOFOLLOW", 0)  # a folder below the staging folder: not a link
_OPEN_FOLDERS = 256  # folders held open at once, far below any limit on open files


class _Folders:
    """The folders below the staging folder, each opened once, never through a link.

    Each is made (as `os.makedirs` would) and opened one name at a time from the staging
    folder with `O_NOFOLLOW`: a link where a folder belongs stops the helper, rather than
    sending a file out of the staging folder. The sync emptied that folder before the helper
    started, so there is no such link unless something planted one.
    """

    def __init__(self, folder: str) -> None:
        self.root = os.open(folder, _DIR)
        self.open: dict[bytes, int] = {b"": self.root}

    def get(self, parent: bytes) -> int:
        """The open folder `parent` (a path below the staging folder), made if it is not."""
        fd = self.open.get(parent)
        if fd is not None:
            return fd
        if len(self.open) > _OPEN_FOLDERS:
            self.close(keep_root=True)
        above, _, name = parent.rpartition(b"/")
        base = self.get(above)
        try:
            os.mkdir(name, dir_fd=base)
        except FileExistsError:
            pass
        fd = self.open[parent] = os.open(name, _FOLDER, dir_fd=base)
        return fd

    def close(self, *, keep_root: bool = False) -> None:
        """Close the folders held open (but the staging folder's own, `keep_root`)."""
        for fd in self.open.values():
            if fd != self.root or not keep_root:
                os.close(fd)
        self.open = {b"": self.root} if keep_root else {}

    def write(self, path: bytes, data: memoryview) -> int | None:
        """`_Paths.write` by folder: the file's name created in its open folder, stat'ed there."""
        parent, _, name = path.rpartition(b"/")
        try:
            fd = self.get(parent)
            out = os.open(name, _NEW, 0o600, dir_fd=fd)
            try:
                if os.write(out, data) != len(data):
                    raise OSError("short write")
            finally:
                os.close(out)
            return os.stat(name, dir_fd=fd, follow_symlinks=False).st_mtime_ns
        except OSError:
            return None


class _Paths:
    """The plain-path way, where folders cannot be opened for it (Windows); else `_Folders`."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.made: set[str] = set()  # the folders made so far, so each is made once

    def close(self) -> None:
        """Nothing is held open here."""

    def write(self, path: bytes, data: memoryview) -> int | None:
        """Create the staged file of `path` (it must not exist) holding `data`: its time once closed.

        None if that failed. The paths are the sync's own, checked by the walk: no part is
        empty, `.`, `..` or absolute. The time is read after the close (a file system may set
        it then), here on the helper's CPU.
        """
        target = _below(self.folder, path.decode("utf-8"))
        parent = os.path.dirname(target)
        try:
            if parent not in self.made:
                os.makedirs(parent, exist_ok=True)
                self.made.add(parent)
            fd = os.open(target, _NEW, 0o600)
            try:
                if os.write(fd, data) != len(data):
                    raise OSError("short write")
            finally:
                os.close(fd)
            return os.stat(target).st_mtime_ns
        except OSError:
            return None


def _helper(folder: str, source: BinaryIO, out: TextIO, by_folder: bool = _BY_FOLDER) -> int:
    """Write each file of each frame (see `_batch`) to its staged file below `folder`.

    Writes a line to `out` for each file written, its number and time, so the sync moves only
    whole files and records them without a stat. Stops at the first file that could not be
    written or did not come whole: status 1.
    """
    written, status = _write_frames(folder, source, by_folder)
    out.write("\n".join(written))
    out.close()  # the sync goes on as soon as it has read this; it reaps us later
    return status


def _namespace(path: str) -> str:
    """The machines/<m>/<source> a cache path is staged under (this script imports no layout)."""
    return "/".join(path.split("/", 3)[:3])


def _write_frames(folder: str, source: BinaryIO,
                  by_folder: bool = _BY_FOLDER) -> tuple[list[str], int]:
    """Write the files of the frames in `source`: a line for each ("number time"), and a status.

    The helper's work, also done in the sync's own process for a few files (`write_few`).
    """
    written: list[str] = []
    status = 1
    try:
        writer = _Folders(folder) if by_folder else _Paths(folder)
    except OSError:
        return written, status  # no folder to write in
    try:
        while header := source.readline():
            if not _write_frame(header, source, writer.write, written):
                break
        else:
            status = 0
    finally:
        writer.close()
    return written, status


def _write_frame(header: bytes, source: BinaryIO, write: Callable[[bytes, memoryview], int | None],
                 written: list[str]) -> bool:
    """Write the files of one frame in order, each line to `written`; False at the first failure.

    A frame cut short (the sync stopped) is written up to its last whole file.
    """
    first, count, names_size, size = (int(x) for x in header.split())
    sizes = array("q")
    raw = source.read(count * sizes.itemsize)
    names = source.read(names_size).split(b"\0")
    texts = memoryview(source.read(size))
    if len(raw) != count * sizes.itemsize or len(names) != count + 1:
        return False  # cut before its texts: not one is known whole
    names.pop()  # after the last NUL
    sizes.frombytes(raw)
    end = 0
    for number, (path, length) in enumerate(zip(names, sizes, strict=True), first):
        start, end = end, end + length
        data = texts[start:end]
        if len(data) != length or (mtime := write(path, data)) is None:
            return False
        written.append(f"{number} {mtime}")
    return True


if __name__ == "__main__":
    if hasattr(os, "nice"):
        os.nice(19)
    os._exit(_helper(sys.argv[1], sys.stdin.buffer, sys.stdout))  # nothing left to flush
