"""`sync`: snapshot each source, exchange it with the server, deliver notes, refresh the cache.

This module publishes; delivering the notes and refreshing the cache are the exchange's
(exchange.py), which a sync holds. What needs no answer from the server is done while ssh
connects (`Sync._prepare`): the walk, the bodies sent ahead and the files staged ahead. The
rest goes in order: publish, notes, pull, apply, save the states. In protocol version 3 the
manifests, the notes and the pull go out together, and the answers are read in order after
(`Sync._publish_pipelined`).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections import deque
from collections.abc import Iterable, Iterator
from pathlib import Path

from sharedmem import __version__, collector, linejson
from sharedmem.cache.staged_files import write_failure
from sharedmem.cache.writers import PreStagedWriter
from sharedmem.client import source_state, tails
from sharedmem.client.config import ClientConfig, SourceConfig
from sharedmem.client.exchange import Exchange, Progress, Published
from sharedmem.client.lock import sync_lock
from sharedmem.client.send_ahead import Ahead
from sharedmem.client.transport import Connection, HelloChanged
from sharedmem.clock import utc_now
from sharedmem.core import CacheError, SharedMemoryError
from sharedmem.files import atomic_write
from sharedmem.hashing import digest_of
from sharedmem.protocol import (
    VERSIONS,
    PeerError,
    chunks,
    encode,
    encode_raw_texts,
    encode_texts,
)
from sharedmem.rules import MACHINES_DIR
from sharedmem.sources import kinds as sources
from sharedmem.sources import walk

TYPE_CHECKING = False  # typing costs each sync's start milliseconds
if TYPE_CHECKING:
    from typing import Any

EXIT_OK, EXIT_PARTIAL, EXIT_FAILED = 0, 1, 2
ERROR_CHARS = 2000  # of an error kept in the report and state/last-sync.json
# Version 3: what the client sends past a manifest whose answer it has not read, at most: the
# server holds up to 64 messages and 8 MiB of them while a manifest waits for its bodies.
PIPELINE_MESSAGES = 48
PIPELINE_BYTES = 6 << 20
STAGE_BATCH = 256  # files read, looked up in the cache together before they are staged
# A manifest's mtime_ns for every file: the server stores the field and reads it for nothing,
# and the real times were a third of a first sync's manifest on the wire, compressed: 66-75 kB
# of 185-212 kB for 10,000 files (docs/PROTOCOL.md "Version 2", docs/BENCHMARKS.md).
NO_MTIME = 0


class _Prepared:
    """One source's snapshot and the messages that publish it, built before the session starts.

    A plain class: the dataclasses module would cost every sync 15 ms to import.
    """

    def __init__(self, source: SourceConfig, spec: sources.SourceSpec, state_file: Path,
                 saved: source_state.SourceState, rules: list[Any], snap: sources.Snapshot,
                 digest: str, lines: linejson.Old) -> None:
        self.source, self.spec, self.state_file = source, spec, state_file
        self.saved, self.rules, self.snap, self.digest = saved, rules, snap, digest
        self.lines = lines  # the saved record's lines, for reuse
        self._by_sha: dict[str, walk.Entry] | None = None
        self.redacted: dict[str, int] = {}
        self.delta: dict[str, Any] | None = None
        self.acked = False
        self.line = b""  # the manifest message (delta or whole), encoded before it is due
        self.placed = False  # `line` names bodies sent ahead by place (`Ahead.places`)
        self.state_text: str | None = None  # the state file if the server acknowledges `digest`
        self._whole: dict[str, Any] | None = None

    @property
    def by_sha(self) -> dict[str, walk.Entry]:
        """sha256 -> file, for the bodies a `need` names: made only when one comes."""
        if self._by_sha is None:
            self._by_sha = {entry.sha256: entry for entry in self.snap.files}
        return self._by_sha

    @property
    def whole(self) -> dict[str, Any]:
        """The whole manifest: sent when there is no delta, or the server's base is another.

        Built when first asked: a sync whose delta the server takes never lists every file.
        """
        if self._whole is None:
            spec = self.spec
            self._whole = {"type": "manifest", "source": spec.name, "kind": spec.kind,
                           "digest": self.digest,
                           "files": [[e.path, e.sha256, e.size, NO_MTIME]
                                     for e in self.snap.files]}
        return self._whole


class Sync:
    """One sync run: publish, then the exchange's pull; `report` is what `sync --json` prints."""

    def __init__(self, config: ClientConfig, max_version: int = max(VERSIONS),
                 progress: Progress | None = None, lock_wait: float = 0.0,
                 waiting: Progress | None = None, build_index: bool = False) -> None:
        self.config = config
        self.lock_wait, self.waiting = lock_wait, waiting  # see lock.sync_lock
        self.max_version = max_version
        self.progress = progress or (lambda _msg: None)
        self.exchange = Exchange(config, self.progress)
        self.exchange.build_index = build_index
        self.staging = self.exchange.staging
        self.have: dict[str, str] = {}  # sha256 -> text of each file read this time
        self.unstaged: list[tuple[str, str, bytes]] = []  # read, to stage if the cache lacks them
        self.snapshots: list[_Prepared] = []
        self.last_to_publish: _Prepared | None = None
        self.published: list[_Prepared] = []
        self.round_trips = 0  # answers waited for: the hello's, then one per batch of sends
        self._sent_at_wait = 0
        self.held: dict[str, dict[str, str]] = {}  # see _held
        # The pull's: version 3 takes this run's own files in with it before the answer comes.
        self.writer = PreStagedWriter(self.staging, own_paths=_OwnPaths(self))
        # With no record of the server's hello, go on as if it answered as ours does by
        # default (`Connection.expected`); not on the run again after a hello that differed.
        self.expect = True
        self.report: dict[str, Any] = {"machine": config.machine, "status": "ok",
                                       "sources": [], "notes": self.exchange.notes}
        self.failure: SharedMemoryError | None = None

    def run(self) -> dict[str, Any]:
        """Publish, deliver, pull; any failure leaves the cache and the outbox as they were.

        What the pull could not write is skipped and named (`pull.skipped`): the run is then
        partial, and everything else is written. Python's cyclic garbage collector is paused
        meanwhile (and restored after), as `serve`'s is for its session: a run makes no
        reference cycles in its work, but holds a record and a snapshot of tens of thousands
        of objects, and the collector's passes over them delayed the manifest of a sync of
        10,000 files with 1% changed by 24-65 ms (docs/BENCHMARKS.md "Sixth round").
        """
        with collector.Paused():
            return self._run()

    def _run(self) -> dict[str, Any]:
        started = time.monotonic()
        try:
            self.exchange.cache.check_meta()  # before anything, so a link there is never used
            with sync_lock(self.config.state, self.lock_wait, self.waiting), \
                    Connection(self.config, self.max_version) as conn:
                ahead = Ahead(conn)
                with conn.handshake(expect=self.expect):
                    self._prepare(ahead)
                self.report["protocol"] = conn.version
                self.round_trips = 1  # the hello
                self._sent_at_wait = conn.channel.sent
                if ahead.send_waiting():  # bodies went that the manifests may name by place
                    self._encode_manifests(ahead)
                ok = [p for p in self.snapshots if p.snap.status == "ok"]
                self.last_to_publish = ok[-1] if ok else None
                if conn.version >= 3:
                    self._publish_pipelined(conn)
                else:
                    for prepared in self.snapshots:
                        self.report["sources"].append(self._publish(conn, prepared))
                    self._request(conn)  # unless the last commit sent it
                self._wait(conn)
                self.exchange.deliver(conn)
                self.report["pull"] = self._pull(conn)
                self._save_states()
                self.exchange.settle()
                self.report["bytes"] = {"sent": conn.channel.sent,
                                        "received": conn.channel.received}
                self.report["round_trips"] = self.round_trips
        except SharedMemoryError as exc:
            self.failure = exc
            error = str(exc)  # may quote the server, whose error text may be megabytes long
            if len(error) > ERROR_CHARS:
                error = f"{error[:ERROR_CHARS]}... ({len(error)} characters)"
            self.report.update(status="failed", error=error)
        else:
            partial = any(s["status"] != "published" and s["status"] != "unchanged"
                          or s["problems"] for s in self.report["sources"])
            if partial or self.report["notes"]["refused"] or self.report["pull"]["skipped_total"]:
                self.report["status"] = "partial"
        finally:
            self.staging.discard()
            self.exchange.cache.discard_check()
        self.report["exit_code"] = {"ok": EXIT_OK, "partial": EXIT_PARTIAL,
                                    "failed": EXIT_FAILED}[self.report["status"]]
        self.report["seconds"] = round(time.monotonic() - started, 3)
        self.report["finished_at"] = utc_now()
        with contextlib.suppress(OSError):  # a full disk: the report still says what happened
            _write_json(self.config.state / "last-sync.json", {
                k: self.report.get(k) for k in ("status", "error", "finished_at", "exit_code")})
        return self.report

    def _prepare(self, ahead: Ahead) -> None:
        """Everything that needs no answer from the server; run while ssh connects.

        Walk every source, staging the files the cache lacks and sending ahead the bodies the
        server lacks, and encode the manifests while the last bodies go out.
        """
        self.exchange.cache.remove_leftovers()
        self.exchange.open_cache()  # its files are checked once the manifests are sent,
        if self.config.sources:  # stat'ed by a helper while the sources are walked
            self.exchange.cache.start_check()
        self.staging.new_namespaces = frozenset(
            self._namespace(s.name) for s in self.config.sources) - self.exchange.known.keys()
        self.snapshots = [self._snapshot(source, ahead) for source in self.config.sources]
        self.staging.flush()  # the rest to the helper; without one, the few are left to the pull
        ahead.finish()
        self._encode_manifests(ahead)  # while the sender writes the last bodies
        ahead.wait()  # each manifest follows its bodies on the channel

    def _snapshot(self, source: SourceConfig, ahead: Ahead) -> _Prepared:
        """Walk one source and build its manifest; done while ssh connects, so the two overlap."""
        spec = sources.SourceSpec(source.name, source.kind, source.path)
        state_file = self.config.state / "sources" / f"{source.name}.json"
        saved, lines = source_state.read(state_file)
        limits = self.config.limits
        rules = [__version__, limits.file_bytes, limits.namespace_bytes, limits.namespace_files]
        previous = saved.record if saved.rules == rules else None
        prefix = self._namespace(source.name) + "/"
        on_server: set[str] | None = None  # the acknowledged sha256s, once a file is read

        def stage(entry: walk.Entry, data: bytes) -> None:
            """A file read: kept for the pull, staged if the cache lacks it, sent if the server does."""
            nonlocal on_server
            if entry.text is None:
                return
            self.have[entry.sha256] = entry.text
            self.unstaged.append((prefix + entry.path, entry.sha256, data))
            if len(self.unstaged) >= STAGE_BATCH:
                self._stage_read()
            if on_server is None:
                on_server = saved.acked_shas()
            if entry.sha256 not in on_server:
                grown = tails.grown_from((saved.record or {}).get(entry.path), data, on_server)
                if grown is not None:  # only appended to what the server holds: the tail goes
                    ahead.offer_tail(entry.sha256, grown[0], data, grown[1])
                else:
                    ahead.offer(entry.sha256, data)

        snap = sources.snapshot(spec, limits, previous, stage)
        self._stage_read()
        acked = saved.acked
        # Every file reused from a record the server acknowledged whole (an older state listed
        # the files in `acked`): the snapshot is that record, its digest the acknowledged one.
        unchanged = (acked is not None and acked.files is None and type(acked.digest) is str
                     and previous is not None and len(snap.files) == len(previous)
                     and all(e.text is None for e in snap.files))
        digest = acked.digest if unchanged else digest_of((e.path, e.sha256) for e in snap.files)
        prepared = _Prepared(source, spec, state_file, saved, rules, snap, digest, lines=lines)
        redacted = prepared.redacted  # the texts read are in `have` already (`stage`)
        for entry in snap.files:
            if entry.redactions:
                for kind, count in entry.redactions.items():
                    redacted[kind] = redacted.get(kind, 0) + count
        if acked is not None and (acked.files is not None or saved.record is not None):
            head = {"type": "manifest", "source": spec.name, "kind": spec.kind,
                    "digest": digest, "base": acked.digest}
            if unchanged:
                prepared.delta = {**head, "files": [], "removed": []}
            else:
                files, removed = _changes(saved, snap.files)
                prepared.delta = {**head, "removed": removed, "files": files}
        return prepared

    def _stage_read(self) -> None:
        """Stage the files read that the cache does not hold at their sha256, looked up together."""
        batch, self.unstaged = self.unstaged, []
        if not batch:
            return
        held = self.exchange.cached_shas([path for path, _, _ in batch])
        for path, sha, data in batch:
            if held.get(path) != sha:
                self.staging.add(path, sha, data)

    def _publish(self, conn: Connection, prepared: _Prepared,
                 reply: dict[str, Any] | None = None) -> dict[str, Any]:
        """One source's report entry; its exchange, unless `reply` is its result already."""
        source, snap = prepared.source, prepared.snap
        result: dict[str, Any] = {
            "source": source.name, "kind": source.kind, "path": str(source.path),
            "files": len(snap.files), "skipped": [s._asdict() for s in snap.skipped],
            "problems": [s._asdict() for s in snap.problems()], "refused": [], "redacted": {}}
        if snap.status != "ok":
            result.update(status="unreadable", message=snap.message +
                          " (the server keeps what it already holds for this source)")
            return result
        if reply is None:
            self.progress(f"{source.name}: {len(snap.files)} files")
            if conn.version == 1:
                reply = self._publish_v1(conn, prepared.spec, snap)
            else:
                reply = self._publish_v2(conn, prepared)
        _check_result(conn, reply, source.name)
        redacted = dict(prepared.redacted)
        for kind, count in reply["redacted"].items():
            redacted[kind] = redacted.get(kind, 0) + count
        result.update(status="unchanged" if reply["unchanged"] else "published",
                      refused=reply["refused"], redacted=redacted,
                      generation=reply["generation"])
        if result["refused"]:
            result["problems"] += result["refused"]
        prepared.acked = reply["digest"] == prepared.digest
        self.published.append(prepared)
        return result

    def _save_states(self) -> None:
        """Remember what each source published, for the next snapshot and delta; after the pull.

        `acked` names the digest the server confirmed; its files are those of the record. The
        record is written one file a line, and the lines of files reused unread are kept.
        """
        for prepared in self.published:
            acked = source_state.Acked(prepared.digest) if prepared.acked else None
            if _state_unchanged(prepared, acked):
                continue
            text = (prepared.state_text if acked is not None and prepared.state_text is not None
                    else source_state.encode_state(prepared.rules, acked, prepared.snap.files,
                                                   prepared.lines))
            try:
                atomic_write(prepared.state_file, text.encode("utf-8"), mode=0o600,
                             durable=False)
            except OSError as exc:  # the next sync reads the source afresh: nothing is lost
                raise CacheError(write_failure(str(prepared.state_file), exc)) from None

    def _publish_v1(self, conn: Connection, spec: sources.SourceSpec,
                    snap: sources.Snapshot) -> dict[str, Any]:
        conn.channel.send({"type": "publish", "source": spec.name, "kind": spec.kind})
        items = [{"path": e.path, "text": _text(spec, e), "mtime_ns": e.mtime_ns}
                 for e in snap.files]
        for batch in chunks(items, lambda i: len(i["text"]) * 2 + len(i["path"]) + 40):
            conn.channel.send({"type": "files", "files": batch})
        conn.channel.send({"type": "commit"})
        self._wait(conn)
        return conn.channel.expect("result")

    def _wait(self, conn: Connection) -> None:
        """Count a round trip when this side waits for an answer after sending something."""
        if conn.channel.sent != self._sent_at_wait:
            self.round_trips += 1
            self._sent_at_wait = conn.channel.sent

    def _publish_pipelined(self, conn: Connection) -> None:
        """Version 3: every manifest, then the notes and the pull, then the answers in order.

        A manifest that needs nothing is answered `result` at once; one that needs bodies is
        answered `need`, which this side answers with bodies and `commit` when it reads it,
        while the server holds what came after. No more than PIPELINE_MESSAGES and
        PIPELINE_BYTES go out past an unanswered manifest: past that, answers are read first.
        """
        window: deque[tuple[_Prepared, int]] = deque()
        in_flight = 0
        replies: dict[int, dict[str, Any]] = {}

        def answer_oldest() -> int:
            prepared, size = window.popleft()
            replies[id(prepared)] = self._answer_v3(conn, prepared)
            return size

        for prepared in self.snapshots:
            if prepared.snap.status != "ok":
                continue
            line = prepared.line or encode(prepared.delta or prepared.whole)
            while window and (len(window) >= PIPELINE_MESSAGES
                              or in_flight + len(line) > PIPELINE_BYTES):
                in_flight -= answer_oldest()
            self.progress(f"{prepared.source.name}: {len(prepared.snap.files)} files")
            conn.channel.send_line(line)
            window.append((prepared, len(line)))
            in_flight += len(line)
        notes = self.exchange.outbox.pending()
        notes_bytes = sum(len(n.text) * 2 + len(n.filename) + 200 for _, n in notes)
        if window and (len(window) + len(notes) + 1 > PIPELINE_MESSAGES
                       or in_flight + notes_bytes > PIPELINE_BYTES):
            while window:
                answer_oldest()
        self._request(conn)
        self._encode_states()  # while the answers are on their way
        self.staging.write_few()  # so is staging the few files no helper took
        self.exchange.take_own_ahead(self.writer)  # and taking in this run's own files
        while window:
            answer_oldest()
        for prepared in self.snapshots:
            self.report["sources"].append(self._publish(conn, prepared, replies.get(id(prepared))))

    def _answer_v3(self, conn: Connection, prepared: _Prepared) -> dict[str, Any]:
        """Read the answer to one pipelined manifest; answer its `need`; return its `result`."""
        spec, by_sha = prepared.spec, prepared.by_sha
        sent = prepared.delta or prepared.whole
        self._wait(conn)
        reply = conn.channel.expect("need", "result")
        if reply["type"] == "need" and reply.get("stale") is True:
            sent = prepared.whole  # the base is not what the server holds: the whole manifest
            conn.channel.send(sent)
            self._wait(conn)
            reply = conn.channel.expect("need", "result")
        if reply["type"] == "result":
            return reply
        index, files = reply.get("index"), sent["files"]
        if reply.get("source") != spec.name or type(index) is not list or not all(
                type(i) is int and 0 <= i < len(files) for i in index):
            raise conn.malformed("need", f"for source {spec.name!r} it needs that source and "
                                 "index as a list of positions in the manifest's files")
        texts: list[bytes] = []
        for sha, text in _needed(spec, by_sha, (files[i][1] for i in index)):
            self.have[sha] = text  # the server sends null for it in the pull
            texts.append(text.encode("utf-8"))
        self.progress(f"{spec.name}: sending {len(texts)} changed files")
        encode_batch = encode_raw_texts if conn.raw_bodies else encode_texts
        for batch in chunks(texts, lambda data: len(data) + 8):
            conn.channel.send_line(encode_batch(batch, spec.name))
        conn.channel.send({"type": "commit", "source": spec.name})
        self._wait(conn)
        return conn.channel.expect("result")

    def _publish_v2(self, conn: Connection, prepared: _Prepared) -> dict[str, Any]:
        spec, by_sha = prepared.spec, prepared.by_sha
        try:
            conn.channel.send_line(prepared.line if prepared.line and not prepared.placed
                                   else encode(prepared.delta or prepared.whole))
            self._wait(conn)
            reply = conn.channel.expect("need", "result")
        except PeerError as exc:
            if exc.code != "stale-base":
                raise
            conn.channel.send(prepared.whole)
            self._wait(conn)
            reply = conn.channel.expect("need", "result")
        if reply["type"] == "result":
            return reply
        need = reply.get("sha256")
        if reply.get("source") != spec.name or type(need) is not list or not all(
                type(sha) is str for sha in need):
            raise conn.malformed("need", f"for source {spec.name!r} it needs that source and "
                                 "sha256 as a list of strings")
        bodies = [[sha, text] for sha, text in _needed(spec, by_sha, need)]
        self.progress(f"{spec.name}: sending {len(bodies)} changed files")
        for batch in chunks(bodies, lambda b: len(b[1]) * 2 + 80):
            conn.channel.send({"type": "bodies", "source": spec.name, "bodies": batch})
        conn.channel.send({"type": "commit", "source": spec.name})
        if prepared is self.last_to_publish:  # so the server goes on to them after its commit
            self._request(conn)
        self._wait(conn)
        return conn.channel.expect("result")

    def _encode_manifests(self, ahead: Ahead) -> None:
        """Encode each manifest message while the last bodies sent ahead are still on their way.

        In version 3 a body sent ahead is named by its place among those texts: a first sync's
        manifest is a third the size on the wire (docs/PROTOCOL.md "Version 3").
        """
        places = ahead.places
        for prepared in self.snapshots:
            if prepared.snap.status != "ok":
                continue
            message = prepared.delta or prepared.whole
            if places:
                files = [[p, places.get(sha, sha), size, mtime]
                         for p, sha, size, mtime in message["files"]]
                message, prepared.placed = {**message, "files": files}, True
            prepared.line = encode(message)

    def _encode_states(self) -> None:
        """Encode the state each source leaves if the server acknowledges what it was sent.

        Done while the answer is awaited (a first sync's is its last bodies and the commit),
        so only the write is left for after it.
        """
        for prepared in self.snapshots:
            if prepared.snap.status != "ok":
                continue
            acked = source_state.Acked(prepared.digest)
            if not _state_unchanged(prepared, acked):
                prepared.state_text = source_state.encode_state(
                    prepared.rules, acked, prepared.snap.files, prepared.lines)

    def _request(self, conn: Connection) -> None:
        """Send the notes and the pull, offering what this run published; once."""
        if self.exchange.requested:
            return
        self.exchange.check_cache()  # after the manifests: the server commits them meanwhile
        whole = self._takes_own()
        entries: dict[str, Any] = {key: p.snap.files for key, p in whole.items()}
        changed, gone = (self._own_changes(entries, whole) if conn.version >= 3
                         else (set(), {}))
        self.exchange.request(conn, Published(self.have, {key: p.digest for key, p in whole.items()},
                                              entries, changed, gone))

    def _pull(self, conn: Connection) -> dict[str, Any]:
        """Take the pull, staging its texts as they come; move all in once the helper is done."""
        pulled = self.exchange.receive(conn, self.writer)
        self.staging.wait()
        return self.exchange.apply(pulled)

    def _own_paths(self) -> set[str]:
        """The cache paths of the files this run published.

        They passed the walk's rules, so apply need not check them again: on a first sync
        that is every file pulled.
        """
        paths: set[str] = set()
        for prepared in self.published:
            prefix = self._namespace(prepared.source.name) + "/"
            paths.update(prefix + e.path for e in prepared.snap.files)
        return paths

    def _namespace(self, source: str) -> str:
        """The cache path of one of this machine's namespaces."""
        return f"{MACHINES_DIR}/{self.config.machine}/{source}"

    def _takes_own(self) -> dict[str, _Prepared]:
        """Namespaces this run publishes whole and the cache never had, with their sources.

        The server leaves each out of the pull if it now holds it at the digest sent, and the
        cache takes the snapshot as it was sent (a first sync then does not pull its own
        files back). In version 3 (`_own_changes`) so is every namespace of this machine the
        cache holds intact, whose files this run read, or the cache holds at their sha256.
        """
        new = self.staging.new_namespaces  # this machine's namespaces the cache does not have
        known, cached = self.exchange.known, self.exchange.cached
        three = self.report.get("protocol", 0) >= 3
        taken = {}
        for p in self.snapshots:
            if p.snap.status != "ok":
                continue
            key = self._namespace(p.source.name)
            if key in new:
                if all(e.text is not None for e in p.snap.files):
                    taken[key] = p
            elif three and known.get(key) and (  # 0: the cache's copy is damaged
                    p.delta is None or p.delta["files"] or p.delta["removed"]):
                if self._acked_in_cache(key, p):
                    taken[key] = p
                    continue
                prefix, held = key + "/", self._held(cached, key)
                if all(e.text is not None or held.get(prefix + e.path) == e.sha256
                       for e in p.snap.files):
                    taken[key] = p
        return taken

    def _acked_in_cache(self, key: str, p: _Prepared) -> bool:
        """Whether the cache holds this namespace as the server acknowledged it last time.

        Its digest from the last pull is the one the last sync's manifest was acknowledged
        at, and the check before the pull found its files intact: every file this run did not
        read is then in the cache at its sha256, and the paths it lost are the delta's
        `removed`, so no row of the manifest need be read.
        """
        acked = p.saved.acked
        return (p.delta is not None and acked is not None and self.exchange.known.get(key, 0) > 0
                and self.exchange.digests.get(key) == acked.digest)

    def _held(self, cached: Any, key: str) -> dict[str, str]:
        """Path -> sha256 of what the cache holds in one of this machine's namespaces.

        Read in one pass over the cache's rows, once a run: a lookup a file costs a query
        each against the manifest's SQLite, 0.5 s for ten thousand.
        """
        if key not in self.held:
            rows = cached.rows(key) if hasattr(cached, "rows") else (
                (path, meta.sha256) for path, meta in cached.items() if meta.namespace == key)
            self.held[key] = {row[0]: row[1] for row in rows}
        return self.held[key]

    def _own_changes(self, entries: dict[str, Any],
                     whole: dict[str, _Prepared]) -> tuple[set[str], dict[str, list[str]]]:
        """Version 3: of the namespaces the cache has, the files it lacks and the paths it loses.

        `entries` keeps, for each, only the files whose sha256 the cache does not hold (the
        walk read them, and staged them: `stage` in `_snapshot`); the paths the cache holds
        in it that the snapshot lacks are removed.
        """
        changed = {key for key in whole if key not in self.staging.new_namespaces}
        if not changed:
            return changed, {}
        cached = self.exchange.cached
        gone: dict[str, list[str]] = {}
        for key in changed:
            prefix, files, p = key + "/", entries[key], whole[key]
            if self._acked_in_cache(key, p):
                assert p.delta is not None
                entries[key] = [e for e in files if e.text is not None and (
                    (c := cached.get(prefix + e.path)) is None or c.sha256 != e.sha256)]
                gone[key] = [prefix + path for path in p.delta["removed"]]
                continue
            held = self._held(cached, key)
            entries[key] = [e for e in files if held.get(prefix + e.path) != e.sha256]
            listed = {prefix + e.path for e in files}
            gone[key] = [path for path in held if path not in listed]
        return changed, gone


