"""Files written ahead by the staging helper: moved in only for the same path and sha256."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from array import array
from pathlib import Path

import pytest

from sharedmem.cache import staged_files as staging_mod
from sharedmem.cache.cache import Cache, NamespaceInfo
from sharedmem.cache.staged_files import Staging
from sharedmem.cache.writers import PreStagedWriter
from sharedmem.hashing import sha256_text

NS = "machines/laptop/notes"


def items(count: int, tag: str = "") -> list[tuple[str, str, str]]:
    texts = [f"# note {i}{tag}\n" + "body ü\n" * i for i in range(count)]
    return [(f"{NS}/d{i % 3}/n{i}.md", sha256_text(t), t) for i, t in enumerate(texts)]


def add(stage: Staging, item: tuple[str, str, str]) -> None:
    stage.add(item[0], item[1], item[2].encode())


def staged_paths(stage: Staging) -> list[str]:
    """The files left in the staging folder, by cache path."""
    return sorted(p.relative_to(stage.folder).as_posix() for p in stage.folder.rglob("*")
                  if p.is_file())


@pytest.fixture
def cache(tmp_path: Path) -> Cache:
    return Cache(tmp_path / "cache")


def staged(cache: Cache, batch: list[tuple[str, str, str]], *, new: bool = False) -> Staging:
    """Files staged by a helper; `new`: their namespace is not in the cache yet (a tree)."""
    stage = Staging(cache.meta, frozenset({NS} if new else ()), min_files=1)
    for path, sha, text in batch:
        stage.add(path, sha, text.encode())
    stage.flush()
    stage.wait()
    return stage


def test_a_new_namespace_staged_as_a_tree_moves_in_whole(cache: Cache) -> None:
    batch = items(40)
    stage = staged(cache, batch, new=True)
    assert stage.written == set(range(40))
    assert staged_paths(stage) == sorted(p for p, _, _ in batch)  # each at its cache path
    # The helper says when it wrote each: the time the file has once closed.
    assert list(stage.mtimes) == [(stage.folder / p).stat().st_mtime_ns for p, _, _ in batch]
    os.utime(stage.folder / batch[7][0], ns=(1, 10**18))  # what the cache shows counts, still
    stage.mtimes[7] = -1  # unknown: the commit reads it from the disk
    info = {NS: NamespaceInfo(NS, "laptop", "notes", "markdown", 1)}
    done = cache.apply(batch, [], info, writer=PreStagedWriter(stage))
    assert done["written"] == 40
    # Recorded without a stat each, as the disk has them after the folder's one rename: the
    # next sync's check of the cache finds every file as recorded.
    rows = {p: (f.size, f.mtime_ns) for p, f in Cache(cache.root).load().files.items()}
    on_disk = {p: ((cache.root / p).stat().st_size, (cache.root / p).stat().st_mtime_ns)
               for p, _, _ in batch}
    assert rows == on_disk and rows[batch[7][0]][1] == 10**18
    assert staged_paths(stage) == []  # every one moved, none copied
    assert not (stage.folder / NS).exists()  # a namespace new to the cache: its folder moved
    for path, _, text in batch:
        assert (cache.root / path).read_text(encoding="utf-8") == text
    stage.discard()
    assert not stage.folder.exists()


def test_files_of_a_namespace_the_cache_has_are_staged_flat_and_moved_one_by_one(
        cache: Cache) -> None:
    batch = items(5)
    stage = staged(cache, batch)
    assert staged_paths(stage) == [f"{n}.part" for n in range(5)]  # no folders made
    done = cache.apply(batch, [], {NS: NamespaceInfo(NS, "laptop", "notes", "markdown", 1)},
                       writer=PreStagedWriter(stage))
    assert done["written"] == 5 and staged_paths(stage) == []
    for path, _, text in batch:
        assert (cache.root / path).read_text(encoding="utf-8") == text
    stage.discard()


def test_only_the_same_path_and_sha_is_moved(cache: Cache) -> None:
    batch = items(3)
    stage = staged(cache, batch)
    other = "# the server redacted this one differently\n"
    pulled = [batch[0], (batch[1][0], sha256_text(other), other)]  # and batch[2] not pulled
    cache.apply(pulled, [], {NS: NamespaceInfo(NS, "laptop", "notes", "markdown", 1)},
                writer=PreStagedWriter(stage))
    assert (cache.root / batch[1][0]).read_text(encoding="utf-8") == other
    assert not (cache.root / batch[2][0]).exists()
    assert staged_paths(stage) == ["1.part", "2.part"]  # for discard
    stage.discard()
    assert not stage.folder.exists()


def test_a_few_files_are_left_to_apply_without_a_helper(cache: Cache) -> None:
    batch = items(3)
    stage = Staging(cache.meta, min_files=4)
    for item in batch:
        add(stage, item)
    stage.flush()  # the walk is over: too few to stage, dropped
    stage.wait()
    assert stage.written == set() and not stage.folder.exists()  # no helper was started
    cache.apply(batch, [], {NS: NamespaceInfo(NS, "laptop", "notes", "markdown", 1)},
                writer=PreStagedWriter(stage))
    for path, _, text in batch:
        assert (cache.root / path).read_text(encoding="utf-8") == text
    stage.discard()


def test_the_helper_starts_with_every_file_queued_once_there_are_enough(cache: Cache) -> None:
    stage = Staging(cache.meta, min_files=4)
    for item in items(3):
        add(stage, item)
    assert stage._child is None and not stage.folder.exists()
    add(stage, items(5, "b")[4])  # the fourth file starts the helper with all four
    stage.flush()
    stage.wait()
    assert stage.written == {0, 1, 2, 3}
    stage.discard()


def test_a_link_planted_in_the_cache_is_replaced_not_followed(cache: Cache,
                                                              tmp_path: Path) -> None:
    info = {NS: NamespaceInfo(NS, "laptop", "notes", "markdown", 1)}
    first = items(2)
    cache.apply(first, [], info)
    outside = tmp_path / "outside.md"
    outside.write_text("not the cache's\n")
    planted = cache.root / first[0][0]
    planted.unlink()
    planted.symlink_to(outside)
    second = items(2, " v2")
    stage = staged(cache, second)
    cache.apply(second, [], info, writer=PreStagedWriter(stage))
    assert staged_paths(stage) == []  # both moved in
    assert not planted.is_symlink() and planted.read_text(encoding="utf-8") == second[0][2]
    stage.discard()
    assert outside.read_text() == "not the cache's\n" and outside.stat().st_nlink == 1


def test_discard_stops_the_helper_and_removes_leftovers(cache: Cache) -> None:
    leftover = cache.meta / "staging" / "7.part"  # what a killed sync left
    leftover.parent.mkdir(parents=True)
    leftover.write_text("old")
    stage = Staging(cache.meta, min_files=1)
    add(stage, items(1)[0])  # starting the helper empties the folder first
    assert not leftover.exists()
    stage.discard()  # before wait(): the helper is stopped, nothing is left
    assert not stage.folder.exists() and stage.numbers == {}


def test_a_helper_that_could_not_write_leaves_the_writing_to_apply(cache: Cache) -> None:
    batch = items(5)
    stage = Staging(cache.meta, min_files=1)
    add(stage, batch[0])
    (stage.folder / "1.part").mkdir()  # the helper's second file cannot be made
    for item in batch[1:]:
        add(stage, item)
    stage.flush()
    stage.wait()
    assert stage.written == {0}
    cache.apply(batch, [], {NS: NamespaceInfo(NS, "laptop", "notes", "markdown", 1)},
                writer=PreStagedWriter(stage))
    for path, _, text in batch:
        assert (cache.root / path).read_text(encoding="utf-8") == text
    stage.discard()


def test_the_helper_refuses_a_short_record(tmp_path: Path) -> None:
    folder = tmp_path / "staging"
    folder.mkdir()
    frame = staging_mod._batch(0, ["d/x.md", "y.md"], array("q", [3, 10]),
                               [b"abc", b"0123456789"])
    proc = subprocess.run([sys.executable, "-I", staging_mod.__file__, str(folder)],
                          input=frame[:-5], capture_output=True, timeout=30)
    mtime = (folder / "d" / "x.md").stat().st_mtime_ns
    assert proc.returncode == 1 and proc.stdout == b"0 %d" % mtime  # the one written, its time
    assert [p.relative_to(folder).as_posix() for p in folder.rglob("*")] == ["d", "d/x.md"]
    assert (folder / "d" / "x.md").read_bytes() == b"abc"


def test_a_namespace_folder_already_in_the_cache_is_not_replaced(cache: Cache) -> None:
    stray = cache.root / NS / "kept.txt"  # not in the manifest, but the folder exists
    stray.parent.mkdir(parents=True)
    stray.write_text("mine")
    batch = items(6)
    stage = staged(cache, batch, new=True)
    cache.apply(batch, [], {NS: NamespaceInfo(NS, "laptop", "notes", "markdown", 1)},
                writer=PreStagedWriter(stage))
    assert stray.read_text() == "mine"
    assert staged_paths(stage) == []  # moved one by one
    for path, _, text in batch:
        assert (cache.root / path).read_text(encoding="utf-8") == text
    stage.discard()


@pytest.mark.skipif(not hasattr(os, "getpriority"), reason="no process priorities here")
def test_the_helper_runs_at_the_lowest_priority(cache: Cache) -> None:
    # Its writes only save time later; at the same priority they would slow the ssh handshake
    # and the server's work, which the sync waits for.
    stage = Staging(cache.meta, min_files=1)
    add(stage, items(1)[0])
    assert stage._child is not None
    deadline = time.monotonic() + 30
    while os.getpriority(os.PRIO_PROCESS, stage._child.pid) < 19:
        assert time.monotonic() < deadline, "the helper did not lower its priority within 30 s"
        time.sleep(0.01)
    stage.discard()


def test_a_pull_staged_keeps_little_per_file(tmp_path: Path) -> None:
    """A first pull stages every file of the store: its bookkeeping must stay small (issue 15)."""
    import tracemalloc
    stage = Staging(tmp_path / ".sharedmem")
    pulled = [(f"machines/lab/notes/f{i:05}.md", sha256_text(f"{i}")) for i in range(5000)]
    tracemalloc.start()
    try:
        for path, sha in pulled:  # the paths and sha256s are the intake's, held anyway
            stage.put(path, sha, b"x")
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    # Found again by the commit's move, by path and sha256 alone.
    assert not stage.move(pulled[0][0], pulled[1][1], str(tmp_path / "other"))  # another sha256
    for i, (path, sha) in enumerate(pulled[::97]):
        assert stage.move(path, sha, str(tmp_path / f"moved{i}"))
        assert (tmp_path / f"moved{i}").read_bytes() == b"x"
    # A guard on memory that grows with the files (a store of any size must sync): nothing is
    # kept per file.
    assert held < 5000 * 20, held / 5000


def test_a_new_namespace_pulled_moves_in_with_one_rename(cache: Cache) -> None:
    """A first pull stages the server's texts at their cache paths: the folder moves whole."""
    stage = Staging(cache.meta)
    stage.put_trees(frozenset({NS}))
    batch = items(12)
    intake = cache.intake(PreStagedWriter(stage))
    for path, sha, text in batch:
        intake.add(path, sha, text)
    assert staged_paths(stage) == sorted(p for p, _, _ in batch)  # at their cache paths
    folder = os.stat(stage.folder / NS).st_ino
    done = cache.commit(intake, [], {NS: NamespaceInfo(NS, "laptop", "notes", "markdown", 1)}).report
    assert done["written"] == 12 and os.stat(cache.root / NS).st_ino == folder  # one rename
    assert {p: (cache.root / p).read_text() for p, _, _ in batch} == {p: t for p, _, t in batch}
    assert Cache(cache.root).load().files[batch[5][0]].sha256 == batch[5][1]
    assert staged_paths(stage) == []
    stage.discard()


