"""`serve`: the stdio end of the sync exchange, over one store.

Run by the client as a local child process or as the remote command of `ssh` (in an SSH forced
command with `--machine`, which pins the key to one machine). Only protocol goes to stdout.
What each protocol version accepts, and how its messages are shaped, is one object per version
in `HANDLERS`; the bodies a session holds until a commit uses them are `body_pool.py`'s.
"""

from __future__ import annotations

import sqlite3
import sys
import time
from collections import deque

from sharedmem import __version__, collector
from sharedmem.compression import REPORT_BYTES
from sharedmem.core import BackupError, NoteError, ProtocolError, SharedMemoryError, StoreError
from sharedmem.hashing import sha256_bytes
from sharedmem.protocol import (
    COMPRESSIONS,
    VERSIONS,
    Channel,
    PeerError,
    choose_version,
    chunks,
    encode_files,
    encode_raw_files,
    error,
    field,
)
from sharedmem.rules import KIND_MARKDOWN, MIB, SOURCE_KINDS, Limits, name_problem
from sharedmem.server.body_pool import BodyPool
from sharedmem.server.disk_full import DiskFull, disk_full, full_error
from sharedmem.server.manifest_entries import address, mtime_ns, parse_entries
from sharedmem.server.store import NotFound, Store

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from pathlib import Path
    from typing import IO, Any

    from sharedmem.server.ingest import IncomingFile


# Version 3: session-level messages that arrive while a namespace exchange waits for its bodies
# and commit are held, at most this many and this much, and answered after that commit.
DEFERRED_MESSAGES = 64
DEFERRED_BYTES = 8 * MIB
MAX_ERROR_CHARS = 2000  # of an error's text: a client's own error, echoed, is cut there


