"""The four tools over the cache as plain functions returning JSON-able dicts (MCP and CLI share them).

Bad arguments raise a SharedMemoryError whose message says what was wrong and what to try; the MCP
loop turns that into an `isError` result, the CLI into a message and an exit code.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import stat
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, BinaryIO

from sharedmem.cache.cache import Cache, Manifest
from sharedmem.cache.layout import CacheFiles
from sharedmem.cache.manifest_store import FileTable
from sharedmem.core import CacheError, PathRuleError, ToolArgumentError
from sharedmem.rules import MAX_PATH_BYTES, NOTE_FILE_MAX_BYTES, NOTES_DIR, path_problems

NOTE_WAIT = 10  # seconds add_ad_hoc_note waits for the server to store a note (its description)

Submit = Callable[[str, str], dict[str, Any]]
LIST_DEFAULT, LIST_MAX = 200, 2000
READ_DEFAULT, READ_MAX = 400, 2000
SEARCH_DEFAULT, SEARCH_MAX = 50, 200
MAX_QUERIES, QUERY_MAX_CHARS = 16, 1000
RESULT_MAX_BYTES = 256 * 1024  # text in one result (UTF-8): lines, paths, queries
__all__ = ["TOOLS", "add_ad_hoc_note", "cached_head", "call", "cut_text", "format_text",
           "list_files", "read_file", "search"]


def _encode_cursor(data: dict[str, Any]) -> str:
    raw = json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return base64.urlsafe_b64encode(raw).decode("ascii")


def _decode_cursor(cursor: str, fingerprint: str) -> dict[str, Any]:
    """The cursor's payload, refused unless this tool made it for this same request."""
    try:
        data = json.loads(base64.urlsafe_b64decode(cursor.encode("ascii")))
    except (ValueError, UnicodeError, binascii.Error):
        data = None
    if not isinstance(data, dict) or data.get("f") != fingerprint:
        raise ToolArgumentError(
            "cursor is not valid for this request: pass back the next_cursor of the previous "
            "page unchanged with the same other arguments, or omit cursor to start again"
        )
    return data


def _fingerprint(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, ensure_ascii=False).encode("utf-8")).hexdigest()[:16]


def _number(value: int | None, name: str, default: int, low: int, high: int) -> int:
    if value is None:
        return default
    if not low <= value <= high:
        raise ToolArgumentError(f"{name} must be between {low} and {high}, not {value}")
    return value


REPAIRING = ("the cache is being repaired: run `shared_memory.py sync` (or wait for the next "
             "scheduled sync)")


def _intact(cache: Cache) -> Manifest:
    """The cache's manifest; a damaged one is refused, so no tool answers from it wrongly.

    The next sync rebuilds it from the files and the server (Cache.damage).
    """
    manifest = cache.load(verify=True)
    if cache.damage is not None:
        raise CacheError(f"{REPAIRING}; {cache.damage}")
    return manifest


def _folder(disk: CacheFiles, path: str | None) -> str:
    """A validated folder path ('' for the root), refused if it breaks the rule or is a link."""
    if path in (None, "", "."):
        return ""
    assert isinstance(path, str)
    path = path.rstrip("/")
    _check_path(path, "use a path from list, e.g. 'machines'", folder=True)
    disk.folder(path)
    return path