def test_a_tree_holds_each_path_once_and_moves_only_what_the_pull_records(cache: Cache) -> None:
    # A server that sends a path twice: the namespace is mixed, not moved whole, and each
    # file in place is the text last recorded for it, the tree's checked by its sha256.
    stage = Staging(cache.meta)
    stage.put_trees(frozenset({NS}))
    (a, a_sha, a_text), (b, b_sha, b_text), (c, c_sha, c_text), (d, d_sha, d_text) = items(4)
    other = "# a again\n"
    mine = "# b, this client's own\n"
    intake = cache.intake(PreStagedWriter(stage))
    intake.add(a, a_sha, a_text)
    intake.add(b, b_sha, b_text)
    intake.add(c, c_sha, c_text)
    intake.add(d, d_sha, d_text)  # put once: its tree file is checked and moved alone
    intake.add(a, sha256_text(other), other)  # put again: the tree keeps the first
    intake.add(b, sha256_text(mine), mine, vouched=True)  # the tree's text is not this one
    intake.add(c, c_sha, c_text)
    assert not stage.move_tree(NS, 3, str(cache.root / "x"))  # mixed: moved file by file
    done = cache.commit(intake, [], {NS: NamespaceInfo(NS, "laptop", "notes", "markdown", 1)}).report
    assert done["written"] == 4
    assert [(cache.root / p).read_text() for p in (a, b, c, d)] == [other, mine, c_text, d_text]
    assert not (stage.folder / d).exists()
    stage.discard()  # what was not moved (the tree's first texts) goes
    assert not stage.folder.exists()


