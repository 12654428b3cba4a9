"""One source's publication in a sync: its snapshot, the manifest that sends it, its saved state.

A sync walks each enabled source once (`Publication.walk`), while ssh connects: the snapshot,
its digest, and the manifest message (a delta against what the server acknowledged last time,
or the whole file list) are all ready before the session starts. The server's `result`
becomes the source's entry in the sync's report (`report`), and the state saved for the next
sync (`save`) records what the server acknowledged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from sharedmem import __version__
from sharedmem.cache.staged_files import write_failure
from sharedmem.client import source_state, tails
from sharedmem.client.config import ClientConfig, SourceConfig
from sharedmem.client.send_ahead import Ahead
from sharedmem.core import CacheError, SharedMemoryError
from sharedmem.files import atomic_write
from sharedmem.hashing import digest_of
from sharedmem.protocol import encode
from sharedmem.rules import MACHINES_DIR
from sharedmem.sources import kinds as sources
from sharedmem.sources.walk import Entry

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from sharedmem.client.source_state import Lines

# A manifest's mtime_ns for every file: the server stores the field and reads it for nothing,
# and the real times were a third of a first sync's manifest on the wire (docs/PROTOCOL.md
# "Version 2").
NO_MTIME = 0

Stage = Callable[[str, str, bytes], None]  # a file read: its cache path, sha256 and UTF-8


def namespace_of(machine: str, source: str) -> str:
    """The cache path of one of a machine's namespaces."""
    return f"{MACHINES_DIR}/{machine}/{source}"