class _OwnPaths:
    """The run's own cache paths (`Sync._own_paths`), listed only if the pull asks about one.

    A no-change sync pulls nothing and so never lists ten thousand paths.
    """

    def __init__(self, run: Sync) -> None:
        self.run = run
        self.paths: set[str] | None = None

    def __contains__(self, path: object) -> bool:
        if self.paths is None:
            self.paths = self.run._own_paths()
        return path in self.paths


def _check_result(conn: Connection, reply: dict[str, Any], source: str) -> None:
    """Refuse a `result` without the fields a sync reads, or with one of the wrong type."""
    refused, redacted, digest = reply.get("refused"), reply.get("redacted"), reply.get("digest")
    if (reply.get("source") != source or type(reply.get("unchanged")) is not bool
            or type(reply.get("generation")) is not int
            or not (digest is None or type(digest) is str)
            or type(refused) is not list or type(redacted) is not dict
            or not all(type(r) is dict and type(r.get("path")) is str
                       and type(r.get("reason")) is str and type(r.get("message")) is str
                       for r in refused)
            or not all(type(n) is int for n in redacted.values())):
        raise conn.malformed("result", f"for source {source!r} it needs that source, unchanged "
                             "(true or false), an integer generation, a digest, refused as a list "
                             "of {path, reason, message} strings and redacted as counts")