def test_a_tree_is_not_moved_over_a_folder_the_cache_has(cache: Cache) -> None:
    stage = Staging(cache.meta)
    stage.put_trees(frozenset({NS}))
    batch = items(4)
    (cache.root / NS / "d0").mkdir(parents=True)
    (cache.root / NS / "keep.md").write_text("not the cache's: left alone\n")
    intake = cache.intake(PreStagedWriter(stage))
    for path, sha, text in batch:
        intake.add(path, sha, text)
    cache.commit(intake, [], {NS: NamespaceInfo(NS, "laptop", "notes", "markdown", 1)})
    assert {p: (cache.root / p).read_text() for p, _, _ in batch} == {p: t for p, _, t in batch}
    assert (cache.root / NS / "keep.md").read_text() == "not the cache's: left alone\n"
    stage.discard()


def test_a_commit_that_fails_takes_a_tree_moved_in_out_again(cache: Cache) -> None:
    from sharedmem.core import CacheError
    stage = Staging(cache.meta)
    stage.put_trees(frozenset({NS}))
    other = "machines/desk/notes"
    intake = cache.intake(PreStagedWriter(stage))
    for path, sha, text in items(5):
        intake.add(path, sha, text)
    intake.add(f"{other}/a.md", sha256_text("a\n"), "a\n")  # staged by its hash, not a tree
    (hashed,) = stage.folder.glob("*.pull")
    hashed.unlink()  # so the commit fails after the tree moved in
    spaces = {key: NamespaceInfo(key, key.split("/")[1], "notes", "markdown", 1)
              for key in (NS, other)}
    with pytest.raises(CacheError, match="is gone"):
        cache.commit(intake, [], spaces)
    assert not any(p.is_file() for p in cache.root.rglob("*.md")) and not cache.exists()


