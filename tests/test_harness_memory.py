"""Where Codex and Claude Code write memory, from their real settings files in a temporary HOME.

The rules were checked against the released harnesses (Codex CLI 0.171.0, Claude Code
2.1.332): scripts/interop_check.py shows them with the real programs.
"""

from __future__ import annotations

import json
from pathlib import Path, PureWindowsPath

import pytest
from conftest import SYSTEM

from sharedmem.sources import harness_memory as hm


def codex_home(tmp_path: Path, config: str | None = None, *folders: str) -> Path:
    home = tmp_path / ".codex"
    home.mkdir()
    if config is not None:
        (home / "config.toml").write_text(config)
    for folder in folders:
        (home / folder).mkdir()
    return home


def env_of(tmp_path: Path, system: Path | None = None) -> dict[str, str]:
    return {"HOME": str(tmp_path), hm.SYSTEM_ROOT_ENV: str(system or tmp_path / "system")}


@pytest.mark.parametrize(("config", "folders", "version", "roots"), [
    (None, (), "v2", ["memories_v2"]),  # a new user: version 2
    (None, ("memories",), "v1", ["memories"]),  # Codex keeps an existing user on version 1
    (None, ("memories", "memories_v2"), "v1", ["memories"]),
    ('[memories]\nversion = "v2"\n', ("memories",), "v2", ["memories_v2"]),
    ('[memories]\nversion = "v1"\n', (), "v1", ["memories"]),
    ('[memories]\ndual_write = true\n', ("memories",), "v1", ["memories", "memories_v2"]),
    ('memories.version = "v1"\nmemories.dual_write = true\n', (), "v1",
     ["memories", "memories_v2"]),
    ('[memories]\nversion = "v2"\ndual_write = true\n', ("memories",), "v2", ["memories_v2"]),
    ('[memories]\ndual_write = false\n', (), "v2", ["memories_v2"]),
    ('[mcp_servers.shared_memories]\ncommand = "x"\n', ("memories",), "v1", ["memories"]),
])
def test_codex_roots_follow_its_configuration(tmp_path: Path, config: str | None,
                                              folders: tuple[str, ...], version: str,
                                              roots: list[str]) -> None:
    home = codex_home(tmp_path, config, *folders)
    found = hm.codex_memory(home, env_of(tmp_path))
    assert found.version == version
    assert [name for name, _ in found.roots] == roots
    assert [path for _, path in found.roots] == [home / r for r in roots]
    assert found.problems == ()
    assert ("memories.version = " in found.why) == (config is not None and "version" in config)


def test_codex_layers_system_user_then_managed(tmp_path: Path) -> None:
    system = tmp_path / "system"
    etc = system / "etc" / "codex"
    etc.mkdir(parents=True)
    home = codex_home(tmp_path, '[memories]\nversion = "v1"\n', "memories")
    env = env_of(tmp_path, system)
    (etc / "config.toml").write_text('[memories]\nversion = "v2"\ndual_write = true\n')
    found = hm.codex_memory(home, env)  # the user's file wins over the system one...
    assert (found.version, found.dual_write) == ("v1", True)
    assert [n for n, _ in found.roots] == ["memories", "memories_v2"]
    (etc / "managed_config.toml").write_text('[memories]\nversion = "v2"\n')
    found = hm.codex_memory(home, env)  # ...and the managed one over both
    assert found.version == "v2" and str(etc / "managed_config.toml") in found.why


@pytest.mark.parametrize(("config", "problem"), [
    ('[memories]\nversion = "v3"\n', "is not one of v1, v2"),
    ('[memories\nversion = "v2"\n', "is not valid TOML"),
    ('[memories]\ndual_write = "yes"\n', "is not true or false"),
])
def test_codex_configuration_problems_are_named(tmp_path: Path, config: str, problem: str) -> None:
    home = codex_home(tmp_path, config, "memories")
    found = hm.codex_memory(home, env_of(tmp_path))
    assert found.version == "v1"  # as if unset
    assert len(found.problems) == 1 and problem in found.problems[0]
    assert str(home / "config.toml") in found.problems[0]


def test_codex_home_of_a_codex_source() -> None:
    assert hm.codex_home_of(Path("/h/.codex/memories")) == Path("/h/.codex")
    assert hm.codex_home_of(Path("/h/notes")) is None


# --- Claude Code ---------------------------------------------------------------------------------

