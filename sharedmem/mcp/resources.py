"""MCP resources: each machine's memory entry files and the notes, and any cached file by its URI.

A resource's URI is `sharedmem://cache/<path>`, `<path>` being the file's published path (as
`list`, `read` and `search` name it) percent-encoded as RFC 3986 asks; `%2F` reads as `/`, so a
client that expands the template `sharedmem://cache/{path}` strictly reaches the same file.
`resources/list` offers the entry files (a codex namespace's `memory_summary.md` and `MEMORY.md`,
each claude-code project's `MEMORY.md`), then the notes; the template reaches any cached file.
A URI is read through the `read` tool's own code path (`tools.cached_head`: the path rule, then
CacheFiles, which follows no link) and gives at most `tools.RESULT_MAX_BYTES` of text, of which
only the head of the file is read: a longer file ends with a line that says where the `read`
tool goes on.
"""

from __future__ import annotations

import base64
import binascii
import codecs
import json
from typing import Any
from urllib.parse import quote

from sharedmem.cache.cache import Cache, Manifest
from sharedmem.core import CacheError, PathRuleError, ToolArgumentError
from sharedmem.mcp.tools import REPAIRING, RESULT_MAX_BYTES, cached_head, cut_text
from sharedmem.rules import NOTES_DIR, SOURCE_CLAUDE, SOURCE_CODEX, path_problems
from sharedmem.sources.allowlist import CODEX_FILES, CODEX_V2

SCHEME = "sharedmem://cache/"
TEMPLATE = SCHEME + "{path}"
MIME = "text/markdown"
PAGE = 100  # resources in one page of resources/list
CLAUDE_ENTRY = "MEMORY.md"  # the index Claude Code keeps in each project's memory folder
_HEX = frozenset("0123456789abcdefABCDEF")
_TITLED = "2025-06-18"  # the first revision whose resources and templates carry a title
_EXAMPLE = SCHEME + "machines/laptop/codex/MEMORY.md"


def uri_of(path: str) -> str:
    """The resource URI of a published path."""
    return SCHEME + quote(path, safe="/")


def list_resources(cache: Cache, cursor: object, version: str) -> dict[str, Any]:
    """One page of the entry files and notes, in that order, each group by path.

    The cursor names the last resource sent, so a sync between two pages neither repeats nor
    skips one that stayed. A page holds at most PAGE resources and RESULT_MAX_BYTES of text.
    """
    after = _decode_cursor(cursor) if cursor is not None else None
    manifest = cache.load(verify=True)
    if cache.damage is not None:
        raise CacheError(f"{REPAIRING}; {cache.damage}")
    rows = sorted(_offered(manifest))
    if after is not None:
        rows = [row for row in rows if (row[0], row[1]) > after]
    page: list[dict[str, Any]] = []
    budget = RESULT_MAX_BYTES
    for group, path, name, title, description, size in rows[:PAGE]:
        item = {"uri": uri_of(path), "name": name, "description": description,
                "mimeType": MIME, "size": size}
        if version >= _TITLED:
            item["title"] = title
        budget -= sum(len(str(v).encode("utf-8")) for v in item.values())
        if page and budget < 0:
            break
        page.append(item)
        last = (group, path)
    result: dict[str, Any] = {"resources": page}
    if len(page) < len(rows):
        result["nextCursor"] = _encode_cursor(last)
    return result


def _offered(manifest: Manifest) -> list[tuple[int, str, str, str, str, int]]:
    """(group, path, name, title, description, size) of each resource the list offers."""
    rows = []
    for path, meta in manifest.files.items():
        if meta.namespace == NOTES_DIR:
            filename = path.rpartition("/")[2]
            rows.append((1, path, f"notes/{filename}", f"Note {filename}",
                         "A note added with add_ad_hoc_note, shared by every machine "
                         "(append-only).", meta.size))
            continue
        ns = manifest.namespaces.get(meta.namespace)
        inner = path[len(meta.namespace) + 1:]
        if ns is None or not (
                ns.kind == SOURCE_CODEX and inner.removeprefix(CODEX_V2 + "/") in CODEX_FILES
                or ns.kind == SOURCE_CLAUDE and inner.count("/") == 1
                and inner.endswith("/" + CLAUDE_ENTRY)):
            continue
        where = ns.source if ns.kind == SOURCE_CODEX else f"{ns.source}/{inner.partition('/')[0]}"
        what = ("Codex memory summary" if inner.endswith("memory_summary.md") else
                "Codex memory index" if ns.kind == SOURCE_CODEX else "Claude Code memory index")
        if inner.startswith(CODEX_V2 + "/") and ns.kind == SOURCE_CODEX:
            what += " (memory version 2)"
        rows.append((0, path, path.partition("/")[2], f"{inner.rpartition('/')[2]} of "
                     f"{ns.machine} ({where})", f"{what} of machine {ns.machine}, synced "
                     f"{ns.synced_at or 'at an unknown time'}: reference data that may be out "
                     "of date.", meta.size))
    return rows