@pytest.mark.skipif(not staging_mod._BY_FOLDER, reason="folders are not opened here (Windows)")
@pytest.mark.parametrize("planted", ["d", "d/e"])
def test_the_helper_does_not_follow_a_link_where_a_folder_belongs(tmp_path: Path,
                                                                    planted: str) -> None:
    # The helper makes and opens each folder itself, one name at a time: a link planted in the
    # staging folder (the sync empties it first, so only something else could) stops it.
    folder, outside = tmp_path / "staging", tmp_path / "outside"
    (outside / "e").mkdir(parents=True)
    (folder / planted).parent.mkdir(parents=True, exist_ok=True)
    (folder / planted).symlink_to(outside if planted == "d" else outside / "e")
    frame = staging_mod._batch(0, ["top.md", "d/e/x.md"], array("q", [3, 3]), [b"abc", b"xyz"])
    proc = subprocess.run([sys.executable, "-I", "-S", staging_mod.__file__, str(folder)],
                          input=frame, capture_output=True, timeout=30)
    mtime = (folder / "top.md").stat().st_mtime_ns
    assert proc.returncode == 1 and proc.stdout == b"0 %d" % mtime  # the file before it only
    assert list(outside.rglob("*")) == [outside / "e"]  # nothing written through the link
    assert (folder / planted).is_symlink()


