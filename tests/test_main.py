"""The command line in process: every --help, errors on stderr, JSON output, argv only."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import config_for, make_memories, run_cli, write_config

from sharedmem.cache.cache import Cache, NamespaceInfo
from sharedmem.cli import main as cli
from sharedmem.client.outbox import Outbox
from sharedmem.hashing import sha256_text
from sharedmem.server.ingest import ingest


def commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command path in the argparse tree, e.g. ('backup', 'create')."""
    out = [path]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += commands(sub, (*path, name))
    return out


ALL = commands(cli.parser())


def test_the_tree_has_every_documented_command() -> None:
    names = {c[0] for c in ALL if c}
    assert {"serve", "sync", "mcp", "doctor", "status", "list", "read", "search", "note",
            "backup", "forget", "export", "demo"} <= names
    assert {c for c in ALL if c[:1] == ("backup",) and len(c) == 2} == {
        ("backup", a) for a in ("create", "list", "verify", "prune", "restore")}


@pytest.mark.parametrize("command", ALL, ids=lambda c: " ".join(c) or "top")
def test_help_of_every_command(command: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main([*command, "--help"])
    assert exc.value.code == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"usage: shared_memory.py {' '.join(command)}".rstrip())
    assert "--help" in out and err == ""


@pytest.mark.parametrize("command", [c for c in ALL if c], ids=" ".join)
def test_a_command_run_by_name_builds_its_parser_alone_and_the_same(
        command: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    # The run builds only the command its first word names (when a builder is named so),
    # whose help must be the one the whole tree gives.
    for tree in (cli.parser(), cli.parser(command[0])):
        with pytest.raises(SystemExit):
            tree.parse_args([*command, "--help"])
    whole, alone = capsys.readouterr().out.split("usage: ")[1:]
    assert alone == whole
    if command[0] in ("sync", "serve", "doctor", "status", "backup"):
        assert commands(cli.parser(command[0]))[1:2] == [command[:1]]


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from sharedmem import __version__
    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"shared_memory.py {__version__}"


def test_usage_errors_exit_2_with_usage_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["status"], ["frobnicate"], [], ["backup"], ["sync", "--config", "x",
                                                             "--max-protocol", "4"]):
        with pytest.raises(SystemExit) as exc:
            cli.main(argv)
        assert exc.value.code == 2, argv
        out, err = capsys.readouterr()
        assert out == "" and "usage: shared_memory.py" in err, argv


@pytest.mark.parametrize("argv,needle", [
    (["status", "--config", "{tmp}/missing/client.json"], "configuration {tmp}/missing/client.json "
     "does not exist"),
    (["export", "--store", "{tmp}/none.sqlite3", "--out", "{tmp}/out"], "store {tmp}/none.sqlite3 "
     "does not exist"),
    (["forget", "--store", "{tmp}/none.sqlite3", "--machine", "pc"], "does not exist"),
    (["read", "--config", "{tmp}/bad.json", "machines/a/b/c.md"], "is not valid JSON (line 1"),
])
def test_errors_name_the_command_on_stderr(tmp_path: Path, home: Path,
                                           capsys: pytest.CaptureFixture[str], argv: list[str],
                                           needle: str) -> None:
    (tmp_path / "bad.json").write_text("{oops")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"shared_memory.py {argv[0]}: error: ")
    assert needle.replace("{tmp}", str(tmp_path)) in err
    assert "Traceback" not in err
    assert not (tmp_path / "out").exists()


def status_config(tmp_path: Path) -> Path:
    cfg = write_config(tmp_path / "client" / "client.json", "laptop",
                       {"kind": "local", "store": str(tmp_path / "store.sqlite3")}, [],
                       tmp_path / "cache")
    key = "machines/desk/notes"
    Cache(tmp_path / "cache").apply(
        [(f"{key}/a.md", sha256_text("a\n"), "a\n"), (f"{key}/b.md", sha256_text("b\n"), "b\n")],
        [], {key: NamespaceInfo(key, "desk", "notes", "markdown", 3, "2026-01-01T00:00:00Z")})
    Outbox(tmp_path / "client" / "state" / "outbox").put("2026-01-31T09-30-00-idea.md", "idea")
    return cfg


def test_a_note_that_is_not_utf8_is_refused_by_the_note_rule(tmp_path: Path) -> None:
    cfg = status_config(tmp_path)
    result = run_cli("note", "--config", str(cfg), "2026-01-31T09-30-00-x.md", "bad \udcff byte")
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("shared_memory.py note: error: argument 'note' of "
                                    "add_ad_hoc_note is not valid UTF-8 text")
    assert len(Outbox(tmp_path / "client" / "state" / "outbox").pending()) == 1  # only "idea"


