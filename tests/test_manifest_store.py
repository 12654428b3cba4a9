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


def test_file_namespaces_jump_from_one_namespace_to_the_next(tmp_path: Path) -> None:
    # Keys that sort inside one another's runs as strings: "x" before "x-y", "x.y", "x0" and
    # "x/..." paths; the notes folder; a namespace with one file and one with many.
    namespaces = ["machines/a/x", "machines/a/x-y", "machines/a/x.y", "machines/a/x0",
                  "machines/a/xx", "machines/b/notes", "notes"]
    rows = []
    for n, key in enumerate(namespaces):
        for i in range(1 if n % 2 else 30):
            folder = "d/" if i % 3 else ""
            path = f"{key}/{folder}{i:03}.md" if key != "notes" else f"notes/m/2026/{i:03}.md"
            rows.append((path, f"{i:064x}", 1, key, 1))
    store = ManifestStore(tmp_path / "manifest.sqlite3")
    with store.transaction() as writing:
        writing.upsert(rows)
    found = store.file_namespaces()
    assert sorted(found) == namespaces
    distinct = [n for (n,) in store.connection().execute("SELECT DISTINCT namespace FROM files")]
    assert sorted(found) == sorted(distinct)
    with store.transaction() as writing:
        writing.delete([p for p, *_ in rows if p.startswith("machines/a/x0/")])
    assert sorted(store.file_namespaces()) == [n for n in namespaces if n != "machines/a/x0"]
    with store.transaction() as writing:
        writing.delete([p for p, *_ in rows])
    assert store.file_namespaces() == []
    store.close()


def test_file_namespaces_reads_a_row_a_namespace_not_every_row(tmp_path: Path) -> None:
    store = ManifestStore(tmp_path / "manifest.sqlite3")
    with store.transaction() as writing:
        writing.upsert([(f"machines/m/s{n}/d{i % 9}/{i:05}.md", f"{i:064x}", 1,
                         f"machines/m/s{n}", 1) for n in range(4) for i in range(2000)])
    conn = store.connection()

    def work(run) -> int:  # SQLite's virtual machine steps, in hundreds
        steps = [0]

        def step() -> int:
            steps[0] += 1
            return 0
        conn.set_progress_handler(step, 100)
        try:
            run()
        finally:
            conn.set_progress_handler(None, 0)
        return steps[0]

    assert sorted(store.file_namespaces()) == [f"machines/m/s{n}" for n in range(4)]
    scanned = work(lambda: conn.execute("SELECT DISTINCT namespace FROM files").fetchall())
    assert scanned > 100 and work(store.file_namespaces) < scanned / 20
    store.close()
