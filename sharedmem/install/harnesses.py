"""Register the `shared_memories` MCP server with each coding-agent harness (guidance: see `guidance`).

Every edit is a merge: only our entry (or our guidance block) changes; every other byte of a
TOML file (edited by `codex_toml`), and every other key (in its order) of a JSON file, stays as
it was. Before the first change to an existing file, a copy of it is kept beside it as
`<file>.bak-shared-memory`; that copy is never overwritten, so it always holds the file as it
was before this project first touched it. Re-running with the same inputs writes nothing, and
`dry_run` only reports.
"""

from __future__ import annotations

import json
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from sharedmem.core import InstallError
from sharedmem.files import atomic_write
from sharedmem.install import codex_toml

HARNESSES = ("codex", "claude-code", "opencode", "cursor")
SERVER_NAME = "shared_memories"
BACKUP_SUFFIX = ".bak-shared-memory"
CODEX_STARTUP_TIMEOUT_SEC = codex_toml.STARTUP_TIMEOUT_SEC
OPENCODE_SCHEMA = "https://opencode.ai/config.json"
CONFIG_MODE = 0o600
_WRITES = ("added", "updated", "removed")


@dataclass
class Change:
    """One file's outcome; `before`/`after` are the texts, for dry-run diffs (None: no file)."""

    harness: str
    path: Path
    action: str  # "added" | "updated" | "unchanged" | "removed" | "skipped" | "manual"
    message: str
    before: str | None = None
    after: str | None = None


# --- where each harness keeps its files ------------------------------------------------------

def home_dir(env: Mapping[str, str]) -> Path:
    """The account's home folder, from env's HOME (never the process's own)."""
    home = env.get("HOME")
    if not home:
        raise InstallError("HOME is not set: set it to the account's home folder and re-run")
    return Path(home)


def codex_home(env: Mapping[str, str]) -> Path:
    """Codex's folder: $CODEX_HOME, else ~/.codex."""
    return Path(env["CODEX_HOME"]) if env.get("CODEX_HOME") else home_dir(env) / ".codex"


def claude_dir(env: Mapping[str, str]) -> Path:
    """Claude Code's folder: $CLAUDE_CONFIG_DIR, else ~/.claude."""
    if env.get("CLAUDE_CONFIG_DIR"):
        return Path(env["CLAUDE_CONFIG_DIR"])
    return home_dir(env) / ".claude"


def opencode_dir(env: Mapping[str, str]) -> Path:
    """OpenCode's global config folder, under $XDG_CONFIG_HOME or ~/.config."""
    return Path(env.get("XDG_CONFIG_HOME") or home_dir(env) / ".config") / "opencode"


def check_harness(harness: str) -> None:
    """Refuse a harness name this module does not know."""
    if harness not in HARNESSES:
        raise InstallError(f"unknown harness {harness!r}: use one of {', '.join(HARNESSES)}")


def config_path(harness: str, env: Mapping[str, str]) -> Path:
    """The file in which `harness` lists its MCP servers (it may not exist yet)."""
    check_harness(harness)
    if harness == "codex":
        return codex_home(env) / "config.toml"
    if harness == "claude-code":
        if env.get("CLAUDE_CONFIG_DIR"):
            return Path(env["CLAUDE_CONFIG_DIR"]) / ".claude.json"
        return home_dir(env) / ".claude.json"
    if harness == "opencode":
        folder = opencode_dir(env)
        if not (folder / "opencode.json").exists() and (folder / "opencode.jsonc").exists():
            return folder / "opencode.jsonc"
        return folder / "opencode.json"
    return home_dir(env) / ".cursor" / "mcp.json"


def detect(env: Mapping[str, str]) -> list[str]:
    """The harnesses that look installed for this account, by their config folders."""
    home = home_dir(env)
    claude_extra = [Path(env["CLAUDE_CONFIG_DIR"])] if env.get("CLAUDE_CONFIG_DIR") else []
    signs = {
        "codex": [codex_home(env), home / ".codex"],
        "claude-code": [home / ".claude", home / ".claude.json", *claude_extra],
        "opencode": [opencode_dir(env)],
        "cursor": [home / ".cursor"],
    }
    return [name for name in HARNESSES if any(p.exists() for p in signs[name])]


def backup_path(path: Path) -> Path:
    """Where the copy of `path` taken before our first change to it lives."""
    return path.with_name(path.name + BACKUP_SUFFIX)