class Session:
    """One client's session: hello, then namespaces, notes and a pull, in a checked order."""

    def __init__(self, store_path: Path | str, channel: Channel, pinned: str | None,
                 versions: tuple[int, ...] = VERSIONS, limits: Limits | None = None) -> None:
        self.store_path = store_path
        self.channel = channel
        self.pinned = pinned
        self.versions = versions
        self.limits = limits or Limits()
        channel.guard(most_bytes=self.limits.session_bytes,
                      most_messages=self.limits.session_messages)
        self.store: Store | None = None
        self.bodies: BodyPool | None = None  # once the store is open
        self.machine = ""
        self.protocol: Version1 = HANDLERS[min(versions)]  # the hello's choice, once it came
        # Version 3: messages the client pipelined past a manifest still waiting for its bodies
        # (answered in order after its commit), with their size on the wire.
        self.deferred: deque[tuple[dict[str, Any], int]] = deque()
        self.deferred_bytes = 0
        # The sha256s whose text the client holds (the bodies it sent that a commit of this
        # session listed): a version 3 pull sends `null` for them, with no `have` list. At most
        # namespace_files of them; past that a text is sent again, which costs bytes only.
        self.client_has: set[str] = set()
        # Compressed, asked for in the client's hello: the wire bytes last reported
        # (`received`), until the first message that is not a body sent ahead (then None).
        self.reported: int | None = None
        self.verified = False  # `verify` checks the whole store: once a session

    @property
    def version(self) -> int:
        """The protocol version the hellos agreed on."""
        return self.protocol.number

    def run(self) -> int:
        """Serve until `bye` or end of input; a protocol error is answered, then ends the session.

        Python's cyclic garbage collector is paused meanwhile (and restored after): a session
        makes no reference cycles in its work, but holds tens of thousands of objects once a
        large manifest is parsed, and each full collection would walk all of them. Reference
        counting frees all the rest as before.
        """
        with collector.Paused():
            return self._run()

    def _run(self) -> int:
        try:
            self._hello()
            while True:
                message = self._next()
                if message is None or message["type"] == "bye":
                    return 0
                if self.reported is not None:
                    self._report(last=message["type"] not in AHEAD)
                self._dispatch(message)
        except (SharedMemoryError, sqlite3.Error, OSError) as exc:
            self._fail(*self._failure(exc))
            return 1
        finally:
            if self.store is not None:
                self._end()

    def _failure(self, exc: Exception) -> tuple[str, str]:
        """The error code and message that end a session on `exc`."""
        if isinstance(exc, PeerError):
            return exc.code, str(exc)
        if isinstance(exc, DiskFull):
            return "disk-full", str(exc)
        if isinstance(exc, StoreError | BackupError):
            return "store", str(exc)
        if isinstance(exc, SharedMemoryError):
            return "bad-field", str(exc)
        if disk_full(exc, self.store_path):  # a read that found no room, an I/O error
            return "disk-full", str(full_error(self.store_path, exc))
        if isinstance(exc, sqlite3.Error):
            return "store", f"the store {self.store_path} failed: {exc}"
        return "store", f"serve failed: {exc}"

    def _end(self) -> None:
        """Release this session's claims, collect what has come due (usually none), close.

        The client has its answers by now: what fails here is said on stderr, and left to the
        next session (which releases a dead session's claims, and copies the log).
        """
        assert self.store is not None
        try:
            self.store.finish()
        except (StoreError, sqlite3.Error) as exc:
            sys.stderr.write(f"serve: could not release this session's bodies (the next session "
                             f"will): {exc}\n")
        try:
            problem = self.store.close()
        except sqlite3.Error as exc:
            problem = f"the store {self.store_path} did not close cleanly: {exc}"
        if problem:
            sys.stderr.write(f"serve: {problem}\n")

    def _fail(self, code: str, message: str) -> None:
        """Say why the session ends; `code` and `message` may echo the peer's own error.

        What the client sent is Unicode text (`Channel.guard`), so every echo can be sent.
        """
        message = message[:MAX_ERROR_CHARS]
        sys.stderr.write(f"serve: {message}\n")
        try:
            self.channel.send(error(code[:MAX_ERROR_CHARS], message))
        except ProtocolError:
            pass

    def _hello(self) -> None:
        message = self.channel.expect("hello")
        self.protocol = HANDLERS[choose_version(self.versions, message.get("versions"))]
        machine = field(message, "machine", str)
        if (problem := name_problem(machine, "machine")) is not None:
            raise PeerError("bad-field", problem)
        if self.pinned is not None and machine != self.pinned:
            raise PeerError("machine-mismatch", f"this key is pinned to machine {self.pinned!r} "
                            f"but the client says it is {machine!r}: nothing was written. Use the "
                            f"key made for {machine!r}, or re-pin this key with install_server.py "
                            f"--authorize {machine} --key ...")
        self.machine = machine
        self._open()
        reply = {"type": "hello", "versions": list(self.versions), "version": self.version,
                 "server": f"sharedmem/{__version__}", "machine": machine,
                 "pinned": self.pinned is not None, **self.protocol.hello(self.limits)}
        compress = self.protocol.compression(message)
        if compress is not None:
            reply["compress"] = compress
            if message.get("reports") is True:  # they tell its sender how fast the link goes
                reply["reports"] = True
                self.reported = 0
        self.channel.send(reply)
        if compress is not None:  # both streams, from the byte after each side's hello line
            self.channel.compress_output()
            self.channel.decompress_input()
        if self.protocol.raw_texts:
            self.channel.take_raw_texts("bodies")
        if self.protocol.ahead and "sharedmem.redact.redactor" not in sys.modules:
            _load_for_changes()  # while the client walks: what its changes will need

    def _open(self) -> None:
        """Open the store (`serve` holds one of its session slots by now) and the body pool."""
        self.store = Store.open(self.store_path, before_migrate=_backup_first)
        self.store.wal.checkpoint_at_close()
        self.bodies = BodyPool(self.store, self.limits)

    def _report(self, *, last: bool) -> None:
        """Say how many bytes of the client's stream have arrived, and when (`received`).

        Before each body sent ahead, once REPORT_BYTES more have come since the last report,
        and once more, with `last`, before the first message that is not one: the client
        reads them while it sends (docs/PROTOCOL.md "Compression").
        """
        assert self.reported is not None
        arrival = getattr(self.channel.reader, "arrival", None)
        wire, at = arrival() if arrival is not None else (self.channel.received, time.monotonic())
        if not last and wire - self.reported < REPORT_BYTES:
            return
        report: dict[str, Any] = {"type": "received", "bytes": wire, "seconds": round(at, 6)}
        if last:
            report["last"] = True
        self.channel.send(report)
        self.reported = None if last else wire

    def _dispatch(self, message: dict[str, Any]) -> None:
        """Answer one message through HANDLERS, the table of what each version accepts."""
        kind = message["type"]
        handler = self.protocol.handlers.get(kind)
        if handler is None:
            code = "out-of-order" if kind in PARTS else "unknown-type"
            raise PeerError(code, f"message type {kind!r} is not allowed here in protocol "
                            f"version {self.version}")
        if kind not in POOL_FREE:
            assert self.bodies is not None
            self.bodies.settle()
        handler(self, message)

    def _next(self) -> dict[str, Any] | None:
        """The next session-level message: one held while an exchange waited, else a new one."""
        if self.deferred:
            message, size = self.deferred.popleft()
            self.deferred_bytes -= size
            return message
        return self.channel.receive()

    def _part(self, source: str | None, *types: str, whole: bool = False) -> dict[str, Any]:
        """Read the next part of `source`'s namespace exchange; pipelined, hold the rest.

        A part that names another source is out of order (docs/PROTOCOL.md). A version 3 client
        sends every manifest, its notes and its pull without waiting: what comes before the
        part awaited is a session-level message, held (up to DEFERRED_MESSAGES and
        DEFERRED_BYTES) and answered in order after this exchange. With `whole`, the part
        awaited is that source's whole manifest (after `need stale`); other manifests are held.
        """
        if not self.protocol.pipelined:
            return _of_source(self.channel.expect(*types), source)
        while True:
            before = self.channel.received
            message = self.channel.receive()
            if message is None:
                return self.channel.expect(*types)  # says the client ended the session
            kind = message["type"]
            if kind in types and (not whole or (message.get("source") == source
                                                and "base" not in message)):
                return _of_source(message, source)
            if kind not in self.protocol.handlers and kind != "bye" or kind in PARTS:
                raise PeerError("out-of-order", f"expected {' or '.join(types)} from the "
                                f"client, got {kind!r}")
            size = self.channel.received - before
            if (len(self.deferred) >= DEFERRED_MESSAGES
                    or self.deferred_bytes + size > DEFERRED_BYTES):
                raise PeerError("out-of-order", f"the client pipelined more than "
                                f"{DEFERRED_MESSAGES} messages or {DEFERRED_BYTES} bytes past a "
                                "manifest still waiting for its bodies and commit; wait for "
                                "its answer (need) before sending more")
            self.deferred.append((message, size))
            self.deferred_bytes += size

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
        """Version 1: the whole snapshot in `files` chunks, then `commit`.

        Each text is taken as it comes, as a body answering a need is: verified, redacted and
        stored in batches, so the session holds the names, not the snapshot.
        """
        assert self.bodies is not None
        source, kind = self._namespace(message)
        entries: list[tuple[str, str, int, int]] = []
        pool = self.bodies
        pool.exchange()
        while (part := self._part(source, "files", "commit"))["type"] == "files":
            items = field(part, "files", list)
            self._count_files(len(entries) + len(items), source)
            bodies: dict[str, bytes] = {}
            for item in items:
                if not isinstance(item, dict):
                    raise PeerError("bad-field", "files entries must be objects")
                path, text = field(item, "path", str), field(item, "text", str)
                data = text.encode("utf-8")
                sha = sha256_bytes(data)
                entries.append((path, sha, len(data), mtime_ns(item.get("mtime_ns"))))
                if sha not in bodies and sha not in pool and pool.admit(sha, data, ahead=False):
                    bodies[sha] = data
            pool.keep(bodies)
        self._commit(source, kind, pool.incoming(entries), {e[1] for e in entries})

    def _count_files(self, count: int, source: str) -> None:
        """Refuse an exchange that lists more files than a namespace may hold, before holding them."""
        if count > self.limits.namespace_files:
            raise PeerError("too-many-files", f"the client sent more than "
                            f"{self.limits.namespace_files} files for source {source!r}, the "
                            "server's namespace quota (namespace_files): nothing of it was "
                            "stored. Publish fewer files in it (limits.namespace_files in "
                            "client.json), or raise the server's quota (serve --limit "
                            "namespace_files=N)")

    def _on_manifest(self, message: dict[str, Any]) -> None:
        """Version 2 and 3: a manifest or a delta; the server asks only for the bodies it lacks.

        Its version says how a manifest may name bodies, how a stale delta and the bodies
        lacking are answered, and whether one that lacks none commits at once.
        """
        assert self.store is not None and self.bodies is not None
        source, kind = self._namespace(message)
        digest = address(field(message, "digest", str), "manifest.digest")
        base = field(message, "base", str, optional=True)
        if base is not None:
            base = address(base, "manifest.base")
        current = self.store.namespace_digest(self.machine, source)
        if current is not None and current == digest:
            self.channel.send({"type": "result", "source": source, "unchanged": True,
                               "generation": self.store.touch(self.machine, source),
                               "digest": digest, "accepted": None, "refused": [],
                               "redacted": {}, "stored": {}})
            return
        raw = field(message, "files", list, optional=True) or []
        self._count_files(len(raw), source)
        entries = parse_entries(raw, self.protocol.places(self.bodies))
        removed = field(message, "removed", list, optional=True) or []
        if not all(isinstance(p, str) for p in removed):
            raise PeerError("bad-field", "manifest.removed must be a list of paths")
        if base is not None and current != base:
            self.protocol.stale(self, source)
            return
        if base is None and "files" not in message:
            raise PeerError("bad-field", "manifest needs files (whole) or base (delta)")
        shas = {sha for _, sha, _, _ in entries}
        need = self.store.need(self.bodies.lacking(shas), (self.machine, source))
        answer = self.protocol.need(source, entries, need)
        self.bodies.exchange()
        if answer is not None:
            self.channel.send(answer)
            wanted = set(need)
            while (part := self._part(source, "bodies", "commit"))["type"] == "bodies":
                self._take_bodies(part, wanted)
        held = self.bodies.held(shas)
        if self._commit(source, kind, self.bodies.incoming(entries), shas,
                        removed=removed if base else None, base=base, digest=digest):
            self._remember(held)

    def _stale_base(self, source: str) -> None:
        """Version 2: a delta's base is not what the store holds; the client sends it whole."""
        self.channel.send(error("stale-base", f"namespace {self.machine}/{source} is not at the "
                                "base digest; send the whole manifest"))

    def _stale_need(self, source: str) -> None:
        """Version 3: `need stale`, and the whole manifest is the next part of this exchange."""
        self.channel.send({"type": "need", "source": source, "stale": True, "index": []})
        self._on_manifest(self._part(source, "manifest", whole=True))

    def _remember(self, shas: Iterable[str]) -> None:
        """Note sha256s whose text the client holds, up to namespace_files of them."""
        room = self.limits.namespace_files - len(self.client_has)
        if room > 0:
            self.client_has.update(list(shas)[:room])

    def _on_bodies(self, message: dict[str, Any]) -> None:
        """Version 2 and 3: bodies ahead of their manifest, sent while the client still walks."""
        self._take_bodies(message, None)

    def _take_bodies(self, message: dict[str, Any], wanted: set[str] | None) -> None:
        """Verify each body against its sha256 and redact it now, while the next chunk travels.

        Bodies that are not `wanted` (when given) or do not match their sha256 are dropped:
        the manifest's need, or the commit's missing-body refusal, names what is still due.
        How an entry names its body is the version's (`Version.body`).
        """
        assert self.bodies is not None
        pool = self.bodies
        fresh: dict[str, bytes] = {}
        refer = wanted is None and self.protocol.places(pool) is not None
        for entry in field(message, "bodies", list):
            body = self.protocol.body(entry)
            if refer:
                pool.refer(None if body is None else body[0])
            if body is None:
                continue
            sha, data, verified = body
            if (wanted is not None and sha not in wanted) or sha in fresh or sha in pool:
                continue
            if wanted is None:  # every body ahead counts, even one dropped below
                pool.count_ahead(len(data))
            if (verified or sha256_bytes(data) == sha) and pool.admit(sha, data,
                                                                      ahead=wanted is None):
                fresh[sha] = data
        pool.keep(fresh)

    def _on_tails(self, message: dict[str, Any]) -> None:
        """Version 3: bodies ahead, each a stored body and what was appended to it (`tails`).

        The joined text is taken as a body sent ahead, under its own sha256, and counts its whole
        size against `ahead_bytes`. A base the store does not hold is dropped (its address and
        tail count): the manifest's `need` then names the whole body.
        """
        from sharedmem.server.tails import joined
        assert self.store is not None and self.bodies is not None
        pool = self.bodies
        fresh: dict[str, bytes] = {}
        for pair in field(message, "tails", list):
            if (not isinstance(pair, list) or len(pair) != 2
                    or not all(isinstance(x, str) for x in pair)):
                raise PeerError("bad-field", "tails entries must be [base sha256, tail text]")
            base, added = address(pair[0], "tails base"), pair[1].encode("utf-8")
            data = joined(self.store, base, added, self.limits.file_bytes)
            # A missing base counts its address too: no entry is free, however short its tail.
            pool.count_ahead(len(base) + len(added) if data is None else len(data))
            if data is None:
                continue
            sha = sha256_bytes(data)
            if sha not in fresh and sha not in pool and pool.admit(sha, data, ahead=True):
                fresh[sha] = data  # a stored text and a str's UTF-8: valid UTF-8
        pool.keep(fresh)

    def _commit(self, source: str, kind: str, files: list[IncomingFile], shas: set[str], *,
                removed: list[str] | None = None, base: str | None = None,
                digest: str | None = None) -> bool:
        """Ingest one namespace, answer its result; the bodies it listed leave the session.

        False when the base turned out stale (the namespace changed since its manifest was
        read: a `forget` meanwhile): nothing changed, and the version answers as it answers a
        stale delta (version 3 then takes the whole manifest in this exchange). The bodies
        leave after the answer, and after the pull that follows it (`BodyPool.listed`): for a
        first sync that is thousands of entries, which the pull's answer need not wait for.
        """
        from sharedmem.server.ingest import StaleBase, ingest
        assert self.store is not None and self.bodies is not None
        try:
            try:
                report = ingest(self.store, self.machine, source, kind, files,
                                limits=self.limits, removed=removed, base_digest=base,
                                digest=digest)
            except StaleBase:
                self.protocol.stale(self, source)
                return False
            self.channel.send({"type": "result", "source": source, "unchanged": report.unchanged,
                               "generation": report.generation, "accepted": report.accepted,
                               "refused": report.refused, "redacted": report.redacted,
                               "stored": report.stored,
                               "digest": self.store.namespace_digest(self.machine, source)})
            return True
        finally:
            self.bodies.listed(shas)

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
        if not all(type(v) is int and 0 <= v < 2**63 for v in known.values()):
            raise PeerError("bad-field", "pull.known must map namespace keys to generations "
                            "(integers from 0)")
        have = self.protocol.have(message, self.client_has)
        published = field(message, "published", dict, optional=True) or {}
        if not all(isinstance(v, str) for v in published.values()):
            raise PeerError("bad-field", "pull.published must map namespace keys to digests")
        with self.store.reading():  # the list and the files it sends: one snapshot
            skipped = []
            if published:  # the client holds these as they are stored: they are left out
                for ns in self.store.namespaces().machines:
                    if ns.machine == self.machine and published.get(ns.key) == ns.digest:
                        known = {**known, ns.key: ns.generation}
                        skipped.append(ns.key)
            namespaces, full, upserts, removals = self.store.pull(known, have, encoded=True)
            self.channel.send({"type": "namespaces", "namespaces": namespaces.to_rows(),
                               "full": sorted(full), "removed": removals, "skipped": skipped})
            self._send_files((path, sha, None if sha in have else data)
                             for path, sha, data in upserts)

    def _on_export(self, message: dict[str, Any]) -> None:
        assert self.store is not None
        with self.store.reading():
            self.channel.send({"type": "namespaces",
                               "namespaces": self.store.namespaces().to_rows(),
                               "full": [], "removed": []})
            self._send_files(self.store.export(encoded=True))

    def _send_files(self, items: Iterable[tuple[str, str, bytes | None]]) -> None:
        """Send files in messages of about CHUNK_BYTES as the store's cursor gives them.

        At most one message is held (its rows, then its line), never the pull: a first pull of
        a large store costs `serve` no more memory than a small one's.
        """
        encoded = encode_raw_files if self.protocol.raw_texts else encode_files
        for batch in chunks(items, _file_cost):
            self.channel.send_line(encoded(batch))
        self.channel.send({"type": "end"})

    def _on_verify(self, message: dict[str, Any]) -> None:
        """The store's own checks (`doctor`): once a session, since each reads the whole store."""
        assert self.store is not None
        if self.verified:
            raise PeerError("out-of-order", "verify was already answered in this session: it "
                            "checks the whole store, so a session asks it once")
        self.verified = True
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
        assert self.store is not None
        self._found("history", self.store.history, field(message, "path", str))

    def _on_show(self, message: dict[str, Any]) -> None:
        """Version 2: one version of a published file, with its text (`show --config`)."""
        assert self.store is not None
        path = field(message, "path", str)
        number = field(message, "version", int)
        if not 0 <= number < 2**63:
            raise PeerError("bad-field", f"show.version must be a version number from "
                            f"`history`, not {number}")
        self._found("version", self.store.version, path, number)

    def _found(self, kind: str, look: Callable[..., dict[str, Any]], *args: object) -> None:
        """Send what `look` finds as a `kind` message; `not-found` lets the session go on."""
        try:
            found = look(*args)
        except NotFound as exc:
            self.channel.send(error("not-found", str(exc)))
            return
        self.channel.send({"type": kind, **found})


