"""The client cache on real files: layout rules, refusals, removals, manifest."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from sharedmem.cache.cache import NOTES_NAMESPACE, Cache, NamespaceInfo
from sharedmem.cache.manifest_store import CachedFile
from sharedmem.cache.staged_files import Staging
from sharedmem.cache.update import CacheUpdate
from sharedmem.cache.writers import PreStagedWriter
from sharedmem.core import CacheError, ProtocolError
from sharedmem.hashing import sha256_text

NOTE = "extensions/ad_hoc/notes/2026-01-31T09-30-00-release-checklist.md"


def up(path: str, text: str) -> tuple[str, str, str]:
    """One upsert as a pull carries it: path, sha256, text."""
    return path, sha256_text(text), text


def spaces(*keys: str) -> dict[str, NamespaceInfo]:
    """The server's namespace list for these keys."""
    out = {}
    for key in keys:
        if key == NOTES_NAMESPACE:
            out[key] = NamespaceInfo(key, None, "ad_hoc", "notes", 1)
        else:
            _, machine, source = key.split("/")
            out[key] = NamespaceInfo(key, machine, source, "markdown", 1)
    return out


def tree(root: Path) -> dict[str, bytes | str | None]:
    """Everything under `root`: file bytes, link targets (prefixed), None for folders."""
    out: dict[str, bytes | str | None] = {}
    if not root.exists():
        return out
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder) / name
            rel = path.relative_to(root).as_posix()
            if path.is_symlink():
                out[rel] = "link:" + os.readlink(path)
            elif path.is_dir():
                out[rel] = None
            else:
                out[rel] = path.read_bytes()
    return out


def files_under(root: Path) -> dict[str, str]:
    """The published files of a cache, without its hidden metadata."""
    return {p.relative_to(root).as_posix(): p.read_text(encoding="utf-8")
            for p in sorted(root.rglob("*.md")) if ".sharedmem" not in p.parts}


def counts(done: dict) -> tuple[int, int, int]:
    """What an apply wrote, removed and holds; it skipped nothing."""
    assert done["skipped"] == [] and done["skipped_total"] == 0
    return done["written"], done["removed"], done["files"]


A, B = "machines/laptop/notes", "machines/desktop/codex"


@pytest.fixture
def cache(tmp_path: Path) -> Cache:
    """A cache that already holds one sync of two namespaces and a note."""
    cache = Cache(tmp_path / "cache")
    cache.apply([up(f"{A}/a.md", "alpha\n"), up(f"{A}/deep/er/b.md", "beta\n"),
                 up(f"{B}/MEMORY.md", "desk\n"), up(NOTE, "note\n")], [],
                spaces(A, B, NOTES_NAMESPACE))
    return cache


# --- what the cache cannot hold: skipped and named, the rest written ----------------------------

