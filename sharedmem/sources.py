"""The three source kinds: what this machine would publish from each, as a snapshot.

Nothing below a source's root is ever followed through a link: every folder and file is opened
through `sharedmem.nofollow`, so a symlink, junction or FIFO swapped in mid-walk is refused.
"""

from __future__ import annotations

import os
import re
import unicodedata
from collections import namedtuple
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from sharedmem import allowlist
from sharedmem.core import (
    KIND_MARKDOWN,
    SOURCE_CLAUDE,
    SOURCE_CODEX,
    SOURCE_KINDS,
    ConfigError,
    Limits,
    SourceError,
    collision_key,
    sha256_bytes,
    sha256_text,
)
from sharedmem.nofollow import (
    Handle,
    Refused,
    close,
    is_link,
    list_dir,
    open_child_dir,
    open_root,
    read_below,
    read_utf8,
    refusal,
    too_large,
)

PROBLEM_REASONS = frozenset(
    {"invalid-utf8", "too-large", "quota", "vanished", "unreadable", "bad-path", "collision"}
)
POLICY_REASONS = frozenset({"hidden", "symlink", "not-regular", "not-allowlisted", "too-deep"})

CLAUDE_MEMORY = "memory"
REDACT_BATCH_BYTES = 1 << 20  # files read are redacted in batches of about this many bytes

_SHA_RE = re.compile(r"[0-9a-f]{64}")
_DEFAULT_LIMITS = Limits()  # frozen, so one shared default is safe


# Plain named tuples, not dataclasses: `serve` loads this module, and the dataclasses module
# alone (it loads `inspect`) costs every sync's server end about 10 ms before it can answer.
class SourceSpec(namedtuple("SourceSpec", "name kind root")):
    """One configured source: its name, its kind and the folder (a Path) that is walked."""

    __slots__ = ()


class Entry(namedtuple("Entry", "path sha256 size mtime_ns disk_size redactions text disk_path",
                       defaults=("",))):
    """One published file.

    Its published path, the sha256 and size of its redacted text, the file's mtime_ns and size
    on disk, redaction counts, the text (None when reused from the previous record unread) and
    where it lies below the source's root.
    """

    __slots__ = ()


class Skipped(namedtuple("Skipped", "path reason message")):
    """A file or folder that was not published, with a reason code and a message for people."""

    __slots__ = ()


class Snapshot(namedtuple("Snapshot", "spec status message files skipped")):
    """What one source would publish right now (`files`), and what it left out (`skipped`)."""

    __slots__ = ()

    def problems(self) -> list[Skipped]:
        """Skipped entries that make a sync partial (policy exclusions are not problems)."""
        return [s for s in self.skipped if s.reason in PROBLEM_REASONS]

    def record(self) -> dict:
        """JSON-serialisable record to pass as `previous` to the next snapshot."""
        return {
            e.path: [e.disk_size, e.mtime_ns, e.sha256, e.size, dict(e.redactions)]
            for e in self.files
        }


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


