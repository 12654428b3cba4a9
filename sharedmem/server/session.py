"""`serve`: the stdio end of the sync exchange, over one store.

Run by the client as a local child process or as the remote command of `ssh` (in an SSH forced
command with `--machine`, which pins the key to one machine). Only protocol goes to stdout.
"""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

from sharedmem import __version__
from sharedmem.core import NoteError, ProtocolError, SharedMemoryError, StoreError
from sharedmem.hashing import sha256_bytes
from sharedmem.protocol import VERSIONS, Channel, PeerError, choose_version, chunks, error, field
from sharedmem.rules import KIND_MARKDOWN, MIB, SOURCE_KINDS, Limits, name_problem
from sharedmem.server.ingest import IncomingFile, StaleBase, ingest
from sharedmem.server.store import Store

TYPE_CHECKING = False  # typing costs `serve` milliseconds before it can answer
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import IO, Any


STORE_AHEAD_BYTES = 4 * MIB  # bodies sent ahead are stored in batches of about this much


class Session:
    """One client's session: hello, then namespaces, notes and a pull, in a checked order."""

    def __init__(self, store_path: Path, channel: Channel, pinned: str | None,
                 versions: tuple[int, ...] = VERSIONS, limits: Limits | None = None) -> None:
        self.store_path = store_path
        self.channel = channel
        self.pinned = pinned
        self.versions = versions
        self.limits = limits or Limits()
        self.store: Store | None = None
        self.machine = ""
        self.version = 0
        # Verified, redacted bodies not yet committed: sha256 -> (text, redactions, size). A
        # version 2 client may send bodies ahead of their manifest, up to `ahead_bytes`; those
        # redaction left as they were are stored in batches of STORE_AHEAD_BYTES as they come
        # (text None here), claimed for this session until it ends (Store.put_blobs). Fewer
        # wait in `unstored` for the commit to store them.
        self.pool: dict[str, tuple[str | None, dict[str, int], int]] = {}
        self.ahead_bytes = 0
        self.unstored: list[tuple[str, int, bytes]] = []
        self.unstored_bytes = 0

    def run(self) -> int:
        """Serve until `bye` or end of input; a protocol error is answered, then ends the session."""
        try:
            self._hello()
            while True:
                message = self.channel.receive()
                if message is None or message["type"] == "bye":
                    return 0
                self._dispatch(message)
        except PeerError as exc:
            self._fail(exc.code, str(exc))
            return 1
        except StoreError as exc:
            self._fail("store", str(exc))
            return 1
        except SharedMemoryError as exc:
            self._fail("bad-field", str(exc))
            return 1
        finally:
            if self.store is not None:
                try:  # release this session's claims; collect what has come due (usually none)
                    self.store.finish()
                except (StoreError, sqlite3.Error) as exc:
                    sys.stderr.write(f"serve: could not collect unused bodies: {exc}\n")
                self.store.close()

    def _fail(self, code: str, message: str) -> None:
        sys.stderr.write(f"serve: {message}\n")
        try:
            self.channel.send(error(code, message))
        except ProtocolError:
            pass

    def _hello(self) -> None:
        message = self.channel.expect("hello")
        self.version = choose_version(self.versions, message.get("versions"))
        machine = field(message, "machine", str)
        if (problem := name_problem(machine, "machine")) is not None:
            raise PeerError("bad-field", problem)
        if self.pinned is not None and machine != self.pinned:
            raise PeerError("machine-mismatch", f"this key is pinned to machine {self.pinned!r} "
                            f"but the client says it is {machine!r}: nothing was written. Use the "
                            f"key made for {machine!r}, or re-pin this key with install_server.py "
                            f"--authorize {machine} --key ...")
        self.machine = machine
        self.store = Store.open(self.store_path, before_migrate=_backup_first)
        self.store.checkpoint_at_close()
        reply = {"type": "hello", "versions": list(self.versions), "version": self.version,
                 "server": f"sharedmem/{__version__}", "machine": machine,
                 "pinned": self.pinned is not None}
        if self.version >= 2:
            reply["ahead_bytes"] = self.limits.namespace_bytes
        self.channel.send(reply)

    def _dispatch(self, message: dict[str, Any]) -> None:
        """Answer one message through HANDLERS, the table of what each version accepts."""
        kind = message["type"]
        handler = HANDLERS[self.version].get(kind)
        if handler is None:
            code = "out-of-order" if kind in PARTS else "unknown-type"
            raise PeerError(code, f"message type {kind!r} is not allowed here in protocol "
                            f"version {self.version}")
        handler(self, message)

    def _namespace(self, message: dict[str, Any]) -> tuple[str, str]:
        source = field(message, "source", str)
        kind = field(message, "kind", str)
        if kind not in SOURCE_KINDS:
            raise PeerError("bad-field", f"source kind {kind!r} is unknown")
        if (problem := name_problem(source, "source")) is not None:
            raise PeerError("bad-field", problem)
        if (kind == KIND_MARKDOWN) == (source in SOURCE_KINDS[:2]) or (
                kind != KIND_MARKDOWN and source != kind):
            raise PeerError("bad-field", f"source {source!r} does not match kind {kind!r}")
        return source, kind

    def _on_publish(self, message: dict[str, Any]) -> None:
        """Version 1: the whole snapshot in `files` chunks, then `commit`."""
        source, kind = self._namespace(message)
        files: list[IncomingFile] = []
        while True:
            part = self.channel.expect("files", "commit")
            if part["type"] == "commit":
                break
            for item in field(part, "files", list):
                if not isinstance(item, dict):
                    raise PeerError("bad-field", "files entries must be objects")
                files.append(IncomingFile(field(item, "path", str), None, None,
                                          _mtime(item.get("mtime_ns")),
                                          field(item, "text", str)))
        self._commit(source, kind, files)

    def _on_manifest(self, message: dict[str, Any]) -> None:
        """Version 2: a manifest or a delta; the server asks only for the bodies it lacks."""
        assert self.store is not None
        source, kind = self._namespace(message)
        self.unstored, self.unstored_bytes = [], 0  # left in the pool, for the commits to store
        digest = field(message, "digest", str)
        base = field(message, "base", str, optional=True)
        current = self.store.namespace_digest(self.machine, source)
        if current is not None and current == digest:
            self.channel.send({"type": "result", "source": source, "unchanged": True,
                               "generation": self.store.touch(self.machine, source),
                               "digest": digest, "accepted": None, "refused": [],
                               "redacted": {}, "stored": {}})
            return
        entries = _entries(field(message, "files", list, optional=True) or [])
        removed = field(message, "removed", list, optional=True) or []
        if not all(isinstance(p, str) for p in removed):
            raise PeerError("bad-field", "manifest.removed must be a list of paths")
        if base is not None and current != base:
            self.channel.send(error("stale-base", f"namespace {self.machine}/{source} is not at "
                                    "the base digest; send the whole manifest"))
            return
        if base is None and "files" not in message:
            raise PeerError("bad-field", "manifest needs files (whole) or base (delta)")
        shas = {sha for _, sha, _, _ in entries}
        need = self.store.need(shas - self.pool.keys())
        self.channel.send({"type": "need", "source": source, "sha256": need})
        if need and "sharedmem.redact.redactor" not in sys.modules:
            _load_redactor_meanwhile()
        wanted = set(need)
        while (part := self.channel.expect("bodies", "commit"))["type"] == "bodies":
            self._take_bodies(part, wanted)
        pool = self.pool
        files = [IncomingFile(path, sha, size, mtime)
                 if (body := pool.get(sha)) is None else
                 IncomingFile(path, sha, body[2], mtime, body[0], body[1])
                 for path, sha, size, mtime in entries]
        try:
            self._commit(source, kind, files, removed=removed if base else None, base=base)
        finally:
            for sha in shas:
                pool.pop(sha, None)

    def _on_bodies(self, message: dict[str, Any]) -> None:
        """Version 2: bodies ahead of their manifest, sent while the client still walks."""
        self._take_bodies(message, None)

    def _take_bodies(self, message: dict[str, Any], wanted: set[str] | None) -> None:
        """Verify each body against its sha256 and redact it now, while the next chunk travels.

        Bodies that are not `wanted` (when given) or do not match their sha256 are dropped:
        the manifest's need, or the commit's missing-body refusal, names what is still due.
        """
        fresh: dict[str, str] = {}
        encoded: list[bytes] = []
        for pair in field(message, "bodies", list):
            if (not isinstance(pair, list) or len(pair) != 2
                    or not all(isinstance(x, str) for x in pair)):
                raise PeerError("bad-field", "bodies entries must be [sha256, text]")
            sha, text = pair
            if (wanted is not None and sha not in wanted) or sha in fresh or sha in self.pool:
                continue
            try:
                data = text.encode("utf-8")
            except UnicodeEncodeError:
                continue
            if wanted is None:
                self.ahead_bytes += len(data)
                if self.ahead_bytes > self.limits.namespace_bytes:
                    raise PeerError("ahead-full", "the client sent more than "
                                    f"{self.limits.namespace_bytes} bytes of bodies ahead of a "
                                    "manifest (hello.ahead_bytes); send the rest when the "
                                    "server names them in need")
            if sha256_bytes(data) == sha:
                fresh[sha] = text
                encoded.append(data)
        if not fresh:
            return
        from sharedmem.redact.redactor import redact_many
        for sha, data, (clean, counts) in zip(
                fresh, encoded, redact_many(list(fresh.values()), encoded), strict=True):
            self.pool[sha] = (clean, counts, len(data))
            if wanted is None and not counts:
                self.unstored.append((sha, len(data), data))
                self.unstored_bytes += len(data)
        if self.unstored_bytes >= STORE_AHEAD_BYTES:
            # Stored now, while the client still walks, not in the commit it waits for. A few
            # bodies (a small re-sync's) are left to that commit: a transaction of their own
            # would cost it more than it saves.
            assert self.store is not None
            rows, self.unstored, self.unstored_bytes = self.unstored, [], 0
            self.store.put_blobs(rows)
            for sha, size, _ in rows:
                self.pool[sha] = (None, {}, size)

    def _commit(self, source: str, kind: str, files: list[IncomingFile], *,
                removed: list[str] | None = None, base: str | None = None) -> None:
        assert self.store is not None
        try:
            report = ingest(self.store, self.machine, source, kind, files, limits=self.limits,
                            removed=removed, base_digest=base)
        except StaleBase as exc:
            self.channel.send(error("stale-base", str(exc)))
            return
        self.channel.send({"type": "result", "source": source, "unchanged": report.unchanged,
                           "generation": report.generation, "accepted": report.accepted,
                           "refused": report.refused, "redacted": report.redacted,
                           "stored": report.stored,
                           "digest": self.store.namespace_digest(self.machine, source)})

    def _on_note(self, message: dict[str, Any]) -> None:
        assert self.store is not None
        note_id = field(message, "note_id", str)
        try:
            path, stored = self.store.append_note(self.machine, field(message, "filename", str),
                                                  field(message, "text", str), note_id)
        except NoteError as exc:
            self.channel.send({"type": "note_result", "note_id": note_id, "status": "refused",
                               "message": str(exc)})
            return
        self.channel.send({"type": "note_result", "note_id": note_id,
                           "status": "stored" if stored else "duplicate", "path": path})

    def _on_pull(self, message: dict[str, Any]) -> None:
        assert self.store is not None
        known = field(message, "known", dict)
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in known.values()):
            raise PeerError("bad-field", "pull.known must map namespace keys to integers")
        have = set(field(message, "have", list, optional=True) or [])
        published = field(message, "published", dict, optional=True) or {}
        if not all(isinstance(v, str) for v in published.values()):
            raise PeerError("bad-field", "pull.published must map namespace keys to digests")
        skipped = []
        if published:  # the client holds these as they are stored: they are left out
            for ns in self.store.namespaces().machines:
                if ns.machine == self.machine and published.get(ns.key) == ns.digest:
                    known = {**known, ns.key: ns.generation}
                    skipped.append(ns.key)
        namespaces, full, upserts, removals = self.store.pull(known, have)
        self.channel.send({"type": "namespaces", "namespaces": namespaces.to_rows(),
                           "full": sorted(full), "removed": removals, "skipped": skipped})
        self._send_files((path, sha, None if sha in have else text)
                         for path, sha, text in upserts)

    def _on_export(self, message: dict[str, Any]) -> None:
        assert self.store is not None
        self.channel.send({"type": "namespaces", "namespaces": self.store.namespaces().to_rows(),
                           "full": [], "removed": []})
        self._send_files(self.store.export())

    def _send_files(self, items: Any) -> None:
        for batch in chunks(list(items), lambda i: len(i[0]) + 80 + len(i[2] or "") * 2):
            self.channel.send({"type": "files", "files": [list(i) for i in batch]})
        self.channel.send({"type": "end"})

    def _on_verify(self, message: dict[str, Any]) -> None:
        assert self.store is not None
        self.channel.send({"type": "verified", "problems": self.store.verify(),
                           "schema": self.store.schema_version(), "counts": self.store.counts()})

    def _on_status(self, message: dict[str, Any]) -> None:
        assert self.store is not None
        self.channel.send({"type": "status", "server": f"sharedmem/{__version__}",
                           "schema": self.store.schema_version(),
                           "namespaces": self.store.namespaces().to_rows()})

    def _on_history(self, message: dict[str, Any]) -> None:
        """Version 2: the versions the store keeps of one published file (`history --config`).

        A path or name that breaks the rules is a `bad-field` (the session ends); a file the
        store holds no version of is `not-found`, and the session goes on.
        """
        from sharedmem.server.store import NotFound
        assert self.store is not None
        try:
            found = self.store.history(field(message, "path", str))
        except NotFound as exc:
            self.channel.send(error("not-found", str(exc)))
            return
        self.channel.send({"type": "history", **found})

    def _on_show(self, message: dict[str, Any]) -> None:
        """Version 2: one version of a published file, with its text (`show --config`)."""
        from sharedmem.server.store import NotFound
        assert self.store is not None
        path = field(message, "path", str)
        number = field(message, "version", int)
        if not 0 <= number < 2**63:
            raise PeerError("bad-field", f"show.version must be a version number from "
                            f"`history`, not {number}")
        try:
            found = self.store.version(path, number)
        except NotFound as exc:
            self.channel.send(error("not-found", str(exc)))
            return
        self.channel.send({"type": "version", **found})