class Version1:
    """Protocol version 1: whole snapshots (`publish`, `files`, `commit`) and the whole export.

    Each version is one of these objects: the messages it accepts after hello (`handlers`,
    each with the method that answers it) and how its messages differ from its predecessor's.
    `bye` and the end of input end the session in `Session.run`, in every version.
    """

    number = 1
    ahead = False  # bodies may come ahead of their manifest (hello offers `ahead_bytes`)
    raw_texts = False  # the texts of `bodies` and `files` lines follow them as raw UTF-8
    pipelined = False  # messages past a manifest waiting for its bodies are held
    handlers: dict[str, Callable[[Session, dict[str, Any]], None]] = {
        "publish": Session._on_publish, "note": Session._on_note, "export": Session._on_export,
        "verify": Session._on_verify, "status": Session._on_status}

    def hello(self, limits: Limits) -> dict[str, Any]:
        """What the server's hello adds in this version."""
        return {}

    def compression(self, hello: dict[str, Any]) -> str | None:
        """The compression this session uses: none before version 3."""
        return None


class Version2(Version1):
    """Version 2: content-addressed publish (`manifest`, `need`, `bodies`), pulls, history."""

    number = 2
    ahead = True
    handlers = {
        "manifest": Session._on_manifest, "bodies": Session._on_bodies, "note": Session._on_note,
        "pull": Session._on_pull, "verify": Session._on_verify, "status": Session._on_status,
        "history": Session._on_history, "show": Session._on_show}

    def hello(self, limits: Limits) -> dict[str, Any]:
        """Bodies ahead, up to the namespace quota."""
        return {"ahead_bytes": limits.namespace_bytes}

    def places(self, pool: BodyPool) -> bytearray | None:
        """The sha256s of the texts sent ahead, by place, if a manifest may name them so."""
        return None

    def stale(self, session: Session, source: str) -> None:
        """Answer a delta whose base the store does not hold."""
        session._stale_base(source)

    def need(self, source: str, entries: list[tuple[str, str, int, int]],
             need: list[str]) -> dict[str, Any] | None:
        """The `need` answering a manifest; None when nothing is lacking and it commits at once."""
        return {"type": "need", "source": source, "sha256": need}

    def body(self, entry: object) -> tuple[str, bytes, bool] | None:
        """A `bodies` entry as (sha256, UTF-8 text, whether the sha256 is the text's): a pair."""
        if (not isinstance(entry, list) or len(entry) != 2
                or not all(isinstance(x, str) for x in entry)):
            raise PeerError("bad-field", "bodies entries must be [sha256, text]")
        return entry[0], entry[1].encode("utf-8"), False

    def have(self, message: dict[str, Any], client_has: set[str]) -> set[str]:
        """The sha256s whose text a pull need not send: the client lists them (`have`)."""
        listed = field(message, "have", list, optional=True) or []
        if not all(isinstance(sha, str) for sha in listed):
            raise PeerError("bad-field", "pull.have must be a list of sha256 strings")
        return set(listed)


