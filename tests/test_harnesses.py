"""Registration of the MCP server with each harness, on real files in a temporary home."""

from __future__ import annotations

import json
import stat
import tomllib
from pathlib import Path

import pytest
from conftest import files_under as snapshot

from sharedmem.core import InstallError
from sharedmem.install import harnesses as h

CMD = ["/usr/bin/python3", "/home/u/.local/share/codex-shared-memory/shared_memory.py", "mcp",
       "--config", "/home/u/.local/share/codex-shared-memory/client.json"]
ODD = ["C:\\Program Files\\Python\\python.exe", 'say "hi"', "tab\there", "ünï cödé", "#[x]"]

TOML = """# my codex settings
model = "o3"  # trailing comment
profile = { name = "work", tags = ["a", "b"] }

[features]
web_search = true

[[hooks]]
name = "one"

[mcp_servers.other]
command = "npx"
args = ["-y", "other-server"]

[mcp_servers.other.env]
TOKEN_FILE = "/tmp/x"

[[hooks]]
name = "two"
"""

OURS_ELSEWHERE = """[mcp_servers.shared_memories]
command = "/old/python"
args = ["/old/shared_memory.py", "mcp"]
startup_timeout_sec = 10

[mcp_servers.shared_memories.env]
FOO = "bar"
"""


@pytest.fixture
def env(home: Path) -> dict[str, str]:
    return {"HOME": str(home)}


# --- Codex -------------------------------------------------------------------------------------

def codex_file(home: Path) -> Path:
    return home / ".codex" / "config.toml"


def test_codex_from_absent(home: Path, env: dict[str, str]) -> None:
    change = h.register("codex", CMD, env)
    path = codex_file(home)
    assert change.action == "added" and change.path == path and str(path) in change.message
    data = tomllib.loads(path.read_text())
    assert data == {"mcp_servers": {"shared_memories": {
        "command": CMD[0], "args": CMD[1:], "startup_timeout_sec": 30}}}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert not h.backup_path(path).exists()
    assert h.registered_command("codex", env) == CMD
    assert h.unregister("codex", env).action == "removed"
    assert not path.exists()


def test_codex_codex_home_and_escaping(tmp_path: Path, env: dict[str, str]) -> None:
    env = {**env, "CODEX_HOME": str(tmp_path / "ch")}
    h.register("codex", ODD, env)
    entry = tomllib.loads((tmp_path / "ch" / "config.toml").read_text())["mcp_servers"]
    assert entry["shared_memories"]["command"] == ODD[0]
    assert entry["shared_memories"]["args"] == ODD[1:]
    assert h.registered_command("codex", env) == ODD


def test_codex_merge_keeps_everything(home: Path, env: dict[str, str]) -> None:
    path = codex_file(home)
    path.parent.mkdir()
    path.write_text(TOML)
    path.chmod(0o640)
    change = h.register("codex", CMD, env)
    assert change.action == "added"
    text = path.read_text()
    assert text.startswith(TOML)  # every original byte kept, our table appended
    data = tomllib.loads(text)
    ours = data["mcp_servers"].pop("shared_memories")
    assert ours == {"command": CMD[0], "args": CMD[1:], "startup_timeout_sec": 30}
    assert data == tomllib.loads(TOML)
    assert h.backup_path(path).read_text() == TOML
    assert stat.S_IMODE(path.stat().st_mode) == 0o640

    before = snapshot(home)
    again = h.register("codex", CMD, env)
    assert again.action == "unchanged"
    assert snapshot(home) == before

    removed = h.unregister("codex", env)
    assert removed.action == "removed"
    assert path.read_text() == TOML  # byte-identical
    assert h.unregister("codex", env).action == "unchanged"


