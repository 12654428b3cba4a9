"""The three source kinds: what this machine would publish from each, as a snapshot.

Nothing below a source's folders is ever followed through a link: every folder and file is
opened through `sharedmem.sources.safe_open`, so a symlink, junction or FIFO swapped in mid-walk
is refused. Each kind says which folders to enter and which names to offer; `sharedmem.sources.walk`
decides, file by file, what is published.

A codex or claude-code source walks every folder its harness writes memory to today, as the
harness's own settings say (`sharedmem.sources.harness_memory`), each one a `Part`: the
configured folder, whose files are shown and re-read by their path below it, and others (Codex's
`memories_v2`, Claude Code's relocated memory and subagent memory), whose files are shown by
their full path and published under their own prefix.
"""

from __future__ import annotations

import os
from collections import namedtuple
from collections.abc import Callable, Mapping
from pathlib import Path

from sharedmem.core import ConfigError, SourceError
from sharedmem.hashing import sha256_text
from sharedmem.rules import KIND_MARKDOWN, SOURCE_CLAUDE, SOURCE_CODEX, SOURCE_KINDS, Limits
from sharedmem.sources import allowlist, harness_memory
from sharedmem.sources.safe_open import (
    Handle,
    Refused,
    close,
    is_link,
    open_root,
    read_below,
    refusal,
    too_large,
)
from sharedmem.sources.walk import Entry, Skipped, Walker, display, record_entry

PROBLEM_REASONS = frozenset(
    {"invalid-utf8", "too-large", "quota", "vanished", "unreadable", "bad-path", "collision"}
)
POLICY_REASONS = frozenset({"hidden", "symlink", "not-regular", "not-allowlisted", "too-deep"})

CLAUDE_MEMORY = "memory"
_DEFAULT_LIMITS = Limits()  # frozen, so one shared default is safe


class SourceSpec(namedtuple("SourceSpec", "name kind root")):
    """One configured source: its name, its kind and the folder (a Path) that is walked."""

    __slots__ = ()


class Part(namedtuple("Part", "root disk published")):
    """One folder a source walks.

    root: the folder (a Path); disk: the prefix its files are shown and re-read by ("" for the
    configured folder, else the folder's own path and a slash); published: the prefix they are
    published under.
    """

    __slots__ = ()


class Snapshot(namedtuple("Snapshot", "spec status message files skipped")):
    """What one source would publish right now (`files`), and what it left out (`skipped`)."""

    __slots__ = ()

    def problems(self) -> list[Skipped]:
        """Skipped entries that make a sync partial (policy exclusions are not problems)."""
        return [s for s in self.skipped if s.reason in PROBLEM_REASONS]

    def record(self) -> dict:
        """The record to pass as `previous` to the next snapshot (`walk.record_entry`)."""
        return {e.path: record_entry(e) for e in self.files}


def default_root(kind: str, env: Mapping[str, str]) -> Path:
    """Folder a codex or claude-code source walks; honours HOME, CODEX_HOME, CLAUDE_CONFIG_DIR."""
    home = env.get("HOME") or env.get("USERPROFILE")
    home_path = Path(home) if home else Path.home()
    if kind == SOURCE_CODEX:
        codex_home = env.get("CODEX_HOME")
        return (Path(codex_home) if codex_home else home_path / ".codex") / "memories"
    if kind == SOURCE_CLAUDE:
        config = env.get("CLAUDE_CONFIG_DIR")
        return (Path(config) if config else home_path / ".claude") / "projects"
    raise ConfigError(
        f"source kind {kind!r} has no default folder: name the folder of a markdown source "
        f"as NAME=PATH (known kinds: {', '.join(SOURCE_KINDS)})"
    )


def _publish_text(raw: str, shown: str, limits: Limits) -> tuple[str, dict[str, int]]:
    """Redact `raw`; the published text must still fit the per-file limit."""
    from sharedmem.redact.redactor import redact  # its patterns compile on first use, not at start-up
    text, counts = redact(raw)
    size = len(text.encode("utf-8"))
    if size > limits.file_bytes:
        raise too_large(shown, size, limits.file_bytes)
    return text, dict(counts)


