"""Codex's config.toml, edited as text: one `[mcp_servers.<name>]` table changes, nothing else.

The standard library can read TOML but not write it, so the table is found and replaced line by
line, and every result is re-read with tomllib to prove that only that table changed.
"""

from __future__ import annotations

import copy
import tomllib
from pathlib import Path

from sharedmem.core import InstallError

STARTUP_TIMEOUT_SEC = 30

_TOML_ESCAPES = {"\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r",
                 '"': '\\"', "\\": "\\\\"}


def toml_string(value: str) -> str:
    """`value` as a TOML basic string, with control characters escaped."""
    out = []
    for ch in value:
        if ch in _TOML_ESCAPES:
            out.append(_TOML_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def entry(command: list[str]) -> dict[str, object]:
    """What tomllib reads back from the table `table` writes for `command`."""
    return {"command": command[0], "args": list(command[1:]),
            "startup_timeout_sec": STARTUP_TIMEOUT_SEC}


def table(name: str, command: list[str], newline: str = "\n") -> str:
    """The `[mcp_servers.<name>]` table, with documented keys only."""
    lines = [f"[mcp_servers.{name}]", f"command = {toml_string(command[0])}",
             "args = [" + ", ".join(toml_string(arg) for arg in command[1:]) + "]",
             f"startup_timeout_sec = {STARTUP_TIMEOUT_SEC}"]
    return newline.join(lines) + newline


def _header_keys(line: str) -> tuple[str, ...] | None:
    """The key path of a table header line (`[a.b]`, `[[a.b]]`), or None for any other line."""
    stripped = line.strip()
    if not stripped.startswith("["):
        return None
    try:
        node: object = tomllib.loads(stripped)
    except tomllib.TOMLDecodeError:
        return None
    keys: list[str] = []
    while isinstance(node, dict) and len(node) == 1:
        key, node = next(iter(node.items()))
        keys.append(key)
        if isinstance(node, list) and node:
            node = node[-1]
    return tuple(keys) if keys and node == {} else None


def _trivia(line: str) -> bool:
    return not line.strip() or line.lstrip().startswith("#")


def _spans(lines: list[str], name: str) -> list[tuple[int, int]]:
    """Line spans of our table and its sub-tables; trailing blank/comment lines stay outside."""
    heads = [(i, keys[:2] == ("mcp_servers", name))
             for i, line in enumerate(lines) if (keys := _header_keys(line))]
    heads.append((len(lines), False))
    spans = []
    for (start, ours), (end, next_ours) in zip(heads, heads[1:], strict=False):
        if ours:
            while not next_ours and end > start + 1 and _trivia(lines[end - 1]):
                end -= 1
            spans.append((start, end))
    return spans


def _without(data: dict, name: str) -> dict:
    """A copy of parsed `data` without our entry (and without an emptied `mcp_servers`)."""
    data = copy.deepcopy(data)
    servers = data.get("mcp_servers")
    if isinstance(servers, dict):
        servers.pop(name, None)
        if not servers:
            del data["mcp_servers"]
    return data


def load(path: Path, text: str) -> dict:
    """Parse `text` (the contents of `path`), refusing invalid TOML with a fix."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InstallError(f"{path} is not valid TOML ({exc}); fix it or move it aside, then "
                           "re-run -- it was left untouched") from exc


def server_entry(data: dict, name: str) -> object:
    """The parsed `[mcp_servers.<name>]` table, or None when absent."""
    servers = data.get("mcp_servers")
    return servers.get(name) if isinstance(servers, dict) else None


def edit(path: Path, text: str, name: str, command: list[str] | None) -> str:
    """`text` with our table replaced by (or appended as) `command`'s, or removed when None.

    The result is checked with tomllib: it must hold exactly our entry and everything else
    unchanged; otherwise nothing is written and the user is told what to edit by hand.
    """
    newline = "\r\n" if "\r\n" in text else "\n"
    lines = text.splitlines(keepends=True)
    spans = _spans(lines, name)
    for start, end in reversed(spans):
        del lines[start:end]
        if command is None and start and not lines[start - 1].strip() and (
                start == len(lines) or not lines[start].strip()):
            del lines[start - 1]
    if command is not None:
        new_table = table(name, command, newline)
        if spans:
            lines.insert(spans[0][0], new_table)
        elif lines:
            lines.append(("" if text.endswith("\n") else newline) + newline + new_table)
        else:
            lines.append(new_table)
    result = "".join(lines)
    wanted = entry(command) if command else None
    table_text = table(name, command) if command else f"[mcp_servers.{name}]"
    how = (f"add this table by hand:\n{table_text}" if command
           else f"remove the {table_text} table by hand")
    try:
        new = tomllib.loads(result)
    except tomllib.TOMLDecodeError as exc:
        raise InstallError(f"editing {path} safely is not possible ({exc}); nothing was "
                           f"written: {how}") from exc
    if server_entry(new, name) != wanted or _without(new, name) != _without(
            tomllib.loads(text), name):
        raise InstallError(f"{path} defines {name} in a form this installer cannot "
                           f"edit safely; nothing was written: {how}")
    return result
