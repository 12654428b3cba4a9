"""The helper that stats the cache's files while a sync walks: real processes, real SQLite."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from sharedmem.cache import file_check
from sharedmem.cache.cache import Cache, FilesChecked, NamespaceInfo
from sharedmem.cache.manifest_store import INTEGRITY_CHECK, STATS_QUERY
from sharedmem.cache.update import CacheUpdate
from sharedmem.hashing import sha256_text

A = "machines/laptop/notes"


def filled(root: Path, count: int) -> Cache:
    """A cache whose manifest lists `count` files of namespace A, as a pull wrote them."""
    cache = Cache(root)
    texts = [(f"{A}/d{i % 7}/f{i:04}.md", f"file {i}\n") for i in range(count)]
    cache.apply([(p, sha256_text(t), t) for p, t in texts], [],
                {A: NamespaceInfo(A, "laptop", "notes", "markdown", 1)})
    return cache


def tamper(cache: Cache) -> set[str]:
    """Change four files four ways; the paths a check must name."""
    root = cache.root
    (root / A / "d1" / "f0001.md").write_text("file 1, edited by hand\n")  # size
    moved = root / A / "d2" / "f0002.md"
    os.utime(moved, ns=(0, moved.stat().st_mtime_ns + 10**9))  # time alone
    (root / A / "d3" / "f0003.md").unlink()  # gone
    linked = root / A / "d4" / "f0004.md"
    linked.unlink()
    linked.symlink_to(root / A / "d5" / "f0005.md")  # a link, never followed
    return {f"{A}/d1/f0001.md", f"{A}/d2/f0002.md", f"{A}/d3/f0003.md", f"{A}/d4/f0004.md"}


def rows_of(cache: Cache) -> list[tuple[str, int, int | None, str]]:
    return list(cache.store.stats())


def test_differing_names_what_is_not_as_recorded(tmp_path: Path) -> None:
    cache = filled(tmp_path / "cache", 40)
    assert list(file_check.differing(str(cache.root), rows_of(cache))) == []
    expected = tamper(cache)
    rows = rows_of(cache)
    assert set(file_check.differing(str(cache.root), rows)) == expected
    unknown = [(p, z, None, sha) for p, z, _, sha in rows[:3]]  # no time recorded
    assert list(file_check.differing(str(cache.root), unknown)) == [p for p, *_ in unknown]
    folder = cache.root / A / "d6" / "f0006.md"
    folder.unlink()
    folder.mkdir()
    assert f"{A}/d6/f0006.md" in set(file_check.differing(str(cache.root), rows_of(cache)))


def test_the_helper_answers_as_the_check_in_process(tmp_path: Path) -> None:
    cache = filled(tmp_path / "cache", 300)
    expected = tamper(cache)
    check = file_check.start(str(cache.root), str(cache.manifest_path),
                             STATS_QUERY, INTEGRITY_CHECK)
    assert check is not None
    assert set(check.answer(wait=True)) == expected
    clean = filled(tmp_path / "clean", 30)
    check = file_check.start(str(clean.root), str(clean.manifest_path),
                             STATS_QUERY, INTEGRITY_CHECK)
    assert check is not None and check.answer(wait=True) == []


def test_a_root_with_uri_characters_is_read(tmp_path: Path) -> None:
    cache = filled(tmp_path / "50% off? #1", 20)
    (cache.root / A / "d1" / "f0001.md").unlink()
    check = file_check.start(str(cache.root), str(cache.manifest_path),
                             STATS_QUERY, INTEGRITY_CHECK)
    assert check is not None and check.answer(wait=True) == [f"{A}/d1/f0001.md"]


def test_a_helper_that_cannot_read_the_manifest_answers_none(tmp_path: Path) -> None:
    cache = filled(tmp_path / "cache", 20)
    missing = tmp_path / "gone" / "manifest.sqlite3"
    check = file_check.start(str(cache.root), str(missing),
                             STATS_QUERY, INTEGRITY_CHECK)
    assert check is not None and check.answer(wait=True) is None
    assert not missing.parent.exists()  # opened read-only: nothing made
    garbage = tmp_path / "garbage.sqlite3"
    garbage.write_bytes(b"not a database" * 100)
    check = file_check.start(str(cache.root), str(garbage),
                             STATS_QUERY, INTEGRITY_CHECK)
    assert check is not None and check.answer(wait=True) is None


def helpers() -> dict[int, str]:
    """Children of this process running file_check.py, each with its state (Linux: /proc).

    An ended child not yet reaped (state Z) has no command line left: it counts too.
    """
    found = {}
    for pid in os.listdir("/proc"):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        if int(fields[1]) == os.getpid() and (b"file_check.py" in command or fields[0] == "Z"):
            found[int(pid)] = fields[0]
    return found


def finished() -> None:
    """Wait until the one helper running has ended (a zombie until its answer is taken)."""
    deadline = time.monotonic() + 30
    while set(helpers().values()) != {"Z"}:
        assert time.monotonic() < deadline, helpers()
        time.sleep(0.01)


linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def started(cache: Cache) -> CacheUpdate:
    """A sync's look at the cache, its helper started as before a walk."""
    update = CacheUpdate(cache.root)
    update.open(check_ahead=True)
    return update


