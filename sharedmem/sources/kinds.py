"""The three source kinds: what this machine would publish from each, as a snapshot.

Nothing below a source's root is ever followed through a link: every folder and file is opened
through `sharedmem.sources.safe_open`, so a symlink, junction or FIFO swapped in mid-walk is refused.
Each kind says which folders to enter and which names to offer; `sharedmem.sources.walk` decides, file by
file, what is published.
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Callable, Mapping
from pathlib import Path

from sharedmem.core import ConfigError, SourceError
from sharedmem.hashing import sha256_text
from sharedmem.rules import KIND_MARKDOWN, SOURCE_CLAUDE, SOURCE_CODEX, SOURCE_KINDS, Limits
from sharedmem.sources import allowlist
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


def _walk_codex(w: Walker, root: Handle) -> None:
    for entry in w.entries(root, ""):
        name = entry.name
        if name == allowlist.CODEX_ROLLOUTS and entry.is_dir(follow_symlinks=False):
            sub = w.subdir(root, name, name)
            if sub is None:
                continue
            try:
                _walk_flat(w, sub, f"{name}/", f"{name}/", "rollout summaries")
            finally:
                close(sub)
        elif name in allowlist.CODEX_FILES:
            w.file(root, entry, name, name)
        elif entry.is_dir(follow_symlinks=False) or name.endswith(".md"):
            w.skip(name, "not-allowlisted", f"{name} is not on the codex allowlist (MEMORY.md, "
                   f"memory_summary.md, {allowlist.CODEX_ROLLOUTS}/*.md); it is never published")


def _walk_flat(w: Walker, handle: Handle, disk: str, published: str, what: str) -> None:
    """Publish the `.md` files directly in one folder; its subfolders are reported, not entered."""
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
        proj = w.subdir(root, project.name, project.name)
        if proj is None:
            continue
        try:
            for entry in w.listing(proj, f"{project.name}/"):
                if entry.name != CLAUDE_MEMORY:
                    continue
                shown = f"{project.name}/{entry.name}"
                if is_link(entry):
                    w.skip(shown, "symlink",
                           f"{display(shown)} is a symbolic link or junction; not followed")
                elif entry.is_dir(follow_symlinks=False):
                    mem = w.subdir(proj, entry.name, shown)
                    if mem is not None:
                        try:
                            _walk_flat(w, mem, f"{shown}/", f"{project.name}/", "memory")
                        finally:
                            close(mem)
        finally:
            close(proj)


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
            sub = w.subdir(handle, entry.name, shown)
            if sub is None:
                continue
            try:
                _walk_markdown(w, sub, f"{shown}/", depth + 1)
            finally:
                close(sub)
        elif entry.name.endswith(".md"):
            w.file(handle, entry, shown, shown, plain)


def snapshot(spec: SourceSpec, limits: Limits = _DEFAULT_LIMITS,
             previous: Mapping | None = None,
             on_read: Callable[[Entry, bytes], None] | None = None) -> Snapshot:
    """Walk one source and describe what it would publish; unchanged files are not re-read.

    `on_read` sees each file read (and redacted) this time, as soon as it is accepted, with the
    UTF-8 of its text.
    """
    if spec.kind not in SOURCE_KINDS:
        raise ConfigError(f"source {spec.name!r} has unknown kind {spec.kind!r}: use one of "
                          f"{', '.join(SOURCE_KINDS)}")
    problems = limits.problems()
    if problems:
        raise ConfigError("; ".join(problems))
    walker = Walker(spec.kind, spec.name, limits, previous, on_read)
    try:
        root = open_root(spec.root)
    except OSError as exc:
        return Snapshot(spec, "unreadable", _root_message(spec, exc), [], [])
    try:
        if spec.kind == SOURCE_CODEX:
            _walk_codex(walker, root)
        elif spec.kind == SOURCE_CLAUDE:
            _walk_claude(walker, root)
        else:
            _walk_markdown(walker, root)
    except OSError as exc:
        return Snapshot(spec, "unreadable", _root_message(spec, exc), [], [])
    finally:
        close(root)
    walker.flush()
    return Snapshot(spec, "ok", "", walker.files, walker.skipped)


def _root_message(spec: SourceSpec, exc: OSError) -> str:
    why = exc.strerror or str(exc)
    return (f"the folder {spec.root} of source {spec.name!r} ({spec.kind}) cannot be listed: "
            f"{why}; create it or fix its permissions, or remove the source from the client "
            "configuration")


def load_text(spec: SourceSpec, entry: Entry) -> str:
    """Re-read an entry reused unread; raise SourceError if it changed since the snapshot."""
    if entry.text is not None:
        return entry.text
    disk = entry.disk_path or _disk_path(spec, entry.path)
    shown = f"{disk} in {spec.root}"
    limits = Limits(file_bytes=max(_DEFAULT_LIMITS.file_bytes, entry.disk_size, entry.size))
    try:
        raw, _ = read_below(spec.root, disk, shown, limits.file_bytes)
        text, _ = _publish_text(raw, shown, limits)
    except Refused as skip:
        raise SourceError(f"{skip.detail} (source {spec.name!r})") from None
    except OSError as exc:
        raise SourceError(refusal(exc, shown).detail) from None
    if sha256_text(text) != entry.sha256:
        raise SourceError(f"{shown} changed since the snapshot of source {spec.name!r}; sync again")
    return text


def _disk_path(spec: SourceSpec, published: str) -> str:
    """Where a published path lives below the source's root."""
    if spec.kind == SOURCE_CLAUDE:
        project, name = published.split("/", 1)
        return f"{project}/{CLAUDE_MEMORY}/{name}"
    return published