def claude_dir(tmp_path: Path, settings: object | None = None) -> Path:
    folder = tmp_path / ".claude"
    folder.mkdir()
    if settings is not None:
        (folder / "settings.json").write_text(json.dumps(settings))
    return folder


def managed(system: Path, settings: object, name: str = "managed-settings.json",
            dropin: bool = False) -> Path:
    folder = system / "etc" / "claude-code"
    if dropin:
        folder = folder / "managed-settings.d"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(json.dumps(settings))
    return path


def test_claude_default_places(tmp_path: Path) -> None:
    config = claude_dir(tmp_path)
    found = hm.claude_memory(config, env_of(tmp_path))
    assert found.projects == config / "projects" and found.agents == config / "agent-memory"
    assert found.relocated is None and found.relocated_by is None and found.problems == ()


@pytest.mark.parametrize(("value", "expected"), [
    ("~/notes/claude-mem", "notes/claude-mem"),
    ("~/notes/claude-mem/", "notes/claude-mem"),
    ("ABS/mem", "mem"),
    ("relative/dir", None),  # Claude Code ignores these and writes the default place
    ("~/../escape", None),
    ("~/", None),
    ("", None),
    (42, None),
    ("/", None),
])
def test_claude_auto_memory_directory_as_claude_code_reads_it(tmp_path: Path, value: object,
                                                              expected: str | None) -> None:
    if isinstance(value, str) and value.startswith("ABS"):
        value = str(tmp_path) + value[3:]
    config = claude_dir(tmp_path, {"autoMemoryDirectory": value, "theme": "dark"})
    found = hm.claude_memory(config, env_of(tmp_path))
    assert found.relocated == (tmp_path / expected if expected else None)
    assert found.relocated_by == config / "settings.json"


def test_claude_config_dir_and_managed_settings_win(tmp_path: Path) -> None:
    system = tmp_path / "system"
    config = claude_dir(tmp_path, {"autoMemoryDirectory": "~/user-mem"})
    env = env_of(tmp_path, system)
    assert hm.claude_memory(config, env).relocated == tmp_path / "user-mem"
    main = managed(system, {"autoMemoryDirectory": str(tmp_path / "policy-mem")})
    found = hm.claude_memory(config, env)
    assert (found.relocated, found.relocated_by) == (tmp_path / "policy-mem", main)
    later = managed(system, {"autoMemoryDirectory": str(tmp_path / "dropin-mem")}, "50-mem.json",
                    dropin=True)
    managed(system, {"autoMemoryDirectory": str(tmp_path / "hidden")}, ".99.json", dropin=True)
    managed(system, {"autoMemoryDirectory": str(tmp_path / "not-json")}, "99.txt", dropin=True)
    found = hm.claude_memory(config, env)
    assert (found.relocated, found.relocated_by) == (tmp_path / "dropin-mem", later)
    main.write_text(json.dumps({"autoMemoryDirectory": "not absolute"}))
    later.unlink()  # the managed value decides even when Claude Code ignores it: the default
    found = hm.claude_memory(config, env)
    assert (found.relocated, found.relocated_by) == (None, main)


def test_claude_unreadable_settings_are_named_and_skipped(tmp_path: Path) -> None:
    config = claude_dir(tmp_path)
    (config / "settings.json").write_text("{not json")
    found = hm.claude_memory(config, env_of(tmp_path))
    assert found.relocated is None
    assert len(found.problems) == 1 and "is not valid JSON" in found.problems[0]


@pytest.mark.parametrize(("platform", "parts"), [
    ("linux", ("etc", "claude-code")),
    ("darwin", ("Library", "Application Support", "ClaudeCode")),
    ("win32", ("Program Files", "ClaudeCode")),
])
def test_managed_settings_file_per_platform(platform: str, parts: tuple[str, ...]) -> None:
    assert hm.claude_managed_file(SYSTEM, platform) == Path(
        SYSTEM[hm.SYSTEM_ROOT_ENV], *parts, "managed-settings.json")


def test_system_files_without_the_override() -> None:
    assert hm.claude_managed_file({}, "linux") == Path("/etc/claude-code/managed-settings.json")
    assert hm.claude_managed_file({}, "darwin") == Path(
        "/Library/Application Support/ClaudeCode/managed-settings.json")
    assert str(hm.claude_managed_file({}, "win32")) == str(PureWindowsPath(
        "C:\\Program Files\\ClaudeCode\\managed-settings.json"))
    assert hm.system_path({}, "etc", "codex", "config.toml") == Path("/etc/codex/config.toml")