def test_codex_table_in_middle_is_updated_in_place(home: Path, env: dict[str, str]) -> None:
    head, tail = TOML.split("[mcp_servers.other]")
    original = head + OURS_ELSEWHERE + "\n[mcp_servers.other]" + tail
    path = codex_file(home)
    path.parent.mkdir()
    path.write_text(original)
    change = h.register("codex", CMD, env)
    assert change.action == "updated"
    assert "/old/python" in change.message
    assert path.read_text() == head + h.codex_table(CMD) + "\n[mcp_servers.other]" + tail
    data = tomllib.loads(path.read_text())
    assert data["mcp_servers"]["shared_memories"]["command"] == CMD[0]
    assert "env" not in data["mcp_servers"]["shared_memories"]
    assert h.backup_path(path).read_text() == original
    h.unregister("codex", env)
    assert tomllib.loads(path.read_text()) == tomllib.loads(TOML)


def test_codex_dry_run_writes_nothing(home: Path, env: dict[str, str]) -> None:
    path = codex_file(home)
    path.parent.mkdir()
    path.write_text(TOML)
    before = snapshot(home)
    change = h.register("codex", CMD, env, dry_run=True)
    assert change.action == "added" and "dry run" in change.message
    assert change.before == TOML and change.after.startswith(TOML)
    assert snapshot(home) == before
    h.register("codex", CMD, env)
    before = snapshot(home)
    assert h.unregister("codex", env, dry_run=True).after == TOML
    assert snapshot(home) == before


@pytest.mark.parametrize("bad", ["model = \n", "[mcp_servers\ncommand = 1\n"])
def test_codex_corrupt_refused(home: Path, env: dict[str, str], bad: str) -> None:
    path = codex_file(home)
    path.parent.mkdir()
    path.write_text(bad)
    with pytest.raises(InstallError, match="config.toml.*not valid TOML"):
        h.register("codex", CMD, env)
    assert path.read_text() == bad
    assert not h.backup_path(path).exists()


def test_codex_inline_definition_refused(home: Path, env: dict[str, str]) -> None:
    original = 'mcp_servers = { shared_memories = { command = "x" } }\n'
    path = codex_file(home)
    path.parent.mkdir()
    path.write_text(original)
    with pytest.raises(InstallError, match="by hand"):
        h.register("codex", CMD, env)
    assert path.read_text() == original
    assert h.registered_command("codex", env) == ["x"]


# --- JSON harnesses ----------------------------------------------------------------------------

JSON_CASES = {
    "claude-code": (".claude.json", ("mcpServers",),
                    {"type": "stdio", "command": CMD[0], "args": CMD[1:]}),
    "cursor": (".cursor/mcp.json", ("mcpServers",), {"command": CMD[0], "args": CMD[1:]}),
    "opencode": (".config/opencode/opencode.json", ("mcp",),
                 {"type": "local", "command": CMD, "enabled": True}),
}


def dig(data: dict, keys: tuple[str, ...]) -> dict:
    for key in keys:
        data = data[key]
    return data


def existing_json(keys: tuple[str, ...]) -> dict:
    servers = {"alpha": {"command": "a", "args": []}, "zeta": {"command": "z"}}
    data: dict = {"numStartups": 7, "theme": "dark"}
    data[keys[0]] = servers
    data["projects"] = {"/x": {"allowedTools": ["ünï"]}}
    return data


@pytest.mark.parametrize("harness", sorted(JSON_CASES))
def test_json_from_absent(home: Path, env: dict[str, str], harness: str) -> None:
    rel, keys, entry = JSON_CASES[harness]
    change = h.register(harness, CMD, env)
    path = home / rel
    assert change.action == "added" and change.path == path
    data = json.loads(path.read_text())
    assert dig(data, keys) == {"shared_memories": entry}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert h.registered_command(harness, env) == CMD
    assert h.unregister(harness, env).action == "removed"
    assert not path.exists()
    assert h.registered_command(harness, env) is None