# The messages a client may send after hello, for each protocol version, and the method that
# answers each: the one statement of what a version accepts (docs/PROTOCOL.md points here).
# `bye` and the end of input end the session in `Session.run`, in either version.
HANDLERS: dict[int, dict[str, Callable[[Session, dict[str, Any]], None]]] = {
    1: {"publish": Session._on_publish, "note": Session._on_note, "export": Session._on_export,
        "verify": Session._on_verify, "status": Session._on_status},
    2: {"manifest": Session._on_manifest, "bodies": Session._on_bodies, "note": Session._on_note,
        "pull": Session._on_pull, "verify": Session._on_verify, "status": Session._on_status,
        "history": Session._on_history, "show": Session._on_show},
}
# The parts of an exchange its handler reads itself (a publish's `files` and `commit`, a
# manifest's `bodies` and `commit`): sent where no handler takes them, they are out of order
# rather than unknown.
PARTS = frozenset({"files", "bodies", "commit"})


def _load_redactor_meanwhile() -> None:
    """Load and compile the redactor on a thread while the client sends the bodies it needs."""
    import threading

    def load() -> None:
        from sharedmem.redact.redactor import prepare
        prepare()

    threading.Thread(target=load, daemon=True, name="sharedmem-redact").start()


def _backup_first(path: Path, old_version: int) -> None:
    """A verified backup before a migration; backup.py loads only when one is due."""
    from sharedmem.server.backup import migration_hook
    migration_hook(path, old_version)