def _changes(saved: source_state.SourceState,
             files: list[walk.Entry]) -> tuple[list[list[Any]], list[str]]:
    """A delta's files (changed or new, in walk order) and removed paths, against the last ack.

    When the record is what the server acknowledged (`acked` lists no files), a file the walk
    reused from it unread is as acknowledged: only those read are looked up, and when the two
    cover every path of the record nothing was removed. With the map of all 10,000 files
    acknowledged, a 1% sync's delta cost 12 ms more (docs/BENCHMARKS.md "Eighth round").
    """
    record = saved.record
    if saved.acked is None or saved.acked.files is not None or record is None:
        old = saved.acked_files() or {}
        listed = {e.path for e in files}
        return ([[e.path, e.sha256, e.size, NO_MTIME] for e in files
                 if old.get(e.path) != e.sha256], sorted(p for p in old if p not in listed))
    changed, present = [], 0
    for e in files:
        if e.text is None:  # taken from its record as it stands
            present += 1
            continue
        rec = record.get(e.path)
        known = type(rec) is list and len(rec) == 5
        present += known
        if not known or rec[2] != e.sha256:
            changed.append([e.path, e.sha256, e.size, NO_MTIME])
    if present == len(record):
        return changed, []
    listed = {e.path for e in files}
    return changed, sorted(p for p in saved.acked_files() or () if p not in listed)


