"""`demo`: the sandboxed whole flow, with the real sync client and the real MCP server."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from conftest import run_cli

from sharedmem.cli import demo as demo_mod
from sharedmem.core import ConfigError, SharedMemoryError


def _token() -> str:
    return demo_mod._FAKE_TOKEN


def test_demo_runs_all_four_tools_in_its_sandbox(tmp_path: Path, home: Path) -> None:
    sandbox = tmp_path / "sandbox"
    seen: list[str] = []
    result = demo_mod.demo(sandbox, seen.append)
    assert result["ok"] and result["kept"] and result["sandbox"] == str(sandbox.resolve())
    assert seen and any("MCP" in m for m in seen)
    calls = {c["tool"]: c for c in result["calls"]}
    assert {"list", "search", "read", "add_ad_hoc_note"} <= set(calls)
    assert not any(c["is_error"] for c in result["calls"])
    listed = {e["name"] for e in calls["list"]["result"]["entries"]}
    assert listed == {"laptop", "desktop"}
    hit_machines = {h["path"].split("/")[1] for h in calls["search"]["result"]["results"]}
    assert hit_machines == {"laptop", "desktop"}
    reads = [c for c in result["calls"] if c["tool"] == "read"]
    memory = "\n".join(reads[0]["result"]["lines"])
    assert "[REDACTED:" in memory and "Zoë" in memory and _token() not in memory
    assert "日本語" in reads[1]["text"]
    assert calls["add_ad_hoc_note"]["result"]["status"] == "stored"  # and read back at once
    assert "second reviewer" in "\n".join(reads[-1]["result"]["lines"])
    assert result["syncs"][0]["sources"][0]["redacted"] == {"openai-key": 1}
    # the invented credential never left the laptop's sample folder
    for path in sandbox.rglob("*"):
        if path.is_file() and "home" not in path.relative_to(sandbox).parts:
            assert _token().encode() not in path.read_bytes(), path
    assert list(home.iterdir()) == []
    text = demo_mod.format_text(result)
    for line in ("> list", "> search", "> read", "> add_ad_hoc_note", "[REDACTED:openai-key]"):
        assert line in text
    assert result["seconds"] < 30


def test_temporary_sandbox_is_removed(home: Path) -> None:
    result = demo_mod.demo()
    assert result["ok"] and not result["kept"]
    assert not Path(result["sandbox"]).exists()
    assert "sandbox was removed" in demo_mod.format_text(result)
    assert list(home.iterdir()) == []


def test_demo_refuses_a_folder_it_did_not_make(tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.md").write_text("precious\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="not an earlier demo sandbox"):
        demo_mod.demo(mine)
    assert sorted(p.name for p in mine.iterdir()) == ["thesis.md"]


def test_demo_through_the_launcher(tmp_path: Path, home: Path) -> None:
    if run_cli("demo", "--help").returncode != 0:
        pytest.skip("demo is not wired into the CLI yet")
    proc = run_cli("demo", "--dir", str(tmp_path / "d"), env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr
    for line in ("> list", "> search", "> read", "> add_ad_hoc_note", "REDACTED"):
        assert line in proc.stdout
    assert list(home.iterdir()) == []


def test_a_server_that_dies_is_reported_with_its_last_words_every_time() -> None:
    """The exit can be noticed before stderr is read; the message must not depend on luck."""
    dies = [sys.executable, "-c", "import sys; sys.stderr.write('boom at start'); sys.exit(3)"]
    for _ in range(25):
        # It may be gone before the request is even written: either way, its words are named.
        with pytest.raises(SharedMemoryError, match="the MCP server stopped (before answering "
                                                    "initialize|while a request was being "
                                                    "sent): boom at start$"):
            with demo_mod.McpSession(dies) as session:
                session.initialize()
