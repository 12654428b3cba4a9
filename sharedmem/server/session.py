"""`serve`: the stdio end of the sync exchange, over one store.

Run by the client as a local child process or as the remote command of `ssh` (in an SSH forced
command with `--machine`, which pins the key to one machine). Only protocol goes to stdout.
"""

from __future__ import annotations

import re
import sqlite3
import sys
import time
from collections import deque

from sharedmem import __version__, collector
from sharedmem.core import BackupError, NoteError, ProtocolError, SharedMemoryError, StoreError
from sharedmem.hashing import sha256_bytes
from sharedmem.protocol import (
    AHEAD_REFS,
    COMPRESSIONS,
    REPORT_BYTES,
    VERSIONS,
    Channel,
    PeerError,
    choose_version,
    chunks,
    encode_files,
    error,
    field,
    printable,
)
from sharedmem.rules import KIND_MARKDOWN, MIB, SOURCE_KINDS, Limits, name_problem
from sharedmem.server.store import DiskFull, Store, disk_full, full_error

TYPE_CHECKING = False  # typing costs `serve` milliseconds before it can answer
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from pathlib import Path
    from typing import IO, Any

    from sharedmem.server.ingest import IncomingFile


# Bodies are stored in batches of about this much as they come. What is left under it waits
# for the namespace's commit, after the client's last byte: at 4 MiB, up to 4 MiB of a first
# sync's bodies were written there (first syncs of 10,000 files over a 40 ms link: 4.16-4.20
# against 4.11-4.13 s at 1 MiB, docs/BENCHMARKS.md "Eighth round").
STORE_AHEAD_BYTES = 1 * MIB
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
        self.store: Store | None = None
        self.machine = ""
        self.version = 0
        # Verified, redacted bodies not yet committed, by the sha256 the client gave them:
        # sha256 -> (text in UTF-8, redactions, size, sha256 as stored), size and address those
        # of the redacted text. Every body (sent ahead, answering a need, or in a version 1 `files`)
        # goes to `unstored`, and once those pass STORE_AHEAD_BYTES they are stored as they are
        # (text None here), claimed for this session until it ends (Store.put_blobs): the
        # session holds no more text than that. Fewer wait for the commit that lists them to
        # store them in its own transaction.
        self.pool: dict[str, tuple[bytes | None, dict[str, int], int, str]] = {}
        self.ahead_bytes = 0
        self.unstored: list[tuple[str, int, bytes]] = []
        self.unstored_keys: list[str] = []  # the client's sha256 of each row of `unstored`
        self.unstored_bytes = 0
        # Bodies refused as they came, kept as (reason, size) and none of their text: over the
        # file limit (for the session), or past the namespace quota of one exchange (`budget`).
        self.refused: dict[str, tuple[str, int]] = {}
        # The bodies the last commit listed, which leave the pool (`_release`) before the next
        # message that reads it: not before a pull, which the client waits for.
        self.to_release: set[str] | None = None
        self.budget = 0  # bytes one exchange may still send (answering need, or version 1)
        # Version 3: messages the client pipelined past a manifest still waiting for its bodies
        # (answered in order after its commit), with their size on the wire.
        self.deferred: deque[tuple[dict[str, Any], int]] = deque()
        self.deferred_bytes = 0
        # Version 3: the sha256s whose text the client holds (the bodies it sent that a commit
        # of this session listed): a pull sends `null` for them, with no `have` list. At most
        # namespace_files of them; past that a text is sent again, which costs bytes only.
        self.client_has: set[str] = set()
        # Version 3: the sha256 (raw) of each text sent ahead, in order, so a manifest entry may
        # name its body by its place here (protocol.AHEAD_REFS); NO_REF for one not UTF-8.
        self.refs = bytearray()
        # Version 3, compressed, asked for in the client's hello: the wire bytes last reported
        # (`received`), until the first message that is not a body sent ahead (then None).
        self.reported: int | None = None

    def run(self) -> int:
        """Serve until `bye` or end of input; a protocol error is answered, then ends the session.

        Python's cyclic garbage collector is paused meanwhile (and restored after): a session
        makes no reference cycles in its work, but holds tens of thousands of objects once a
        manifest of 10,000 files is parsed, and each full collection walks all of them, up to
        a fifth of the time from that manifest to its result. Reference counting frees all
        the rest as before.
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
        except PeerError as exc:
            self._fail(exc.code, str(exc))
            return 1
        except DiskFull as exc:
            self._fail("disk-full", str(exc))
            return 1
        except (StoreError, BackupError) as exc:
            self._fail("store", str(exc))
            return 1
        except (sqlite3.Error, OSError) as exc:  # a read that found no room, an I/O error
            if disk_full(exc, self.store_path):
                self._fail("disk-full", str(full_error(self.store_path, exc)))
            elif isinstance(exc, sqlite3.Error):
                self._fail("store", f"the store {self.store_path} failed: {exc}")
            else:
                self._fail("store", f"serve failed: {exc}")
            return 1
        except SharedMemoryError as exc:
            self._fail("bad-field", str(exc))
            return 1
        finally:
            if self.store is not None:
                self._end()

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
        """Say why the session ends; `code` and `message` may echo the peer's own error."""
        message = printable(message[:MAX_ERROR_CHARS])
        sys.stderr.write(f"serve: {message}\n")
        try:
            self.channel.send(error(printable(code[:MAX_ERROR_CHARS]), message))
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
        if self.version >= 3:  # bodies may carry their texts as raw UTF-8 after their line
            reply["raw_bodies"] = True
        compress = self._compression(message)
        if compress is not None:
            reply["compress"] = compress
            if message.get("reports") is True:  # they tell its sender how fast the link goes
                reply["reports"] = True
                self.reported = 0
        self.channel.send(reply)
        if compress is not None:  # both streams, from the byte after each side's hello line
            self.channel.compress_output()
            self.channel.decompress_input()
        self.channel.raw_bodies = self.version >= 3
        if self.version >= 2 and "sharedmem.redact.redactor" not in sys.modules:
            _load_for_changes()  # while the client walks: what its changes will need

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

    def _compression(self, hello: dict[str, Any]) -> str | None:
        """Version 3: the first compression the client offers that this server speaks, or None.

        The client's offer is its promise: from the byte after its hello it compresses when
        this server's hello says so (docs/PROTOCOL.md "Compression").
        """
        offered = hello.get("compress")
        if self.version < 3 or offered is None:
            return None
        if not isinstance(offered, list) or not all(isinstance(c, str) for c in offered):
            raise PeerError("bad-field", "hello.compress must be a list of compression names "
                            f"such as {list(COMPRESSIONS)}")
        return next((c for c in offered if c in COMPRESSIONS), None)

    def _dispatch(self, message: dict[str, Any]) -> None:
        """Answer one message through HANDLERS, the table of what each version accepts."""
        kind = message["type"]
        handler = HANDLERS[self.version].get(kind)
        if handler is None:
            code = "out-of-order" if kind in PARTS else "unknown-type"
            raise PeerError(code, f"message type {kind!r} is not allowed here in protocol "
                            f"version {self.version}")
        if self.to_release is not None and kind not in POOL_FREE:
            shas, self.to_release = self.to_release, None
            self._release(shas)
        handler(self, message)

    def _next(self) -> dict[str, Any] | None:
        """The next session-level message: one held while an exchange waited, else a new one."""
        if self.deferred:
            message, size = self.deferred.popleft()
            self.deferred_bytes -= size
            return message
        return self.channel.receive()

    def _part(self, *types: str, whole: str | None = None) -> dict[str, Any]:
        """Read the next part of a namespace exchange (`expect`); in version 3 hold the rest.

        A version 3 client sends every manifest, its notes and its pull without waiting: what
        comes before the part awaited is a session-level message, held (up to
        DEFERRED_MESSAGES and DEFERRED_BYTES) and answered in order after this exchange.
        With `whole`, the part awaited is that source's whole manifest (after `need stale`);
        other manifests are held.
        """
        if self.version < 3:
            return self.channel.expect(*types)
        while True:
            before = self.channel.received
            message = self.channel.receive()
            if message is None:
                return self.channel.expect(*types)  # says the client ended the session
            kind = message["type"]
            if kind in types and (whole is None or (message.get("source") == whole
                                                    and "base" not in message)):
                return message
            if kind not in HANDLERS[self.version] and kind != "bye" or kind in PARTS:
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
        source, kind = self._namespace(message)
        entries: list[tuple[str, str | None, int, int]] = []
        self.budget = self.limits.namespace_bytes
        while True:
            part = self.channel.expect("files", "commit")
            if part["type"] == "commit":
                break
            items = field(part, "files", list)
            self._count_files(len(entries) + len(items), source)
            bodies: dict[str, bytes] = {}
            for item in items:
                if not isinstance(item, dict):
                    raise PeerError("bad-field", "files entries must be objects")
                path, text = field(item, "path", str), field(item, "text", str)
                mtime = _mtime(item.get("mtime_ns"))
                try:
                    data = text.encode("utf-8")
                except UnicodeEncodeError:
                    entries.append((path, None, 0, mtime))  # refused: invalid-utf8
                    continue
                sha = sha256_bytes(data)
                entries.append((path, sha, len(data), mtime))
                if (sha not in bodies and sha not in self.pool and sha not in self.refused
                        and self._admit(sha, data, ahead=False)):
                    bodies[sha] = data
            self._keep(bodies)
        files = self._incoming(entries)
        self._commit(source, kind, files, {sha for _, sha, _, _ in entries if sha is not None})

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
        """Version 2: a manifest or a delta; the server asks only for the bodies it lacks.

        Version 3 names the bodies it lacks by their index in `files`, answers a stale delta
        with `need {"stale": true}` and takes the whole manifest as the next part, and commits
        at once a manifest that needs nothing (docs/PROTOCOL.md "Version 3").
        """
        assert self.store is not None
        source, kind = self._namespace(message)
        digest = _address(field(message, "digest", str), "manifest.digest")
        base = field(message, "base", str, optional=True)
        if base is not None:
            base = _address(base, "manifest.base")
        current = self.store.namespace_digest(self.machine, source)
        if current is not None and current == digest:
            self.channel.send({"type": "result", "source": source, "unchanged": True,
                               "generation": self.store.touch(self.machine, source),
                               "digest": digest, "accepted": None, "refused": [],
                               "redacted": {}, "stored": {}})
            return
        raw = field(message, "files", list, optional=True) or []
        self._count_files(len(raw), source)
        entries = _entries(raw, self.refs if self.version >= 3 else None)
        removed = field(message, "removed", list, optional=True) or []
        if not all(isinstance(p, str) for p in removed) or not _unicode(removed):
            raise PeerError("bad-field", "manifest.removed must be a list of paths in valid "
                            "Unicode")
        if base is not None and current != base:
            if self.version >= 3:
                self.channel.send({"type": "need", "source": source, "stale": True,
                                   "index": []})
                self._on_manifest(self._part("manifest", whole=source))
                return
            self.channel.send(error("stale-base", f"namespace {self.machine}/{source} is not at "
                                    "the base digest; send the whole manifest"))
            return
        if base is None and "files" not in message:
            raise PeerError("bad-field", "manifest needs files (whole) or base (delta)")
        shas = {sha for _, sha, _, _ in entries}
        need = self.store.need(shas - self.pool.keys() - self.refused.keys(),
                               (self.machine, source))
        if self.version >= 3:
            missing, index = set(need), []
            for i, (_, sha, _, _) in enumerate(entries):
                if sha in missing:
                    missing.discard(sha)
                    index.append(i)
            if index:
                self.channel.send({"type": "need", "source": source, "index": index})
        else:
            self.channel.send({"type": "need", "source": source, "sha256": need})
        wanted = set(need)
        self.budget = self.limits.namespace_bytes
        if need or self.version < 3:
            while (part := self._part("bodies", "commit"))["type"] == "bodies":
                self._take_bodies(part, wanted)
        files = self._incoming(entries)
        held = [sha for sha in shas if sha in self.pool] if self.version >= 3 else []
        if self._commit(source, kind, files, shas, removed=removed if base else None,
                        base=base, digest=digest) and self.version >= 3:
            self._remember(held)

    def _remember(self, shas: Iterable[str]) -> None:
        """Version 3: note sha256s whose text the client holds, up to namespace_files of them."""
        room = self.limits.namespace_files - len(self.client_has)
        if room > 0:
            self.client_has.update(list(shas)[:room])

    def _incoming(self, entries: Iterable[tuple[str, str | None, int, int]]
                  ) -> list[IncomingFile]:
        """The listed files with what this session holds of each body: text, stored, or refused.

        Each made as a plain tuple of all its fields, not through IncomingFile's keywords and
        defaults: a third of the cost, for the 10,000 files of a first sync. ingest.py is not
        loaded before the hello: `_load_for_changes` loads it after, while the client walks.
        """
        from sharedmem.server.ingest import IncomingFile
        pool, refused = self.pool, self.refused
        make = tuple.__new__
        files = []
        for path, sha, size, mtime in entries:
            body = pool.get(sha)
            if body is not None:
                text, counts, size, address = body
                files.append(make(IncomingFile, (path, sha, size, mtime, text, counts, address,
                                                 None)))
            elif (refusal := refused.get(sha)) is not None:
                files.append(make(IncomingFile, (path, sha, refusal[1], mtime, None, None, None,
                                                 refusal[0])))
            else:  # version 1 lists a text that is not UTF-8 with no sha256: refused
                files.append(make(IncomingFile, (path, sha, size, mtime, None, None, None,
                                                 "invalid-utf8" if sha is None else None)))
        return files

    def _on_bodies(self, message: dict[str, Any]) -> None:
        """Version 2: bodies ahead of their manifest, sent while the client still walks."""
        self._take_bodies(message, None)

    def _take_bodies(self, message: dict[str, Any], wanted: set[str] | None) -> None:
        """Verify each body against its sha256 and redact it now, while the next chunk travels.

        Bodies that are not `wanted` (when given) or do not match their sha256 are dropped:
        the manifest's need, or the commit's missing-body refusal, names what is still due.
        Version 3's raw texts (bytes, read by `Channel` after the line) are hashed and kept as
        they came, each checked to be UTF-8 and never decoded whole.
        """
        fresh: dict[str, bytes] = {}
        compact = self.version >= 3
        for pair in field(message, "bodies", list):
            if compact:  # the text alone: its address is its sha256, computed here
                if type(pair) is bytes:
                    data = pair
                    valid = data.isascii() or _utf8(data)
                elif isinstance(pair, str):
                    data, valid = _encoded(pair)
                else:
                    raise PeerError("bad-field", "bodies entries must be texts (strings) in "
                                    "protocol version 3")
                if not valid:
                    if wanted is None:
                        self._refer(None)
                    continue
                sha = sha256_bytes(data)
                if wanted is None:
                    self._refer(sha)
            else:
                if (not isinstance(pair, list) or len(pair) != 2
                        or not all(isinstance(x, str) for x in pair)):
                    raise PeerError("bad-field", "bodies entries must be [sha256, text]")
                sha, text = pair
            if ((wanted is not None and sha not in wanted) or sha in fresh or sha in self.pool
                    or sha in self.refused):
                continue
            if not compact:
                data, valid = _encoded(text)
                if not valid:
                    continue
            if wanted is None:  # every body ahead counts, even one dropped below
                self._count_ahead(len(data))
            if (compact or sha256_bytes(data) == sha) and self._admit(sha, data,
                                                                       ahead=wanted is None):
                fresh[sha] = data
        self._keep(fresh)

    def _refer(self, sha: str | None) -> None:
        """Version 3: remember the next text sent ahead, which a manifest may name by its place."""
        if len(self.refs) < AHEAD_REFS * REF_BYTES:
            self.refs += NO_REF if sha is None else bytes.fromhex(sha)

    def _count_ahead(self, size: int) -> None:
        """Count bytes of bodies or tails sent ahead; past `ahead_bytes` the session ends."""
        self.ahead_bytes += size
        if self.ahead_bytes > self.limits.namespace_bytes:
            raise PeerError("ahead-full", "the client sent more than "
                            f"{self.limits.namespace_bytes} bytes of bodies and tails ahead of "
                            "a manifest (hello.ahead_bytes); send the rest when the server "
                            "names them in need")

    def _on_tails(self, message: dict[str, Any]) -> None:
        """Version 3: bodies ahead, each a stored body and what was appended to it (`tails`).

        The joined text is taken as a body sent ahead, under its own sha256, and counts its whole
        size against `ahead_bytes`. A base the store does not hold is dropped (its address and
        tail count): the manifest's `need` then names the whole body.
        """
        from sharedmem.server.tails import joined
        assert self.store is not None
        fresh: dict[str, bytes] = {}
        for pair in field(message, "tails", list):
            if (not isinstance(pair, list) or len(pair) != 2
                    or not all(isinstance(x, str) for x in pair)):
                raise PeerError("bad-field", "tails entries must be [base sha256, tail text]")
            base, tail = _address(pair[0], "tails base"), pair[1]
            try:
                added = tail.encode("utf-8")
            except UnicodeEncodeError:
                continue
            data = joined(self.store, base, added, self.limits.file_bytes)
            # A missing base counts its address too: no entry is free, however short its tail.
            self._count_ahead(len(base) + len(added) if data is None else len(data))
            if data is None:
                continue
            sha = sha256_bytes(data)
            if (sha not in fresh and sha not in self.pool and sha not in self.refused
                    and self._admit(sha, data, ahead=True)):
                fresh[sha] = data  # a stored text and a str's UTF-8: valid UTF-8
        self._keep(fresh)

    def _admit(self, sha: str, data: bytes, *, ahead: bool) -> bool:
        """Whether to keep a verified body; a refused one is remembered, none of its text.

        A body over the file limit is refused as `too-large` at once, so it is never stored.
        Bodies ahead are bounded by `ahead_bytes` (`_take_bodies`); the others by the
        exchange's namespace quota (`budget`), past which each is refused as `quota`: more
        than that could not all be stored in one namespace anyway.
        """
        size = len(data)
        if size > self.limits.file_bytes:
            self.refused[sha] = ("too-large", size)
            return False
        if not ahead:
            self.budget -= size
            if self.budget < 0:
                self.refused[sha] = ("quota", size)
                return False
        return True

    def _keep(self, fresh: dict[str, bytes]) -> None:
        """Redact admitted bodies (valid UTF-8) in one pass into the pool; store them once they add up.

        The redactor gets the bytes alone and decodes only the texts its screen touches: the
        others are stored as the bytes that came, never made into a str.
        """
        if not fresh:
            return
        from sharedmem.redact.redactor import redact_many
        for (sha, data), (clean, counts) in zip(
                fresh.items(), redact_many(None, list(fresh.values())), strict=True):
            address = sha
            if counts:  # stored as redacted, under the address of what is stored
                assert clean is not None
                data = clean.encode("utf-8")
                address = sha256_bytes(data)
            self.pool[sha] = (data, counts, len(data), address)
            self.unstored.append((address, len(data), data))
            self.unstored_keys.append(sha)
            self.unstored_bytes += len(data)
        if self.unstored_bytes >= STORE_AHEAD_BYTES:
            # Stored now, while the client still walks or sends, not in the commit it waits
            # for, and not held. A few bodies (a small re-sync's) are left to that commit: a
            # transaction of their own would cost it more than it saves.
            assert self.store is not None
            rows, keys = self.unstored, self.unstored_keys
            self.unstored, self.unstored_keys, self.unstored_bytes = [], [], 0
            self.store.put_blobs(rows)
            for sha in keys:
                _, counts, size, address = self.pool[sha]
                self.pool[sha] = (None, counts, size, address)

    def _commit(self, source: str, kind: str, files: list[IncomingFile], shas: set[str], *,
                removed: list[str] | None = None, base: str | None = None,
                digest: str | None = None) -> bool:
        """Ingest one namespace, answer its result; the bodies it listed leave the session.

        False when the base turned out stale (answered `stale-base`, nothing changed). They
        leave after the answer, and after the pull that follows it (`to_release`): forgetting a
        first sync's 10,000 took 13-17 ms, which the pull's answer waited for.
        """
        from sharedmem.server.ingest import StaleBase, ingest
        assert self.store is not None
        try:
            try:
                report = ingest(self.store, self.machine, source, kind, files,
                                limits=self.limits, removed=removed, base_digest=base,
                                digest=digest)
            except StaleBase as exc:
                self.channel.send(error("stale-base", str(exc)))
                return False
            self.channel.send({"type": "result", "source": source, "unchanged": report.unchanged,
                               "generation": report.generation, "accepted": report.accepted,
                               "refused": [_shown(item) for item in report.refused],
                               "redacted": report.redacted, "stored": report.stored,
                               "digest": self.store.namespace_digest(self.machine, source)})
            return True
        finally:
            if self.to_release is not None:  # a commit in this message's exchange: both go
                shas = shas | self.to_release
            self.to_release = shas

    def _release(self, shas: set[str]) -> None:
        """Forget the bodies a commit listed: it stored what it accepted, and the rest is dropped."""
        for sha in shas:
            self.pool.pop(sha, None)
        if self.refused:
            for sha in shas:
                self.refused.pop(sha, None)
        if self.unstored and not shas.isdisjoint(self.unstored_keys):
            kept = [i for i, sha in enumerate(self.unstored_keys) if sha not in shas]
            self.unstored = [self.unstored[i] for i in kept]
            self.unstored_keys = [self.unstored_keys[i] for i in kept]
            self.unstored_bytes = sum(row[1] for row in self.unstored)

    def _on_note(self, message: dict[str, Any]) -> None:
        assert self.store is not None
        note_id = field(message, "note_id", str)
        if not _unicode([note_id]):  # refused here: SQLite cannot even look it up
            self.channel.send({"type": "note_result", "note_id": printable(note_id),
                               "status": "refused", "message": "note id is not valid Unicode "
                               "(it holds a lone surrogate): the client must make a new one"})
            return
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
        if self.version >= 3:  # no list: the session knows what the client sent it
            have: set[str] = self.client_has
        else:
            have_list = field(message, "have", list, optional=True) or []
            if not all(isinstance(sha, str) for sha in have_list):
                raise PeerError("bad-field", "pull.have must be a list of sha256 strings")
            have = set(have_list)
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
        a store of 100,000 files costs `serve` no more memory than one of 1,000.
        """
        for batch in chunks(items, _file_cost):
            self.channel.send_line(encode_files(batch))
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
# Messages whose answer reads nothing of the bodies a session holds (`pool`, `refused`,
# `unstored`): the bodies a commit listed are released after them (`Session.to_release`).
POOL_FREE = frozenset({"pull", "note", "status", "history", "show", "verify"})

HANDLERS: dict[int, dict[str, Callable[[Session, dict[str, Any]], None]]] = {
    1: {"publish": Session._on_publish, "note": Session._on_note, "export": Session._on_export,
        "verify": Session._on_verify, "status": Session._on_status},
    2: {"manifest": Session._on_manifest, "bodies": Session._on_bodies, "note": Session._on_note,
        "pull": Session._on_pull, "verify": Session._on_verify, "status": Session._on_status,
        "history": Session._on_history, "show": Session._on_show},
}
# Version 3 takes what version 2 takes, and `tails`, the same handlers reading the version's
# changes (compact bodies, needs by index, no `have`, pipelining): docs/PROTOCOL.md "Version 3".
HANDLERS[3] = {**HANDLERS[2], "tails": Session._on_tails}
# The parts of an exchange its handler reads itself (a publish's `files` and `commit`, a
# manifest's `bodies` and `commit`): sent where no handler takes them, they are out of order
# rather than unknown.
PARTS = frozenset({"files", "bodies", "commit"})
AHEAD = frozenset({"bodies", "tails"})  # session-level messages reported on (`_report`)


def _load_for_changes() -> None:
    """Load what a change needs on a thread, while the client walks or sends its bodies.

    The redactor's screens and the path rules' patterns take 3-4 ms to compile, and `hashlib`
    (OpenSSL), `ingest.py` and `tails.py` another 8-10 ms to load; a session spends them on a
    thread while it waits for the client, not on its answer. One that receives no change
    loads them for nothing, on that thread, while it waits.
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