def test_status_json_is_valid_json(tmp_path: Path, home: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    cfg = status_config(tmp_path)
    assert cli.main(["status", "--config", str(cfg), "--json"]) == 0
    out, err = capsys.readouterr()
    info = json.loads(out)
    assert err == ""
    assert info["machine"] == "laptop" and info["cache"] == str(tmp_path / "cache")
    assert info["pending_notes"] == ["2026-01-31T09-30-00-idea.md"]
    assert info["namespaces"] == [{"key": "machines/desk/notes", "machine": "desk",
                                   "source": "notes", "kind": "markdown", "files": 2,
                                   "synced_at": "2026-01-01T00:00:00Z"}]
    assert info["last_sync"] and info["age_seconds"] >= 0

    assert cli.main(["status", "--config", str(cfg)]) == 0
    text = capsys.readouterr().out
    assert "machine laptop" in text and "machines/desk/notes: 2 files" in text
    assert "pending notes: 1" in text


def test_index_refreshes_and_reports(tmp_path: Path, home: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    cfg = status_config(tmp_path)
    assert cli.main(["index", "--config", str(cfg), "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == {"changed": 2, "files": 2} and err == ""
    assert cli.main(["index", "--config", str(cfg)]) == 0
    assert capsys.readouterr().out == "index: 0 files refreshed, 2 indexed\n"
    quiet = run_cli("index", "--cache", str(tmp_path / "cache"), "--background")  # a child:
    assert (quiet.returncode, quiet.stdout, quiet.stderr) == (0, "", "")  # it lowers its priority
    assert cli.main(["index", "--cache", str(tmp_path)]) == 2
    assert "is not a synced cache" in capsys.readouterr().err


def test_main_reads_only_its_argv(tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    cfg = status_config(tmp_path)
    monkeypatch.setattr(sys, "argv", ["garbage-prog", "--no-such-flag", "serve", "--bogus"])
    assert cli.main(["status", "--config", str(cfg), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["machine"] == "laptop"
    assert cli.main(("list", "--config", str(cfg), "machines", "--json")) == 0
    listed = json.loads(capsys.readouterr().out)
    assert "machines/desk" in json.dumps(listed)
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert capsys.readouterr().out.startswith("usage: shared_memory.py ")


# forget and export, through the real launcher, on a real store ------------------------------------

def _store_with_two_machines(tmp_path):
    from sharedmem.server.ingest import IncomingFile
    from sharedmem.server.store import Store
    path = tmp_path / "store.sqlite3"
    with Store.open(path) as st:
        ingest(st, "laptop", "codex", "codex", [IncomingFile("MEMORY.md", text="laptop memory")])
        ingest(st, "laptop", "notes", "markdown", [IncomingFile("a/b.md", text="laptop note")])
        ingest(st, "desktop", "notes", "markdown", [IncomingFile("x.md", text="desktop note")])
        st.append_note("laptop", "2026-11-30T10-00-00-kept.md", "a note survives forget", "note-0001")
    return path


def test_forget_one_source_then_machine_keeps_notes(tmp_path):
    import json

    from conftest import run_cli

    from sharedmem.server.store import Store
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


def test_export_writes_the_published_tree(tmp_path):
    from conftest import run_cli
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


@pytest.mark.parametrize("argv,quick", [
    (["serve", "--store", "/s.db"], {"store": "/s.db", "machine": None}),
    (["serve", "--store", "/s.db", "--machine", "laptop"], {"store": "/s.db", "machine": "laptop"}),
    (["serve", "--store"], None),
    (["serve", "--store", "--machine", "laptop"], None),
    (["serve", "--store", "/s.db", "--max-protocol", "1"], None),
    (["serve", "--store", "/s.db", "--machine"], None),
    (["serve", "--machine", "laptop", "--store", "/s.db"], None),
    (["sync", "--store", "/s.db"], None),
])
def test_forced_command_serve_is_parsed_without_argparse(argv: list[str], quick: dict | None) -> None:
    args = cli._quick_args(argv)
    if quick is None:
        assert args is None  # argparse parses it, and explains what is wrong
    else:
        full = cli.parser().parse_args(argv)
        assert {k: getattr(args, k) for k in ("store", "machine", "max_protocol", "handler")} == {
            k: getattr(full, k) for k in ("store", "machine", "max_protocol", "handler")}
        assert (args.store, args.machine) == (quick["store"], quick["machine"])


@pytest.mark.parametrize("argv,quick", [
    (["sync", "--config", "/c.json"], True),
    (["sync", "--config", "/c.json", "--json"], True),
    (["sync", "--config", "/c.json", "--json", "--wait", "0"], False),
    (["sync", "--config", "/c.json", "--index"], False),
    (["sync", "--config", "--json"], False),
    (["sync", "--config"], False),
    (["sync", "--json", "--config", "/c.json"], False),
])
def test_the_scheduled_sync_is_parsed_without_argparse_as_argparse_would(
        argv: list[str], quick: bool) -> None:
    args = cli._quick_args(argv)
    if not quick:
        assert args is None  # argparse parses it, and explains what is wrong
        return
    full = cli.parser("sync").parse_args(argv)
    assert vars(args) == vars(full)


def test_status_says_a_damaged_cache_and_the_refused_notes(tmp_path: Path, home: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    from sharedmem.client.exchange import _quarantine
    cfg = status_config(tmp_path)
    outbox = Outbox(tmp_path / "client" / "state" / "outbox")
    [(path, queued)] = outbox.pending()
    _quarantine(path, {"filename": queued.filename, "note_id": queued.note_id,
                       "message": "a note must not be empty\x1b[2J"})
    outbox.done(path)
    (tmp_path / "cache" / ".sharedmem" / "manifest.sqlite3").write_text("{", encoding="utf-8")
    assert cli.main(["status", "--config", str(cfg)]) == 0
    text = capsys.readouterr().out
    assert (f"the cache is damaged and will be repaired by the next sync (run "
            f"`shared_memory.py sync --config {cfg}` now to repair it): ") in text
    assert "refused notes: 1 (kept in " in text
    assert "  2026-01-31T09-30-00-idea.md: a note must not be empty\\x1b[2J" in text
    assert cli.main(["status", "--config", str(cfg), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert "manifest.sqlite3" in info["damage"] and info["refused_notes_total"] == 1


def test_the_sync_text_counts_the_cache_files_it_repaired(tmp_path: Path) -> None:
    home = tmp_path / "h"
    make_memories(home, files=3)
    cfg = config_for(tmp_path, home, "laptop",
                     {"kind": "local", "store": str(tmp_path / "store.sqlite3")})
    assert run_cli("sync", "--config", str(cfg)).returncode == 0
    cache = tmp_path / "laptop" / "cache"
    (cache / "machines/laptop/notes/d1/note-001.md").write_text("edited by hand\n")
    (cache / "machines/laptop/codex/MEMORY.md").write_text("edited too\n")
    proc = run_cli("sync", "--config", str(cfg))
    assert proc.returncode == 0, proc.stderr
    assert "    2 cache files repaired (changed by hand or damaged" in proc.stdout, proc.stdout
    again = run_cli("sync", "--config", str(cfg))
    assert again.returncode == 0 and "repaired" not in again.stdout, again.stdout


def test_export_streams_the_store_instead_of_listing_it(tmp_path: Path, home: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """The texts pass through once (the plain writer keeps each until its commit), not twice."""
    import tracemalloc

    from sharedmem.server.ingest import IncomingFile
    from sharedmem.server.store import Store
    store = tmp_path / "store.sqlite3"
    texts = {f"f{i:03}.md": f"# file {i}\n" + f"line {i} " * 12_000 + "\n" for i in range(40)}
    with Store.open(store) as st:
        ingest(st, "laptop", "notes", "markdown",
               [IncomingFile(p, text=t) for p, t in texts.items()])
    total = sum(len(t) for t in texts.values())
    tracemalloc.start()
    try:
        assert cli.main(["export", "--store", str(store), "--out", str(tmp_path / "out")]) == 0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    capsys.readouterr()
    root = tmp_path / "out" / "machines" / "laptop" / "notes"
    assert {p.name: p.read_text() for p in root.iterdir()} == texts
    assert peak < 1.5 * total, (peak, total)


PROBE = r'''
import gc, os, sys
sys.path.insert(0, sys.argv[1])
seen = {}

class Probe:
    """Records whether the collector runs as each module named below starts to load."""
    def find_spec(self, name, path=None, target=None):
        if name in ("sharedmem.client.sync", "sharedmem.server.session"):
            seen[name] = gc.isenabled()
        return None

sys.meta_path.insert(0, Probe())
from sharedmem.cli.main import main
main(sys.argv[2:])
with open(os.environ["PROBE_OUT"], "w") as out:  # serve's stdout is its channel
    out.write(f"{sorted(seen.items())} {gc.isenabled()}")
'''


@pytest.mark.parametrize("argv, module", [
    (["sync", "--config", "{tmp}/client.json"], "sharedmem.client.sync"),
    (["serve", "--store", "{tmp}/store.sqlite3"], "sharedmem.server.session"),
])
def test_sync_and_serve_load_their_modules_with_the_collector_paused(
        tmp_path: Path, argv: list[str], module: str) -> None:
    # Their runs make no cycles to collect, and neither do their imports: young collections
    # meanwhile freed nothing and cost a sync 12-15 ms (docs/BENCHMARKS.md "Eighth round").
    (tmp_path / "client.json").write_text(json.dumps({
        "machine": "laptop", "transport": {"kind": "local", "store": str(tmp_path / "s.sqlite3")},
        "sources": [], "cache": str(tmp_path / "cache"), "state": str(tmp_path / "state")}))
    args = [a.format(tmp=tmp_path) for a in argv]
    root, out = Path(cli.__file__).resolve().parents[2], tmp_path / "probe.txt"
    done = subprocess.run([sys.executable, "-c", PROBE, str(root), *args], input="",
                          capture_output=True, text=True, timeout=60, cwd=tmp_path,
                          env={**os.environ, "PROBE_OUT": str(out)})
    assert out.read_text() == f"[('{module}', False)] True", done.stderr
