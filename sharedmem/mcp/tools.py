"""The four tools over the cache as plain functions returning JSON-able dicts (MCP and CLI share them).

Bad arguments raise a SharedMemoryError whose message says what was wrong and what to try; the MCP
loop turns that into an `isError` result, the CLI into a message and an exit code.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import stat
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from sharedmem.cache.cache import Cache, FileTable, Manifest
from sharedmem.cache.layout import CacheFiles
from sharedmem.core import CacheError, LimitError, PathRuleError, ProtocolError
from sharedmem.rules import path_problems

Submit = Callable[[str, str], dict[str, Any]]
LIST_DEFAULT, LIST_MAX = 200, 2000
READ_DEFAULT, READ_MAX = 400, 2000
SEARCH_DEFAULT, SEARCH_MAX = 50, 200
MAX_QUERIES, QUERY_MAX_CHARS = 16, 1000
RESULT_MAX_BYTES = 256 * 1024  # text in one result (UTF-8): lines, paths, queries
__all__ = ["TOOLS", "add_ad_hoc_note", "cached_bytes", "call", "cut_text", "format_text",
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
        raise ProtocolError(
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
        raise LimitError(f"{name} must be between {low} and {high}, not {value}")
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
    problems = path_problems(path, folder=True)
    if problems:
        raise PathRuleError("; ".join(problems) + ": use a path from list, e.g. 'machines'")
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
    `next_char_offset` for the rest of a cut line).
    """
    from sharedmem.cache.search import provenance
    _check_file_path(path)
    start = _number(line_offset, "line_offset", 1, 1, 2**31)
    count = _number(max_lines, "max_lines", READ_DEFAULT, 1, READ_MAX)
    skip = _number(char_offset, "char_offset", 0, 0, 2**31)
    manifest = _intact(cache)
    text = _read_cached(cache, path).decode("utf-8", "replace")
    lines = text.split("\n")
    if text.endswith("\n"):
        lines.pop()
    total = len(lines)
    if start > max(total, 1):
        raise LimitError(f"line_offset {start} is past the end of {path!r}, which has {total} "
                         "lines: start at 1")
    first = lines[start - 1].rstrip("\r")
    if skip > len(first):
        raise LimitError(f"char_offset {skip} is past the end of line {start} of {path!r}, "
                         f"which has {len(first)} characters: pass next_char_offset unchanged")
    window, cut = _window([first[skip:]] + [line.rstrip("\r") for line in
                                             lines[start:start - 1 + count]], RESULT_MAX_BYTES)
    end = start - 1 + len(window) - (cut is not None)
    more = end < total
    return {"path": path, "line_offset": start, "char_offset": skip, "lines": window,
            "total_lines": total, "truncated": more,
            "next_offset": end + 1 if more else None,
            "next_char_offset": None if cut is None else skip + cut,
            "capped": cut is not None or (more and len(window) < count),
            **provenance(manifest, path)}


def cached_bytes(cache: Cache, path: str) -> bytes:
    """A cached file's bytes by its published path, as `read` opens it (MCP resources too).

    The path rule first, then CacheFiles, which follows no link: PathRuleError names the path
    and says what to do when it breaks the rule, is not in the cache, or is a link or a FIFO.
    """
    _check_file_path(path)
    return _read_cached(cache, path)


def _check_file_path(path: str) -> None:
    problems = path_problems(path)
    if problems:
        raise PathRuleError("; ".join(problems) + ": pass a .md path from list or search")


def _read_cached(cache: Cache, path: str) -> bytes:
    with CacheFiles(cache.root) as disk:
        data = disk.read(path)
    if data is None:
        raise PathRuleError(f"no file {path!r} in the cache: use list or search to find "
                            "published paths")
    return data