def _mtime(value: object) -> int:
    if type(value) is int and 0 <= value < 2**63:  # `type(x) is int` refuses True and False
        return value
    if value is None:
        return 0
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**63:
        raise PeerError("bad-field", "mtime_ns must be a non-negative integer")
    return value


def _entries(raw: list[Any], refs: bytearray | None) -> list[tuple[str, str, int, int]]:
    """Manifest entries as (path, sha256, size, mtime_ns); `refs`: version 3's texts sent ahead.

    One pass over the entries, each checked with no call for the usual values: a first sync
    lists 10,000 of them, and this is on the way from its manifest to its result.
    """
    out: list[tuple[str, str, int, int]] = []
    append = out.append
    hexed, count = "", 0  # `refs` in hex, made at the first entry that names a text by place
    for item in raw:  # `type(x) is int` refuses True and False too
        if (type(item) is not list or len(item) != 4 or type(item[0]) is not str
                or type(item[2]) is not int):
            raise PeerError("bad-field", "manifest entries must be [path, sha256, size, mtime_ns]")
        path, sha, size, mtime = item
        if type(sha) is int and refs is not None:
            if not hexed:
                hexed, count = refs.hex(), len(refs) // REF_BYTES
            place = sha
            sha = hexed[place * 64:place * 64 + 64] if 0 <= place < count else _NO_REF_HEX
            if sha == _NO_REF_HEX:
                raise _unnamed(place, count, path)
        elif type(sha) is not str or len(sha) != 64:
            raise PeerError("bad-field", "manifest entries must be [path, sha256, size, mtime_ns]"
                            + (" (in version 3 the sha256 may be the place of a text sent ahead)"
                               if refs is not None else ""))
        if type(mtime) is not int or not 0 <= mtime < 2**63:
            mtime = _mtime(mtime)
        append((path, sha, size, mtime))
    if not _HEX.fullmatch("".join(e[1] for e in out)):  # one match for all: each is 64 long
        raise PeerError("bad-field", "manifest entries must be [path, sha256, size, mtime_ns] "
                        "with sha256 in 64 lower-case hex digits")
    return out