def parts(spec: SourceSpec, env: Mapping[str, str]) -> list[Part]:
    """The folders a source walks: for codex and claude-code, each one its harness writes to."""
    if spec.kind == SOURCE_CODEX:
        home = harness_memory.codex_home_of(spec.root)
        if home is None:  # a folder not named `memories`: walked as version 1's, by itself
            return [Part(spec.root, "", "")]
        roots = harness_memory.codex_memory(home, env).roots
        return [Part(root, "", "") if root == spec.root else
                Part(root, f"{root}/", f"{allowlist.CODEX_V2}/") for _, root in roots]
    if spec.kind == SOURCE_CLAUDE:
        found = harness_memory.claude_memory(spec.root.parent, env)
        out = [Part(spec.root, "", "")]
        if found.relocated is not None and not harness_memory.within(found.relocated, spec.root):
            out.append(Part(found.relocated, f"{found.relocated}/",
                            f"{allowlist.CLAUDE_RELOCATED}/"))
        out.append(Part(found.agents, f"{found.agents}/", f"{allowlist.CLAUDE_AGENTS}/"))
        return out
    return [Part(spec.root, "", "")]


def _inside(w: Walker, handle: Handle, name: str, shown: str,
            walk: Callable[..., None], *args: object) -> None:
    """`walk(w, folder, *args)` over the child folder `name` of `handle`, closed after.

    A folder that cannot be opened is reported and left out.
    """
    sub = w.subdir(handle, name, shown)
    if sub is None:
        return
    try:
        walk(w, sub, *args)
    finally:
        close(sub)


def _walk_codex(w: Walker, root: Handle, disk: str = "", published: str = "") -> None:
    for entry in w.entries(root, disk):
        name = entry.name
        shown = f"{disk}{name}"
        if name == allowlist.CODEX_ROLLOUTS and entry.is_dir(follow_symlinks=False):
            _inside(w, root, name, shown, _walk_flat, f"{shown}/", f"{published}{name}/",
                    "rollout summaries")
        elif name == allowlist.CODEX_SKILLS and entry.is_dir(follow_symlinks=False):
            _inside(w, root, name, shown, _walk_skills, f"{shown}/", f"{published}{name}/")
        elif name in allowlist.CODEX_FILES:
            w.file(root, entry, shown, f"{published}{name}")
        elif entry.is_dir(follow_symlinks=False) or name.endswith(".md"):
            w.skip(shown, "not-allowlisted", f"{display(shown)} is not on the codex allowlist "
                   f"(MEMORY.md, memory_summary.md, {allowlist.CODEX_ROLLOUTS}/*.md, "
                   f"{allowlist.CODEX_SKILLS}/<skill>/*.md); it is never published")


def _walk_skills(w: Walker, handle: Handle, disk: str, published: str) -> None:
    """Each skill folder's Markdown (SKILL.md and the `.md` beside it); never its scripts."""
    for skill in w.entries(handle, disk):
        shown = f"{disk}{skill.name}"
        if not skill.is_dir(follow_symlinks=False):
            if skill.name.endswith(".md"):
                w.skip(shown, "not-allowlisted", f"{display(shown)} is not inside a skill's "
                       "folder; it is not published")
            continue
        _inside(w, handle, skill.name, shown, _walk_skill, f"{shown}/",
                f"{published}{skill.name}/")


def _walk_skill(w: Walker, handle: Handle, disk: str, published: str) -> None:
    """One skill folder: its `.md` files when it holds SKILL.md, else nothing (it is no skill)."""
    listing = w.listing(handle, disk)
    if not any(e.name == "SKILL.md" for e in listing):
        shown = disk.rstrip("/")
        w.skip(shown, "not-allowlisted", f"{display(shown)} has no SKILL.md, so it is not a "
               "skill; it is not published")
        return
    _walk_flat(w, handle, disk, published, "skill", listing)