class Version3(Version2):
    """Version 3, for slow links: compression, texts alone, needs by index, pipelining, tails.

    The same messages as version 2 and `tails` (docs/PROTOCOL.md "Version 3").
    """

    number = 3
    raw_texts = True
    pipelined = True
    handlers = {**Version2.handlers, "tails": Session._on_tails}

    def compression(self, hello: dict[str, Any]) -> str | None:
        """The first compression the client offers that this server speaks, or None.

        The client's offer is its promise: from the byte after its hello it compresses when
        this server's hello says so (docs/PROTOCOL.md "Compression").
        """
        offered = hello.get("compress")
        if offered is None:
            return None
        if not isinstance(offered, list) or not all(isinstance(c, str) for c in offered):
            raise PeerError("bad-field", "hello.compress must be a list of compression names "
                            f"such as {list(COMPRESSIONS)}")
        return next((c for c in offered if c in COMPRESSIONS), None)

    def places(self, pool: BodyPool) -> bytearray | None:
        """A manifest entry may name its body by its place among the texts sent ahead."""
        return pool.refs

    def stale(self, session: Session, source: str) -> None:
        """`need stale`: the whole manifest comes next, in the same exchange."""
        session._stale_need(source)

    def need(self, source: str, entries: list[tuple[str, str, int, int]],
             need: list[str]) -> dict[str, Any] | None:
        """Positions in the manifest's files, the first of each sha256 lacking; None for none."""
        if not need:
            return None
        missing, index = set(need), []
        for i, (_, sha, _, _) in enumerate(entries):
            if sha in missing:
                missing.discard(sha)
                index.append(i)
        return {"type": "need", "source": source, "index": index}

    def body(self, entry: object) -> tuple[str, bytes, bool] | None:
        """The text alone, raw bytes read after the line: its address is computed.

        None for bytes that are not UTF-8 (dropped, and a place nothing can name).
        """
        if type(entry) is not bytes:
            raise PeerError("bad-field", "a version 3 bodies message carries its texts raw after "
                            "its line (sizes), not in the JSON")
        if not (entry.isascii() or _utf8(entry)):
            return None
        return sha256_bytes(entry), entry, True

    def have(self, message: dict[str, Any], client_has: set[str]) -> set[str]:
        """No list: the session knows which texts the client sent it."""
        return client_has