def _window(lines: list[str], budget: int) -> tuple[list[str], int | None]:
    """The lines that fit in `budget` bytes of UTF-8, and where the last one was cut (if it was).

    Whole lines while they fit; a line too long is cut at a character only when it comes
    first, so a window always moves on.
    """
    out: list[str] = []
    for line in lines:
        size = len(line) if len(line) > budget else _size(line)
        if size <= budget:
            out.append(line)
            budget -= size
            continue
        if not out:
            out.append(cut_text(line, budget))
            return out, len(out[0])
        break
    return out, None


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
        raise LimitError(f"queries must be a list of 1 to {MAX_QUERIES} strings, e.g. "
                         "[\"release\"]")
    for query in queries:
        if not isinstance(query, str) or not query or len(query) > QUERY_MAX_CHARS:
            raise LimitError(f"each query must be a non-empty string of at most "
                             f"{QUERY_MAX_CHARS} characters, not {query!r}")
        if "\n" in query or "\r" in query:
            raise LimitError(f"query {query!r} contains a line break: lines are matched one at "
                             "a time, so search for one line's text (or pass several queries)")
        if normalized and not normalize(query).strip():
            raise LimitError(f"query {query!r} is empty once normalized: search for letters")
    mode = match_mode or "any"
    if mode not in ("any", "all"):
        raise LimitError(f"match_mode must be 'any' or 'all', not {mode!r}")
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
        raise ProtocolError("cursor is damaged: omit it to start the search again")
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


def add_ad_hoc_note(filename: str, note: str, submit: Submit) -> dict[str, Any]:
    """Check and redact a note, then hand it to `submit`, which queues it in the outbox.

    MCP's submit starts the delivery in the background and answers at once; the CLI's `note`
    delivers before it answers.
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


def call(name: str, arguments: dict[str, Any], cache: Cache, submit: Callable[[], Submit],
         freshness: Callable[[], dict[str, Any]] | None = None) -> dict[str, Any]:
    """Check `arguments` against the tool's input schema, then run it.

    `freshness` says how fresh the cache is, for `list` of the top level.
    """
    spec = next((t for t in TOOLS if t["name"] == name), None)
    if spec is None:
        raise ProtocolError(f"unknown tool {name!r}: use list, read, search or add_ad_hoc_note")
    schema = spec["inputSchema"]
    for key, value in arguments.items():
        prop = schema["properties"].get(key)
        if prop is None:
            raise ProtocolError(f"{name} has no argument {key!r}; it takes "
                                f"{', '.join(schema['properties'])}")
        kind = _TYPES[prop["type"]]
        bad = not isinstance(value, kind) or (kind is int and isinstance(value, bool))
        if bad or (kind is list and not all(isinstance(v, str) for v in value)):
            raise ProtocolError(f"argument {key!r} of {name} must be "
                                f"{_ARTICLES[prop['type']]}, "
                                f"not {json.dumps(value)[:80]}")
        problem = _unicode_problem(value)
        if problem:
            raise ProtocolError(f"argument {key!r} of {name} is not valid UTF-8 text: {problem} "
                                "(from a JSON escape such as \\ud800 that is not half of a pair, "
                                "or from bytes that are not UTF-8): send it as UTF-8")
    missing = [k for k in schema.get("required", []) if k not in arguments]
    if missing:
        raise ProtocolError(f"{name} needs the argument {missing[0]!r}: "
                            f"{schema['properties'][missing[0]]['description']}")
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
        rows.insert(0, f"# {result['path']} ({result['total_lines']} lines, from "
                       f"{result['machine'] or '?'}/{result['source'] or '?'})")
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
     "asks to remember something. Notes are append-only and credentials are redacted. The note "
     "is queued on this machine and delivered to the server in the background (usually within "
     "seconds); the result gives the path where it can then be read. If the server is "
     "unreachable it stays queued and the next sync delivers it.",
     "annotations": {"title": "Add a shared memory note", "readOnlyHint": False,
                     "destructiveHint": False, "idempotentHint": False, "openWorldHint": False},
     "inputSchema": _obj({"filename": _prop("string", "YYYY-MM-DDTHH-MM-SS-<slug>.md with a "
                                            "lower-case slug, e.g. "
                                            "2026-01-31T09-30-00-release-checklist.md"),
                          "note": _prop("string", "the note's Markdown text, at most 64 KiB")},
                         ("filename", "note"), closed=True),
     "outputSchema": _obj({
         "status": {"type": "string", "description": "'queued': waiting on this machine for "
                    "its delivery; 'stored': the server has it"},
         "filename": {"type": "string"}, "note_id": {"type": "string"},
         "path": {"type": "string", "description": "where the note can be read (read, list) "
                  "once it is delivered"},
         "delivery": {"type": "string", "description": "'started', 'already running' (that "
                      "delivery takes this note too) or 'not started' (the next sync "
                      "delivers it)"},
         "message": {"type": "string"}, "redactions": _ANY}, ("status",))},
]