def _display(text: str) -> str:
    """A printable form of an on-disk name that may hold undecodable bytes."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _publish_text(raw: str, shown: str, limits: Limits) -> tuple[str, dict[str, int]]:
    """Redact `raw`; the published text must still fit the per-file limit."""
    from sharedmem.redact import redact  # its patterns compile on first use, not at start-up
    text, counts = redact(raw)
    size = len(text.encode("utf-8"))
    if size > limits.file_bytes:
        raise too_large(shown, size, limits.file_bytes)
    return text, dict(counts)


def _valid_record(value: object) -> tuple[int, int, str, int, dict[str, int]] | None:
    """One `previous` record entry, or None when it is malformed (10,000 of these a sync)."""
    if type(value) not in (list, tuple) or len(value) != 5:  # type: ignore[arg-type]
        return None
    disk_size, mtime_ns, sha, size, counts = value  # type: ignore[misc]
    if not (type(disk_size) is int and disk_size >= 0 and type(mtime_ns) is int
            and type(size) is int and size >= 0 and type(sha) is str
            and type(counts) is dict and _SHA_RE.fullmatch(sha)):
        return None  # `type(x) is int` also refuses True and False
    if counts and not all(type(k) is str and type(v) is int and v >= 0
                          for k, v in counts.items()):
        return None
    return disk_size, mtime_ns, sha, size, dict(counts)


class _Walker:
    """Collects the files and skips of one snapshot, applying path, collision and quota rules."""

    def __init__(self, spec: SourceSpec, limits: Limits, previous: Mapping | None,
                 on_read: Callable[[Entry, bytes], None] | None = None) -> None:
        self.spec = spec
        self.limits = limits
        self.on_read = on_read
        self.previous = previous if isinstance(previous, Mapping) else {}
        self.files: list[Entry] = []
        self.skipped: list[Skipped] = []
        self.keys: set[str] = set()
        self.bytes = 0
        self.full = False
        # Files waiting for the next flush, in walk order: (disk path, reused entry or None,
        # (published path, stat, bytes read) and raw text of a file read this time). Redaction
        # runs over a whole batch at once (redact.redact_many), which costs half as much as file
        # by file; the bytes read are the text's UTF-8, hashed as they are when nothing changed.
        self.queue: list[tuple[str, Entry | None, tuple[str, os.stat_result, bytes] | None,
                               str | None]] = []
        self.queued_bytes = 0

    def skip(self, shown: str, reason: str, message: str) -> None:
        self.flush()  # decisions on earlier files come first, as if each were taken at once
        self.skipped.append(Skipped(_display(shown), reason, message))

    def flush(self) -> None:
        """Redact the queued files in one batch, then accept or refuse each in walk order."""
        queue, self.queue, self.queued_bytes = self.queue, [], 0
        if not queue:
            return
        from sharedmem.redact import redact_many  # its patterns compile on first use
        redacted = iter(redact_many([raw for _, _, _, raw in queue if raw is not None],
                                    [read[2] for _, _, read, _ in queue if read is not None]))
        data = b""
        for disk, made, read, _ in queue:
            if read is not None:
                text, counts = next(redacted)
                published, st, data = read
                if counts:
                    data = text.encode("utf-8")
                if len(data) > self.limits.file_bytes:
                    skip = too_large(_display(disk), len(data), self.limits.file_bytes)
                    self.skipped.append(Skipped(_display(disk), skip.reason, skip.detail))
                    continue
                made = Entry(published, sha256_bytes(data), len(data), st.st_mtime_ns,
                             st.st_size, dict(counts), text, disk)
            assert made is not None
            if self.full or self.bytes + made.size > self.limits.namespace_bytes:
                self.full = True
                shown = _display(disk)
                self.skipped.append(Skipped(shown, "quota", self._quota_message(shown)))
                continue
            self.bytes += made.size
            self.files.append(made)
            if read is not None and self.on_read is not None:
                self.on_read(made, data)

    def listing(self, handle: Handle, rel: str) -> list[os.DirEntry]:
        """A folder's sorted entries; an unlistable subfolder is reported, the root raises."""
        try:
            return list_dir(handle)
        except OSError as exc:
            if not rel:
                raise
            skip = refusal(exc, _display(rel.rstrip("/")))
            self.skip(rel.rstrip("/"), skip.reason, skip.detail)
            return []

    def entries(self, handle: Handle, rel: str,
                listing: list[os.DirEntry] | None = None) -> Iterator[os.DirEntry]:
        """Entries of a folder (`listing` if read already) that are neither hidden nor links."""
        for entry in self.listing(handle, rel) if listing is None else listing:
            shown = f"{rel}{entry.name}"
            if entry.name.startswith("."):
                self.skip(shown, "hidden",
                          f"{_display(shown)} is hidden; hidden names are never published")
                continue
            try:
                link = is_link(entry)
            except OSError:
                self.skip(shown, "vanished", f"{_display(shown)} disappeared during the walk")
                continue
            if link:
                self.skip(shown, "symlink",
                          f"{_display(shown)} is a link or junction; links are never followed")
                continue
            yield entry

    def subdir(self, handle: Handle, name: str, shown: str) -> Handle | None:
        """Open a child folder, reporting why not when it cannot be opened."""
        try:
            return open_child_dir(handle, name)
        except OSError as exc:
            skip = refusal(exc, _display(shown))
            self.skip(shown, skip.reason, skip.detail)
            return None

    def file(self, handle: Handle, entry: os.DirEntry, disk: str, published: str,
             plain: bool = False) -> None:
        """Publish one candidate `.md` file found at `disk` (below the root) as `published`.

        `plain`: its folder's names are plain (`allowlist.plain`), so the path rule holds.
        """
        shown = disk if plain else _display(disk)  # plain names are ASCII: shown as they are
        try:
            if not entry.is_file(follow_symlinks=False):
                self.skip(disk, "not-regular",
                          f"{shown} is not a regular file; it is not published")
                return
            # Only a file the last sync read may be reused unread; any other is read, and
            # read_utf8 takes its size and time from the open file.
            st = entry.stat(follow_symlinks=False) if self.previous else None
        except OSError:
            self.skip(disk, "vanished", f"{shown} disappeared during the walk; sync again")
            return
        problems = None
        if not plain:
            published = unicodedata.normalize("NFC", published)
            problems = allowlist.problem(self.spec.kind, published)
        if problems:
            self.skip(disk, "bad-path", f"{shown} cannot be published: {problems}; rename it")
            return
        key = published.lower() if plain else collision_key(published)  # the same, for ASCII
        if key in self.keys:
            self.skip(disk, "collision", f"{shown} has the same name as another file once case and "
                      "Unicode form are ignored; rename one of them")
            return
        self.keys.add(key)
        if len(self.files) + len(self.queue) >= self.limits.namespace_files:
            self.flush()  # the file-count quota is decided on accepted files only
        if self.full or len(self.files) >= self.limits.namespace_files:
            self.full = True
            self.skip(disk, "quota", self._quota_message(shown))
            return
        reused = None if st is None else self._reuse(published, disk, st)
        if reused is not None:
            self.queue.append((disk, reused, None, None))
            return
        try:
            raw, data, st = read_utf8(handle, entry.name, shown, self.limits.file_bytes)
        except Refused as skip:
            self.skip(disk, skip.reason, skip.detail)
            return
        self.queue.append((disk, None, (published, st, data), raw))
        self.queued_bytes += len(raw)
        if self.queued_bytes >= REDACT_BATCH_BYTES:
            self.flush()

    def _quota_message(self, shown: str) -> str:
        return (f"{shown} is past the quota of source {self.spec.name!r} "
                f"({self.limits.namespace_files} files, {self.limits.namespace_bytes} bytes); "
                "remove files or raise the limit")

    def _reuse(self, published: str, disk: str, st: os.stat_result) -> Entry | None:
        """The previous record's entry when size and mtime are unchanged, without reading."""
        rec = _valid_record(self.previous.get(published))
        if rec is None or (rec[0], rec[1]) != (st.st_size, st.st_mtime_ns):
            return None
        if rec[0] > self.limits.file_bytes or rec[3] > self.limits.file_bytes:
            return None
        return Entry(published, rec[2], rec[3], rec[1], rec[0], rec[4], None, disk)


