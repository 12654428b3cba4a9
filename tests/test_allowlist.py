"""Which paths each source kind may publish: the table, hostile paths, and the batch check."""

from __future__ import annotations

import pytest

from sharedmem.rules import KIND_MARKDOWN, SOURCE_CLAUDE, SOURCE_CODEX
from sharedmem.sources.allowlist import plain, problem

ALLOWLIST_CASES = [
    (SOURCE_CODEX, "MEMORY.md", True),
    (SOURCE_CODEX, "memory_summary.md", True),
    (SOURCE_CODEX, "rollout_summaries/2025-01-01-x.md", True),
    (SOURCE_CODEX, "raw_memories.md", False),
    (SOURCE_CODEX, "memory.md", False),
    (SOURCE_CODEX, "skills/x.md", False),
    (SOURCE_CODEX, "skills/deploy/SKILL.md", True),
    (SOURCE_CODEX, "skills/deploy/notes.md", True),
    (SOURCE_CODEX, "skills/deploy/scripts/run.md", False),
    (SOURCE_CODEX, "memories_v2/MEMORY.md", True),
    (SOURCE_CODEX, "memories_v2/memory_summary.md", True),
    (SOURCE_CODEX, "memories_v2/rollout_summaries/r.md", True),
    (SOURCE_CODEX, "memories_v2/skills/deploy/SKILL.md", True),
    (SOURCE_CODEX, "memories_v2/raw_memories.md", False),
    (SOURCE_CODEX, "memories_v2/phase2_workspace_diff.md", False),
    (SOURCE_CODEX, "memories_v2/extensions/ad_hoc/notes/x.md", False),
    (SOURCE_CODEX, "memories_v2/memories_v2/MEMORY.md", False),
    (SOURCE_CODEX, "phase2_workspace_diff.md", False),
    (SOURCE_CODEX, "extensions/ad_hoc/notes/x.md", False),
    (SOURCE_CODEX, "rollout_summaries/a/b.md", False),
    (SOURCE_CODEX, "rollout_summaries/.x.md", False),
    (SOURCE_CODEX, "rollout_summaries/x.txt", False),
    (SOURCE_CODEX, "rollout_summaries", False),
    (SOURCE_CLAUDE, "-home-alice-src-app/x.md", True),
    (SOURCE_CLAUDE, "P/memory/x.md", False),
    (SOURCE_CLAUDE, "x.md", False),
    (SOURCE_CLAUDE, "P/session.jsonl", False),
    (SOURCE_CLAUDE, "P/sub/x.md", False),
    (SOURCE_CLAUDE, "auto-memory/MEMORY.md", True),
    (SOURCE_CLAUDE, "agent-memory/reviewer/MEMORY.md", True),
    (SOURCE_CLAUDE, "agent-memory/reviewer/sub/x.md", False),
    (SOURCE_CLAUDE, "P/reviewer/x.md", False),
    (KIND_MARKDOWN, "x.md", True),
    (KIND_MARKDOWN, "a/b/c/d/x.md", True),
    (KIND_MARKDOWN, "a/b/c/d/e/x.md", False),
    (KIND_MARKDOWN, "caf\u00e9.md", True),
    (KIND_MARKDOWN, "cafe\u0301.md", False),
    ("dropbox", "x.md", False),
]
HOSTILE = ["../x.md", "/etc/x.md", "a/../../x.md", "./x.md", "a//x.md", "C:/x.md", "a\\x.md",
           "x.md\x00", "a\nb.md", ".hidden/x.md", "", "CON.md", "a /x.md", "x.md/", "\ud800.md"]


@pytest.mark.parametrize(("kind", "path", "allowed"), ALLOWLIST_CASES)
def test_each_kind_allows_its_own_paths(kind, path, allowed):
    found = problem(kind, path)
    assert (found is None) == allowed, found


@pytest.mark.parametrize("kind", [SOURCE_CODEX, SOURCE_CLAUDE, KIND_MARKDOWN])
@pytest.mark.parametrize("path", HOSTILE)
def test_hostile_paths_are_refused_for_every_kind(kind, path):
    assert problem(kind, path)
    for prefix in ("rollout_summaries/", "P/"):
        assert problem(kind, prefix + path)


def test_a_path_that_is_not_a_string_is_refused():
    assert problem(KIND_MARKDOWN, None)  # type: ignore[arg-type]
    assert problem(KIND_MARKDOWN, 42)  # type: ignore[arg-type]



@pytest.mark.parametrize(("kind", "paths", "is_plain"), [
    ("markdown", ["a.md", "b/c/d/e/f.md"], True),
    ("markdown", ["a.md", "b/c/d/e/f/g.md"], False),  # five folders: too deep
    ("claude-code", ["proj/a.md", "other/b.md"], True),
    ("claude-code", ["proj/a.md", "b.md"], False),
    ("claude-code", ["proj/a.md", "agent-memory/r/b.md"], True),
    ("claude-code", ["proj/a.md", "other/r/b.md"], False),
    ("codex", ["MEMORY.md"], False),  # always checked file by file
    ("markdown", ["a.md", "con.md"], False),
])
def test_plain_vouches_only_for_allowed_paths(kind: str, paths: list[str],
                                              is_plain: bool) -> None:
    assert plain(kind, paths) is is_plain
    if is_plain:
        assert all(problem(kind, p) is None for p in paths)
