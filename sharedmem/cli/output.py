"""What every command handler shares: data to stdout (JSON or text), progress to stderr, paths."""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # typing and pathlib cost milliseconds that `mcp` start-up does not pay
if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path
    from typing import Any


def emit(data: Any, as_json: bool, text: str) -> None:
    """Data to stdout: JSON for scripts, or the readable text."""
    if as_json:
        import json
        print(json.dumps(data, indent=2, ensure_ascii=False))
    elif text:
        print(text)


def progress(enabled: bool) -> Callable[[str], None] | None:
    if not enabled:
        return None
    return lambda message: print(f"... {message}", file=sys.stderr, flush=True)


def user_path(value: str) -> Path:
    from pathlib import Path
    return Path(value).expanduser()


def load_config(path: str) -> Any:
    from sharedmem.client import config
    return config.load(path)