def _walk_codex(w: _Walker, root: Handle) -> None:
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


def _walk_flat(w: _Walker, handle: Handle, disk: str, published: str, what: str) -> None:
    """Publish the `.md` files directly in one folder; its subfolders are reported, not entered."""
    listing = w.listing(handle, disk)
    plain = allowlist.plain(w.spec.kind, [published + e.name for e in listing
                                          if e.name.endswith(".md")])
    for entry in w.entries(handle, disk, listing):
        shown = f"{disk}{entry.name}"
        if entry.is_dir(follow_symlinks=False):
            w.skip(shown, "not-allowlisted",
                   f"{_display(shown)} is a subfolder; only files directly in the {what} "
                   "folder are published")
        elif entry.name.endswith(".md"):
            w.file(handle, entry, shown, f"{published}{entry.name}", plain)


def _walk_claude(w: _Walker, root: Handle) -> None:
    for project in w.entries(root, ""):
        if not project.is_dir(follow_symlinks=False):
            if project.name.endswith(".md"):
                w.skip(project.name, "not-allowlisted", f"{_display(project.name)} is not inside "
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
                           f"{_display(shown)} is a symbolic link or junction; not followed")
                elif entry.is_dir(follow_symlinks=False):
                    mem = w.subdir(proj, entry.name, shown)
                    if mem is not None:
                        try:
                            _walk_flat(w, mem, f"{shown}/", f"{project.name}/", "memory")
                        finally:
                            close(mem)
        finally:
            close(proj)


def _walk_markdown(w: _Walker, handle: Handle, rel: str = "", depth: int = 0) -> None:
    listing = w.listing(handle, rel)
    plain = allowlist.plain(KIND_MARKDOWN, [rel + e.name for e in listing if e.name.endswith(".md")])
    for entry in w.entries(handle, rel, listing):
        shown = f"{rel}{entry.name}"
        if entry.is_dir(follow_symlinks=False):
            if depth + 1 >= allowlist.MARKDOWN_MAX_PARTS:
                w.skip(shown, "too-deep", f"{_display(shown)} is more than four folder levels "
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
    walker = _Walker(spec, limits, previous, on_read)
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