def _mtime(value: object) -> int:
    if type(value) is int and 0 <= value < 2**63:  # `type(x) is int` refuses True and False
        return value
    if value is None:
        return 0
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**63:
        raise PeerError("bad-field", "mtime_ns must be a non-negative integer")
    return value


def _entries(raw: list[Any]) -> list[tuple[str, str, int, int]]:
    out = []
    for item in raw:  # `type(x) is int` refuses True and False too
        if (type(item) is not list or len(item) != 4 or type(item[0]) is not str
                or type(item[1]) is not str or len(item[1]) != 64 or type(item[2]) is not int):
            raise PeerError("bad-field", "manifest entries must be [path, sha256, size, mtime_ns]")
        out.append((item[0], item[1], item[2], _mtime(item[3])))
    return out


def serve(store: Path, pinned: str | None = None, *, max_version: int = max(VERSIONS),
          stdin: IO[bytes] | None = None, stdout: IO[bytes] | None = None) -> int:
    """Run one session on stdin/stdout; logs go to stderr, never to the protocol stream."""
    if pinned is not None and (problem := name_problem(pinned, "--machine")) is not None:
        raise ProtocolError(problem)
    if stdin is not None:
        reader: Any = stdin
    else:
        from sharedmem.server.input_reader import ReadAhead
        reader = ReadAhead(sys.stdin.fileno())
    writer = stdout if stdout is not None else sys.stdout.buffer
    if stdout is None:
        sys.stdout = sys.stderr
    versions = tuple(v for v in VERSIONS if v <= max_version)
    return Session(store, Channel(reader, writer, "client"), pinned, versions).run()