class Publication:
    """One source's snapshot and the messages that publish it, built before the session starts.

    A plain class: a sync does not load the dataclasses module.
    """

    def __init__(self, source: SourceConfig, key: str, state_file: Path,
                 saved: source_state.SourceState, rules: list[Any], snap: sources.Snapshot,
                 digest: str, lines: Lines) -> None:
        self.source, self.key, self.state_file = source, key, state_file
        self.spec = sources.SourceSpec(source.name, source.kind, source.path)
        self.saved, self.rules, self.snap, self.digest = saved, rules, snap, digest
        self.lines = lines  # the saved record's lines, for reuse
        self.ok = snap.status == "ok"
        self.redacted: dict[str, int] = {}
        for entry in snap.files:
            for kind, count in entry.redactions.items():
                self.redacted[kind] = self.redacted.get(kind, 0) + count
        self.delta = self._delta()
        self.line = b""  # the manifest message, encoded before it is due (`encode`)
        self.placed = False  # `line` names bodies sent ahead by place (`Ahead.places`)
        self.acked = False  # the server acknowledged `digest` (`report`)
        self.state_text: str | None = None  # the state file if the server acknowledges `digest`
        self._by_sha: dict[str, Entry] | None = None
        self._whole: dict[str, Any] | None = None

    @classmethod
    def walk(cls, source: SourceConfig, config: ClientConfig, stage: Stage,
             ahead: Ahead) -> Publication:
        """Walk one source: each file read is staged for the cache and offered to the server.

        A file whose sha256 the server acknowledged last time is not offered; one that only
        grew from such a version goes as its tail (client/tails.py).
        """
        state_file = config.state / "sources" / f"{source.name}.json"
        saved, lines = source_state.read(state_file)
        limits = config.limits
        rules = [__version__, limits.file_bytes, limits.namespace_bytes, limits.namespace_files]
        previous = saved.record if saved.rules == rules else None
        key = namespace_of(config.machine, source.name)
        prefix = key + "/"
        on_server: set[str] | None = None  # the acknowledged sha256s, once a file is read

        def read(entry: Entry, data: bytes) -> None:
            nonlocal on_server
            if entry.text is None:
                return
            stage(prefix + entry.path, entry.sha256, data)
            if on_server is None:
                on_server = saved.acked_shas()
            if entry.sha256 not in on_server:
                grown = tails.grown_from(saved.record.get(entry.path), data, on_server)
                if grown is not None:  # only appended to what the server holds: the tail goes
                    ahead.offer_tail(entry.sha256, grown[0], data, grown[1])
                else:
                    ahead.offer(entry.sha256, data)

        spec = sources.SourceSpec(source.name, source.kind, source.path)
        snap = sources.snapshot(spec, limits, previous, read)
        # Every file reused from a record the server acknowledged: the snapshot is that
        # record, and its digest the acknowledged one.
        unchanged = (saved.acked is not None and previous is not None
                     and len(snap.files) == len(previous)
                     and all(e.text is None for e in snap.files))
        digest = saved.acked if unchanged else digest_of((e.path, e.sha256) for e in snap.files)
        return cls(source, key, state_file, saved, rules, snap, digest, lines)

    @property
    def name(self) -> str:
        """The source's name, as the messages carry it."""
        return self.source.name

    @property
    def files(self) -> list[Entry]:
        """The files of the snapshot, in walk order."""
        return self.snap.files

    @property
    def all_read(self) -> bool:
        """Whether every file's text was read this time (none reused from the record)."""
        return all(e.text is not None for e in self.snap.files)

    @property
    def changed(self) -> bool:
        """Whether the snapshot differs from what the server acknowledged last time."""
        return self.delta is None or bool(self.delta["files"] or self.delta["removed"])

    @property
    def removed(self) -> list[str]:
        """The paths gone since the acknowledged snapshot (none without a delta)."""
        return self.delta["removed"] if self.delta is not None else []

    def _delta(self) -> dict[str, Any] | None:
        """The manifest against the acknowledged snapshot; None when there is none to delta from."""
        saved = self.saved
        if not self.ok or saved.acked is None:
            return None
        head = {"type": "manifest", "source": self.name, "kind": self.source.kind,
                "digest": self.digest, "base": saved.acked}
        if self.digest == saved.acked:
            return {**head, "files": [], "removed": []}
        files, removed = _changes(saved, self.snap.files)
        return {**head, "removed": removed, "files": files}

    @property
    def whole(self) -> dict[str, Any]:
        """The whole manifest: sent when there is no delta, or the server's base is another.

        Built when first asked: a sync whose delta the server takes never lists every file.
        """
        if self._whole is None:
            self._whole = {"type": "manifest", "source": self.name, "kind": self.source.kind,
                           "digest": self.digest,
                           "files": [[e.path, e.sha256, e.size, NO_MTIME]
                                     for e in self.snap.files]}
        return self._whole

    @property
    def manifest(self) -> dict[str, Any]:
        """The manifest message a sync sends first: the delta, else the whole one."""
        return self.delta or self.whole

    def encode(self, places: dict[str, int]) -> None:
        """Encode the manifest now, while the last bodies sent ahead are still on their way.

        In version 3 a body sent ahead is named by its place among those texts (`places`): a
        first sync's manifest is a third the size on the wire (docs/PROTOCOL.md "Version 3").
        """
        message = self.manifest
        if places:
            files = [[p, places.get(sha, sha), size, mtime]
                     for p, sha, size, mtime in message["files"]]
            message, self.placed = {**message, "files": files}, True
        self.line = encode(message)

    def texts(self, shas: Iterable[str]) -> Iterator[tuple[str, str]]:
        """(sha256, text) of each body a `need` names that this run can still read, once each.

        One the run never listed, or whose file went or changed since the walk, is left out:
        the server then refuses that file as `missing-body`.
        """
        if self._by_sha is None:
            self._by_sha = {entry.sha256: entry for entry in self.snap.files}
        by_sha, given = self._by_sha, set()
        for sha in shas:
            entry = by_sha.get(sha)
            if entry is None or sha in given:
                continue
            given.add(sha)
            try:
                yield sha, (entry.text if entry.text is not None
                            else sources.load_text(self.spec, entry))
            except SharedMemoryError:
                continue

    def report(self, reply: dict[str, Any] | None) -> dict[str, Any]:
        """The source's entry in the sync's report, from the server's `result` (checked)."""
        snap = self.snap
        result: dict[str, Any] = {
            "source": self.name, "kind": self.source.kind, "path": str(self.source.path),
            "files": len(snap.files), "skipped": [s._asdict() for s in snap.skipped],
            "problems": [s._asdict() for s in snap.problems()], "refused": [], "redacted": {}}
        if not self.ok:
            result.update(status="unreadable", message=snap.message +
                          " (the server keeps what it already holds for this source)")
            return result
        assert reply is not None
        redacted = dict(self.redacted)
        for kind, count in reply["redacted"].items():
            redacted[kind] = redacted.get(kind, 0) + count
        result.update(status="unchanged" if reply["unchanged"] else "published",
                      refused=reply["refused"], redacted=redacted,
                      generation=reply["generation"])
        if result["refused"]:
            result["problems"] += result["refused"]
        self.acked = reply["digest"] == self.digest
        return result

    def encode_state(self) -> None:
        """Encode the state left if the server acknowledges what it was sent, ahead of time.

        Done while the answers are awaited, so only the write is left for after them.
        """
        if self.ok and not self._state_stands(self.digest):
            self.state_text = source_state.encode_state(self.rules, self.digest, self.snap.files,
                                                        self.lines)

    def save(self) -> None:
        """Remember what was published, for the next snapshot and delta; after the pull.

        The acknowledged digest is the next delta's base; the record is written one file a
        line, and the lines of files reused unread are kept.
        """
        if not self.ok:
            return
        acked = self.digest if self.acked else None
        if self._state_stands(acked):
            return
        text = (self.state_text if acked is not None and self.state_text is not None
                else source_state.encode_state(self.rules, acked, self.snap.files, self.lines))
        try:
            atomic_write(self.state_file, text.encode("utf-8"), mode=0o600, durable=False)
        except OSError as exc:  # the next sync reads the source afresh: nothing is lost
            raise CacheError(write_failure(str(self.state_file), exc)) from None

    def _state_stands(self, acked: str | None) -> bool:
        """Whether the saved state stands: every file reused from its record, as many, same ack."""
        saved, files = self.saved, self.snap.files
        return (acked == saved.acked and saved.rules == self.rules
                and len(saved.record) == len(files) and bool(saved.record)
                and all(e.text is None for e in files))


def _changes(saved: source_state.SourceState,
             files: list[Entry]) -> tuple[list[list[Any]], list[str]]:
    """A delta's files (changed or new, in walk order) and removed paths, against the last ack.

    The record is what the server acknowledged, so a file the walk reused from it unread is as
    acknowledged: only those read are looked up, and when the two cover every path of the
    record nothing was removed.
    """
    record = saved.record
    changed, present = [], 0
    for e in files:
        if e.text is None:  # taken from its record as it stands
            present += 1
            continue
        rec = record.get(e.path)
        present += rec is not None
        if rec is None or rec[2] != e.sha256:
            changed.append([e.path, e.sha256, e.size, NO_MTIME])
    if present == len(record):
        return changed, []
    listed = {e.path for e in files}
    return changed, sorted(p for p in record if p not in listed)
