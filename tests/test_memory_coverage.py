"""Which harness memory the configured sources publish, on real harness layouts in a temporary
HOME: Codex version 1, 2 and dual write, Claude Code relocated and subagent memory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import SYSTEM

from sharedmem.client.config import SourceConfig
from sharedmem.install.memory_coverage import OK, WARN, coverage

CODEX = "codex"
CLAUDE = "claude-code"


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {"HOME": str(tmp_path), **SYSTEM}


def codex_source(home: Path) -> SourceConfig:
    return SourceConfig(CODEX, CODEX, home / ".codex" / "memories")


def claude_source(home: Path) -> SourceConfig:
    return SourceConfig(CLAUDE, CLAUDE, home / ".claude" / "projects")


def one(sources: list[SourceConfig], env: dict[str, str], harness: str):
    [found] = coverage(sources, env, "laptop", [harness])
    return found


def test_codex_version_2_is_published_by_the_codex_source(tmp_path: Path, env) -> None:
    (tmp_path / ".codex" / "memories_v2").mkdir(parents=True)
    found = one([codex_source(tmp_path)], env, CODEX)
    assert found.status == OK
    assert str(tmp_path / ".codex" / "memories_v2") in found.message
    assert "machines/laptop/codex/memories_v2/" in found.message
    assert "version v2" in found.message and found.fix == ""


def test_codex_dual_write_names_both_folders(tmp_path: Path, env) -> None:
    (tmp_path / ".codex" / "memories").mkdir(parents=True)
    (tmp_path / ".codex" / "config.toml").write_text("[memories]\ndual_write = true\n")
    found = one([codex_source(tmp_path)], env, CODEX)
    assert found.status == OK and found.folders == [tmp_path / ".codex" / "memories",
                                                    tmp_path / ".codex" / "memories_v2"]
    assert "machines/laptop/codex/, machines/laptop/codex/memories_v2/" in found.message


def test_codex_memory_without_a_codex_source_is_a_warning_with_the_fix(tmp_path: Path,
                                                                       env) -> None:
    (tmp_path / ".codex" / "memories_v2").mkdir(parents=True)
    found = one([claude_source(tmp_path)], env, CODEX)
    assert found.status == WARN and "no codex source publishes it" in found.message
    assert "--source codex" in found.fix


def test_codex_without_memory_yet_is_fine(tmp_path: Path, env) -> None:
    (tmp_path / ".codex").mkdir()
    found = one([], env, CODEX)
    assert found.status == OK and "no memory there yet" in found.message


def test_a_markdown_source_on_codex_memory_is_a_warning(tmp_path: Path, env) -> None:
    v2 = tmp_path / ".codex" / "memories_v2"
    v2.mkdir(parents=True)
    found = one([SourceConfig("v2", "markdown", v2)], env, CODEX)
    assert found.status == WARN and "raw memories" in found.message
    assert "remove markdown source v2" in found.fix


def test_codex_configuration_problem_is_a_warning(tmp_path: Path, env) -> None:
    (tmp_path / ".codex" / "memories").mkdir(parents=True)
    (tmp_path / ".codex" / "config.toml").write_text('[memories]\nversion = "v9"\n')
    found = one([codex_source(tmp_path)], env, CODEX)
    assert found.status == WARN and "is not one of v1, v2" in found.message


def claude_settings(home: Path, auto_memory_directory: str) -> Path:
    settings = home / ".claude" / "settings.json"
    settings.parent.mkdir()
    settings.write_text(json.dumps({"autoMemoryDirectory": auto_memory_directory}))
    return settings


def test_claude_relocated_memory_is_named_with_its_setting(tmp_path: Path, env) -> None:
    settings = claude_settings(tmp_path, "~/mem")
    (tmp_path / "mem").mkdir()
    found = one([claude_source(tmp_path)], env, CLAUDE)
    assert found.status == OK
    assert f"{tmp_path / 'mem'} (autoMemoryDirectory in {settings})" in found.message
    assert "machines/laptop/claude-code/auto-memory/" in found.message
    assert "machines/laptop/claude-code/agent-memory/" in found.message
    missed = one([codex_source(tmp_path)], env, CLAUDE)
    assert missed.status == WARN and "--source claude-code" in missed.fix


def test_claude_ignored_setting_is_a_warning(tmp_path: Path, env) -> None:
    claude_settings(tmp_path, "relative/mem")
    found = one([claude_source(tmp_path)], env, CLAUDE)
    assert found.status == WARN and "Claude Code ignores it" in found.message


def test_harnesses_without_memory_files(env) -> None:
    found = coverage([], env, "laptop", ["opencode", "cursor"])
    assert [(f.harness, f.status) for f in found] == [("opencode", OK), ("cursor", OK)]
    assert all("nothing to publish" in f.message for f in found)
