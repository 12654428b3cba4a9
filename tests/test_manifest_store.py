"""The cache manifest's store and a pull's record of each file (`PullRows`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sharedmem.cache.manifest_store import ManifestStore, PullRows


def test_pull_rows_below_a_folder_and_outside_others() -> None:
    rows = PullRows()
    paths = ["machines/a/x/1.md", "machines/a/x/sub/2.md", "machines/a/x0/3.md",
             "machines/a/x.md", "machines/b/y/4.md", "notes/n.md"]
    for path in paths:
        rows.set(path, "s" * 64, PullRows.WRITE)
    rows.set("machines/b/y/kept.md", "k" * 64, PullRows.KEPT)
    assert list(rows.paths(PullRows.TAKEN)) == sorted(paths)
    # A folder's records are those below "key/": not machines/a/x0 nor machines/a/x.md.
    assert list(rows.paths(PullRows.TAKEN, outside={"machines/a/x"})) == [
        "machines/a/x.md", "machines/a/x0/3.md", "machines/b/y/4.md", "notes/n.md"]
    assert list(rows.paths(PullRows.TAKEN, outside={"machines/a/x", "machines/b/y"})) == [
        "machines/a/x.md", "machines/a/x0/3.md", "notes/n.md"]
    assert [r[0] for r in rows.rows(PullRows.HELD, "machines/", outside={"machines/a/x"})] == [
        "machines/a/x.md", "machines/a/x0/3.md", "machines/b/y/4.md", "machines/b/y/kept.md"]
    assert list(rows.paths(PullRows.TAKEN, outside=())) == sorted(paths)


def test_a_new_manifest_checks_the_length_of_each_sha256(tmp_path: Path) -> None:
    store = ManifestStore(tmp_path / "manifest.sqlite3")
    with store.transaction() as writing:
        writing.upsert([("machines/a/x/1.md", "a" * 64, 1, "machines/a/x", 1)])
    with pytest.raises(Exception, match="CHECK constraint failed"), \
            store.transaction() as writing:
        writing.upsert([("machines/a/x/2.md", "a" * 63, 1, "machines/a/x", 1)])
    assert [r.path for r in store.rows()] == ["machines/a/x/1.md"]
    store.close()


def test_sha256s_looks_up_many_paths_a_chunk_a_query(tmp_path: Path) -> None:
    from sharedmem.cache.manifest_store import IN_CHUNK

    store = ManifestStore(tmp_path / "manifest.sqlite3")
    held = {f"machines/a/x/{i:05}.md": f"{i:064x}" for i in range(0, 3 * IN_CHUNK, 2)}
    with store.transaction() as writing:
        writing.upsert([(p, s, 1, "machines/a/x", 1) for p, s in held.items()])
    asked = [f"machines/a/x/{i:05}.md" for i in range(3 * IN_CHUNK)]  # every other one held
    statements: list[str] = []
    store.connection().set_trace_callback(statements.append)
    assert store.sha256s(asked) == held
    assert len([s for s in statements if "IN (" in s]) == 3
    assert store.sha256s([]) == {}
    store.close()