@pytest.mark.parametrize("harness", sorted(JSON_CASES))
def test_json_merge_update_unregister(home: Path, env: dict[str, str], harness: str) -> None:
    rel, keys, entry = JSON_CASES[harness]
    path = home / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    original = existing_json(keys)
    original_text = json.dumps(original, indent=4, ensure_ascii=False)
    path.write_text(original_text)

    assert h.register(harness, CMD, env).action == "added"
    data = json.loads(path.read_text())
    assert list(data) == list(original)
    assert list(dig(data, keys)) == ["alpha", "zeta", "shared_memories"]
    assert dig(data, keys).pop("shared_memories") == entry
    assert data == original
    assert h.backup_path(path).read_text() == original_text

    before = snapshot(home)
    assert h.register(harness, CMD, env).action == "unchanged"
    assert snapshot(home) == before

    moved = [*CMD[:1], "/elsewhere/shared_memory.py", *CMD[2:]]
    change = h.register(harness, moved, env)
    assert change.action == "updated" and "/elsewhere" in change.message
    assert h.registered_command(harness, env) == moved
    assert h.backup_path(path).read_text() == original_text  # first backup kept

    assert h.unregister(harness, env).action == "removed"
    assert json.loads(path.read_text()) == original
    assert h.registered_command(harness, env) is None


@pytest.mark.parametrize("harness", sorted(JSON_CASES))
def test_json_unchanged_entry_means_no_write(home: Path, env: dict[str, str],
                                             harness: str) -> None:
    rel, keys, entry = JSON_CASES[harness]
    path = home / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    data = existing_json(keys)
    dig(data, keys)["shared_memories"] = entry
    text = json.dumps(data, indent=8)  # formatting we would not produce
    path.write_text(text)
    assert h.register(harness, CMD, env).action == "unchanged"
    assert path.read_text() == text
    assert not h.backup_path(path).exists()


@pytest.mark.parametrize("harness", sorted(JSON_CASES))
def test_json_dry_run_and_corrupt(home: Path, env: dict[str, str], harness: str) -> None:
    rel, _, _ = JSON_CASES[harness]
    change = h.register(harness, CMD, env, dry_run=True)
    assert change.action == "added" and change.before is None and "shared_memories" in change.after
    assert snapshot(home) == {}
    path = home / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('{"mcpServers": {,}')
    with pytest.raises(InstallError, match=f"{path.name} is not valid JSON"):
        h.register(harness, CMD, env)
    assert path.read_text() == '{"mcpServers": {,}'
    assert not h.backup_path(path).exists()


def test_claude_config_dir(tmp_path: Path, env: dict[str, str]) -> None:
    env = {**env, "CLAUDE_CONFIG_DIR": str(tmp_path / "cc")}
    assert h.register("claude-code", CMD, env).path == tmp_path / "cc" / ".claude.json"
    assert h.registered_command("claude-code", env) == CMD


def test_opencode_servers_shape_and_xdg(tmp_path: Path, env: dict[str, str]) -> None:
    env = {**env, "XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    path = tmp_path / "xdg" / "opencode" / "opencode.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"mcp": {"servers": {"x": {"type": "remote", "url": "u"}}}}))
    h.register("opencode", CMD, env)
    servers = json.loads(path.read_text())["mcp"]["servers"]
    assert servers["shared_memories"] == {"type": "local", "command": CMD, "enabled": True}
    assert list(json.loads(path.read_text())["mcp"]) == ["servers"]
    assert h.registered_command("opencode", env) == CMD


