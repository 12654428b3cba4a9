"""Tests for sharedmem.cli.main: every --help, usage and errors on stderr, argv only, the quick parse."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import client_with_cache

from sharedmem.cli import main as cli


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


def test_main_reads_only_its_argv(tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    cfg = client_with_cache(tmp_path, {"MEMORY.md": "# Memory\n"})
    monkeypatch.setattr(sys, "argv", ["garbage-prog", "--no-such-flag", "serve", "--bogus"])
    assert cli.main(["status", "--config", str(cfg), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["machine"] == "lab"
    assert cli.main(("list", "--config", str(cfg), "machines", "--json")) == 0
    listed = json.loads(capsys.readouterr().out)
    assert "machines/lab" in json.dumps(listed)
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert capsys.readouterr().out.startswith("usage: shared_memory.py ")


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
    # Their runs make no cycles to collect, and neither do their imports: collections meanwhile
    # free nothing and only cost a sync time (docs/BENCHMARKS.md).
    (tmp_path / "client.json").write_text(json.dumps({
        "machine": "laptop", "transport": {"kind": "local", "store": str(tmp_path / "s.sqlite3")},
        "sources": [], "cache": str(tmp_path / "cache"), "state": str(tmp_path / "state")}))
    args = [a.format(tmp=tmp_path) for a in argv]
    root, out = Path(cli.__file__).resolve().parents[2], tmp_path / "probe.txt"
    done = subprocess.run([sys.executable, "-c", PROBE, str(root), *args], input="",
                          capture_output=True, text=True, timeout=60, cwd=tmp_path,
                          env={**os.environ, "PROBE_OUT": str(out)})
    assert out.read_text() == f"[('{module}', False)] True", done.stderr