# --- reading and writing ------------------------------------------------------------------------

def read_text(path: Path) -> str | None:
    """A file's UTF-8 text, or None when it does not exist."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise InstallError(f"cannot read {path}: {exc}; check its permissions") from exc
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InstallError(f"{path} is not valid UTF-8: fix it or move it aside, then re-run") from exc


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def finish(change: Change, *, dry_run: bool, new_mode: int) -> Change:
    """Carry out `change` (backup first, then an atomic write or a removal) unless dry-run."""
    if change.action not in _WRITES:
        return change
    if dry_run:
        change.message = "dry run, nothing written: " + change.message
        return change
    path = change.path
    try:
        if change.after is None:
            path.unlink()
            return change
        if change.before is not None and not backup_path(path).exists():
            atomic_write(backup_path(path), path.read_bytes(), mode=_mode(path))
        mode = _mode(path) if path.exists() else new_mode
        atomic_write(path, change.after.encode("utf-8"), mode=mode)
    except OSError as exc:
        raise InstallError(f"cannot write {path}: {exc}; check the folder's permissions") from exc
    return change


def _check_command(command: list[str]) -> None:
    if not command or not all(isinstance(part, str) and part for part in command):
        raise InstallError(f"MCP server command {command!r} must be a non-empty list of strings")


def codex_table(command: list[str], newline: str = "\n") -> str:
    """The `[mcp_servers.shared_memories]` table, with documented keys only."""
    return codex_toml.table(SERVER_NAME, command, newline)


# --- JSON harnesses -------------------------------------------------------------------------------

def _json_load(path: Path, text: str) -> dict:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InstallError(f"{path} is not valid JSON (line {exc.lineno}, column {exc.colno}: "
                           f"{exc.msg}); fix it or move it aside, then re-run -- it was left "
                           "untouched") from exc
    if not isinstance(data, dict):
        raise InstallError(f"{path} does not hold a JSON object; fix it or move it aside")
    return data


def _json_keys(harness: str, data: dict) -> tuple[str, ...]:
    if harness != "opencode":
        return ("mcpServers",)
    mcp = data.get("mcp")
    servers = mcp.get("servers") if isinstance(mcp, dict) else None
    if isinstance(servers, dict) and not {"type", "command", "url"} & servers.keys():
        return ("mcp", "servers")
    return ("mcp",)


def _json_entry(harness: str, command: list[str]) -> dict[str, object]:
    if harness == "opencode":
        return {"type": "local", "command": list(command), "enabled": True}
    if harness == "claude-code":
        return {"type": "stdio", "command": command[0], "args": list(command[1:])}
    return {"command": command[0], "args": list(command[1:])}


def _container(path: Path, data: dict, keys: tuple[str, ...], create: bool) -> dict | None:
    node = data
    for depth, key in enumerate(keys, 1):
        if key not in node:
            if not create:
                return None
            node[key] = {}
        if not isinstance(node[key], dict):
            raise InstallError(f"{path}: {'.'.join(keys[:depth])} is not a JSON object; fix it "
                               "by hand, then re-run")
        node = node[key]
    return node


def _dump(data: dict) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def _skeleton_only(data: object) -> bool:
    """True when `data` holds nothing but empty objects (and opencode's `$schema`)."""
    return isinstance(data, dict) and all(
        key == "$schema" or _skeleton_only(value) for key, value in data.items())


def _manual_jsonc(harness: str, path: Path, command: list[str] | None) -> Change:
    if command is None:
        text = f"remove the \"{SERVER_NAME}\" entry under \"mcp\" by hand"
    else:
        entry = json.dumps({SERVER_NAME: _json_entry(harness, command)}, indent=2)
        text = f"add this entry under \"mcp\" by hand:\n{entry}"
    return Change(harness, path, "manual", f"{path} has comments or trailing commas, so it "
                  f"cannot be edited safely and was left alone: {text}")


# --- the public operations ---------------------------------------------------------------------------

def _entry_command(harness: str, entry: object) -> list[str] | None:
    if not isinstance(entry, dict):
        return None
    if harness == "opencode":
        cmd = entry.get("command")
        return list(cmd) if isinstance(cmd, list) and all(isinstance(c, str) for c in cmd) else None
    program, args = entry.get("command"), entry.get("args", [])
    if isinstance(program, str) and isinstance(args, list):
        return [program, *(str(a) for a in args)]
    return None


def _load(harness: str, path: Path, text: str) -> tuple[dict, object]:
    """The parsed file and our entry in it (None when absent)."""
    if harness == "codex":
        data = codex_toml.load(path, text)
        return data, codex_toml.server_entry(data, SERVER_NAME)
    data = _json_load(path, text)
    node = _container(path, data, _json_keys(harness, data), create=False)
    return data, (node or {}).get(SERVER_NAME)


def register(harness: str, command: list[str], env: Mapping[str, str], *,
             dry_run: bool = False) -> Change:
    """Add or update our MCP server entry in `harness`'s config, leaving the rest as it was."""
    _check_command(command)
    path = config_path(harness, env)
    before = read_text(path)
    text = before if before is not None else ""
    if harness == "opencode" and before is not None and path.suffix == ".jsonc":
        try:
            json.loads(before)
        except json.JSONDecodeError:
            return _manual_jsonc(harness, path, command)
    if before is None and harness != "codex":
        text = _dump({"$schema": OPENCODE_SCHEMA} if harness == "opencode" else {})
    data, old = _load(harness, path, text)
    wanted = codex_toml.entry(command) if harness == "codex" else _json_entry(harness, command)
    if old == wanted:
        return Change(harness, path, "unchanged", f"{SERVER_NAME} already registered in {path}",
                      before, before)
    if harness == "codex":
        after = codex_toml.edit(path, text, SERVER_NAME, command)
    else:
        node = _container(path, data, _json_keys(harness, data), create=True)
        assert node is not None
        node[SERVER_NAME] = wanted
        after = _dump(data)
    if old is None:
        change = Change(harness, path, "added", f"{SERVER_NAME} added to {path}", before, after)
    else:
        was = _entry_command(harness, old)
        change = Change(harness, path, "updated", f"{SERVER_NAME} in {path} updated: it ran "
                        f"{was if was else old!r}, now {command}", before, after)
    return finish(change, dry_run=dry_run, new_mode=CONFIG_MODE)


def unregister(harness: str, env: Mapping[str, str], *, dry_run: bool = False) -> Change:
    """Remove our MCP server entry; remove the file too when we created it and nothing else is left."""
    path = config_path(harness, env)
    before = read_text(path)
    if harness == "opencode" and before is not None and path.suffix == ".jsonc":
        try:
            json.loads(before)
        except json.JSONDecodeError:
            return _manual_jsonc(harness, path, None)
    if before is None:
        return Change(harness, path, "unchanged", f"{path} does not exist: nothing to remove")
    data, old = _load(harness, path, before)
    if old is None:
        return Change(harness, path, "unchanged", f"{SERVER_NAME} is not registered in {path}",
                      before, before)
    if harness == "codex":
        after: str | None = codex_toml.edit(path, before, SERVER_NAME, None)
        empty = not (after or "").strip()
    else:
        node = _container(path, data, _json_keys(harness, data), create=False)
        assert node is not None
        del node[SERVER_NAME]
        after, empty = _dump(data), _skeleton_only(data)
    if empty and not backup_path(path).exists():
        after = None
    change = Change(harness, path, "removed", f"{SERVER_NAME} removed from {path}"
                    + (" (the file held nothing else and was deleted)" if after is None else ""),
                    before, after)
    return finish(change, dry_run=dry_run, new_mode=CONFIG_MODE)


def _strip_jsonc(text: str) -> str:
    """`text` without // and /* */ comments and trailing commas, for reading only."""
    out: list[str] = []
    i, in_string = 0, False
    while i < len(text):
        ch = text[i]
        if in_string:
            out.append(text[i:i + 2] if ch == "\\" else ch)
            i += 2 if ch == "\\" else 1
            in_string = ch != '"'
        elif text.startswith("//", i) or text.startswith("/*", i):
            close = "\n" if text[i + 1] == "/" else "*/"
            end = text.find(close, i + 2)
            i = len(text) if end < 0 else end + (0 if close == "\n" else 2)
        else:
            out.append(ch)
            in_string = ch == '"'
            i += 1
    return re.sub(r",(\s*[}\]])", r"\1", "".join(out))


def registered_command(harness: str, env: Mapping[str, str]) -> list[str] | None:
    """The command `harness` would run for our server, read back from its file (None if absent)."""
    path = config_path(harness, env)
    text = read_text(path)
    if text is None:
        return None
    if path.suffix == ".jsonc":
        text = _strip_jsonc(text)
    return _entry_command(harness, _load(harness, path, text)[1])