@pytest.mark.parametrize("by_folder", [True, False] if staging_mod._BY_FOLDER else [False])
def test_the_helper_writes_alike_by_folder_and_by_path(tmp_path: Path, by_folder: bool) -> None:
    # More folders than it holds open at once, in two frames, as the sync sends them.
    paths = [f"{NS}/f{i % 300}/g{i % 7}/n{i}.md" for i in range(700)]
    texts = [f"note {i}\n".encode() * (i % 5) for i in range(700)]
    sizes = array("q", map(len, texts))
    source = tmp_path / "frames"
    source.write_bytes(staging_mod._batch(0, paths[:400], sizes[:400], texts[:400])
                       + staging_mod._batch(400, paths[400:], sizes[400:], texts[400:]))
    folder = tmp_path / "staging"
    folder.mkdir()
    with source.open("rb") as frames, (tmp_path / "report").open("w") as report:
        assert staging_mod._helper(str(folder), frames, report, by_folder) == 0
    lines = (tmp_path / "report").read_text().split("\n")
    assert lines == [f"{n} {(folder / p).stat().st_mtime_ns}" for n, p in enumerate(paths)]
    assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*.md")) == sorted(paths)
    assert all((folder / p).read_bytes() == t for p, t in zip(paths, texts, strict=True))
    assert (folder / paths[0]).stat().st_mode & 0o777 == 0o600


def test_a_tree_moves_whole_only_if_it_holds_just_what_is_pulled(cache: Cache) -> None:
    # One file pulled at another sha256, one more than staged, one fewer: written one by one.
    batch = items(6)
    other = "# the server redacted this one differently\n"
    extra = (f"{NS}/d0/extra.md", sha256_text("extra\n"), "extra\n")
    info = {NS: NamespaceInfo(NS, "laptop", "notes", "markdown", 1)}
    for pulled in ([*batch[:2], (batch[2][0], sha256_text(other), other), *batch[3:]],
                   [*batch, extra], batch[:-1]):
        root = cache.root.parent / f"cache-{len(pulled)}-{pulled[2][1][:6]}"
        other_cache = Cache(root)
        stage = staged(other_cache, batch, new=True)
        done = other_cache.apply(pulled, [], info, writer=PreStagedWriter(stage))
        assert done["written"] == len(pulled)
        on_disk = {f.relative_to(root).as_posix() for f in (root / NS).rglob("*") if f.is_file()}
        assert on_disk == {p for p, _, _ in pulled}  # nothing staged and not pulled moved in
        assert {p: (root / p).read_text(encoding="utf-8") for p, _, _ in pulled} == {
            p: t for p, _, t in pulled}
        rows = Cache(root).load().files
        assert {p: f.sha256 for p, f in rows.items()} == {p: s for p, s, _ in pulled}
        assert all(f.size == (root / p).stat().st_size for p, f in rows.items())
        stage.discard()


