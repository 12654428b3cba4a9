"""What every command handler shares: data to stdout (JSON or text), progress to stderr, paths.

Whatever is printed may hold text a peer sent (the server's errors and refusals, paths and
names it lists, cached files), so it passes through `shown` on its way out: no control
character reaches the terminal.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path
    from typing import Any

_TABLES: dict[bool, dict[int, str]] = {}


def shown(text: object, *, lines: bool = False) -> str:
    r"""`text` safe to print: each control character and lone surrogate written as an escape.

    C0 controls become `\x1b` and the like; DEL, the C1 controls (some terminals obey them as
    escapes too) and lone surrogates (which cannot be printed at all) become `\u009b` and the
    like, which a JSON reader takes back as the same character. With `lines`, line breaks and
    tabs are kept, for text of many lines; a single field a peer sent is shown without them,
    so it cannot forge a line of its own.
    """
    text = str(text)
    if text.isprintable():
        return text
    table = _TABLES.get(lines)
    if table is None:
        table = {c: f"\\x{c:02x}" for c in range(32)} | {9: "\\t", 10: "\\n", 13: "\\r"}
        table.update({c: f"\\u{c:04x}" for c in (*range(0x7F, 0xA0), *range(0xD800, 0xE000))})
        if lines:
            del table[ord("\n")], table[ord("\t")]
        _TABLES[lines] = table
    return text.translate(table)


def emit(data: Any, as_json: bool, text: str) -> None:
    """Data to stdout: JSON for scripts, or the readable text."""
    if as_json:
        import json
        print(shown(json.dumps(data, indent=2, ensure_ascii=False), lines=True))
    elif text:
        print(shown(text, lines=True))


def progress(enabled: bool) -> Callable[[str], None] | None:
    if not enabled:
        return None
    return lambda message: print(f"... {shown(message)}", file=sys.stderr, flush=True)


def user_path(value: str) -> Path:
    from pathlib import Path
    return Path(value).expanduser()


def load_config(path: str) -> Any:
    from sharedmem.client import config
    return config.load(path)