def answer(update: CacheUpdate) -> FilesChecked:
    """What the sync's check before its pull finds: the helper's answer, or its own pass."""
    update.check()
    assert update.checked is not None
    return update.checked


def in_process(cache: Cache) -> FilesChecked:
    """The check with no helper: the sync's own pass over the rows."""
    update = CacheUpdate(cache.root)
    update.open()
    return answer(update)


@linux
def test_the_cache_takes_the_helpers_answer(tmp_path: Path) -> None:
    """The same namespaces and damaged files as the check in process, which hashes the same."""
    cache = filled(tmp_path / "cache", file_check.MIN_FILES)
    update = started(cache)
    finished()
    expected = tamper(cache)  # after the helper looked: only the check in process sees it
    assert answer(update).stale == set() and helpers() == {}
    update = started(cache)
    finished()
    checked = answer(update)
    assert checked.stale == {A}
    assert checked.damaged == expected - {f"{A}/d2/f0002.md"}  # its time alone moved: hashed
    plain = filled(tmp_path / "plain", file_check.MIN_FILES)
    tamper(plain)
    assert in_process(plain).stale == {A} and in_process(plain).damaged == checked.damaged


@linux
def test_a_helper_just_started_is_stopped_and_the_cache_checks_itself(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A sync with little to walk (no source of its own) asks before any helper could answer.
    monkeypatch.setattr(file_check, "HEAD_START", 3600.0)
    cache = filled(tmp_path / "cache", file_check.MIN_FILES)
    update = started(cache)
    (stopped,) = helpers()
    os.kill(stopped, signal.SIGSTOP)  # it never finishes by itself
    (cache.root / A / "d1" / "f0001.md").write_text("edited by hand\n")
    checked = answer(update)
    assert checked.stale == {A} and checked.damaged == {f"{A}/d1/f0001.md"}
    assert helpers() == {}  # killed and reaped
    update = started(cache)
    (killed,) = helpers()
    os.kill(killed, signal.SIGKILL)  # a helper that dies (out of memory)
    finished()
    checked = answer(update)
    assert checked.stale == {A} and checked.damaged == {f"{A}/d1/f0001.md"}
    assert helpers() == {}


@linux
def test_a_large_cache_is_checked_by_a_helper_and_a_small_one_is_not(tmp_path: Path) -> None:
    small = filled(tmp_path / "small", file_check.MIN_FILES - 1)
    started(small)
    assert helpers() == {}
    large = started(filled(tmp_path / "large", file_check.MIN_FILES))
    assert len(helpers()) == 1
    large.discard()  # a sync that ended before its check
    assert helpers() == {}


@linux
def test_a_helper_past_its_start_is_waited_for(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # A sync that walked long: its helper is nearly done, and finishing costs less than a pass.
    monkeypatch.setattr(file_check, "HEAD_START", 0.0)
    cache = filled(tmp_path / "cache", file_check.MIN_FILES)
    expected = tamper(cache)
    update = started(cache)
    (paused,) = helpers()
    os.kill(paused, signal.SIGSTOP)
    resume = threading.Timer(0.5, os.kill, (paused, signal.SIGCONT))
    resume.start()
    started_at = time.monotonic()
    try:
        checked = answer(update)
        waited = time.monotonic() - started_at
    finally:
        resume.cancel()  # a helper stopped at once is gone: nothing to resume
        resume.join()
    assert checked.stale == {A}
    assert file_check.WAIT_LIMIT > waited >= 0.5  # not stopped at once, nor at the limit
    assert checked.damaged == expected - {f"{A}/d2/f0002.md"} and helpers() == {}


@linux
def test_a_stalled_helper_is_waited_for_up_to_the_limit(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(file_check, "HEAD_START", 0.0)
    monkeypatch.setattr(file_check, "WAIT_LIMIT", 0.3)
    cache = filled(tmp_path / "cache", file_check.MIN_FILES)
    update = started(cache)
    (stalled,) = helpers()
    os.kill(stalled, signal.SIGSTOP)  # a filesystem that hangs, or a starved helper
    (cache.root / A / "d1" / "f0001.md").write_text("edited by hand\n")
    started_at = time.monotonic()
    checked = answer(update)
    assert checked.stale == {A} and checked.damaged == {f"{A}/d1/f0001.md"}
    assert 5 > time.monotonic() - started_at >= 0.3
    assert helpers() == {}  # killed and reaped


def test_the_check_before_a_pull_asks_again_for_what_is_not_as_written(tmp_path: Path) -> None:
    """The damaged files named, their namespace asked for whole; a file whose time alone moved
    is hashed and found as written."""
    cache = filled(tmp_path / "cache", 40)
    expected = tamper(cache)
    update = CacheUpdate(cache.root)
    update.open()
    update.check()
    assert update.checked is not None
    assert update.checked.stale == {A}
    assert update.checked.damaged == expected - {f"{A}/d2/f0002.md"}
    assert update.known[A] == 0
    update.discard()