def test_opencode_jsonc(home: Path, env: dict[str, str]) -> None:
    """OpenCode reads JSONC: its comments and trailing commas stay, and our entry goes in."""
    path = home / ".config" / "opencode" / "opencode.jsonc"
    path.parent.mkdir(parents=True)
    commented = '{\n  // my servers\n  "mcp": {},\n}\n'
    path.write_text(commented)
    change = h.register("opencode", CMD, env)
    assert change.action == "added" and change.path == path
    assert path.read_text().startswith('{\n  // my servers\n  "mcp": {\n    "shared_memories": {')
    assert path.read_text().endswith("\n  },\n}\n")
    assert h.registered_command("opencode", env) == CMD
    assert not (path.parent / "opencode.json").exists()
    assert h.unregister("opencode", env).action == "removed"
    assert path.read_text() == commented
    assert h.registered_command("opencode", env) is None
    added_by_hand = commented.replace('"mcp": {}', '"mcp": {/* ours */ "shared_memories": {\n'
                                      '"type": "local", // "http://x"\n"command": '
                                      + json.dumps(CMD) + ",},}")
    path.write_text(added_by_hand)
    assert h.registered_command("opencode", env) == CMD  # read back despite the comments
    assert h.unregister("opencode", env).action == "removed"
    assert path.read_text() == '{\n  // my servers\n  "mcp": {/* ours */},\n}\n'