def _walk_agents(w: Walker, handle: Handle, disk: str, published: str) -> None:
    """Each subagent's memory folder (`agent-memory/<agent>/`), its `.md` files only."""
    for agent in w.entries(handle, disk):
        if not agent.is_dir(follow_symlinks=False):
            continue
        shown = f"{disk}{agent.name}"
        _inside(w, handle, agent.name, shown, _walk_flat, f"{shown}/",
                f"{published}{agent.name}/", "agent memory")


def _walk_flat(w: Walker, handle: Handle, disk: str, published: str, what: str,
               listing: list[os.DirEntry] | None = None) -> None:
    """Publish the `.md` files directly in one folder; its subfolders are reported, not entered."""
    if listing is None:
        listing = w.listing(handle, disk)
    plain = allowlist.plain(w.kind, [published + e.name for e in listing
                                          if e.name.endswith(".md")])
    reuse = w.reuses_plain(plain)
    for entry in listing:
        if reuse and w.reuse_plain(entry, disk, published) or not w.admit(entry, disk):
            continue
        shown = f"{disk}{entry.name}"
        if entry.is_dir(follow_symlinks=False):
            w.skip(shown, "not-allowlisted",
                   f"{display(shown)} is a subfolder; only files directly in the {what} "
                   "folder are published")
        elif entry.name.endswith(".md"):
            w.file(handle, entry, shown, f"{published}{entry.name}", plain)


def _walk_claude(w: Walker, root: Handle) -> None:
    for project in w.entries(root, ""):
        if not project.is_dir(follow_symlinks=False):
            if project.name.endswith(".md"):
                w.skip(project.name, "not-allowlisted", f"{display(project.name)} is not inside "
                       "<project>/memory/; it is not published")
            continue
        if project.name in allowlist.CLAUDE_RESERVED:
            w.skip(project.name, "not-allowlisted", f"{display(project.name)} is a name the "
                   "claude-code source publishes other memory under; it is not published")
            continue
        _inside(w, root, project.name, project.name, _walk_project, project.name)


def _walk_project(w: Walker, handle: Handle, project: str) -> None:
    """One Claude Code project folder: the `.md` files of its `memory/` only."""
    for entry in w.listing(handle, f"{project}/"):
        if entry.name != CLAUDE_MEMORY:
            continue
        shown = f"{project}/{entry.name}"
        if is_link(entry):
            w.skip(shown, "symlink", f"{display(shown)} is a symbolic link or junction; not followed")
        elif entry.is_dir(follow_symlinks=False):
            _inside(w, handle, entry.name, shown, _walk_flat, f"{shown}/", f"{project}/", "memory")


def _walk_markdown(w: Walker, handle: Handle, rel: str = "", depth: int = 0) -> None:
    listing = w.listing(handle, rel)
    plain = allowlist.plain(KIND_MARKDOWN, [rel + e.name for e in listing if e.name.endswith(".md")])
    reuse = w.reuses_plain(plain)
    for entry in listing:
        if reuse and w.reuse_plain(entry, rel, rel) or not w.admit(entry, rel):
            continue
        shown = f"{rel}{entry.name}"
        if entry.is_dir(follow_symlinks=False):
            if depth + 1 >= allowlist.MARKDOWN_MAX_PARTS:
                w.skip(shown, "too-deep", f"{display(shown)} is more than four folder levels "
                       "deep; its files are not published")
                continue
            _inside(w, handle, entry.name, shown, _walk_markdown, f"{shown}/", depth + 1)
        elif entry.name.endswith(".md"):
            w.file(handle, entry, shown, shown, plain)


