"""Which published paths each source kind may hold: checked by the walk, and again by the server.

A codex source publishes `MEMORY.md`, `memory_summary.md` and `rollout_summaries/<name>.md`; a
claude-code source `<project>/<name>.md`; a markdown source any `.md` at most four folders deep.
Every path also follows the path rule (`core.path_problems`).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat

from sharedmem.rules import (
    KIND_MARKDOWN,
    SOURCE_CLAUDE,
    SOURCE_CODEX,
    SOURCE_KINDS,
    path_problems,
    plain_paths,
)

CODEX_FILES = ("MEMORY.md", "memory_summary.md")
CODEX_ROLLOUTS = "rollout_summaries"
MARKDOWN_MAX_PARTS = 5  # PATH/a/b/c/d/x.md: four folder levels, then the file


def plain(kind: str, paths: Sequence[str]) -> bool:
    """True when all `paths` are plain (`core.plain_paths`) and where a `kind` source publishes.

    Then none has a `problem`; False says nothing (check each).
    """
    if kind == KIND_MARKDOWN:
        return plain_paths(paths) and max(
            map(str.count, paths, repeat("/")), default=0) < MARKDOWN_MAX_PARTS
    if kind == SOURCE_CLAUDE:
        return plain_paths(paths) and all(p.count("/") == 1 for p in paths)
    return False  # a codex source publishes a few files: each is checked


def problem(kind: str, path: str) -> str | None:
    """Why a published `path` may not come from a `kind` source, or None; the server re-checks."""
    problems = path_problems(path)
    if problems:
        return "; ".join(problems)
    parts = path.split("/")
    if kind == SOURCE_CODEX:
        if path in CODEX_FILES or (len(parts) == 2 and parts[0] == CODEX_ROLLOUTS):
            return None
        return (
            f"path {path!r} is not published by a codex source: only MEMORY.md, "
            f"memory_summary.md and {CODEX_ROLLOUTS}/<name>.md are"
        )
    if kind == SOURCE_CLAUDE:
        if len(parts) == 2:
            return None
        return (f"path {path!r} is not published by a claude-code source: "
                "only <project>/<name>.md is")
    if kind == KIND_MARKDOWN:
        if len(parts) <= MARKDOWN_MAX_PARTS:
            return None
        return (
            f"path {path!r} is too deep for a markdown source: at most four folder levels "
            "above the file"
        )
    return f"source kind {kind!r} is unknown: use one of {', '.join(SOURCE_KINDS)}"
