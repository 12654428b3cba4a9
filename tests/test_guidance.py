"""Agent guidance, directly: block extraction, where each harness reads it, line endings.

tests/test_harnesses.py covers adding, updating, skipping and removing the block; these are the
module's own functions and corners it does not reach.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sharedmem.core import InstallError
from sharedmem.install import guidance as g

CACHE = Path("/home/u/.local/share/codex-shared-memory/cache")


def test_extract_block() -> None:
    block = f"{g.BEGIN_MARK}\nbody\n{g.END_MARK}"
    assert g.extract_block(f"before\n{block}\nafter\n") == block
    assert g.extract_block("no markers here") is None
    assert g.extract_block(f"{g.BEGIN_MARK}\nhalf a block\n") is None
    assert g.extract_block(f"{g.END_MARK}\nbackwards\n{g.BEGIN_MARK}\n") is None


def test_guidance_paths_follow_the_environment(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {"HOME": str(home)}
    assert g.guidance_paths("codex", env) == [home / ".codex" / "AGENTS.override.md",
                                              home / ".codex" / "AGENTS.md"]
    assert g.guidance_paths("claude-code", env) == [home / ".claude" / "CLAUDE.md"]
    assert g.guidance_paths("opencode", env) == [home / ".config" / "opencode" / "AGENTS.md"]
    assert g.guidance_paths("cursor", env) == []
    moved = {**env, "CODEX_HOME": str(tmp_path / "ch"), "CLAUDE_CONFIG_DIR": str(tmp_path / "cc"),
             "XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    assert g.guidance_paths("codex", moved)[-1] == tmp_path / "ch" / "AGENTS.md"
    assert g.guidance_paths("claude-code", moved) == [tmp_path / "cc" / "CLAUDE.md"]
    assert g.guidance_paths("opencode", moved) == [tmp_path / "xdg" / "opencode" / "AGENTS.md"]
    with pytest.raises(InstallError, match="unknown harness 'vim'"):
        g.guidance_paths("vim", env)


def test_a_crlf_file_gets_a_crlf_block(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path)}
    path = tmp_path / ".claude" / "CLAUDE.md"
    path.parent.mkdir()
    path.write_bytes(b"# Rules\r\n\r\nbe brief\r\n")
    assert g.add_guidance("claude-code", CACHE, env).action == "added"
    data = path.read_bytes()
    assert data.startswith(b"# Rules\r\n\r\nbe brief\r\n\r\n" + g.BEGIN_MARK.encode())
    assert data.count(b"\n") == data.count(b"\r\n")
    assert g.guidance_block(CACHE).replace("\n", "\r\n").encode() in data
    assert g.add_guidance("claude-code", CACHE, env).action == "unchanged"


def test_remove_finds_the_block_in_the_second_candidate(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path)}
    folder = tmp_path / ".codex"
    folder.mkdir()
    (folder / "AGENTS.override.md").write_text("override, without our block\n")
    (folder / "AGENTS.md").write_text(f"mine\n\n{g.guidance_block(CACHE)}\n")
    change = g.remove_guidance("codex", env)
    assert change.action == "removed" and change.path == folder / "AGENTS.md"
    assert (folder / "AGENTS.md").read_text() == "mine\n"
    assert (folder / "AGENTS.override.md").read_text() == "override, without our block\n"
    assert g.remove_guidance("codex", env).action == "unchanged"