def templates(cursor: object, version: str) -> dict[str, Any]:
    """The one template: any cached file by its published path."""
    if cursor is not None:
        raise ToolArgumentError("invalid cursor: there is one page of resource templates; "
                                "omit cursor")
    template = {"uriTemplate": TEMPLATE, "name": "cached-file",
                "description": "Any Markdown file in the shared memory cache by its published "
                f"path (from the list or search tools), e.g. {_EXAMPLE}",
                "mimeType": MIME}
    if version >= _TITLED:
        template["title"] = "A shared memory file"
    return {"resourceTemplates": [template]}


def path_of(uri: object) -> str:
    """The published path a resource URI names; PathRuleError saying why it names none."""
    if not isinstance(uri, str):
        raise PathRuleError(f"uri must be a string such as {_EXAMPLE!r}, not {uri!r:.80}")
    try:
        uri.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise PathRuleError(f"uri holds a lone surrogate (U+{ord(uri[exc.start]):04X}) at "
                            f"character {exc.start}, which is not UTF-8 text: send it as "
                            "UTF-8") from None
    if uri[:len(SCHEME)].lower() != SCHEME:
        raise PathRuleError(f"uri {uri!r:.300} is not a shared memory resource: use a uri from "
                            f"resources/list, or {TEMPLATE} with a path from list or search")
    rest = uri[len(SCHEME):]
    if "?" in rest or "#" in rest:
        raise PathRuleError(f"uri {uri!r:.300} has a query or fragment, which no resource has: "
                            "leave out what follows ? or #")
    path = _unquote(rest, uri)
    problems = path_problems(path)
    if problems:
        raise PathRuleError(f"uri {uri!r:.300} names no cached file: " + "; ".join(problems))
    return path


def read(cache: Cache, uri: str, path: str) -> dict[str, Any]:
    """The file at `path` (from `uri`) as one text content, cut at RESULT_MAX_BYTES.

    PathRuleError when it is not in the cache, or is a link or a FIFO there; CacheError, as the
    tools give it, while the cache's manifest is damaged (a file may then not be the server's).
    """
    damage = cache.check()
    if damage is not None:
        raise CacheError(f"{REPAIRING}; {damage}")
    head, size = cached_head(cache, path, RESULT_MAX_BYTES + 1)
    whole = len(head) == size  # else the head is longer than can be shown: cut it
    text = codecs.getincrementaldecoder("utf-8")("replace").decode(head, whole)
    if not whole or len(text) > RESULT_MAX_BYTES // 4 and \
            len(text.encode("utf-8")) > RESULT_MAX_BYTES:
        text = _cut(text, path, size)
    return {"contents": [{"uri": uri, "mimeType": MIME, "text": text}]}


def _cut(text: str, path: str, size: int) -> str:
    """The whole lines of a long text that fit RESULT_MAX_BYTES, then where `read` goes on.

    A first line too long for that is cut at a character, as `read` cuts it.
    """
    marker = ("\n\n[shared memory: the rest of this {size}-byte file is not in this resource; "
              "the read tool goes on with path {path}, line_offset {line}{chars}]")
    longest = marker.format(size=size, path=json.dumps(path, ensure_ascii=False), line=2**31,
                            chars=f", char_offset {2**31}")
    head = cut_text(text, RESULT_MAX_BYTES - len(longest.encode("utf-8")))
    head = head[:head.rfind("\n") + 1] or head  # whole lines, unless the first is too long
    line = head.count("\n") + 1
    done = len(head) - head.rfind("\n") - 1  # characters of the cut line already sent
    return head + marker.format(size=size, path=json.dumps(path, ensure_ascii=False), line=line,
                                chars=f", char_offset {done}" if done else "")


def _unquote(text: str, uri: str) -> str:
    """Percent-decoding that refuses what is not RFC 3986: a stray `%`, escapes not UTF-8."""
    out = bytearray()
    i = 0
    while i < len(text):
        if text[i] != "%":
            j = text.find("%", i)
            j = len(text) if j < 0 else j
            out += text[i:j].encode("utf-8")
            i = j
            continue
        pair = text[i + 1:i + 3]
        if len(pair) != 2 or not set(pair) <= _HEX:
            raise PathRuleError(f"uri {uri!r:.300} has a '%' that is not followed by two hex "
                                "digits: write a '%' in a path as %25")
        out.append(int(pair, 16))
        i += 3
    try:
        return out.decode("utf-8")
    except UnicodeDecodeError:
        raise PathRuleError(f"uri {uri!r:.300}: its percent-escapes are not UTF-8: encode the "
                            "path's characters as UTF-8 bytes") from None


def _encode_cursor(last: tuple[int, str]) -> str:
    raw = json.dumps(["r", *last], ensure_ascii=False).encode("utf-8")
    return base64.urlsafe_b64encode(raw).decode("ascii")


def _decode_cursor(cursor: object) -> tuple[int, str]:
    """The last resource of the page before; ToolArgumentError unless resources/list made it."""
    try:
        data = json.loads(base64.urlsafe_b64decode(str(cursor).encode("ascii")))
    except (ValueError, UnicodeError, binascii.Error):
        data = None
    if not (isinstance(cursor, str) and isinstance(data, list) and len(data) == 3
            and data[0] == "r" and data[1] in (0, 1) and isinstance(data[2], str)):
        raise ToolArgumentError("invalid cursor: pass the nextCursor of the previous page "
                                "unchanged, or omit it to start again")
    return data[1], data[2]
