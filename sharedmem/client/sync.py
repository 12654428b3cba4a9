"""`sync`: one run, as a list of steps. Each step is a call on the object that owns its state.

1. lock: the machine's sync lock, so a scheduled sync and a note's delivery never overlap;
2. connect: `serve` started (locally or over ssh), its hello read on a thread while step 3 runs;
3. walk: each source's snapshot and manifest (`Publication`), the files read staged for the
   cache (`CacheUpdate`) and sent ahead to the server (`Ahead`): none of it needs an answer;
4. publish: every manifest, each answered with the bodies the server lacks (a `Publisher`
   of the version the session speaks), then the notes and the pull request (`Exchange`),
   which offers what this run published (`OwnFiles`, computed once);
5. pull: the notes' results, then the server's changes, taken in as they stream;
6. commit: the cache's files, its manifest and its search index (`CacheUpdate.commit`);
7. save: each source's state, then the notes leave the outbox.

Any failure leaves the cache and the outbox as they were, and the run reports `failed`.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

from sharedmem import collector
from sharedmem.cache.update import CacheUpdate
from sharedmem.client.config import ClientConfig
from sharedmem.client.exchange import Exchange, Progress
from sharedmem.client.lock import sync_lock
from sharedmem.client.own_files import OwnFiles
from sharedmem.client.publication import Publication, namespace_of
from sharedmem.client.publishers import PUBLISHERS, RoundTrips, publisher_for
from sharedmem.client.send_ahead import Ahead
from sharedmem.client.transport import Connection, HelloChanged, busy_pause
from sharedmem.clock import utc_now
from sharedmem.core import SharedMemoryError
from sharedmem.files import atomic_write
from sharedmem.protocol import PeerError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

EXIT_OK, EXIT_PARTIAL, EXIT_FAILED = 0, 1, 2
ERROR_CHARS = 2000  # of an error kept in the report and state/last-sync.json


class Sync:
    """One sync run; `report` is what `sync --json` prints."""

    def __init__(self, config: ClientConfig, max_version: int = max(PUBLISHERS),
                 progress: Progress | None = None, lock_wait: float = 0.0,
                 waiting: Progress | None = None, build_index: bool = False,
                 expect: bool = True) -> None:
        self.config = config
        self.max_version = max_version
        self.progress = progress or (lambda _msg: None)
        self.lock_wait, self.waiting = lock_wait, waiting  # see lock.sync_lock
        # With no record of the server's hello, go on as if it answered as ours does by
        # default (`Connection.expected`); not on the run again after a hello that differed.
        self.expect = expect
        self.update = CacheUpdate(config.cache, file_bytes=config.limits.file_bytes,
                                  progress=self.progress, build_index=build_index)
        self.exchange = Exchange(config, self.progress)
        self.publications: list[Publication] = []
        self.own: OwnFiles | None = None
        self.report: dict[str, Any] = {"machine": config.machine, "status": "ok",
                                       "sources": [], "notes": self.exchange.notes}
        self.failure: SharedMemoryError | None = None

    def run(self) -> dict[str, Any]:
        """The steps, timed and reported; the last attempt recorded for `status` and `doctor`.

        Python's cyclic garbage collector is paused meanwhile (and restored after), as
        `serve`'s is for its session: a run makes no reference cycles in its work, but holds
        a record and a snapshot of tens of thousands of objects that each collection would
        walk.
        """
        started = time.monotonic()
        try:
            with collector.Paused():
                self._steps()
        except SharedMemoryError as exc:
            self.failure = exc
            error = str(exc)  # may quote the server, whose error text may be megabytes long
            if len(error) > ERROR_CHARS:
                error = f"{error[:ERROR_CHARS]}... ({len(error)} characters)"
            self.report.update(status="failed", error=error)
        else:
            if (any(s["status"] not in ("published", "unchanged") or s["problems"]
                    for s in self.report["sources"])
                    or self.report["notes"]["refused"] or self.report["pull"]["skipped_total"]):
                self.report["status"] = "partial"
        finally:
            self.update.discard()
        self.report["exit_code"] = {"ok": EXIT_OK, "partial": EXIT_PARTIAL,
                                    "failed": EXIT_FAILED}[self.report["status"]]
        self.report["seconds"] = round(time.monotonic() - started, 3)
        self.report["finished_at"] = utc_now()
        with contextlib.suppress(OSError):  # a full disk: the report still says what happened
            _write_json(self.config.state / "last-sync.json", {
                k: self.report.get(k) for k in ("status", "error", "finished_at", "exit_code")})
        return self.report

    def _steps(self) -> None:
        with sync_lock(self.config.state, self.lock_wait, self.waiting), \
                Connection(self.config, self.max_version) as conn:
            ahead = Ahead(conn)
            with conn.handshake(expect=self.expect):
                self._walk(ahead)
            self.report["protocol"] = conn.version
            trips = RoundTrips(conn)
            self._publish(conn, ahead, trips)
            trips.wait()
            self.exchange.deliver(conn)
            self.report["pull"] = self.update.commit(self.exchange.receive(conn, self.update))
            for publication in self.publications:
                publication.save()
            self.exchange.settle()
            self.report["bytes"] = {"sent": conn.channel.sent, "received": conn.channel.received}
            self.report["round_trips"] = trips.count

    def _walk(self, ahead: Ahead) -> None:
        """Everything that needs no answer from the server; run while ssh connects.

        Walk every source, staging the files the cache lacks and sending ahead the bodies the
        server lacks, and encode the manifests while the last bodies go out.
        """
        config = self.config
        self.update.open([namespace_of(config.machine, s.name) for s in config.sources],
                         check_ahead=bool(config.sources))
        self.publications = [Publication.walk(source, config, self.update.stage, ahead)
                             for source in config.sources]
        self.update.staged()
        ahead.finish()
        self._encode_manifests(ahead.places)  # while the sender writes the last bodies
        ahead.wait()  # each manifest follows its bodies on the channel

    def _encode_manifests(self, places: dict[str, int]) -> None:
        for publication in self.publications:
            if publication.ok:
                publication.encode(places)

    def _publish(self, conn: Connection, ahead: Ahead, trips: RoundTrips) -> None:
        """Every source's manifest, then the notes and the pull request, then their answers.

        While the answers are on their way, what the end of the run needs is done ahead: the
        states encoded, the few files no helper took staged, this run's own files taken in.
        """
        if ahead.send_waiting():  # bodies went that the manifests may name by place
            self._encode_manifests(ahead.places)
        publisher = publisher_for(conn, self._own, trips, self.progress)
        publisher.send(self.publications, self.exchange.pending())
        self.update.check()  # after the manifests: the server commits them meanwhile
        own = self._own()
        self.exchange.request(conn, self.update, own)
        for publication in self.publications:
            publication.encode_state()
        self.update.take_own(own.offered, own.whole(own.offered), own.files(own.offered))
        replies = publisher.finish()
        self.report["sources"] = [p.report(replies.get(p.name)) for p in self.publications]

    def _own(self) -> OwnFiles:
        """What this run published that its cache takes from itself; computed once, when asked."""
        if self.own is None:
            self.update.check()
            self.own = OwnFiles.of(self.publications, self.update, self.report["protocol"])
        return self.own


def _write_json(path: Path, value: object) -> None:
    """Write a small record; ASCII with escapes, as an error may quote a lone surrogate."""
    atomic_write(path, json.dumps(value).encode("utf-8"), mode=0o600, durable=False)


def sync(config: ClientConfig, *, max_version: int = max(PUBLISHERS),
         progress: Progress | None = None, lock_wait: float = 0.0,
         waiting: Progress | None = None, build_index: bool = False) -> dict[str, Any]:
    """One whole sync; see Sync.run. With `build_index`, a missing search index is built too.

    A run is made again when nothing it did can have counted: after bodies went ahead of a
    hello that then differed from the one remembered (expecting nothing this time), or when
    the server turned the session away as busy before its hello (after a growing, jittered
    pause, at most `timeouts.busy_retries` times, said through `waiting`), so a burst of
    machines spreads out instead of failing together. The run is kept alive afterwards:
    freeing ten thousand snapshot entries one by one costs a sync that ends the process anyway
    (`shared_memory.py sync`) several milliseconds.
    """
    expect, busy = True, 0
    while True:
        runner = Sync(config, max_version, progress, lock_wait, waiting, build_index, expect)
        _FINISHED[:] = [runner]  # only the last: a process that syncs again frees the one before
        report = runner.run()
        failure = runner.failure
        if isinstance(failure, HelloChanged) and expect:
            expect = False
        elif (isinstance(failure, PeerError) and failure.code == "busy"
              and busy < config.timeouts.busy_retries):
            busy += 1
            pause = busy_pause(busy)
            (waiting or (lambda _msg: None))(
                f"the server is busy; trying again in {pause:.0f} s ({busy} of "
                f"{config.timeouts.busy_retries})")
            time.sleep(pause)
        else:
            return report


_FINISHED: list[Sync] = []  # see sync()