# name -> (upserts, removals, extra namespaces, the skipped item's reason). Each is an item no
# client may write; the good file beside it is written all the same (issue 14: one bad item
# used to refuse the whole pull, of every client, until an operator ran `forget`).
HOSTILE = {
    "dot-dot": ([up("../../outside.md", "x")], [], {}, "bad-path"),
    "dot-dot inside": ([up(f"{A}/../../../../outside.md", "x")], [], {}, "bad-path"),
    "absolute": ([up("/tmp/absolute-evil.md", "x")], [], {}, "bad-path"),
    "too short": ([up("machines/x", "x")], [], {}, "bad-path"),
    "bad machine": ([up("machines/Evil Box/notes/a.md", "x")], [], {}, "bad-path"),
    "reserved machine": ([up("machines/con/notes/a.md", "x")], [], {}, "bad-path"),
    "reserved source": ([up("machines/laptop/aux.x/a.md", "x")], [], {}, "bad-path"),
    "trailing dot": ([up("machines/laptop/x./a.md", "x")], [], {}, "bad-path"),
    "hidden": ([up(f"{A}/.hidden.md", "x")], [], {}, "bad-path"),
    "backslash": ([up("machines/evil/x\\..\\y.md", "x")], [], {}, "bad-path"),
    "bad note name": ([up("extensions/ad_hoc/notes/evil.md", "x")], [], {}, "bad-path"),
    "note subfolder": ([up("extensions/ad_hoc/notes/a/2026-01-31T09-30-00-x.md", "x")], [], {},
                       "bad-path"),
    "sha mismatch": ([(f"{B}/other.md", sha256_text("something else"), "pwned")], [], {},
                     "sha256-mismatch"),
    "lone surrogate": ([(f"{B}/other.md", "ab" * 32, "a\ud800b")], [], {}, "invalid-utf8"),
    "over the limit": ([up(f"{B}/big.md", "x" * 1025)], [], {}, "too-large"),
    "over the limit in UTF-8": ([up(f"{B}/big.md", "\u00e9" * 513)], [], {}, "too-large"),
    "bad removal": ([], ["../../victim.md"], {}, "bad-path"),
    "bad namespace": ([], [], {"machines/x": NamespaceInfo("machines/x", "x", "", "markdown")},
                      "bad-namespace"),
    "bad namespace name": ([], [], spaces("machines/Evil/notes"), "bad-namespace"),
    "reserved namespace name": ([], [], spaces("machines/nul/notes"), "bad-namespace"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_apply_skips_what_it_cannot_write_and_writes_the_rest(tmp_path: Path, cache: Cache,
                                                              name: str) -> None:
    upserts, removals, extra, reason = HOSTILE[name]
    victim = tmp_path / "victim.md"
    victim.write_text("mine")
    before_cache, before_all = tree(cache.root), tree(tmp_path)
    good = [up(f"{A}/new.md", "fine\n")]
    done = cache.apply(good + upserts, removals, {**spaces(A, B, NOTES_NAMESPACE), **extra},
                       writer=PreStagedWriter(Staging(cache.meta)), file_bytes=1024)
    assert done["skipped_total"] == 1 and [s["reason"] for s in done["skipped"]] == [reason]
    assert done["written"] == 1 and (cache.root / A / "new.md").read_text() == "fine\n"
    after = tree(cache.root)
    assert {k: v for k, v in after.items() if not k.startswith(".sharedmem/")} == {
        **{k: v for k, v in before_cache.items() if not k.startswith(".sharedmem/")},
        f"{A}/new.md": b"fine\n"}
    assert set(cache.load().files) == {f"{A}/a.md", f"{A}/deep/er/b.md", f"{B}/MEMORY.md",
                                       NOTE, f"{A}/new.md"}
    assert set(cache.load().namespaces) == {A, B, NOTES_NAMESPACE}
    assert {k: v for k, v in tree(tmp_path).items() if not k.startswith("cache/")} == {
        k: v for k, v in before_all.items() if not k.startswith("cache/")}
    assert victim.read_text() == "mine"


def test_a_file_changed_to_what_the_cache_refuses_loses_its_old_copy(cache: Cache) -> None:
    done = cache.apply([up(f"{A}/a.md", "alpha, now too long\n")], [],
                       spaces(A, B, NOTES_NAMESPACE), file_bytes=10)
    assert [(s["path"], s["reason"]) for s in done["skipped"]] == [(f"{A}/a.md", "too-large")]
    assert "over this client's limit of 10 bytes" in done["skipped"][0]["message"]
    assert done["removed"] == 1 and not (cache.root / A / "a.md").exists()
    assert f"{A}/a.md" not in cache.load().files  # the cache agrees with its manifest
    # A text at the limit, and one the cache holds already whatever its size, are taken.
    done = cache.apply([up(f"{A}/a.md", "0123456789"), up(f"{A}/deep/er/b.md", "beta\n")], [],
                       spaces(A, B, NOTES_NAMESPACE), file_bytes=5)
    assert done["skipped_total"] == 1 and done["skipped"][0]["path"] == f"{A}/a.md"
    done = cache.apply([up(f"{A}/a.md", "0123456789")], [], spaces(A, B, NOTES_NAMESPACE),
                       file_bytes=10)
    assert counts(done) == (1, 0, 4)


def test_the_report_names_the_first_hundred_skipped_and_counts_the_rest(cache: Cache) -> None:
    long_path = "../" * 10_000 + "x.md"
    bad = [up(f"../{i}.md", "x") for i in range(150)] + [up(long_path, "x")]
    done = cache.apply(bad, [], spaces(A, B, NOTES_NAMESPACE))
    assert done["skipped_total"] == 151 and len(done["skipped"]) == 100
    assert all(len(s["path"]) <= 400 and len(s["message"]) <= 600 for s in done["skipped"])
    done = cache.apply([up(long_path, "x")], [], spaces(A, B, NOTES_NAMESPACE))
    assert done["skipped"][0]["path"].endswith("(30004 characters)")


@pytest.mark.parametrize("linked", [".sharedmem", ".sharedmem/staging"])
def test_a_linked_metadata_folder_is_refused_and_its_target_untouched(
        tmp_path: Path, cache: Cache, linked: str) -> None:
    target = tmp_path / "elsewhere"
    (target / "staging").mkdir(parents=True)
    (target / "staging" / "0.part").write_text("not the cache's")
    (target / "replaced").mkdir()
    (target / "manifest.sqlite3").write_text("{}")
    meta = cache.root / ".sharedmem"
    if linked == ".sharedmem":
        meta.rename(tmp_path / "old-meta")
    link = cache.root / linked
    link.symlink_to(target, target_is_directory=True)
    before, before_cache = tree(target), tree(cache.root)
    with pytest.raises(CacheError, match=f"{link} is a link or not a folder") as exc:
        cache.apply([up(f"{A}/new.md", "new\n")], [], spaces(A, B, NOTES_NAMESPACE))
    assert f"rm {link}" in str(exc.value)
    with pytest.raises(CacheError):
        CacheUpdate(cache.root).open()  # the first step of a sync
    Staging(cache.meta).discard()  # and its last: never through the link
    assert tree(target) == before and tree(cache.root) == before_cache


@pytest.mark.parametrize("where", ["machines", "machines/laptop", f"{A}/deep"])
def test_apply_refuses_a_planted_link_to_outside(tmp_path: Path, cache: Cache, where: str) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    planted = cache.root / where
    real = planted.with_name(planted.name + "-moved")
    planted.rename(real)
    planted.symlink_to(elsewhere, target_is_directory=True)
    before = tree(cache.root)
    upserts = [up(f"{B}/first.md", "written before the link is reached?\n"),
               up(f"{A}/deep/er/b.md", "through the link\n"), up(f"{A}/deep/c.md", "c\n")]
    with pytest.raises(ProtocolError, match="is a link"):
        cache.apply(upserts, [], spaces(A, B, NOTES_NAMESPACE))
    assert tree(elsewhere) == {}
    assert tree(cache.root) == before


def test_removal_through_a_planted_link_is_refused(tmp_path: Path, cache: Cache) -> None:
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "er").mkdir(parents=True)
    (elsewhere / "er" / "b.md").write_text("keep me")
    deep = cache.root / A / "deep"
    deep.rename(tmp_path / "old-deep")
    deep.symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(ProtocolError, match="is a link"):
        cache.apply([], [f"{A}/deep/er/b.md"], spaces(A, B, NOTES_NAMESPACE))
    assert (elsewhere / "er" / "b.md").read_text() == "keep me"


def test_a_file_in_the_way_is_refused_before_any_write(cache: Cache) -> None:
    (cache.root / "machines" / "server").write_text("a file where a folder goes")
    before = tree(cache.root)
    with pytest.raises(ProtocolError, match="not a folder"):
        cache.apply([up(f"{B}/x.md", "x\n"), up("machines/server/codex/y.md", "y\n")], [],
                    spaces(A, B, NOTES_NAMESPACE, "machines/server/codex"))
    assert tree(cache.root) == before


def test_file_path_refuses_escapes(cache: Cache) -> None:
    assert cache.file_path(f"{A}/a.md") == (cache.root / A / "a.md").resolve()
    for bad in ("../x.md", "machines/x", f"{A}/../../../x.md"):
        with pytest.raises(ProtocolError):
            cache.file_path(bad)


# --- removals, full pulls, pruning ------------------------------------------------------------

def test_namespaces_no_longer_listed_are_removed_and_folders_pruned(cache: Cache) -> None:
    done = cache.apply([], [], spaces(A))
    assert counts(done) == (0, 2, 2)
    assert set(files_under(cache.root)) == {f"{A}/a.md", f"{A}/deep/er/b.md"}
    assert not (cache.root / "machines" / "desktop").exists()
    assert not (cache.root / "extensions").exists()
    assert set(cache.load().namespaces) == {A}
    assert {m.namespace for m in cache.load().files.values()} == {A}


def test_delta_keeps_unsent_files_full_removes_them(cache: Cache) -> None:
    everything = spaces(A, B, NOTES_NAMESPACE)
    assert cache.apply([up(f"{A}/a.md", "alpha\n")], [], everything)["removed"] == 0
    assert len(files_under(cache.root)) == 4

    done = cache.apply([up(f"{A}/a.md", "alpha 2\n")], [], everything, whole={A})
    assert counts(done) == (1, 1, 3)
    assert set(files_under(cache.root)) == {f"{A}/a.md", f"{B}/MEMORY.md", NOTE}
    assert not (cache.root / A / "deep").exists()
    assert (cache.root / A).is_dir()

    done = cache.apply([up(f"{B}/MEMORY.md", "desk\n")], [], everything, whole=everything)
    assert counts(done) == (0, 2, 1)
    assert files_under(cache.root) == {f"{B}/MEMORY.md": "desk\n"}
    assert not (cache.root / "machines" / "laptop").exists()


def test_explicit_removal_and_rewrite_of_a_missing_file(cache: Cache) -> None:
    (cache.root / B / "MEMORY.md").unlink()
    done = cache.apply([up(f"{B}/MEMORY.md", "desk\n")], [f"{A}/deep/er/b.md"],
                       spaces(A, B, NOTES_NAMESPACE))
    assert counts(done) == (1, 1, 3)
    assert (cache.root / B / "MEMORY.md").read_text() == "desk\n"
    assert not (cache.root / A / "deep").exists()


# --- the manifest ------------------------------------------------------------------------------------

def _marks(cache: Cache) -> dict[str, str]:
    return {k: v for k, v in cache.store.meta().items() if k in ("files", "commit")}


def test_manifest_rows_change_only_when_files_change(cache: Cache) -> None:
    before = _marks(cache)
    same = [up(f"{A}/a.md", "alpha\n"), up(f"{A}/deep/er/b.md", "beta\n"),
            up(f"{B}/MEMORY.md", "desk\n"), up(NOTE, "note\n")]
    server = {"server": "sharedmem/x", "protocol": 2}
    intake = cache.intake()
    for path, sha, text in same:
        intake.add(path, sha, text)
    done = cache.commit(intake, [], spaces(A, B, NOTES_NAMESPACE), server=server)
    assert done.report["written"] == 0
    after = _marks(cache)
    assert after["files"] == before["files"] and after["commit"] != before["commit"]
    assert list(done.written) == [] and done.removed == []
    reader = Cache(cache.root)
    assert reader.load().server == server and set(reader.load().namespaces) == {
        A, B, NOTES_NAMESPACE}

    intake = cache.intake()
    intake.add(*up(f"{A}/a.md", "alpha changed\n"))
    done = cache.commit(intake, [], spaces(A, B, NOTES_NAMESPACE))
    assert _marks(cache)["files"] != before["files"] and list(done.written) == [f"{A}/a.md"]
    assert reader.load().files[f"{A}/a.md"].sha256 == sha256_text("alpha changed\n")
    assert reader.load().server == server


def test_manifest_rows_in_path_order_and_as_written(cache: Cache) -> None:
    fresh = Cache(cache.root)  # as the next sync process reads it
    before = dict(fresh.load().files.items())
    fresh.apply([up(f"{A}/a.md", "alpha 2\n"), up(f"{A}/new.md", "new\n")], [],
                spaces(A, B, NOTES_NAMESPACE))
    after = Cache(cache.root).load().files
    mtime = {p: (cache.root / p).stat().st_mtime_ns for p in (f"{A}/a.md", f"{A}/new.md")}
    assert dict(after.items()) == {
        **before,
        f"{A}/a.md": CachedFile(sha256_text("alpha 2\n"), 8, A, mtime[f"{A}/a.md"]),
        f"{A}/new.md": CachedFile(sha256_text("new\n"), 4, A, mtime[f"{A}/new.md"])}
    assert list(after) == sorted(after) and len(after) == len(before) + 1
    assert f"{A}/new.md" in after and f"{A}/gone.md" not in after and 5 not in after


def test_the_manifest_is_never_held_whole(tmp_path: Path) -> None:
    """A no-change sync reads the manifest by rows: no Python object per file (issue 15)."""
    import tracemalloc
    cache = Cache(tmp_path / "cache")
    cache.apply([up(f"{A}/f{i:05}.md", f"file {i}\n") for i in range(5000)], [], spaces(A))
    reader = Cache(cache.root)
    tracemalloc.start()
    try:
        reader.load(verify=True)
        assert reader.check_files(reader.load()).stale == set() and reader.damage is None
        assert f"{A}/f00042.md" in reader.load().files
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # A guard on memory that grows with the files (a store of any size must sync), not a speed
    # target: 5,000 entries held would take several MB.
    assert peak < 1_000_000, peak


def test_a_first_pull_holds_no_object_per_file(tmp_path: Path) -> None:
    """A first pull names every file of the store: its records stay in SQLite (issue 15).

    What the intake, the staging and the commit keep (and `written`, for the index) must not
    grow with the files: a dict of path to sha256 took about 400 bytes a file.
    """
    import tracemalloc
    cache = Cache(tmp_path / "cache")
    staging = Staging(cache.meta)
    count = 6000

    def take(intake: Any, numbers: range) -> None:  # each made here: only what is kept stays
        for i in numbers:
            text = f"file {i}\n"
            intake.add(f"{A}/f{i:05}.md", sha256_text(text), text)

    tracemalloc.start()
    try:
        intake = cache.intake(PreStagedWriter(staging))
        take(intake, range(2000))
        first = tracemalloc.get_traced_memory()[0]
        take(intake, range(2000, count))
        taken = tracemalloc.get_traced_memory()[0]
        done = cache.commit(intake, [], spaces(A))
        committed = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
        staging.discard()
    assert done.report["written"] == count and len(done.written) == count
    assert next(iter(done.written)) == f"{A}/f00000.md"
    assert (cache.root / A / "f05999.md").read_text() == "file 5999\n"
    per_file = (taken - first) / 4000, (committed - first) / 4000
    # A guard on memory that grows with the files, not a speed target: a dict of path -> sha256
    # alone takes about 250 bytes a file.
    assert max(per_file) < 30, per_file


def test_an_older_versions_manifest_reads_as_damaged_until_a_sync_rebuilds_it(cache: Cache) -> None:
    # Versions 1 and 2 kept manifest.json beside namespaces.json; a sync rebuilds from the files.
    cache.store.close()
    cache.manifest_path.unlink()
    (cache.meta / "manifest.json").write_text("{}")
    (cache.meta / "namespaces.json").write_text("{}")
    reader = Cache(cache.root)
    assert len(reader.load().files) == 0 and "older version" in str(reader.damage)
    assert reader.check() is not None  # the tools refuse it until then


def test_a_manifest_replaced_while_read_is_read_anew(tmp_path: Path, cache: Cache) -> None:
    reader = Cache(cache.root)
    assert f"{A}/a.md" in reader.load().files
    later = Cache(Path(shutil.copytree(cache.root, tmp_path / "later")))
    later.apply([], [f"{A}/a.md"], spaces(A, B, NOTES_NAMESPACE))
    os.replace(later.manifest_path, cache.manifest_path)  # as a rebuilt manifest is moved in
    assert f"{A}/a.md" not in reader.load().files
    assert reader.damage is None and reader.check() is None


def test_check_files(cache: Cache) -> None:
    assert cache.check_files(cache.load()) == (set(), set(), {})
    same_size = cache.root / A / "a.md"
    same_size.write_text(same_size.read_text().upper())  # only its time tells
    checked = cache.check_files(cache.load())
    assert checked.stale == {A} and checked.damaged == {f"{A}/a.md"}
    touched = cache.root / B / "MEMORY.md"
    os.utime(touched, ns=(touched.stat().st_atime_ns, touched.stat().st_mtime_ns + 10**9))
    checked = cache.check_files(cache.load())
    assert checked.stale == {A}  # hashed, and found as written
    assert set(checked.verified) == {f"{B}/MEMORY.md"}
    cache.apply([up(f"{A}/a.md", same_size.read_text().lower())], [],
                spaces(A, B, NOTES_NAMESPACE), checked=checked)
    assert same_size.read_text() == same_size.read_text().lower()  # written again
    assert cache.load().files[f"{B}/MEMORY.md"].mtime_ns == touched.stat().st_mtime_ns
    assert cache.check_files(cache.load()) == (set(), set(), {})
    (cache.root / A / "a.md").write_text("alpha, edited by hand\n")
    assert cache.check_files(cache.load()).stale == {A}
    (cache.root / B / "MEMORY.md").unlink()
    checked = cache.check_files(cache.load())
    assert checked.stale == {A, B}
    cache.apply([up(f"{A}/a.md", "alpha\n"), up(f"{B}/MEMORY.md", "desk\n")], [],
                spaces(A, B, NOTES_NAMESPACE), whole={A, B}, checked=checked)
    assert (cache.root / B / "MEMORY.md").read_text() == "desk\n"


def test_a_reader_part_way_through_the_rows_does_not_block_a_commit(tmp_path: Path) -> None:
    """An index build reads every row for minutes; a sync's commit must not wait for it."""
    import time
    cache = Cache(tmp_path / "cache")
    cache.apply([up(f"{A}/f{i:05}.md", f"file {i}\n") for i in range(3000)], [], spaces(A))
    reader = Cache(cache.root)
    rows = iter(reader.load().files.items())
    first = next(rows)
    started = time.monotonic()
    writer = Cache(cache.root)
    writer.apply([up(f"{A}/f00000.md", "changed\n")], [], spaces(A))
    assert time.monotonic() - started < 5  # SQLite's busy wait is 10 s
    assert first[0] == f"{A}/f00000.md" and sum(1 for _ in rows) == 2999
    assert reader.load().files[f"{A}/f00000.md"].sha256 == sha256_text("changed\n")
