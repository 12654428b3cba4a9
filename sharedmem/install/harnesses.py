"""Register the `shared_memories` MCP server with each coding-agent harness (guidance: see `guidance`).

Every edit is a merge: only our entry (or our guidance block) changes; every other byte of a
TOML file (edited by `codex_toml`) or a JSON file (edited by `json_edit`, comments included
where OpenCode allows them) stays as it was, and removing our entry gives back the bytes it
was added to. Before the first change to an existing file, a copy of it is kept beside it as
`<file>.bak-shared-memory`; that copy is never overwritten, so it always holds the file as it
was before this project first touched it. Re-running with the same inputs writes nothing, and
`dry_run` only reports.
"""

from __future__ import annotations

import copy
import json
import stat
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from sharedmem.core import InstallError
from sharedmem.files import atomic_write
from sharedmem.install import codex_toml, json_edit

HARNESSES = ("codex", "claude-code", "opencode", "cursor")
SERVER_NAME = "shared_memories"
BACKUP_SUFFIX = ".bak-shared-memory"
OPENCODE_SCHEMA = "https://opencode.ai/config.json"
CONFIG_MODE = 0o600
CLAUDE_LEGACY = ".config.json"  # Claude Code's older global configuration file
OPENCODE_GUIDANCE = "shared-memories.md"
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


def opencode_guidance(env: Mapping[str, str]) -> Path:
    """Our guidance file for OpenCode, which its configuration's `instructions` lists."""
    return opencode_dir(env) / OPENCODE_GUIDANCE


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
        return claude_files(env)[0]
    if harness == "opencode":
        folder = opencode_dir(env)
        if not (folder / "opencode.json").exists() and (folder / "opencode.jsonc").exists():
            return folder / "opencode.jsonc"
        return folder / "opencode.json"
    return home_dir(env) / ".cursor" / "mcp.json"


def claude_files(env: Mapping[str, str]) -> list[Path]:
    """Claude Code's global configuration files, the one it reads first.

    `.claude.json` in $CLAUDE_CONFIG_DIR (else the home); but a non-empty legacy
    `.config.json` in Claude Code's folder is read instead (checked against Claude Code
    2.1.332, whose `claude mcp list` then shows only that file's servers).
    """
    base = Path(env["CLAUDE_CONFIG_DIR"]) if env.get("CLAUDE_CONFIG_DIR") else home_dir(env)
    current = base / ".claude.json"
    legacy = claude_dir(env) / CLAUDE_LEGACY
    try:
        used = legacy.is_file() and legacy.stat().st_size > 0
    except OSError:
        used = False
    return [legacy, current] if used else [current, legacy]


def config_paths(harness: str, env: Mapping[str, str]) -> list[Path]:
    """Every file that may hold our entry for `harness`, the one it reads first."""
    return claude_files(env) if harness == "claude-code" else [config_path(harness, env)]


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


def finish(change: Change, *, dry_run: bool, new_mode: int, backup: bool = True) -> Change:
    """Carry out `change` (backup first, then an atomic write or a removal) unless dry-run.

    `backup=False` for a file that holds only what we wrote (`ours_only`), and for a removal:
    there is nothing of the user's to keep that the install's backup does not hold, and a
    backup of our own entries would make them look like the user's.
    """
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
        if backup and change.before is not None and not backup_path(path).exists():
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

def jsonc(harness: str) -> bool:
    """Whether `harness` reads its file as JSONC: OpenCode does (comments, trailing commas)."""
    return harness == "opencode"


def _document(harness: str, path: Path, text: str) -> json_edit.Document:
    return json_edit.Document(path, text, jsonc=jsonc(harness))


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


def _new_json(harness: str, command: list[str]) -> str:
    """A whole new file holding our entry, for a harness whose file is absent or blank."""
    data: dict[str, object] = {"$schema": OPENCODE_SCHEMA} if harness == "opencode" else {}
    data[_json_keys(harness, data)[0]] = {SERVER_NAME: _json_entry(harness, command)}
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def skeleton_only(data: object) -> bool:
    """True when `data` holds nothing but empty objects and lists (and opencode's `$schema`)."""
    return isinstance(data, dict) and all(
        key == "$schema" or value == [] or skeleton_only(value) for key, value in data.items())


def ours_only(harness: str, path: Path, text: str | None, env: Mapping[str, str]) -> bool:
    """Whether a harness file holds one of our entries and nothing of anyone else's.

    For a JSON file, our entries are our server entry and, for OpenCode, our guidance file in
    `instructions`; with them taken out, only empty objects and lists (and `$schema`) are left.
    A file without an entry of ours is the user's, even when empty.
    """
    if text is None or not text.strip() or harness == "codex":
        return False
    doc = _document(harness, path, text)
    data = copy.deepcopy(doc.data)
    found = False
    node: object = data
    keys = _json_keys(harness, doc.data)
    for key in keys[:-1]:
        node = node.get(key) if isinstance(node, dict) else None
    servers = node.get(keys[-1]) if isinstance(node, dict) else None
    if isinstance(servers, dict) and SERVER_NAME in servers:
        del servers[SERVER_NAME]
        found = True
    listed = data.get("instructions")
    if harness == "opencode" and isinstance(listed, list):
        mine = str(opencode_guidance(env))
        found = found or mine in listed
        data["instructions"] = [item for item in listed if item != mine]
    return found and skeleton_only(data)