def _state_unchanged(prepared: _Prepared, acked: source_state.Acked | None) -> bool:
    """Whether the saved state stands: every file reused from its record, as many, same ack."""
    saved, files = prepared.saved, prepared.snap.files
    return (acked == saved.acked and saved.rules == prepared.rules
            and saved.record is not None and len(saved.record) == len(files)
            and all(e.text is None for e in files))


def _needed(spec: sources.SourceSpec, by_sha: dict[str, walk.Entry],
            shas: Iterable[str]) -> Iterator[tuple[str, str]]:
    """(sha256, text) of each body a `need` names that this run can still read.

    One the run never listed, or whose file went or changed since the walk, is left out:
    the server then refuses that file as `missing-body`.
    """
    for sha in shas:
        entry = by_sha.get(sha)
        if entry is None:
            continue
        try:
            yield sha, _text(spec, entry)
        except SharedMemoryError:
            continue


def _text(spec: sources.SourceSpec, entry: walk.Entry) -> str:
    return entry.text if entry.text is not None else sources.load_text(spec, entry)


def _write_json(path: Path, value: object) -> None:
    """Write a small record; ASCII with escapes, as an error may quote a lone surrogate."""
    atomic_write(path, json.dumps(value).encode("utf-8"), mode=0o600, durable=False)


def sync(config: ClientConfig, *, max_version: int = max(VERSIONS),
         progress: Progress | None = None, lock_wait: float = 0.0,
         waiting: Progress | None = None, build_index: bool = False) -> dict[str, Any]:
    """One whole sync; see Sync.run. With `build_index`, a missing search index is built too.

    The run is kept alive afterwards: freeing ten thousand snapshot entries one by one costs a
    sync that ends the process anyway (`shared_memory.py sync`) several milliseconds.
    """
    runner = Sync(config, max_version, progress, lock_wait, waiting, build_index)
    _FINISHED[:] = [runner]  # only the last: a process that syncs again frees the one before
    report = runner.run()
    if isinstance(runner.failure, HelloChanged):  # sent ahead of a hello that changed: again
        runner = Sync(config, max_version, progress, lock_wait, waiting, build_index)
        runner.expect = False
        _FINISHED[:] = [runner]
        report = runner.run()
    return report


_FINISHED: list[Sync] = []  # see sync()

