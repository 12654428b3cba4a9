"""Tests for sharedmem.sources.kinds: each kind's allowlist and links, roots, records, load_text."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import SYSTEM, published, reasons, run_with_timeout, spec, write

from sharedmem.core import ConfigError, SourceError
from sharedmem.hashing import sha256_text
from sharedmem.rules import KIND_MARKDOWN, SOURCE_CLAUDE, SOURCE_CODEX, Limits
from sharedmem.sources.kinds import (
    POLICY_REASONS,
    PROBLEM_REASONS,
    SourceSpec,
    default_root,
    load_text,
    snapshot,
)
from sharedmem.sources.walk import Entry

# --- allowlists, on real trees ------------------------------------------------------------------

def test_codex_publishes_exactly_its_allowlist(tmp_path):
    root = tmp_path / "memories"
    write(root / "MEMORY.md", "# memory\n")
    write(root / "memory_summary.md", "summary\n")
    write(root / "rollout_summaries" / "x.md", "rollout\n")
    write(root / "raw_memories.md", "raw conversation\n")
    write(root / "skills" / "s.md", "skill\n")
    write(root / "skills" / "deploy" / "SKILL.md", "# deploy\n")
    write(root / "skills" / "deploy" / "notes.md", "notes\n")
    write(root / "skills" / "deploy" / "run.sh", "echo hi\n")
    write(root / "skills" / "deploy" / "scripts" / "x.md", "script doc\n")
    write(root / "skills" / "loose" / "readme.md", "not a skill\n")
    write(root / "extensions" / "ad_hoc" / "e.md", "ext\n")
    write(root / "rollout_summaries" / "a" / "b.md", "nested\n")
    write(root / "rollout_summaries" / "y.json", "{}")
    write(root / "other.md", "other\n")
    write(root / "config.toml", "x = 1\n")
    snap = snapshot(spec(SOURCE_CODEX, root))
    assert snap.status == "ok"
    assert snap.message == ""
    assert published(snap) == ["MEMORY.md", "memory_summary.md", "rollout_summaries/x.md",
                               "skills/deploy/SKILL.md", "skills/deploy/notes.md"]
    got = reasons(snap)
    assert got == {
        "raw_memories.md": "not-allowlisted",
        "skills/s.md": "not-allowlisted",
        "skills/deploy/scripts": "not-allowlisted",
        "skills/loose": "not-allowlisted",
        "extensions": "not-allowlisted",
        "other.md": "not-allowlisted",
        "rollout_summaries/a": "not-allowlisted",
    }
    assert snap.problems() == []
    texts = {e.path: e.text for e in snap.files}
    assert texts["MEMORY.md"] == "# memory\n"
    entry = snap.files[0]
    assert entry.sha256 == sha256_text("# memory\n")
    assert entry.size == len(b"# memory\n") == entry.disk_size
    assert entry.mtime_ns == (root / "MEMORY.md").stat().st_mtime_ns
    assert entry.redactions == {} or sum(entry.redactions.values()) == 0


def test_claude_publishes_project_memory_files_only(tmp_path):
    root = tmp_path / "claude" / "projects"
    project = root / "-home-alice-src-app"
    write(project / "memory" / "x.md", "remember this\n")
    write(project / "memory" / "MEMORY.md", "index\n")
    write(project / "session.jsonl", '{"role": "user"}\n')
    write(project / "memory" / "sub" / "x.md", "too deep\n")
    write(project / "memory" / "notes.txt", "not markdown\n")
    write(project / "loose.md", "beside memory\n")
    write(root / "other" / "memory" / "y.md", "second project\n")
    write(root / "empty-project" / "s.jsonl", "{}\n")
    snap = snapshot(spec(SOURCE_CLAUDE, root))
    assert snap.status == "ok"
    assert published(snap) == [
        "-home-alice-src-app/MEMORY.md",
        "-home-alice-src-app/x.md",
        "other/y.md",
    ]
    assert reasons(snap) == {"-home-alice-src-app/memory/sub": "not-allowlisted"}
    assert all("role" not in (e.text or "") for e in snap.files)


def codex_v2_tree(folder: Path) -> None:
    """A memory folder as Codex 0.171 leaves it (version 2 has no raw_memories.md)."""
    write(folder / "MEMORY.md", f"# {folder.name} index\n")
    write(folder / "memory_summary.md", f"{folder.name} summary\n")
    write(folder / "rollout_summaries" / "2026-01-02T03-04-05-abc.md", "rollout\n")
    write(folder / "phase2_workspace_diff.md", "# Memory Workspace Diff\n")
    write(folder / "extensions" / "ad_hoc" / "instructions.md", "how to read notes\n")
    write(folder / "extensions" / "ad_hoc" / "notes" / "2026-01-02T03-04-05-x.md", "note\n")
    write(folder / ".git" / "HEAD", "ref: refs/heads/main\n")
    write(folder / ".codex-baseline" / "MEMORY.md", "baseline\n")
    write(folder / "skills" / "deploy" / "SKILL.md", "# deploy\n")
    write(folder / "skills" / "deploy" / "scripts" / "run.py", "print(1)\n")


CODEX_V2_PUBLISHED = ["memories_v2/MEMORY.md", "memories_v2/memory_summary.md",
                      "memories_v2/rollout_summaries/2026-01-02T03-04-05-abc.md",
                      "memories_v2/skills/deploy/SKILL.md"]


def test_codex_version_2_only_user(tmp_path):
    """A new Codex user has only memories_v2: the codex source publishes it, marked as v2."""
    home = tmp_path / ".codex"
    codex_v2_tree(home / "memories_v2")
    snap = snapshot(spec(SOURCE_CODEX, home / "memories"), env=SYSTEM)
    assert snap.status == "ok", snap.message
    assert published(snap) == CODEX_V2_PUBLISHED
    v2 = f"{home / 'memories_v2'}/"
    assert reasons(snap) == {f"{v2}.codex-baseline": "hidden", f"{v2}.git": "hidden",
                             f"{v2}extensions": "not-allowlisted",
                             f"{v2}phase2_workspace_diff.md": "not-allowlisted",
                             f"{v2}skills/deploy/scripts": "not-allowlisted"}
    assert snap.problems() == []
    again = snapshot(snap.spec, previous=snap.record(), env=SYSTEM)
    assert [e.text for e in again.files] == [None] * 4  # reused unread: load_text finds them
    assert [load_text(again.spec, e) for e in again.files] == [e.text for e in snap.files]
    rollouts = home / "memories_v2" / "rollout_summaries"  # swapped for a link: refused
    shutil.move(rollouts, tmp_path / "elsewhere")
    rollouts.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(SourceError, match="was replaced"):
        load_text(again.spec, again.files[2])


@pytest.mark.parametrize(("config", "expected"), [
    ('[memories]\nversion = "v1"\n', ["MEMORY.md", "memory_summary.md",
                                      "rollout_summaries/2026-01-02T03-04-05-abc.md",
                                      "skills/deploy/SKILL.md"]),
    ('[memories]\nversion = "v2"\n', CODEX_V2_PUBLISHED),
    ('[memories]\ndual_write = true\n', ["MEMORY.md", "memory_summary.md",
                                         "rollout_summaries/2026-01-02T03-04-05-abc.md",
                                         "skills/deploy/SKILL.md", *CODEX_V2_PUBLISHED]),
])
def test_codex_publishes_the_folders_its_configuration_names(tmp_path, config, expected):
    home = tmp_path / ".codex"
    codex_v2_tree(home / "memories")
    write(home / "memories" / "raw_memories.md", "raw\n")
    codex_v2_tree(home / "memories_v2")
    write(home / "config.toml", config)
    snap = snapshot(spec(SOURCE_CODEX, home / "memories"), env=SYSTEM)
    assert published(snap) == expected
    texts = {e.path: e.text for e in snap.files}
    assert {texts[p] for p in expected if p.endswith("MEMORY.md") and "skills" not in p} <= {
        "# memories index\n", "# memories_v2 index\n"}
    assert all(texts[p] == "# memories_v2 index\n" for p in expected
               if p == "memories_v2/MEMORY.md")


def test_codex_with_no_memory_folder_yet_is_unreadable_naming_it(tmp_path):
    home = tmp_path / ".codex"
    home.mkdir()
    snap = snapshot(spec(SOURCE_CODEX, home / "memories"), env=SYSTEM)
    assert snap.status == "unreadable" and str(home / "memories_v2") in snap.message


def claude_layout(config: Path) -> None:
    write(config / "projects" / "-home-a-app" / "memory" / "MEMORY.md", "project index\n")
    write(config / "agent-memory" / "reviewer" / "MEMORY.md", "reviewer index\n")
    write(config / "agent-memory" / "reviewer" / "style.md", "style\n")
    write(config / "agent-memory" / "reviewer" / "notes.txt", "not markdown\n")
    write(config / "agent-memory" / "reviewer" / "sub" / "x.md", "too deep\n")
    write(config / "agent-memory" / "stray.md", "outside an agent\n")


def test_claude_publishes_subagent_memory(tmp_path):
    config = tmp_path / ".claude"
    claude_layout(config)
    write(config / "projects" / "agent-memory" / "memory" / "x.md", "a project by that name\n")
    snap = snapshot(spec(SOURCE_CLAUDE, config / "projects"), env=SYSTEM)
    assert published(snap) == ["-home-a-app/MEMORY.md", "agent-memory/reviewer/MEMORY.md",
                               "agent-memory/reviewer/style.md"]
    assert reasons(snap) == {"agent-memory": "not-allowlisted",
                             f"{config / 'agent-memory'}/reviewer/sub": "not-allowlisted"}
    again = snapshot(snap.spec, previous=snap.record(), env=SYSTEM)
    assert [load_text(again.spec, e) for e in again.files] == [e.text for e in snap.files]
    # an agent's folder swapped for a link to a copy: below agent-memory/ no link is followed
    shutil.copytree(config / "agent-memory" / "reviewer", tmp_path / "copy")
    shutil.rmtree(config / "agent-memory" / "reviewer")
    (config / "agent-memory" / "reviewer").symlink_to(tmp_path / "copy")
    with pytest.raises(SourceError, match="was replaced"):
        load_text(again.spec, again.files[1])


def test_claude_publishes_the_folder_auto_memory_directory_names(tmp_path):
    config = tmp_path / ".claude"
    claude_layout(config)
    write(config / "settings.json", json.dumps({"autoMemoryDirectory": "~/notes/claude"}))
    relocated = tmp_path / "notes" / "claude"
    write(relocated / "MEMORY.md", "relocated index\n")
    write(relocated / "topic.md", "topic\n")
    env = {"HOME": str(tmp_path), **SYSTEM}
    snap = snapshot(spec(SOURCE_CLAUDE, config / "projects"), env=env)
    assert published(snap) == ["-home-a-app/MEMORY.md", "auto-memory/MEMORY.md",
                               "auto-memory/topic.md", "agent-memory/reviewer/MEMORY.md",
                               "agent-memory/reviewer/style.md"]
    texts = {e.path: e.text for e in snap.files}
    assert texts["auto-memory/topic.md"] == "topic\n"
    again = snapshot(snap.spec, previous=snap.record(), env=env)
    assert all(e.text is None for e in again.files)
    assert [load_text(again.spec, e) for e in again.files] == [e.text for e in snap.files]
    # the folder swapped for a link after the snapshot: refused, not followed
    shutil.move(relocated, tmp_path / "moved")
    relocated.symlink_to(tmp_path / "moved")
    entry = next(e for e in again.files if e.path == "auto-memory/topic.md")
    assert load_text(again.spec, entry) == "topic\n"  # the folder itself is the user's to name
    (tmp_path / "moved" / "sub").mkdir()
    (tmp_path / "moved" / "sub" / "x.md").write_text("x\n")
    assert "sub" in " ".join(reasons(snapshot(snap.spec, env=env)))


def test_claude_with_only_relocated_memory_is_ok(tmp_path):
    config = tmp_path / ".claude"
    config.mkdir()
    write(config / "settings.json", json.dumps({"autoMemoryDirectory": str(tmp_path / "mem")}))
    write(tmp_path / "mem" / "MEMORY.md", "index\n")
    snap = snapshot(spec(SOURCE_CLAUDE, config / "projects"), env=SYSTEM)
    assert snap.status == "ok" and published(snap) == ["auto-memory/MEMORY.md"]


def test_markdown_depth_four_in_five_out(tmp_path):
    root = tmp_path / "docs"
    write(root / "top.md", "top\n")
    write(root / "a" / "b" / "c" / "d" / "x.md", "deep but in\n")
    write(root / "a" / "b" / "c" / "d" / "e" / "x.md", "too deep\n")
    write(root / "a" / "image.png", b"\x89PNG")
    snap = snapshot(spec(KIND_MARKDOWN, root))
    assert published(snap) == ["a/b/c/d/x.md", "top.md"]
    assert reasons(snap) == {"a/b/c/d/e": "too-deep"}
    assert snap.problems() == []



# --- links in each kind and in load_text, FIFOs -------------------------------------------------

def test_symlink_as_middle_component_in_every_kind(tmp_path):
    outside = tmp_path / "outside"
    write(outside / "b" / "x.md", "outside\n")
    write(outside / "y.md", "outside\n")
    md = tmp_path / "docs"
    md.mkdir()
    (md / "a").symlink_to(outside)
    assert published(snapshot(spec(KIND_MARKDOWN, md))) == []
    codex = tmp_path / "memories"
    codex.mkdir()
    (codex / "rollout_summaries").symlink_to(outside)
    snap = snapshot(spec(SOURCE_CODEX, codex))
    assert published(snap) == [] and reasons(snap) == {"rollout_summaries": "symlink"}
    claude = tmp_path / "projects"
    (claude / "P").mkdir(parents=True)
    (claude / "P" / "memory").symlink_to(outside)
    (claude / "Q").symlink_to(outside)
    snap = snapshot(spec(SOURCE_CLAUDE, claude))
    assert published(snap) == []
    assert reasons(snap) == {"P/memory": "symlink", "Q": "symlink"}


def test_root_reached_through_a_symlink_is_walked(tmp_path):
    real = tmp_path / "real"
    write(real / "x.md", "x\n")
    (tmp_path / "alias").symlink_to(real)
    snap = snapshot(spec(KIND_MARKDOWN, tmp_path / "alias"))
    assert snap.status == "ok" and published(snap) == ["x.md"]


def test_load_text_refuses_a_folder_swapped_for_a_symlink(tmp_path):
    root = tmp_path / "docs"
    write(root / "a" / "x.md", "same text\n")
    first = snapshot(spec(KIND_MARKDOWN, root))
    again = snapshot(spec(KIND_MARKDOWN, root), previous=first.record())
    entry = again.files[0]
    assert entry.text is None
    assert load_text(again.spec, entry) == "same text\n"
    # Swap the middle folder for a link to an identical copy elsewhere: following it would
    # return the right bytes, so only refusing the link makes this raise.
    outside = tmp_path / "outside"
    shutil.copytree(root / "a", outside, copy_function=shutil.copy2)
    shutil.rmtree(root / "a")
    (root / "a").symlink_to(outside)
    with pytest.raises(SourceError, match="x.md"):
        load_text(again.spec, entry)


def test_fifo_swapped_in_before_load_text_does_not_hang(tmp_path):
    root = tmp_path / "docs"
    write(root / "x.md", "text\n")
    first = snapshot(spec(KIND_MARKDOWN, root))
    entry = snapshot(spec(KIND_MARKDOWN, root), previous=first.record()).files[0]
    assert entry.text is None
    (root / "x.md").unlink()
    os.mkfifo(root / "x.md")
    with pytest.raises(SourceError, match="not a regular file"):
        run_with_timeout(lambda: load_text(first.spec, entry))



# --- unreadable roots ---------------------------------------------------------------------------

@pytest.mark.parametrize("kind", [SOURCE_CODEX, SOURCE_CLAUDE, KIND_MARKDOWN])
def test_missing_root_is_unreadable_not_empty(tmp_path, kind):
    root = tmp_path / "does-not-exist"
    snap = snapshot(spec(kind, root))
    assert snap.status == "unreadable"
    assert str(root) in snap.message
    assert snap.files == [] and snap.skipped == []


def test_root_that_is_a_file_is_unreadable(tmp_path):
    root = write(tmp_path / "file.md", "not a folder\n")
    snap = snapshot(spec(KIND_MARKDOWN, root))
    assert snap.status == "unreadable"
    assert str(root) in snap.message


def test_empty_root_is_ok(tmp_path):
    snap = snapshot(spec(SOURCE_CODEX, tmp_path))
    assert snap.status == "ok" and snap.files == [] and snap.skipped == []



# --- records, load_text -------------------------------------------------------------------------

def test_load_text_when_file_vanished(tmp_path):
    root = tmp_path / "docs"
    path = write(root / "x.md", "content\n")
    first = snapshot(spec(KIND_MARKDOWN, root))
    entry = snapshot(first.spec, previous=first.record()).files[0]
    path.unlink()
    with pytest.raises(SourceError, match="x.md"):
        load_text(first.spec, entry)


def test_load_text_for_claude_entry_built_from_published_path(tmp_path):
    root = tmp_path / "projects"
    write(root / "-home-a" / "memory" / "n.md", "note\n")
    entry = Entry("-home-a/n.md", sha256_text("note\n"), 5, 0, 5, {}, None)
    assert load_text(spec(SOURCE_CLAUDE, root), entry) == "note\n"


def test_record_round_trips_through_json(tmp_path):
    root = tmp_path / "docs"
    write(root / "x.md", "x\n")
    snap = snapshot(spec(KIND_MARKDOWN, root))
    entry = snap.files[0]
    assert json.loads(json.dumps(snap.record())) == {
        "x.md": [entry.disk_size, entry.mtime_ns, entry.sha256, entry.size, entry.redactions]
    }


def test_problem_reasons_set():
    assert PROBLEM_REASONS == {"invalid-utf8", "too-large", "quota", "vanished", "unreadable",
                               "bad-path", "collision"}


def test_every_skip_is_either_a_problem_or_policy_and_only_problems_are_reported(tmp_path):
    root = tmp_path / "docs"
    write(root / "ok.md", "fine\n")
    write(root / ".hidden.md", "hidden\n")
    write(root / "a" / "b" / "c" / "d" / "e" / "deep.md", "deep\n")
    write(root / "bad.md", b"\xff\xfe")
    write(root / "a:b.md", "colon\n")
    write(root / "Case.md", "upper\n")
    write(root / "case.md", "lower\n")
    write(root / "big.md", "x" * 2048)
    (root / "link.md").symlink_to(root / "ok.md")
    os.mkfifo(root / "pipe.md")
    snap = snapshot(spec(KIND_MARKDOWN, root), Limits(file_bytes=1024))
    given = set(reasons(snap).values())
    assert POLICY_REASONS.isdisjoint(PROBLEM_REASONS)
    assert given == {"hidden", "too-deep", "symlink", "not-regular",
                     "invalid-utf8", "bad-path", "collision", "too-large"}
    assert given <= POLICY_REASONS | PROBLEM_REASONS
    assert {p.reason for p in snap.problems()} == given & PROBLEM_REASONS


def test_unknown_kind_and_bad_limits_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="unknown kind"):
        snapshot(SourceSpec("x", "dropbox", tmp_path))
    with pytest.raises(ConfigError, match="file_bytes"):
        snapshot(spec(KIND_MARKDOWN, tmp_path), Limits(file_bytes=0))



# --- default_root -------------------------------------------------------------------------------

def test_default_root_honours_environment(tmp_path):
    home = tmp_path / "home"
    assert default_root(SOURCE_CODEX, {"HOME": str(home)}) == home / ".codex" / "memories"
    assert default_root(SOURCE_CLAUDE, {"HOME": str(home)}) == home / ".claude" / "projects"
    env = {"HOME": str(home), "CODEX_HOME": str(tmp_path / "cx"),
           "CLAUDE_CONFIG_DIR": str(tmp_path / "cl")}
    assert default_root(SOURCE_CODEX, env) == tmp_path / "cx" / "memories"
    assert default_root(SOURCE_CLAUDE, env) == tmp_path / "cl" / "projects"
    empty = {"HOME": str(home), "CODEX_HOME": "", "CLAUDE_CONFIG_DIR": ""}
    assert default_root(SOURCE_CODEX, empty) == home / ".codex" / "memories"
    assert default_root(SOURCE_CLAUDE, empty) == home / ".claude" / "projects"
    with pytest.raises(ConfigError, match="markdown"):
        default_root(KIND_MARKDOWN, env)
