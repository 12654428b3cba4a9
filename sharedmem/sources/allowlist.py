"""Which published paths each source kind may hold: checked by the walk, and again by the server.

A codex source publishes, from each memory folder Codex uses, `MEMORY.md`, `memory_summary.md`,
`rollout_summaries/<name>.md` and `skills/<skill>/<name>.md`: version 1's folder at the top,
version 2's under `memories_v2/`. A claude-code source publishes `<project>/<name>.md` (the
folder `autoMemoryDirectory` names as the project `auto-memory`) and
`agent-memory/<agent>/<name>.md`. A markdown source publishes any `.md` at most four folders
deep. Every path also follows the path rule (`core.path_problems`).
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
CODEX_SKILLS = "skills"
CODEX_V2 = "memories_v2"  # where version 2's memory folder is published
CLAUDE_RELOCATED = "auto-memory"  # the folder autoMemoryDirectory names, published as a project
CLAUDE_AGENTS = "agent-memory"  # subagents' user-scoped memory
CLAUDE_RESERVED = frozenset({CLAUDE_RELOCATED, CLAUDE_AGENTS})  # never a project folder
MARKDOWN_MAX_PARTS = 5  # PATH/a/b/c/d/x.md: four folder levels, then the file


def plain(kind: str, paths: Sequence[str]) -> bool:
    """True when all `paths` are plain (`core.plain_paths`) and where a `kind` source publishes.

    Then none has a `problem`; False says nothing (check each).
    """
    if kind == KIND_MARKDOWN:
        return plain_paths(paths) and max(
            map(str.count, paths, repeat("/")), default=0) < MARKDOWN_MAX_PARTS
    if kind == SOURCE_CLAUDE:
        return plain_paths(paths) and all(p.count("/") == 1 or p.count("/") == 2 and p.startswith(
            CLAUDE_AGENTS + "/") for p in paths)
    return False  # a codex source publishes a few files: each is checked


def problem(kind: str, path: str) -> str | None:
    """Why a published `path` may not come from a `kind` source, or None; the server re-checks."""
    problems = path_problems(path)
    if problems:
        return "; ".join(problems)
    parts = path.split("/")
    if kind == SOURCE_CODEX:
        inner = parts[1:] if parts[0] == CODEX_V2 else parts
        if (len(inner) == 1 and inner[0] in CODEX_FILES
                or len(inner) == 2 and inner[0] == CODEX_ROLLOUTS
                or len(inner) == 3 and inner[0] == CODEX_SKILLS):
            return None
        return (
            f"path {path!r} is not published by a codex source: only MEMORY.md, "
            f"memory_summary.md, {CODEX_ROLLOUTS}/<name>.md and {CODEX_SKILLS}/<skill>/<name>.md "
            f"are, at the top or under {CODEX_V2}/"
        )
    if kind == SOURCE_CLAUDE:
        if len(parts) == 2 or len(parts) == 3 and parts[0] == CLAUDE_AGENTS:
            return None
        return (f"path {path!r} is not published by a claude-code source: only "
                f"<project>/<name>.md and {CLAUDE_AGENTS}/<agent>/<name>.md are")
    if kind == KIND_MARKDOWN:
        if len(parts) <= MARKDOWN_MAX_PARTS:
            return None
        return (
            f"path {path!r} is too deep for a markdown source: at most four folder levels "
            "above the file"
        )
    return f"source kind {kind!r} is unknown: use one of {', '.join(SOURCE_KINDS)}"