_HEX = re.compile("[0-9a-f]*")
REF_BYTES = 32
NO_REF = bytes(REF_BYTES)  # a text sent ahead that was not UTF-8: nothing to refer to
_NO_REF_HEX = NO_REF.hex()


def _unnamed(place: int, count: int, path: object) -> PeerError:
    """Why a manifest entry cannot name its body as the text sent ahead at `place`."""
    return PeerError("bad-field", f"manifest entry {path!r} names text {place} sent ahead, "
                     f"but this session took {count} texts ahead that it can name (the first "
                     f"{AHEAD_REFS}, in UTF-8): give that file's sha256 instead")


def _address(value: str, what: str) -> str:
    """A sha256 or digest field, which must be 64 lower-case hex digits."""
    if len(value) != 64 or not _HEX.fullmatch(value):
        raise PeerError("bad-field", f"{what} must be a sha256 in 64 lower-case hex digits")
    return value


def _utf8(data: bytes) -> bool:
    """Whether `data` is valid UTF-8 (no lone surrogate either), checked without keeping a str."""
    try:
        str(data, "utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _encoded(text: str) -> tuple[bytes, bool]:
    """A JSON text in UTF-8, and whether it has that form (a lone surrogate has none)."""
    try:
        return text.encode("utf-8"), True
    except UnicodeEncodeError:
        return b"", False


def _unicode(texts: list[str]) -> bool:
    """Whether every one of `texts` has a UTF-8 form (holds no lone surrogate)."""
    try:
        "".join(texts).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _shown(refusal: dict[str, str]) -> dict[str, str]:
    """A refusal as it can be sent: a path or message with a lone surrogate written out."""
    if _unicode(list(refusal.values())):
        return refusal
    return {key: printable(value) for key, value in refusal.items()}


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