def _modified(disk: CacheFiles, relpath: str) -> str | None:
    """When the cache wrote the file; None for a missing file or a link (never followed)."""
    info = disk.stat(relpath)
    if info is None or stat.S_ISLNK(info.st_mode):
        return None
    return datetime.fromtimestamp(info.st_mtime, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def list_files(cache: Cache, path: str | None = None, cursor: str | None = None,
               max_results: int | None = None,
               freshness: Callable[[], dict[str, Any]] | None = None) -> dict[str, Any]:
    """Files and folders directly under `path` (not recursive), in name order, one page.

    A page of the top level also says how fresh the cache is, when `freshness` can tell
    (client/status.py: last sync, last attempt, notes waiting, a background sync).
    """
    with CacheFiles(cache.root) as disk:
        folder = _folder(disk, path)
        result = _list(cache, disk, folder, cursor, max_results)
    if not folder and freshness is not None:
        result["freshness"] = freshness()
    return result


def _list(cache: Cache, disk: CacheFiles, folder: str, cursor: str | None,
          max_results: int | None) -> dict[str, Any]:
    """One page of list_files, its folder checked, modified times read through `disk`."""
    from sharedmem.cache.search import provenance
    limit = _number(max_results, "max_results", LIST_DEFAULT, 1, LIST_MAX)
    offset = _decode_cursor(cursor, _fingerprint("list", folder))["o"] if cursor else 0
    manifest = _intact(cache)
    prefix = folder + "/" if folder else ""
    files: dict[str, str] = {}
    folders: dict[str, list[int]] = {}
    listed = manifest.files
    rows = listed.sizes(prefix) if isinstance(listed, FileTable) else (
        (p, m.size) for p, m in sorted(listed.items()) if p.startswith(prefix))
    cut = len(prefix)
    for relpath, size in rows:  # only those below the folder, as two values each
        head, sep, _ = relpath[cut:].partition("/")
        if sep:
            entry = folders.setdefault(head, [0, 0])
            entry[0] += 1
            entry[1] += size
        else:
            files[head] = relpath
    if folder and not files and not folders:
        if folder in manifest.files:
            raise PathRuleError(f"{folder!r} is a file, not a folder: use read to open it")
        raise PathRuleError(f"no folder {folder!r} in the cache: call list without a path to "
                            "see the top level")
    names = sorted(set(files) | set(folders))
    entries: list[dict[str, Any]] = []
    budget = RESULT_MAX_BYTES
    for name in names[offset:offset + limit]:
        budget -= _size(name) + _size(prefix + name)
        if entries and budget < 0:
            break
        if name in folders:
            entries.append({"name": name, "path": prefix + name, "type": "folder",
                            "files": folders[name][0], "size": folders[name][1]})
        else:
            relpath = files[name]
            entries.append({"name": name, "path": relpath, "type": "file",
                            "size": manifest.files[relpath].size,
                            "modified": _modified(disk, relpath),
                            **provenance(manifest, relpath)})
    end = offset + len(entries)
    result: dict[str, Any] = {
        "path": folder, "entries": entries, "total": len(names),
        "next_cursor": _encode_cursor({"f": _fingerprint("list", folder), "o": end})
        if end < len(names) else None,
        "capped": end < len(names) and len(entries) < limit,
    }
    if not manifest.files:
        result["hint"] = "the cache is empty: run `shared_memory.py sync --config PATH` first"
    return result


def read_file(cache: Cache, path: str, line_offset: int | None = None,
              max_lines: int | None = None, char_offset: int | None = None) -> dict[str, Any]:
    """A window of a cached file's lines with its provenance, and where the next window starts.

    The window holds at most RESULT_MAX_BYTES of text: it stops before the line that would pass
    that, or cuts a first line longer than that, and says where to go on (`next_offset`, and
    `next_char_offset` for the rest of a cut line). The file is streamed once: what is held
    is the window, not the file. A note also says whose entries it holds (`note_origin`).
    """
    from sharedmem.cache.search import provenance
    _check_file_path(path)
    start = _number(line_offset, "line_offset", 1, 1, 2**31)
    count = _number(max_lines, "max_lines", READ_DEFAULT, 1, READ_MAX)
    skip = _number(char_offset, "char_offset", 0, 0, 2**31)
    manifest = _intact(cache)
    window = _Window(path, start, skip, count, RESULT_MAX_BYTES)
    with CacheFiles(cache.root) as disk:
        stream = disk.open(path)
        if stream is None:
            raise _not_cached(path)
        with stream:
            window.scan(stream)
        origin = note_origin(disk, path) if path.startswith(NOTES_DIR + "/") else None
    total = window.total
    if start > max(total, 1):
        raise ToolArgumentError(f"line_offset {start} is past the end of {path!r}, which has "
                                f"{total} lines: start at 1")
    end = start - 1 + len(window.lines) - (window.cut is not None)
    more = end < total
    result = {"path": path, "line_offset": start, "char_offset": skip, "lines": window.lines,
              "total_lines": total, "truncated": more,
              "next_offset": end + 1 if more else None,
              "next_char_offset": None if window.cut is None else skip + window.cut,
              "capped": window.cut is not None or (more and len(window.lines) < count),
              **provenance(manifest, path)}
    if origin is not None:
        result["machine"] = ", ".join(origin["machines"]) or None
        result["note_origin"] = origin
    return result


class _Window:
    """Lines `start`.. of a file read in chunks, as `read` shows them, and how many lines it has.

    Lines end at LF (CRs before it are dropped) and are decoded as UTF-8 with U+FFFD for what
    is not, as the whole text would be: an LF byte is never part of another character, so a
    decoder that has just taken one holds nothing back. Lines before the window and after it
    are only counted; of a line in it, only the characters that could still fit are kept, so a
    40 MiB file (or a 40 MiB line) costs a chunk, not 40 MiB.
    """

    CHUNK = 256 * 1024

    def __init__(self, path: str, start: int, skip: int, count: int, budget: int) -> None:
        import codecs
        self.path, self.start, self.skip, self.count = path, start, skip, count
        self.budget = budget  # bytes of UTF-8 the window may still take
        self.lines: list[str] = []
        self.cut: int | None = None  # where the window's one line was cut, if it was
        self.line = 1  # the number of the line being read
        self.open = True  # lines are still taken
        self.total = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._begin()

    def scan(self, stream: BinaryIO) -> None:
        """Read the whole stream; then `lines`, `cut` and `total` hold the answer."""
        newlines, last = 0, b""
        while chunk := stream.read(self.CHUNK):
            newlines += self._feed(chunk)
            last = chunk[-1:]
        if last != b"\n":  # the text after the last LF (or an empty file) is a line too
            newlines += 1
            if self._taking():
                self._take(self._decoder.decode(b"", True))
                self._end_line()
        self.total = newlines

    def _taking(self) -> bool:
        return self.open and self.line >= self.start

    def _feed(self, data: bytes) -> int:
        """Take one chunk; the LFs in it."""
        pos = seen = 0
        if not self._taking():
            rest = data.count(b"\n")
            need = self.start - self.line if self.open else rest + 1
            if rest < need:
                self.line += rest
                return rest
            for _ in range(need):  # only in the chunk where the window starts
                pos = data.index(b"\n", pos) + 1
            self.line += need
            seen = need
        end = data.rfind(b"\n", pos)
        if end < 0:
            self._take(self._decoder.decode(data[pos:]))
            return seen
        parts = self._decoder.decode(data[pos:end + 1]).split("\n")
        parts.pop()  # what follows the last LF
        for done, part in enumerate(parts, 1):
            if self._chars:
                self._take(part)
                self._end_line()
            else:
                self._end_line(part)
            if not self.open:  # the rest of the chunk is only counted
                self.line += len(parts) - done
                return seen + len(parts)
        self._take(self._decoder.decode(data[end + 1:]))
        return seen + len(parts)

    def _begin(self) -> None:
        """Start a line that comes in parts: none of it taken yet."""
        self._chars = self._crs = 0  # characters so far; CRs at their end
        self._kept: list[str] = []

    def _keep(self) -> tuple[int, int]:
        """Which characters of the line to keep: from the first, at most how many.

        The first line of the window starts at `skip`; one character more than fits the budget
        tells that the line does not fit.
        """
        return (self.skip if self.line == self.start else 0), self.budget + 1

    def _take(self, text: str) -> None:
        """Take the next part of a line that comes in more than one."""
        if not text:
            return
        bare = text.rstrip("\r")
        self._crs = self._crs + len(text) if not bare else len(text) - len(bare)
        first, most = self._keep()
        low, high = first - self._chars, first + most - self._chars
        if high > 0 and low < len(text):
            self._kept.append(text[max(0, low):high])
        self._chars += len(text)

    def _end_line(self, whole: str | None = None) -> None:
        """A line is complete (`whole`, when it came in one part): in the window if it fits."""
        first, most = self._keep()
        if whole is None:
            length = self._chars - self._crs  # without the CRs at its end
            text = "".join(self._kept)[:max(0, length - first)]
            self._begin()
        else:
            whole = whole.rstrip("\r")
            length = len(whole)
            text = whole[first:first + most] if first or length >= most else whole
        if first > length:
            raise ToolArgumentError(
                f"char_offset {first} is past the end of line {self.line} of {self.path!r}, "
                f"which has {length} characters: pass next_char_offset unchanged")
        size = len(text) if len(text) > self.budget else _size(text)
        if length - first < most and size <= self.budget:
            self.lines.append(text)
            self.budget -= size
        elif not self.lines:  # a first line too long: cut at a character, so a window moves on
            self.lines.append(cut_text(text, self.budget))
            self.cut = len(self.lines[0])
            self.open = False
        else:
            self.open = False
        if len(self.lines) == self.count:
            self.open = False
        self.line += 1


def cached_head(cache: Cache, path: str, most: int) -> tuple[bytes, int]:
    """The first `most` bytes of a cached file by its published path, and its size (resources).

    Opened as `read` opens it: the path rule, then CacheFiles, which follows no link.
    PathRuleError names the path and what to do when it breaks the rule, is not in the cache,
    or is a link or a FIFO. Only the head is read, however large the file.
    """
    _check_file_path(path)
    with CacheFiles(cache.root) as disk:
        stream = disk.open(path)
        if stream is None:
            raise _not_cached(path)
        with stream:
            parts = []
            while most > 0 and (part := stream.read(most)):
                parts.append(part)
                most -= len(part)
            return b"".join(parts), os.fstat(stream.fileno()).st_size


def _check_file_path(path: str) -> None:
    _check_path(path, "pass a .md path from list or search")


def _check_path(path: str, fix: str, *, folder: bool = False) -> None:
    """Refuse a path that breaks the path rule; one too long is named by its size, not shown."""
    if len(path) > MAX_PATH_BYTES:
        raise PathRuleError(f"path is {len(path)} characters, longer than any published path "
                            f"({MAX_PATH_BYTES} bytes): {fix}")
    problems = path_problems(path, folder=folder)
    if problems:
        raise PathRuleError("; ".join(problems) + f": {fix}")


def _not_cached(path: str) -> PathRuleError:
    return PathRuleError(f"no file {path!r} in the cache: use list or search to find published "
                         "paths")


_NOTE_LINES = None  # compiled at the first note read: the server's headings and fences


def note_origin(disk: CacheFiles, path: str) -> dict[str, Any]:
    """Who added a cached note file's entries, and when, from the headings the server wrote.

    Only the server writes a line outside a fence (PROVENANCE.md), so a heading there names the
    machine that sent the entry; a text that looks like one is inside its fence. A file larger
    than a note file may be (not the server's rendering) is not read: its origin is unknown.
    """
    global _NOTE_LINES
    if _NOTE_LINES is None:
        import re
        _NOTE_LINES = re.compile(r"^(?:## ([0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z)"
                                 r" \u00b7 ([a-z0-9][a-z0-9._-]{0,62})|(`{3,}))$", re.MULTILINE)
    stream = disk.open(path)
    data = b""
    if stream is not None:
        with stream:
            data = stream.read(NOTE_FILE_MAX_BYTES + 1)
    origin: dict[str, Any] = {"entries": 0, "machines": [], "first_added_at": None,
                              "last_added_at": None}
    if len(data) > NOTE_FILE_MAX_BYTES:
        origin["unknown"] = (f"the file is larger than a note file may be ({NOTE_FILE_MAX_BYTES} "
                             "bytes), so it is not the server's rendering")
        return origin
    fence = None
    for match in _NOTE_LINES.finditer(data.decode("utf-8", "replace")):
        added, machine, ticks = match.groups()
        if fence is not None:
            fence = None if ticks == fence else fence
        elif ticks:
            fence = ticks
        else:
            origin["entries"] += 1
            origin["first_added_at"] = origin["first_added_at"] or added
            origin["last_added_at"] = added
            if machine not in origin["machines"]:
                origin["machines"].append(machine)
    return origin


def _size(text: str) -> int:
    """Bytes of `text` as UTF-8, what the result cap counts."""
    return len(text.encode("utf-8", "surrogatepass"))


def cut_text(text: str, budget: int) -> str:
    """The longest start of `text` whose UTF-8 is at most `budget` bytes: whole characters.

    Python strings index characters, so no cut falls inside a UTF-8 sequence or between the
    halves of a surrogate pair that JSON would write for a character beyond U+FFFF.
    """
    head = text[:budget]  # every character is at least one byte: nothing longer can fit
    data = head.encode("utf-8", "surrogatepass")
    if len(data) <= budget:
        return head
    end = budget
    while data[end] & 0xC0 == 0x80:  # a continuation byte: back to its character's first
        end -= 1
    return data[:end].decode("utf-8", "surrogatepass")


def search(cache: Cache, queries: list[str], match_mode: str | None = None,
           path: str | None = None, cursor: str | None = None, context_lines: int | None = None,
           case_sensitive: bool | None = None, normalized: bool | None = None,
           max_results: int | None = None) -> dict[str, Any]:
    """Lines containing the queries as substrings, most relevant files first, one page."""
    from sharedmem.cache.folding import normalize
    from sharedmem.cache.search import Query, searcher
    if not isinstance(queries, list) or not 1 <= len(queries) <= MAX_QUERIES:
        raise ToolArgumentError(f"queries must be a list of 1 to {MAX_QUERIES} strings, e.g. "
                                "[\"release\"]")
    problems = [_query_problem(number, query, normalize if normalized else None)
                for number, query in enumerate(queries, 1)]
    mode = match_mode or "any"
    if mode not in ("any", "all"):
        problems.append(f"match_mode must be 'any' or 'all', not {mode!r:.40}")
    if any(problems):
        raise ToolArgumentError("; ".join(filter(None, problems)))
    with CacheFiles(cache.root) as disk:
        folder = _folder(disk, path)
    query = Query(list(queries), mode, folder or None,
                  True if case_sensitive is None else case_sensitive, bool(normalized),
                  _number(context_lines, "context_lines", 0, 0, 10))
    limit = _number(max_results, "max_results", SEARCH_DEFAULT, 1, SEARCH_MAX)
    fingerprint = _fingerprint("search", query.queries, mode, folder, query.case_sensitive,
                               query.normalized)
    after = _decode_cursor(cursor, fingerprint)["k"] if cursor else None
    # (path, line), or with several queries in `any` mode (-queries matched, path, line).
    shape = (int, str, int) if len(query.queries) > 1 and mode == "any" else (str, int)
    if after is not None and not (isinstance(after, list) and len(after) == len(shape) and all(
            type(v) is t for v, t in zip(after, shape, strict=True))):
        raise ToolArgumentError("cursor is damaged: omit it to start the search again")
    budget = RESULT_MAX_BYTES - sum(map(_size, query.queries))
    damage = cache.check(verify=False)  # the search reads its texts from its index
    if damage is not None:
        raise CacheError(f"{REPAIRING}; {damage}")
    found = searcher(cache)
    results, last = found.search(query, after, limit, budget)
    note = found.index.read_only  # a read-only cache: how its index was (not) used
    return {"queries": query.queries, "match_mode": mode, "path": folder, "results": results,
            "next_cursor": _encode_cursor({"f": fingerprint, "k": last}) if last else None,
            "capped": last is not None and len(results) < limit, **({"note": note} if note else {})}


def _query_problem(number: int, query: object,
                   normalize: Callable[[str], str] | None) -> str | None:
    """What is wrong with one search query, or None.

    It names the query by number and size, never repeating it whole, so an error stays far
    below one result's cap.
    """
    if not isinstance(query, str) or not query:
        return f"query {number} is empty or not a string: pass non-empty strings"
    if len(query) > QUERY_MAX_CHARS:
        return (f"query {number} is {len(query)} characters, over the {QUERY_MAX_CHARS} a query "
                "may have: search for a shorter part of the line")
    if "\n" in query or "\r" in query:
        return (f"query {number} ({query[:40]!r}...) contains a line break: lines are matched "
                "one at a time, so search for one line's text (or pass several queries)")
    if normalize is not None and not normalize(query).strip():
        return f"query {number} ({query[:40]!r}) is empty once normalized: search for letters"
    return None


def add_ad_hoc_note(filename: str, note: str, submit: Submit) -> dict[str, Any]:
    """Check and redact a note, then hand it to `submit`, which queues and delivers it.

    MCP's submit (`note.add_note`) starts a delivery of its own and waits, bounded, until the
    cache shows the note; the CLI's (`note.submit_note`) delivers it in its own process.
    """
    from sharedmem.redact.redactor import redact_note
    text, counts = redact_note(filename, note)
    outcome = dict(submit(filename, text))
    outcome.setdefault("filename", filename)
    outcome["redactions"] = {kind: n for kind, n in sorted(counts.items()) if n}
    return outcome


_TYPES = {"string": str, "integer": int, "boolean": bool, "array": list}
_ARTICLES = {"string": "a string", "integer": "an integer", "boolean": "true or false",
             "array": "a list of strings"}


def _unicode_problem(value: object) -> str | None:
    """Where a string (or a list's string) holds a lone surrogate, which no UTF-8 text can.

    JSON escapes can carry one; refused here, it cannot fail later where the text is encoded.
    """
    texts = value if isinstance(value, list) else [value] if isinstance(value, str) else []
    for number, text in enumerate(texts, 1):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            where = f"string {number} holds" if isinstance(value, list) else "it holds"
            return (f"{where} a lone surrogate (U+{ord(text[exc.start]):04X}) at character "
                    f"{exc.start}")
    return None


def check_arguments(name: str, arguments: dict[str, Any]) -> None:
    """Check `arguments` against the tool's input schema: every problem, raised once.

    ToolArgumentError for an unknown argument, a value of the wrong type or not UTF-8 text,
    and a required one left out; the MCP server reports it as the negotiated revision says.
    """
    spec = next((t for t in TOOLS if t["name"] == name), None)
    if spec is None:
        raise ToolArgumentError(f"unknown tool {name!r:.80}: use list, read, search or "
                                "add_ad_hoc_note")
    schema = spec["inputSchema"]
    problems = []
    for key, value in arguments.items():
        prop = schema["properties"].get(key)
        if prop is None:
            problems.append(f"{name} has no argument {key!r:.80}; it takes "
                            f"{', '.join(schema['properties'])}")
            continue
        kind = _TYPES[prop["type"]]
        bad = not isinstance(value, kind) or (kind is int and isinstance(value, bool))
        if bad or (kind is list and not all(isinstance(v, str) for v in value)):
            problems.append(f"argument {key!r} of {name} must be {_ARTICLES[prop['type']]}, "
                            f"not {json.dumps(value)[:80]}")
        elif problem := _unicode_problem(value):
            problems.append(f"argument {key!r} of {name} is not valid UTF-8 text: {problem} "
                            "(from a JSON escape such as \\ud800 that is not half of a pair, "
                            "or from bytes that are not UTF-8): send it as UTF-8")
    problems += [f"{name} needs the argument {key!r}: {schema['properties'][key]['description']}"
                 for key in schema.get("required", []) if key not in arguments]
    if problems:
        raise ToolArgumentError("; ".join(problems))


def call(name: str, arguments: dict[str, Any], cache: Cache, submit: Callable[[], Submit],
         freshness: Callable[[], dict[str, Any]] | None = None) -> dict[str, Any]:
    """Check `arguments` against the tool's input schema, then run it.

    `freshness` says how fresh the cache is, for `list` of the top level.
    """
    check_arguments(name, arguments)
    if name == "list":
        return list_files(cache, **arguments, freshness=freshness)
    if name == "read":
        return read_file(cache, **arguments)
    if name == "search":
        return search(cache, **arguments)
    return add_ad_hoc_note(arguments["filename"], arguments["note"], submit())


def format_text(tool: str, result: dict[str, Any]) -> str:
    """Readable output of a tool's result, for people at a terminal."""
    if tool == "list":
        rows = [f"{e['path']}/  ({e['files']} files, {e['size']} bytes)" if e["type"] == "folder"
                else f"{e['path']}  {e['size']} bytes  {e.get('modified') or ''}"
                for e in result["entries"]]
        rows.extend([result["hint"]] if result.get("hint") else [])
        rows.extend([result["freshness"]["summary"]] if result.get("freshness") else [])
    elif tool == "read":
        first = result["line_offset"]
        rows = [f"{first + i:>6}  {line}" for i, line in enumerate(result["lines"])]
        rows.insert(0, f"# {result['path']} ({result['total_lines']} lines, {_origin(result)})")
        if result["truncated"]:
            rows.append(f"... more from line {result['next_offset']}" + (
                f", character {result['next_char_offset']} (--char-offset)"
                if result.get("next_char_offset") is not None else ""))
    elif tool == "search":
        rows = []
        for hit in result["results"]:
            number = hit["line_number"]
            for i, line in enumerate(hit["context_before"]):
                rows.append(f"{hit['path']}-{number - len(hit['context_before']) + i}-{line}")
            rows.append(f"{hit['path']}:{number}:{hit['line']}")
            rows.extend(f"{hit['path']}-{number + 1 + i}-{line}"
                        for i, line in enumerate(hit["context_after"]))
        rows = (rows or ["no matches"]) + ([f"({result['note']})"] if result.get("note") else [])
    else:
        rows = [f"note {result.get('filename')}: {result.get('status', 'done')}"
                + (f" at {result['path']}" if result.get("path") else "")]
        rows.extend([result["message"]] if result.get("message") else [])
        rows.extend(f"redacted {n} {kind}" for kind, n in result.get("redactions", {}).items())
    if result.get("next_cursor"):
        rows.append(f"(more: --cursor {result['next_cursor']})")
    return "\n".join(rows)


def _origin(result: dict[str, Any]) -> str:
    """Where a read file came from, in words: a machine's source, or a note's entries."""
    note = result.get("note_origin")
    if note is None:
        return f"from {result['machine'] or '?'}/{result['source'] or '?'}"
    if not note["entries"]:
        return "a note whose entries' origin is unknown"
    when = note["first_added_at"] if note["entries"] == 1 else \
        f"{note['first_added_at']} to {note['last_added_at']}"
    return (f"a note of {note['entries']} entr{'y' if note['entries'] == 1 else 'ies'} from "
            f"{', '.join(note['machines'])}, added {when}")


def _prop(kind: str, description: str, **extra: Any) -> dict[str, Any]:
    return {"type": kind, "description": description, **extra}


def _obj(props: dict[str, Any], required: tuple[str, ...] = (), *,
         closed: bool = False) -> dict[str, Any]:
    out = {"type": "object", "properties": props, "required": list(required)}
    return {**out, "additionalProperties": False} if closed else out


_PROVENANCE = {k: {"type": ["string", "null"]} for k in ("machine", "source", "sha256", "synced_at")}
_NEXT = {"next_cursor": {"type": ["string", "null"]}}
_CAPPED = {"capped": {"type": "boolean", "description": "the result reached its 256 KiB of "
                      "text and ended early; go on from where it says"}}
_CURSOR = _prop("string", "next_cursor from the previous page; omit for the first page")
_FOLDER = "folder relative to the cache root, e.g. 'machines/laptop/codex'; omit for everything"
_ANY = {"type": "object"}
TOOLS: list[dict[str, Any]] = [
    {"name": "list", "title": "List shared memory",
     "description": "List the files and folders directly under a folder of the shared memory "
     "cache (not recursive), with size, modified time, machine and source. Start at the top "
     "level, which also says how fresh the cache is (freshness: last sync, a failed last "
     "attempt, notes waiting), then open machines/<machine>/<source>. Page with next_cursor "
     "(a page holds at most 256 KiB of names; capped says it ended there).",
     "annotations": {"title": "List shared memory", "readOnlyHint": True, "openWorldHint": False},
     "inputSchema": _obj({"path": _prop("string", _FOLDER), "cursor": _CURSOR,
                          "max_results": _prop("integer", "entries per page, 1-2000 (default 200)",
                                               minimum=1, maximum=LIST_MAX)}, closed=True),
     "outputSchema": _obj({"path": {"type": "string"}, "total": {"type": "integer"},
                           "entries": {"type": "array", "items": _ANY}, "hint": {"type": "string"},
                           "freshness": {"type": "object", "description": "top level only: "
                                         "last_sync, age, last_attempt, pending_notes, "
                                         "background_sync and a summary sentence"},
                           **_NEXT, **_CAPPED}, ("path", "entries", "total"))},
    {"name": "read", "title": "Read a shared memory file",
     "description": "Read lines of one Markdown file from the shared memory cache, with where it "
     "came from (machine, source, sha256, synced_at). Memory is reference data written earlier: "
     "verify it against the current state before acting on it. For long files, call again with "
     "line_offset=next_offset. A result holds at most 256 KiB of text: a window that reaches it "
     "ends early (capped true), and a longer line is cut at a character; then also pass "
     "char_offset=next_char_offset.",
     "annotations": {"title": "Read a shared memory file", "readOnlyHint": True,
                     "openWorldHint": False},
     "inputSchema": _obj({"path": _prop("string", "file path from list or search, e.g. "
                                        "'machines/laptop/codex/MEMORY.md'"),
                          "line_offset": _prop("integer", "first line to return, 1-based "
                                               "(default 1)", minimum=1),
                          "max_lines": _prop("integer", "lines to return, 1-2000 (default 400)",
                                             minimum=1, maximum=READ_MAX),
                          "char_offset": _prop("integer", "characters of the first line to "
                                               "skip, to go on with a line the size cap cut: "
                                               "pass next_char_offset (default 0)", minimum=0)},
                         ("path",), closed=True),
     "outputSchema": _obj({"path": {"type": "string"}, "line_offset": {"type": "integer"},
                           "char_offset": {"type": "integer"},
                           "lines": {"type": "array", "items": {"type": "string"}},
                           "total_lines": {"type": "integer"},
                           "truncated": {"type": "boolean",
                                         "description": "more of the file follows"},
                           "next_offset": {"type": ["integer", "null"]},
                           "next_char_offset": {"type": ["integer", "null"],
                                                "description": "set when the last line was "
                                                "cut: where it goes on"},
                           "note_origin": {"type": "object", "description": "a note "
                                           "only: its entries (count), machines, "
                                           "first_added_at and last_added_at, from the "
                                           "headings the server wrote"},
                           **_CAPPED, **_PROVENANCE},
                          ("path", "lines", "total_lines", "truncated"))},
    {"name": "search", "title": "Search shared memory",
     "description": "Find lines containing any of up to 16 substrings across the shared memory "
     "cache (with match_mode 'all', only in files that contain every query). Matching is by "
     "substring and case-sensitive by "
     "default; set case_sensitive false to ignore case, or normalized true to also ignore accents "
     "and Unicode forms. Files matching more of the queries come first, then by path, lines in "
     "order. Page with "
     "next_cursor; then read a file for the full text. Lines are cut at 1000 characters, and "
     "a page holds at most 256 KiB of text (capped true: fewer results, the rest next page).",
     "annotations": {"title": "Search shared memory", "readOnlyHint": True,
                     "openWorldHint": False},
     "inputSchema": _obj({
         "queries": _prop("array", "1-16 non-empty substrings, e.g. [\"deploy\", \"staging\"]",
                          items={"type": "string", "minLength": 1}, minItems=1,
                          maxItems=MAX_QUERIES),
         "match_mode": _prop("string", "'any' (default): lines matching any query; 'all': only "
                             "files containing every query", enum=["any", "all"]),
         "path": _prop("string", _FOLDER), "cursor": _CURSOR,
         "context_lines": _prop("integer", "lines of context before and after, 0-10 (default 0)",
                                minimum=0, maximum=10),
         "case_sensitive": _prop("boolean", "match case exactly (default true)"),
         "normalized": _prop("boolean", "ignore case, accents, Unicode form and repeated spaces "
                             "(a CRLF line's carriage return is no space; default false)"),
         "max_results": _prop("integer", "matching lines per page, 1-200 (default 50)", minimum=1,
                              maximum=SEARCH_MAX)}, ("queries",), closed=True),
     "outputSchema": _obj({"queries": {"type": "array", "items": {"type": "string"}},
                           "match_mode": {"type": "string"}, "path": {"type": "string"},
                           "results": {"type": "array", "items": _ANY}, **_NEXT, **_CAPPED,
                           "note": {"type": "string", "description": "set on a read-only cache: "
                                    "how its search index was used"}},
                          ("queries", "results"))},
    {"name": "add_ad_hoc_note", "title": "Add a shared memory note",
     "description": "Store a new note in the shared memory for every machine, ONLY when the user "
     "asks to remember something. Notes are append-only and credentials are redacted. The call "
     f"waits (at most {NOTE_WAIT:g} s) until the server has stored the note and this machine's "
     "cache shows it, then answers 'stored' with the path read finds it at. If the server does "
     "not answer in time the answer is 'queued': the note waits on this machine, and the "
     "message says what delivers it (the delivery still running, or the next sync).",
     "annotations": {"title": "Add a shared memory note", "readOnlyHint": False,
                     "destructiveHint": False, "idempotentHint": False, "openWorldHint": False},
     "inputSchema": _obj({"filename": _prop("string", "YYYY-MM-DDTHH-MM-SS-<slug>.md with a "
                                            "lower-case slug, e.g. "
                                            "2026-01-31T09-30-00-release-checklist.md"),
                          "note": _prop("string", "the note's Markdown text, at most 64 KiB")},
                         ("filename", "note"), closed=True),
     "outputSchema": _obj({
         "status": {"type": "string", "description": "'stored': the server has it (and, "
                    "unless message says otherwise, read finds it at path now); 'queued': it "
                    "waits on this machine for its delivery"},
         "filename": {"type": "string"}, "note_id": {"type": "string"},
         "path": {"type": "string", "description": "where read and list find the note"},
         "delivery": {"type": "string", "description": "'started', 'already running' (that "
                      "delivery takes this note too) or 'not started' (the next sync "
                      "delivers it)"},
         "message": {"type": "string"}, "redactions": _ANY}, ("status",))},
]