def snapshot(spec: SourceSpec, limits: Limits = _DEFAULT_LIMITS,
             previous: Mapping | None = None,
             on_read: Callable[[Entry, bytes], None] | None = None,
             env: Mapping[str, str] | None = None) -> Snapshot:
    """Walk one source and describe what it would publish; unchanged files are not re-read.

    `on_read` sees each file read (and redacted) this time, as soon as it is accepted, with the
    UTF-8 of its text. `env` (default: this process's) is where the harnesses' settings are
    found (HOME, and `SHAREDMEM_SYSTEM_ROOT` for system-wide ones).
    """
    if spec.kind not in SOURCE_KINDS:
        raise ConfigError(f"source {spec.name!r} has unknown kind {spec.kind!r}: use one of "
                          f"{', '.join(SOURCE_KINDS)}")
    problems = limits.problems()
    if problems:
        raise ConfigError("; ".join(problems))
    walker = Walker(spec.kind, spec.name, limits, previous, on_read)
    missing: list[tuple[Path, OSError]] = []
    walked = 0
    for part in parts(spec, os.environ if env is None else env):
        try:
            root = open_root(part.root)
        except FileNotFoundError as exc:  # a folder the harness has not made (yet)
            missing.append((part.root, exc))
            continue
        except OSError as exc:
            return Snapshot(spec, "unreadable", _root_message(spec, [(part.root, exc)]), [], [])
        try:
            _walk(walker, spec.kind, root, part)
        except OSError as exc:  # nothing is published: the server keeps what it holds
            return Snapshot(spec, "unreadable", _root_message(spec, [(part.root, exc)]), [], [])
        finally:
            close(root)
        walked += 1
    if not walked:
        return Snapshot(spec, "unreadable", _root_message(spec, missing), [], [])
    walker.flush()
    return Snapshot(spec, "ok", "", walker.files, walker.skipped)


def _walk(w: Walker, kind: str, root: Handle, part: Part) -> None:
    """Walk one part of a source, as its kind and its place say."""
    if kind == SOURCE_CODEX:
        _walk_codex(w, root, part.disk, part.published)
    elif kind == KIND_MARKDOWN:
        _walk_markdown(w, root)
    elif part.published == f"{allowlist.CLAUDE_AGENTS}/":
        _walk_agents(w, root, part.disk, part.published)
    elif part.published:
        _walk_flat(w, root, part.disk, part.published, "auto memory")
    else:
        _walk_claude(w, root)


def _root_message(spec: SourceSpec, failed: list[tuple[Path, OSError]]) -> str:
    listed = "; ".join(f"{root}: {exc.strerror or exc}" for root, exc in failed)
    where = "folder" if len(failed) == 1 else "folders"
    return (f"the {where} of source {spec.name!r} ({spec.kind}) cannot be listed ({listed}); "
            "create it or fix its permissions, or remove the source from the client "
            "configuration")


def load_text(spec: SourceSpec, entry: Entry) -> str:
    """Re-read an entry reused unread; raise SourceError if it changed since the snapshot."""
    if entry.text is not None:
        return entry.text
    disk = entry.disk_path or _disk_path(spec, entry.path)
    root, below = spec.root, disk
    depth = _part_depth(spec.kind, entry.path)
    if depth:  # a file of another part: its disk path is that folder's, a slash, and `depth` names
        head, *rest = disk.rsplit("/", depth)
        root, below = Path(head), "/".join(rest)
    shown = f"{below} in {root}"
    limits = Limits(file_bytes=max(_DEFAULT_LIMITS.file_bytes, entry.disk_size, entry.size))
    try:
        raw, _ = read_below(root, below, shown, limits.file_bytes)
        text, _ = _publish_text(raw, shown, limits)
    except Refused as skip:
        raise SourceError(f"{skip.detail} (source {spec.name!r})") from None
    except OSError as exc:
        raise SourceError(refusal(exc, shown).detail) from None
    if sha256_text(text) != entry.sha256:
        raise SourceError(f"{shown} changed since the snapshot of source {spec.name!r}; sync again")
    return text


def _part_depth(kind: str, published: str) -> int:
    """How many names a file of another part has below that part's folder (0: the root's own)."""
    head = published.partition("/")[0]
    if kind == SOURCE_CODEX and head == allowlist.CODEX_V2:
        return published.count("/")
    if kind == SOURCE_CLAUDE and head == allowlist.CLAUDE_AGENTS:
        return 2
    if kind == SOURCE_CLAUDE and head == allowlist.CLAUDE_RELOCATED:
        return 1
    return 0


def _disk_path(spec: SourceSpec, published: str) -> str:
    """Where a published path lives below the source's root."""
    if spec.kind == SOURCE_CLAUDE:
        project, name = published.split("/", 1)
        return f"{project}/{CLAUDE_MEMORY}/{name}"
    return published