def test_a_tree_moved_whole_and_files_written_one_by_one_are_recorded_alike(
        cache: Cache) -> None:
    batch = items(12)
    stage = staged(cache, batch, new=True)
    elsewhere = "machines/desk/notes"
    pulled = [(f"{elsewhere}/a.md", sha256_text("a\n"), "a\n"),
              (f"{elsewhere}/z/b.md", sha256_text("b\n"), "b\n")]
    info = {NS: NamespaceInfo(NS, "laptop", "notes", "markdown", 1),
            elsewhere: NamespaceInfo(elsewhere, "desk", "notes", "markdown", 2)}
    done = cache.apply(batch + pulled, [], info, writer=PreStagedWriter(stage))
    assert done["written"] == 14 and not (stage.folder / NS).exists()  # the tree moved
    rows = Cache(cache.root).load().files
    assert sorted(rows) == sorted(p for p, _, _ in batch + pulled)
    for path, sha, _ in batch + pulled:
        info_on_disk = (cache.root / path).stat()
        assert (rows[path].sha256, rows[path].size, rows[path].mtime_ns) == (
            sha, info_on_disk.st_size, info_on_disk.st_mtime_ns)
        assert rows[path].namespace == (NS if path.startswith(NS) else elsewhere)
    stage.discard()


def test_a_tree_checked_ahead_is_checked_again_if_the_pull_records_into_it(cache: Cache) -> None:
    # `PreStagedWriter.plan` checks the staged folder while the answer is on its way; a file
    # the pull then records in that namespace (the server sent another text) voids the check.
    batch = items(8)
    info = {NS: NamespaceInfo(NS, "laptop", "notes", "markdown", 1)}
    other = "# the server's text of this one\n"
    for late in ([], [(f"{NS}/d0/late.md", sha256_text("late\n"), "late\n")],
                 [(batch[3][0], sha256_text(other), other)]):
        root = cache.root.parent / f"cache-{len(late)}-{late[0][1][:6] if late else ''}"
        target = Cache(root)
        stage = staged(target, batch, new=True)
        writer = PreStagedWriter(stage)
        intake = target.intake(writer)
        intake.add_own(batch)
        writer.plan(intake.rows)
        assert writer.plans[NS]  # as staged: it would move whole
        for path, sha, text in late:
            intake.add(path, sha, text)
        done = target.commit(intake, [], info).report
        want = {p: t for p, _, t in batch} | {p: t for p, _, t in late}
        on_disk = {f.relative_to(root).as_posix(): f.read_text(encoding="utf-8")
                   for f in (root / NS).rglob("*") if f.is_file()}
        assert on_disk == want and done["written"] == len(want)
        assert {p: f.sha256 for p, f in Cache(root).load().files.items()} == {
            p: sha256_text(t) for p, t in want.items()}
        stage.discard()


@pytest.mark.parametrize("new", [False, True])
def test_a_few_files_written_here_are_moved_in_as_the_helpers_are(cache: Cache,
                                                                   new: bool) -> None:
    # Too few for a helper: a version 3 sync writes them itself while the answer travels.
    batch = items(3)
    stage = Staging(cache.meta, frozenset({NS} if new else ()), min_files=4)
    for item in batch:
        add(stage, item)
    stage.flush()
    assert stage._child is None and not stage.folder.exists()  # no helper, nothing written
    stage.write_few()
    assert stage.written == {0, 1, 2}
    assert staged_paths(stage) == (sorted(p for p, _, _ in batch) if new
                                   else ["0.part", "1.part", "2.part"])
    assert list(stage.mtimes) == [(stage.folder / (p if new else f"{n}.part")).stat().st_mtime_ns
                                  for n, (p, _, _) in enumerate(batch)]
    stage.write_few()  # nothing is left to write
    done = cache.apply(batch, [], {NS: NamespaceInfo(NS, "laptop", "notes", "markdown", 1)},
                       writer=PreStagedWriter(stage))
    assert done["written"] == 3 and staged_paths(stage) == []  # every one moved, none written
    rows = Cache(cache.root).load().files
    for path, sha, text in batch:
        assert (cache.root / path).read_text(encoding="utf-8") == text
        assert (rows[path].sha256, rows[path].mtime_ns) == (sha, (cache.root / path).stat().st_mtime_ns)
    stage.discard()
    assert not stage.folder.exists()
