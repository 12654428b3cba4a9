"""Agent guidance on real files in a temporary home: where each harness reads the block, adding,
updating, skipping and removing it byte for byte, one copy only, and OpenCode's `instructions`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import files_under as snapshot

from sharedmem.core import InstallError
from sharedmem.install import guidance as g
from sharedmem.install import harnesses as h

CACHE = Path("/home/u/.local/share/codex-shared-memory/cache")
CMD = ["/usr/bin/python3", "/x/shared_memory.py", "mcp", "--config", "/x/client.json"]


@pytest.fixture
def env(home: Path) -> dict[str, str]:
    return {"HOME": str(home)}


def first(changes: list[h.Change]) -> h.Change:
    """The change to the file the harness reads the block from."""
    return changes[0]


def test_extract_block() -> None:
    block = f"{g.BEGIN_MARK}\nbody\n{g.END_MARK}"
    assert g.extract_block(f"before\n{block}\nafter\n") == block
    assert g.extract_block("no markers here") is None
    assert g.extract_block(f"{g.BEGIN_MARK}\nhalf a block\n") is None
    assert g.extract_block(f"{g.END_MARK}\nbackwards\n{g.BEGIN_MARK}\n") is None


def test_guidance_block_comes_from_doc() -> None:
    block = g.guidance_block(CACHE)
    assert block.startswith(g.BEGIN_MARK) and block.endswith(g.END_MARK)
    for needed in ("shared_memories", "add_ad_hoc_note", "memory_summary.md", "MEMORY.md",
                   "untrusted", "machine, source, sync time", str(CACHE),
                   "extensions/ad_hoc/notes/", "Codex's own memory"):
        assert needed in block
    assert "<cache>" not in block
    doc = g.GUIDANCE_DOC.read_text()
    assert g.extract_block(doc).replace("<cache>", str(CACHE)) == block
    assert doc.count(g.BEGIN_MARK) == 1


def test_guidance_paths_follow_the_environment(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {"HOME": str(home)}
    assert g.guidance_paths("codex", env) == [home / ".codex" / "AGENTS.override.md",
                                              home / ".codex" / "AGENTS.md"]
    assert g.guidance_paths("claude-code", env) == [home / ".claude" / "CLAUDE.md"]
    assert g.guidance_paths("opencode", env) == [home / ".config" / "opencode" / h.OPENCODE_GUIDANCE,
                                                 home / ".config" / "opencode" / "AGENTS.md"]
    assert g.guidance_paths("cursor", env) == []
    moved = {**env, "CODEX_HOME": str(tmp_path / "ch"), "CLAUDE_CONFIG_DIR": str(tmp_path / "cc"),
             "XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    assert g.guidance_paths("codex", moved)[-1] == tmp_path / "ch" / "AGENTS.md"
    assert g.guidance_paths("claude-code", moved) == [tmp_path / "cc" / "CLAUDE.md"]
    assert g.read_by("opencode", moved) == tmp_path / "xdg" / "opencode" / h.OPENCODE_GUIDANCE
    with pytest.raises(InstallError, match="unknown harness 'vim'"):
        g.guidance_paths("vim", env)


GUIDE_FILES = {"codex": ".codex/AGENTS.md", "claude-code": ".claude/CLAUDE.md",
               "opencode": f".config/opencode/{h.OPENCODE_GUIDANCE}"}


@pytest.mark.parametrize("harness", sorted(GUIDE_FILES))
def test_guidance_absent_file(home: Path, env: dict[str, str], harness: str) -> None:
    path = home / GUIDE_FILES[harness]
    change = first(g.add_guidance(harness, CACHE, env))
    assert change.action == "added" and change.path == path
    assert path.read_text() == g.guidance_block(CACHE) + "\n"
    assert all(c.action == "unchanged" for c in g.add_guidance(harness, CACHE, env))
    assert first(g.remove_guidance(harness, env)).action == "removed"
    assert snapshot(home) == {}  # every file we made is gone again


@pytest.mark.parametrize("harness", ["codex", "claude-code"])
@pytest.mark.parametrize("original", ["# Mine\n\n- be terse\n", "no newline at end"])
def test_guidance_merge(home: Path, env: dict[str, str], harness: str, original: str) -> None:
    path = home / GUIDE_FILES[harness]
    path.parent.mkdir(parents=True)
    path.write_text(original)
    assert first(g.add_guidance(harness, CACHE, env, dry_run=True)).action == "added"
    assert path.read_text() == original
    assert first(g.add_guidance(harness, CACHE, env)).action == "added"
    text = path.read_text()
    assert text.startswith(original) and g.guidance_block(CACHE) in text
    assert h.backup_path(path).read_text() == original

    before = snapshot(home)
    assert first(g.add_guidance(harness, CACHE, env)).action == "unchanged"
    assert snapshot(home) == before

    path.write_text(text + "\nlater text\n")
    change = first(g.add_guidance(harness, Path("/other/cache"), env))
    assert change.action == "updated"
    assert path.read_text() == text.replace(str(CACHE), "/other/cache") + "\nlater text\n"

    assert first(g.remove_guidance(harness, env)).action == "removed"
    # the block is no longer last: exactly it and its line end go
    assert path.read_text() == text[:text.index(g.BEGIN_MARK)] + "\nlater text\n"
    assert g.BEGIN_MARK not in path.read_text()


def test_guidance_removed_byte_identical(home: Path, env: dict[str, str]) -> None:
    path = home / ".codex" / "AGENTS.md"
    path.parent.mkdir()
    for original in ("# Rules\r\n\r\nkeep CRLF\r\n", "a\n\n\n", "a\n"):
        path.write_text(original, newline="")
        g.add_guidance("codex", CACHE, env)
        assert first(g.remove_guidance("codex", env)).action == "removed"
        assert path.read_bytes() == original.encode()


def test_a_crlf_file_gets_a_crlf_block(home: Path, env: dict[str, str]) -> None:
    path = home / ".claude" / "CLAUDE.md"
    path.parent.mkdir()
    path.write_bytes(b"# Rules\r\n\r\nbe brief\r\n")
    assert first(g.add_guidance("claude-code", CACHE, env)).action == "added"
    data = path.read_bytes()
    assert data.startswith(b"# Rules\r\n\r\nbe brief\r\n\r\n" + g.BEGIN_MARK.encode())
    assert data.count(b"\n") == data.count(b"\r\n")
    assert g.guidance_block(CACHE).replace("\n", "\r\n").encode() in data
    assert first(g.add_guidance("claude-code", CACHE, env)).action == "unchanged"


def test_guidance_override_file(home: Path, env: dict[str, str]) -> None:
    folder = home / ".codex"
    folder.mkdir()
    (folder / "AGENTS.md").write_text("base\n")
    (folder / "AGENTS.override.md").write_text("override\n")
    change = first(g.add_guidance("codex", CACHE, env))
    assert change.path == folder / "AGENTS.override.md"
    assert g.BEGIN_MARK in (folder / "AGENTS.override.md").read_text()
    assert (folder / "AGENTS.md").read_text() == "base\n"
    g.remove_guidance("codex", env)
    assert (folder / "AGENTS.override.md").read_text() == "override\n"


def test_remove_finds_the_block_in_the_second_candidate(home: Path, env: dict[str, str]) -> None:
    folder = home / ".codex"
    folder.mkdir()
    (folder / "AGENTS.override.md").write_text("override, without our block\n")
    (folder / "AGENTS.md").write_text(f"mine\n\n{g.guidance_block(CACHE)}\n")
    [change] = g.remove_guidance("codex", env)
    assert change.action == "removed" and change.path == folder / "AGENTS.md"
    assert (folder / "AGENTS.md").read_text() == "mine\n"
    assert (folder / "AGENTS.override.md").read_text() == "override, without our block\n"
    assert first(g.remove_guidance("codex", env)).action == "unchanged"


def test_a_second_copy_is_removed_and_a_reinstall_leaves_one(home: Path,
                                                             env: dict[str, str]) -> None:
    """Claude Code can copy a Codex block into CLAUDE.md: two copies in one file."""
    path = home / ".claude" / "CLAUDE.md"
    path.parent.mkdir()
    original = "# Rules\n\nbe brief\n"
    path.write_text(original)
    g.add_guidance("claude-code", CACHE, env)
    installed = path.read_text()
    block = g.guidance_block(Path("/old/cache"))
    path.write_text(installed + "\n## Imported from AGENTS.md\n\n" + block + "\n")
    [change] = g.add_guidance("claude-code", CACHE, env)
    assert change.action == "updated" and "1 more copy" in change.message
    assert path.read_text().count(g.BEGIN_MARK) == 1
    assert path.read_text() == installed + "\n## Imported from AGENTS.md\n"
    path.write_text(installed + "\n## Imported from AGENTS.md\n\n" + block + "\n")
    [change] = g.remove_guidance("claude-code", env)
    assert change.action == "removed" and "2 copies" in change.message
    # each copy and its line end go; the blank line before ours stays, as text follows it
    assert path.read_text() == original + "\n\n## Imported from AGENTS.md\n"


def test_a_copy_in_the_file_codex_does_not_read_goes_on_install(home: Path,
                                                                env: dict[str, str]) -> None:
    folder = home / ".codex"
    folder.mkdir()
    (folder / "AGENTS.md").write_text(f"base\n\n{g.guidance_block(CACHE)}\n")
    (folder / "AGENTS.override.md").write_text("override\n")
    changes = g.add_guidance("codex", CACHE, env)
    assert [(c.path.name, c.action) for c in changes] == [("AGENTS.override.md", "added"),
                                                          ("AGENTS.md", "removed")]
    assert (folder / "AGENTS.md").read_text() == "base\n"
    assert (folder / "AGENTS.override.md").read_text().count(g.BEGIN_MARK) == 1


@pytest.mark.parametrize("policy", ["Use the shared_memories tools first.\n",
                                    "## Shared Memory\nnever consult it\n"])
def test_guidance_skipped_when_policy_exists(home: Path, env: dict[str, str],
                                             policy: str) -> None:
    path = home / ".claude" / "CLAUDE.md"
    path.parent.mkdir()
    path.write_text(policy)
    change = first(g.add_guidance("claude-code", CACHE, env))
    assert change.action == "skipped" and str(path) in change.message
    assert path.read_text() == policy
    assert first(g.remove_guidance("claude-code", env)).action == "unchanged"
    assert path.read_text() == policy


def test_guidance_damaged_block_refused(home: Path, env: dict[str, str]) -> None:
    path = home / ".codex" / "AGENTS.md"
    path.parent.mkdir()
    path.write_text(f"x\n{g.BEGIN_MARK}\nhalf\n")
    with pytest.raises(InstallError, match="AGENTS.md"):
        g.add_guidance("codex", CACHE, env)


def test_guidance_cursor_is_manual(home: Path, env: dict[str, str]) -> None:
    [change] = g.add_guidance("cursor", CACHE, env)
    assert change.action == "manual" and change.after == g.guidance_block(CACHE)
    assert "User Rules" in change.message
    assert first(g.remove_guidance("cursor", env)).action == "manual"
    assert snapshot(home) == {}


# --- OpenCode: its own file, listed in `instructions` ----------------------------------------------

def opencode(home: Path) -> Path:
    return home / ".config" / "opencode"


def test_opencode_keeps_reading_the_users_claude_instructions(home: Path,
                                                              env: dict[str, str]) -> None:
    """OpenCode reads only the first of its AGENTS.md and ~/.claude/CLAUDE.md: neither is
    created; the block is a file of ours that opencode.json lists."""
    claude = home / ".claude" / "CLAUDE.md"
    claude.parent.mkdir()
    claude.write_text("# my Claude rules\n")
    changes = g.add_guidance("opencode", CACHE, env)
    ours, config = opencode(home) / h.OPENCODE_GUIDANCE, opencode(home) / "opencode.json"
    assert [(c.path, c.action) for c in changes] == [(ours, "added"), (config, "added")]
    assert not (opencode(home) / "AGENTS.md").exists()
    assert claude.read_text() == "# my Claude rules\n"
    assert json.loads(config.read_text())["instructions"] == [str(ours)]
    assert g.opencode_lists(env)
    assert all(c.action == "unchanged" for c in g.add_guidance("opencode", CACHE, env))
    assert [c.action for c in g.remove_guidance("opencode", env)] == ["removed", "removed"]
    assert snapshot(home) == {".claude/CLAUDE.md": b"# my Claude rules\n"}


OPENCODE_FILES = {
    "jsonc with comments": '{\n  // mine\n  "$schema": "https://opencode.ai/config.json",\n'
                           '  "autoupdate": false,\n}\n',
    "a list of mine": '{\n  "instructions": [\n    "~/rules.md",\n    "CONTRIBUTING.md"\n  ]\n}\n',
    "an empty list": '{"instructions": []}',
    "one-line list": '{\n  "instructions": ["a.md"], "theme": "x"\n}',
}


@pytest.mark.parametrize("shape", sorted(OPENCODE_FILES))
def test_opencode_instructions_get_their_bytes_back(home: Path, env: dict[str, str],
                                                    shape: str) -> None:
    config = opencode(home) / "opencode.json"
    config.parent.mkdir(parents=True)
    original = OPENCODE_FILES[shape]
    config.write_text(original)
    assert h.register("opencode", CMD, env).action == "added"  # as the installer does
    g.add_guidance("opencode", CACHE, env)
    listed = json.loads(g.json_edit.Document(config, config.read_text(), jsonc=True).text
                        .replace("// mine\n", "").replace(",\n}", "\n}"))["instructions"]
    assert listed[-1] == str(opencode(home) / h.OPENCODE_GUIDANCE)
    assert h.unregister("opencode", env).action == "removed"
    g.remove_guidance("opencode", env)
    assert config.read_text() == original
    assert not (opencode(home) / h.OPENCODE_GUIDANCE).exists()


def test_opencode_file_made_by_the_install_goes_on_uninstall(home: Path,
                                                             env: dict[str, str]) -> None:
    """Register and guidance both write opencode.json; neither keeps a backup of our own file."""
    h.register("opencode", CMD, env)
    g.add_guidance("opencode", CACHE, env)
    config = opencode(home) / "opencode.json"
    assert not h.backup_path(config).exists()
    h.register("opencode", [*CMD[:1], "/moved/shared_memory.py", *CMD[2:]], env)
    assert not h.backup_path(config).exists()
    h.unregister("opencode", env)
    g.remove_guidance("opencode", env)
    assert snapshot(home) == {}


def test_opencode_block_an_older_install_put_in_agents_md_moves(home: Path,
                                                                env: dict[str, str]) -> None:
    agents = opencode(home) / "AGENTS.md"
    agents.parent.mkdir(parents=True)
    agents.write_text(g.guidance_block(CACHE) + "\n")  # all an older install wrote there
    changes = g.add_guidance("opencode", CACHE, env)
    assert [(c.path.name, c.action) for c in changes] == [
        (h.OPENCODE_GUIDANCE, "added"), ("opencode.json", "added"), ("AGENTS.md", "removed")]
    assert not agents.exists()


def test_opencode_instructions_that_are_not_a_list_are_refused(home: Path,
                                                               env: dict[str, str]) -> None:
    config = opencode(home) / "opencode.json"
    config.parent.mkdir(parents=True)
    config.write_text('{"instructions": "rules.md"}')
    with pytest.raises(InstallError, match="instructions is not a list"):
        g.add_guidance("opencode", CACHE, env)
    assert config.read_text() == '{"instructions": "rules.md"}'