def backup_data(harness: str, path: Path) -> dict | None:
    """The parsed backup of `path` (the file before our first change), if it reads as JSON."""
    try:
        text = read_text(backup_path(path))
        return _document(harness, path, text).data if text and text.strip() else {}
    except InstallError:
        return None


def _unregister_json(harness: str, path: Path, doc: json_edit.Document) -> str | None:
    """The file without our entry; objects the install added (absent from the backup) go too.

    Taking out our member undoes its insertion byte for byte, and an `mcpServers` object we
    added is removed again once empty, so a file nothing else changed gets its bytes back.
    """
    keys = _json_keys(harness, doc.data)
    after = doc.remove((*keys, SERVER_NAME))
    backup = backup_data(harness, path) if backup_path(path).exists() else None
    for depth in range(len(keys), 0, -1):
        doc = _document(harness, path, after)
        if backup is None or doc.get(keys[:depth]) != {} or _has(backup, keys[:depth]):
            break
        after = doc.remove(keys[:depth])
    if skeleton_only(_document(harness, path, after).data):
        if not backup_path(path).exists():
            return None  # we created the file, and it holds nothing else
        blank = read_text(backup_path(path))
        if blank is not None and not blank.strip():
            return blank
    return after


def _has(data: dict, keys: tuple[str, ...]) -> bool:
    node: object = data
    for key in keys:
        if not isinstance(node, dict) or key not in node:
            return False
        node = node[key]
    return True


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


def _load(harness: str, path: Path, text: str) -> tuple[json_edit.Document | None, object]:
    """The parsed JSON file (None for Codex, or a blank file) and our entry in it (or None).

    A file we cannot read is refused with an error naming it and the place.
    """
    if harness == "codex":
        return None, codex_toml.server_entry(codex_toml.load(path, text), SERVER_NAME)
    if not text.strip():
        return None, None
    doc = _document(harness, path, text)
    return doc, doc.get((*_json_keys(harness, doc.data), SERVER_NAME))


def register(harness: str, command: list[str], env: Mapping[str, str], *,
             dry_run: bool = False) -> Change:
    """Add or update our MCP server entry in `harness`'s config, leaving every other byte."""
    _check_command(command)
    path = config_path(harness, env)
    before = read_text(path)
    text = before if before is not None else ""
    doc, old = _load(harness, path, text)
    wanted = codex_toml.entry(command) if harness == "codex" else _json_entry(harness, command)
    if old == wanted:
        return Change(harness, path, "unchanged", f"{SERVER_NAME} already registered in {path}, "
                      "unchanged", before, before)
    if harness == "codex":
        after = codex_toml.edit(path, text, SERVER_NAME, command)
    elif doc is None:
        after = _new_json(harness, command)
    else:
        after = doc.set((*_json_keys(harness, doc.data), SERVER_NAME), wanted)
    if old is None:
        change = Change(harness, path, "added", f"{SERVER_NAME} added to {path}", before, after)
    else:
        was = _entry_command(harness, old)
        change = Change(harness, path, "updated", f"{SERVER_NAME} in {path} updated: it ran "
                        f"{was if was else old!r}, now {command}", before, after)
    return finish(change, dry_run=dry_run, new_mode=CONFIG_MODE,
                  backup=not ours_only(harness, path, before, env))


def unregister(harness: str, env: Mapping[str, str], *, dry_run: bool = False) -> Change:
    """Remove our MCP server entry; remove the file too when we created it and nothing else is left.

    For Claude Code, from each of its configuration files that holds one (the harness may have
    moved to the other since the install); the change returned is the first one's.
    """
    changes = [_unregister_file(harness, path, dry_run) for path in config_paths(harness, env)]
    removed = [c for c in changes if c.action == "removed"]
    if len(removed) > 1:
        return replace(removed[0], message=removed[0].message + "; also from "
                       + ", ".join(str(c.path) for c in removed[1:]))
    return removed[0] if removed else changes[0]


def _unregister_file(harness: str, path: Path, dry_run: bool) -> Change:
    """Our entry taken out of one file, as `unregister` describes."""
    before = read_text(path)
    if before is None:
        return Change(harness, path, "unchanged", f"{path} does not exist: nothing to remove")
    doc, old = _load(harness, path, before)
    if old is None:
        return Change(harness, path, "unchanged", f"{SERVER_NAME} is not registered in {path}",
                      before, before)
    after: str | None
    if harness == "codex":
        after = codex_toml.edit(path, before, SERVER_NAME, None)
        if not (after or "").strip() and not backup_path(path).exists():
            after = None
    else:
        assert doc is not None
        after = _unregister_json(harness, path, doc)
    change = Change(harness, path, "removed", f"{SERVER_NAME} removed from {path}"
                    + (" (the file held nothing else and was deleted)" if after is None else ""),
                    before, after)
    return finish(change, dry_run=dry_run, new_mode=CONFIG_MODE, backup=False)


def registered_command(harness: str, env: Mapping[str, str]) -> list[str] | None:
    """The command `harness` would run for our server, read back from its file (None if absent)."""
    path = config_path(harness, env)
    text = read_text(path)
    return None if text is None else _entry_command(harness, _load(harness, path, text)[1])