def test_detect(tmp_path: Path, home: Path, env: dict[str, str]) -> None:
    assert h.detect(env) == []
    (home / ".claude.json").write_text("{}")
    (home / ".cursor").mkdir()
    assert h.detect(env) == ["claude-code", "cursor"]
    (tmp_path / "ch").mkdir()
    (tmp_path / "xdg" / "opencode").mkdir(parents=True)
    env = {**env, "CODEX_HOME": str(tmp_path / "ch"), "XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    assert h.detect(env) == list(h.HARNESSES)


def test_unknown_harness_and_bad_command(env: dict[str, str]) -> None:
    with pytest.raises(InstallError, match="unknown harness"):
        h.register("vim", CMD, env)
    with pytest.raises(InstallError, match="non-empty list"):
        h.register("codex", [], env)
    with pytest.raises(InstallError, match="HOME"):
        h.detect({})


def test_codex_quoted_header_and_trick_string(home: Path, env: dict[str, str]) -> None:
    path = codex_file(home)
    path.parent.mkdir()
    path.write_text('a = 1\n\n[ mcp_servers . "shared_memories" ]  # ours\ncommand = "old"\n')
    assert h.register("codex", CMD, env).action == "updated"
    assert path.read_text() == "a = 1\n\n" + h.codex_table(CMD)
    # a header-like line inside a multi-line string must not be edited: refused, untouched
    tricky = 'note = """\n[mcp_servers.shared_memories]\n"""\n'
    path.write_text(tricky)
    with pytest.raises(InstallError, match="nothing was written"):
        h.register("codex", CMD, env)
    assert path.read_text() == tricky


# --- JSON files keep every byte but ours -----------------------------------------------------------

def one_insertion(before: str, after: str) -> str:
    """The text `after` adds to `before` at one place (fails if anything else changed)."""
    assert len(after) > len(before)
    head = 0
    while head < len(before) and before[head] == after[head]:
        head += 1
    inserted = after[head:head + len(after) - len(before)]
    assert after[:head] + after[head + len(inserted):] == before, "more than one place changed"
    return inserted


JSON_SHAPES = {
    "one-line arrays": '{\n  "numStartups": 7,\n  "tips": ["a", "b"],\n  "@": {\n    "alpha": '
                       '{"command": "a", "args": ["x", "y"]}\n  },\n  "projects": {"/s": '
                       '{"allowedTools": [], "n": [1, 2, 3]}}\n}\n',
    "tabs": '{\n\t"@": {\n\t\t"alpha": {\n\t\t\t"command": "a"\n\t\t}\n\t},\n\t"x": [1,2]\n}\n',
    "crlf": '{\r\n  "theme": "dark",\r\n  "@": {\r\n    "alpha": {}\r\n  }\r\n}\r\n',
    "no trailing newline": '{\n    "@": {\n        "a": {"command": "b"}\n    }\n}',
    "unicode escapes": '{\n  "n\\u00e4me": "caf\\u00e9",\n  "@": {\n    "\\u00fc": {}\n  }\n}\n',
    "raw unicode": '{\n  "name": "café ☕",\n  "@": {"ünï": {"command": "x"}}\n}\n',
    "compact": '{"a":1,"@":{"b":{"command":"x","args":[]}},"c":[1,2]}',
    "empty container": '{\n  "numStartups": 1,\n  "@": {},\n  "z": [null, 1]\n}\n',
    "no container": '{\n  "numStartups": 1,\n  "projects": {\n    "/x": {}\n  }\n}\n',
    "no container, one line": '{"numStartups": 1, "theme": "dark"}',
    "empty object": "{}\n",
    "nested": '{\n  "@": {\n    "a": {\n      "command": "x",\n      "env": {"K": {"d": [{}]}}\n'
              '    }\n  },\n  "projects": {"/x": {"mcpServers": {"q": 1}}}\n}\n',
    "byte order mark": '\ufeff{\n  "@": {\n    "a": {}\n  }\n}\n',
}


def shaped(harness: str, shape: str) -> str:
    return JSON_SHAPES[shape].replace('"@"', '"mcp"' if harness == "opencode" else '"mcpServers"')


@pytest.mark.parametrize("shape", sorted(JSON_SHAPES))
@pytest.mark.parametrize("harness", sorted(JSON_CASES))
def test_json_files_keep_every_byte_but_ours(home: Path, env: dict[str, str], harness: str,
                                            shape: str) -> None:
    rel, keys, entry = JSON_CASES[harness]
    path = home / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    original = shaped(harness, shape).encode("utf-8")
    path.write_bytes(original)
    assert h.register(harness, CMD, env).action == "added"
    ours = one_insertion(original.decode(), path.read_bytes().decode())
    assert h.backup_path(path).read_bytes() == original
    assert h.registered_command(harness, env) == CMD
    text = original.decode()
    if "\r\n" in text:
        assert "\n" not in ours.replace("\r\n", "")
    if "\t" in text:
        assert "\n  " not in ours and "\n\t\t" in ours
    if "\n" not in text.strip() and text.strip() != "{}":
        assert "\n" not in ours
    moved = [*CMD[:1], "/elsewhere/shared_memory.py", *CMD[2:]]
    assert h.register(harness, moved, env).action == "updated"
    assert h.registered_command(harness, env) == moved
    assert h.unregister(harness, env).action == "removed"
    assert path.read_bytes() == original  # every byte back, even the objects we added


def test_json_a_blank_file_gets_its_bytes_back(home: Path, env: dict[str, str]) -> None:
    path = home / ".cursor" / "mcp.json"
    path.parent.mkdir()
    path.write_bytes(b"\n")
    assert h.register("cursor", CMD, env).action == "added"
    assert json.loads(path.read_text()) == {"mcpServers": {"shared_memories": JSON_CASES[
        "cursor"][2]}}
    assert h.unregister("cursor", env).action == "removed"
    assert path.read_bytes() == b"\n"


def test_json_objects_the_user_had_stay_when_emptied(home: Path, env: dict[str, str]) -> None:
    path = home / ".claude.json"
    path.write_text('{"mcpServers": {}}')
    h.register("claude-code", CMD, env)
    path.write_text(path.read_text().replace('{"mcpServers"', '{"numStartups": 2, "mcpServers"'))
    assert h.unregister("claude-code", env).action == "removed"
    assert path.read_text() == '{"numStartups": 2, "mcpServers": {}}'


@pytest.mark.parametrize("harness", ["claude-code", "cursor"])
@pytest.mark.parametrize(("text", "why"), [
    ('{\n  // mine\n  "mcpServers": {}\n}\n', "(a comment at line 2, column 3: comments are "
     "not allowed in this file)"),
    ('{"mcpServers": {"a": 1,}}', "(Expecting property name enclosed in double quotes at line "
     "1, column 24)"),
    ('{"mcpServers": {} /* x */}', "(a comment at line 1, column 19: comments are not allowed"),
])
def test_json_comments_are_refused_where_the_harness_reads_plain_json(
        home: Path, env: dict[str, str], harness: str, text: str, why: str) -> None:
    path = home / JSON_CASES[harness][0]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    for call in (lambda: h.register(harness, CMD, env), lambda: h.unregister(harness, env),
                 lambda: h.registered_command(harness, env)):
        with pytest.raises(InstallError) as exc:
            call()
        assert f"{path} is not valid JSON {why}" in str(exc.value)
        assert "left untouched" in str(exc.value)
    assert path.read_text() == text and not h.backup_path(path).exists()


@pytest.mark.parametrize(("text", "why"), [
    ('{"mcp": {"a": 1} // x\n', "Expecting ',' delimiter at line 2, column 1"),
    ('{"mcp": {"a": 1}} /* x', "unterminated comment at line 1, column 19"),
    ('{"mcp": {"shared_memories": {}, "shared_memories": {}}}', "2 times"),
    ('{"mcp": {}} trailing', "unexpected character"),
])
def test_opencode_file_we_cannot_edit_is_refused_and_untouched(
        home: Path, env: dict[str, str], text: str, why: str) -> None:
    path = home / ".config" / "opencode" / "opencode.json"
    path.parent.mkdir(parents=True)
    path.write_text(text)
    with pytest.raises(InstallError, match=why) as exc:
        h.register("opencode", CMD, env)
    assert str(path) in str(exc.value)
    assert path.read_text() == text and not h.backup_path(path).exists()


# --- Claude Code's legacy .config.json -------------------------------------------------------------

@pytest.mark.parametrize("moved", [False, True])
def test_claude_registers_where_it_reads_a_legacy_config(home: Path, env: dict[str, str],
                                                         tmp_path: Path, moved: bool) -> None:
    """Claude Code 2.1.332 reads a non-empty `.claude/.config.json` instead of `~/.claude.json`
    (`claude mcp list` then shows only its servers): the entry goes where it reads."""
    if moved:
        env = {**env, "CLAUDE_CONFIG_DIR": str(tmp_path / "cfg")}
    folder = Path(env.get("CLAUDE_CONFIG_DIR") or home / ".claude")
    current = (folder if moved else home) / ".claude.json"
    legacy = folder / ".config.json"
    folder.mkdir(parents=True)
    current.write_text('{"numStartups": 3}\n')
    original = '{\n  "numStartups": 9,\n  "mcpServers": {}\n}\n'
    legacy.write_text(original)
    assert h.config_path("claude-code", env) == legacy
    change = h.register("claude-code", CMD, env)
    assert change.action == "added" and change.path == legacy
    assert current.read_text() == '{"numStartups": 3}\n'
    assert h.registered_command("claude-code", env) == CMD
    assert h.unregister("claude-code", env).action == "removed"
    assert legacy.read_text() == original


def test_an_empty_legacy_config_is_not_read(home: Path, env: dict[str, str]) -> None:
    (home / ".claude").mkdir()
    (home / ".claude" / ".config.json").write_text("")
    assert h.config_path("claude-code", env) == home / ".claude.json"
    assert h.register("claude-code", CMD, env).path == home / ".claude.json"
    assert (home / ".claude" / ".config.json").read_text() == ""


def test_uninstall_finds_the_entry_in_either_claude_file(home: Path, env: dict[str, str]) -> None:
    """Registered in ~/.claude.json; Claude Code then turned to a legacy file: both are cleaned."""
    h.register("claude-code", CMD, env)
    legacy = home / ".claude" / ".config.json"
    legacy.parent.mkdir()
    legacy.write_text(json.dumps({"numStartups": 4,
                                  "mcpServers": {"shared_memories": {"command": "x"}}}))
    change = h.unregister("claude-code", env)
    assert change.action == "removed" and change.path == legacy
    assert str(home / ".claude.json") in change.message
    assert not (home / ".claude.json").exists()
    assert json.loads(legacy.read_text()) == {"numStartups": 4, "mcpServers": {}}
