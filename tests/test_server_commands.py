"""Tests for sharedmem.cli.server_commands: forget and export on a real store.

forget and export run through the real launcher (a child process) or `main`, as a user runs them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_cli

from sharedmem.cli import main as cli
from sharedmem.server.ingest import IncomingFile, ingest
from sharedmem.server.store import Store


def _store_with_two_machines(tmp_path: Path) -> Path:
    """A store of two machines' files and a note of the laptop."""
    path = tmp_path / "store.sqlite3"
    with Store.open(path) as st:
        ingest(st, "laptop", "codex", "codex", [IncomingFile("MEMORY.md", text="laptop memory")])
        ingest(st, "laptop", "notes", "markdown", [IncomingFile("a/b.md", text="laptop note")])
        ingest(st, "desktop", "notes", "markdown", [IncomingFile("x.md", text="desktop note")])
        st.append_note("laptop", "2026-11-30T10-00-00-kept.md", "a note survives forget", "note-0001")
    return path


def test_forget_one_source_then_machine_keeps_notes(tmp_path: Path) -> None:
    store = _store_with_two_machines(tmp_path)
    proc = run_cli("forget", "--store", str(store), "--machine", "laptop", "--source", "notes",
                   "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["files_removed"] == 1
    with Store.open(store) as st:
        paths = set(st.manifest())
    assert "machines/laptop/notes/a/b.md" not in paths
    assert "machines/laptop/codex/MEMORY.md" in paths
    assert "machines/desktop/notes/x.md" in paths
    proc = run_cli("forget", "--store", str(store), "--machine", "laptop", "--reason", "sold")
    assert proc.returncode == 0 and "notes are append-only" in proc.stdout
    with Store.open(store) as st:
        paths = set(st.manifest())
        forgotten = st.conn.execute("SELECT machine, source, reason FROM forgotten").fetchall()
        assert st.verify() == []
    assert not any(p.startswith("machines/laptop/") for p in paths)
    assert "extensions/ad_hoc/notes/2026-11-30T10-00-00-kept.md" in paths
    assert forgotten == [("laptop", "notes", ""), ("laptop", None, "sold")]
    proc = run_cli("forget", "--store", str(store), "--machine", "laptop")
    assert proc.returncode == 2 and "holds nothing for machine 'laptop'" in proc.stderr
    assert proc.stdout == ""


def test_export_writes_the_published_tree(tmp_path: Path) -> None:
    store = _store_with_two_machines(tmp_path)
    out = tmp_path / "export"
    proc = run_cli("export", "--store", str(store), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    files = {str(p.relative_to(out)): p.read_text() for p in out.rglob("*.md")
             if ".sharedmem" not in p.parts}
    assert files["machines/laptop/codex/MEMORY.md"] == "laptop memory"
    assert files["machines/desktop/notes/x.md"] == "desktop note"
    assert "a note survives forget" in files["extensions/ad_hoc/notes/2026-11-30T10-00-00-kept.md"]
    assert len(files) == 4
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "mine.txt").write_text("keep")
    proc = run_cli("export", "--store", str(store), "--out", str(busy))
    assert proc.returncode == 2 and "not empty" in proc.stderr
    assert [p.name for p in busy.iterdir()] == ["mine.txt"]


def test_export_writes_large_texts_whole(tmp_path: Path, home: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Forty texts of 100 KB, streamed from the store's cursor, each written byte for byte."""
    store = tmp_path / "store.sqlite3"
    texts = {f"f{i:03}.md": f"# file {i}\n" + f"line {i} " * 12_000 + "\n" for i in range(40)}
    with Store.open(store) as st:
        ingest(st, "laptop", "notes", "markdown",
               [IncomingFile(p, text=t) for p, t in texts.items()])
    assert cli.main(["export", "--store", str(store), "--out", str(tmp_path / "out")]) == 0
    capsys.readouterr()
    root = tmp_path / "out" / "machines" / "laptop" / "notes"
    assert {p.name: p.read_text() for p in root.iterdir()} == texts