# The protocol versions this server speaks, each with its handlers: the one statement of what a
# version accepts (docs/PROTOCOL.md points here).
HANDLERS: dict[int, Version1] = {v.number: v for v in (Version1(), Version2(), Version3())}
# Messages whose answer reads nothing of the bodies a session holds: the bodies a commit listed
# are released after them (`BodyPool.settle`), so the pull's answer does not wait for it.
POOL_FREE = frozenset({"pull", "note", "status", "history", "show", "verify"})
# The parts of an exchange its handler reads itself (a publish's `files` and `commit`, a
# manifest's `bodies` and `commit`): sent where no handler takes them, they are out of order
# rather than unknown.
PARTS = frozenset({"files", "bodies", "commit"})
AHEAD = frozenset({"bodies", "tails"})  # session-level messages reported on (`_report`)


def _of_source(part: dict[str, Any], source: str | None) -> dict[str, Any]:
    """`part` of an exchange, unless it names a source other than the exchange's."""
    named = part.get("source")
    if source is not None and named is not None and named != source:
        raise PeerError("out-of-order", f"a {part['type']!r} for source {named!r} came while "
                        f"the exchange of source {source!r} waited for its parts; finish one "
                        "source's exchange before the next")
    return part


def _load_for_changes() -> None:
    """Load what a change needs on a thread, while the client walks or sends its bodies.

    Compiling the redactor's screens and the path rules' patterns, and loading `hashlib`
    (OpenSSL), `ingest.py` and `tails.py`, take milliseconds a session spends on a thread while
    it waits for the client, not on its answer. One that receives no change loads them for
    nothing, on that thread, while it waits.
    """
    import threading

    def load() -> None:
        from sharedmem.hashing import sha256_bytes
        from sharedmem.redact.redactor import prepare
        from sharedmem.rules import compile_rules
        prepare()
        compile_rules()
        sha256_bytes(b"")  # loads hashlib, which the first hash would
        import importlib
        for module in ("sharedmem.server.ingest", "sharedmem.server.tails"):
            importlib.import_module(module)

    threading.Thread(target=load, daemon=True, name="sharedmem-load").start()


def _backup_first(path: Path, old_version: int) -> None:
    """A verified backup before a migration; backup.py loads only when one is due."""
    from sharedmem.server.backup import migration_hook
    migration_hook(path, old_version)


def _file_cost(item: tuple[str, str, bytes | None]) -> int:
    """What one file adds to a `files` message, at most (JSON may double a text's bytes)."""
    return len(item[0]) + 80 + 2 * len(item[2] or b"")


def _utf8(data: bytes) -> bool:
    """Whether `data` is valid UTF-8, checked without keeping a str."""
    try:
        str(data, "utf-8")
    except UnicodeDecodeError:
        return False
    return True


def serve(store: Path | str, pinned: str | None = None, *, max_version: int = max(VERSIONS),
          stdin: IO[bytes] | None = None, stdout: IO[bytes] | None = None,
          limits: Limits | None = None) -> int:
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
    return Session(store, Channel(reader, writer, "client"), pinned, versions, limits).run()
