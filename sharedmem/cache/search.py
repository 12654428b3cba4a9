"""Substring search over the cache: answering a query, with the index only ever narrowing the scan.

A search asks the index (search_index.py) which files can possibly match and verifies every
candidate against the real file. When the index covers the manifest exactly (the same
`Cache.files_mark`), the manifest's file rows are never read: paths, sha256s and namespaces come
from the index. Otherwise the files whose indexed sha256 differs from the manifest's (or that the
index lacks) are always scanned, and a missing or broken index means a full scan, so results
never depend on the index. Only a missing, old or broken index makes a search start a refresh in
the background.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any, BinaryIO, NamedTuple

from sharedmem.cache.cache import Cache, Manifest, NamespaceInfo
from sharedmem.cache.folding import accented_keys, normalize
from sharedmem.cache.index_reader import Cut, IndexLost, IndexReader, regions
from sharedmem.cache.index_view import Named, Spots, View, walk_named
from sharedmem.cache.layout import CacheFiles
from sharedmem.cache.matching import Matcher
from sharedmem.cache.search_index import (
    being_written,
    index_version,
    read_cached,
    refresh_in_background,
)
from sharedmem.core import SharedMemoryError

LINE_CHARS = 1000
BACKGROUND_REFRESH = True  # a missing or broken index makes a search start `index --background`
_CLOSE = 10  # lines a result's context reaches back before the first line of a part read
_PARTS_ALONE = 8  # a file of fewer parts is read at once: reading parts alone costs more


class Query(NamedTuple):
    """One search, validated by the caller (tools.py); a named tuple, as dataclasses loads slowly."""

    queries: list[str]
    match_mode: str = "any"
    path: str | None = None
    case_sensitive: bool = True
    normalized: bool = False
    context_lines: int = 0


class _Page:
    """The results of one page, which ends at `limit` results or `max_bytes` of their text."""

    def __init__(self, query: Query, limit: int, max_bytes: int) -> None:
        self.query, self.limit = query, limit
        self.left = max_bytes
        self.results: list[dict[str, Any]] = []

    def room(self) -> int:
        """How many more results the page takes, at most."""
        return self.limit - len(self.results)

    def add(self, relpath: str, lines: _Lines, number: int, which: Iterable[int],
            origin: dict[str, Any]) -> bool:
        """Add the result for this line; False when the page has no room for it (it is full)."""
        if len(self.results) == self.limit:
            return False
        result = _result(self.query, relpath, lines, number, which, origin)
        cost = sum(len(t.encode("utf-8", "surrogatepass")) for t in (
            relpath, result["line"], *result["context_before"], *result["context_after"],
            *result["matched_queries"]))
        if self.results and cost > self.left:
            return False
        self.results.append(result)
        self.left -= cost
        return True


class Searcher:
    """Search over one cache; long-lived in the MCP server so the index and its view stay open."""

    def __init__(self, cache: Cache) -> None:
        self.cache = cache
        self.index = IndexReader(cache)
        self._view: View | None = None
        self._view_key: tuple[Any, ...] | None = None
        self._refreshed_for: str | None = None
        self.scanned = 0  # files the last search read: what the index spared shows here

    def search(self, query: Query, after: list[Any] | None, limit: int,
               max_bytes: int) -> tuple[list[dict[str, Any]], list[Any] | None]:
        """Up to `limit` results after the sort key `after`, and the key to resume from.

        A page also ends before the result that would take its text past `max_bytes` (see
        `_Page`); it always holds one result when there is one.
        """
        use_index, self.scanned = True, 0
        for _ in range(3):
            try:
                return self._search(query, after, limit, max_bytes, use_index)
            except IndexLost:  # scan without it; a damaged one is gone and rebuilt later
                self._view, self._view_key, use_index = None, None, False
            finally:
                self.index.end()
        raise AssertionError("unreachable: a search without the index does not lose it")

    def _search(self, query: Query, after: list[Any] | None, limit: int, max_bytes: int,
                use_index: bool) -> tuple[list[dict[str, Any]], list[Any] | None]:
        view = self._current(use_index)
        matcher = Matcher(query.queries, "normalized" if query.normalized else
                          "exact" if query.case_sensitive else "casefold")
        spans = view.scope(query.path)
        page = _Page(query, limit, max_bytes)
        with CacheFiles(self.cache.root) as disk:
            if len(query.queries) == 1 or query.match_mode == "all":
                return self._ordered(view, disk, page, matcher, spans, after)
            return self._ranked(view, disk, page, matcher, spans, after)

    def _current(self, use_index: bool) -> View:
        """The view for the cache and index as they are now, rebuilt only when either changed."""
        marks = self._marks()
        meta = self.index.begin() if use_index else None
        if use_index and (meta is None or meta.get("version") != index_version()):
            self._start_refresh(marks[1])
            meta = None
        key = (marks, self.index._identity, meta.get("generation") if meta else None,
               meta.get("version") if meta else None)
        if self._view is not None and self._view_key == key:
            return self._view
        view = None
        if meta and meta.get("manifest") and meta["manifest"] == marks[1]:
            namespaces = self._read_namespaces()
            if namespaces is not None:
                ids, owners, where = self.index.order(meta)
                view = View(self.index, ids, owners, None, None, namespaces, where)
        if view is None:
            view = self._from_manifest(meta is not None)
        self._view, self._view_key = view, key
        return view

    def _from_manifest(self, indexed: bool) -> View:
        """The slow way: the whole manifest, each file vouched for only at its sha256."""
        return View.of_manifest(self.index, self.cache.load(), indexed)

    def _marks(self) -> tuple[str | None, str | None]:
        """The manifest's commit and files marks: what tells a view or an index out of date."""
        try:
            meta = self.cache.store.meta() if self.cache.store.exists() else {}
        except SharedMemoryError:
            return None, None
        return meta.get("commit"), meta.get("files")

    def _read_namespaces(self) -> dict[str, NamespaceInfo] | None:
        """The manifest's namespaces; None when it cannot be read."""
        manifest = self.cache.load()
        return None if self.cache.damage is not None else manifest.namespaces

    def _start_refresh(self, mark: str | None) -> None:
        """No usable index: build it in the background, once for each manifest.

        Not on a read-only cache, where no refresh could write it, nor while a writer holds the
        index (a sync's background refresh, which makes it usable when it is done).
        """
        if mark is not None and self._refreshed_for != mark and self.index.read_only is None \
                and not being_written(self.cache):
            self._refreshed_for = mark
            if BACKGROUND_REFRESH:
                refresh_in_background(self.cache)  # meanwhile every file is scanned

    def _ordered(self, view: View, disk: CacheFiles, page: _Page, matcher: Matcher,
                 spans: list[range], after: list[Any] | None) -> tuple[list[dict[str, Any]],
                                                                       list[Any] | None]:
        """One query, or all of several: results in path and line order, read until full.

        The index is asked a chunk of positions at a time, so a page that fills within the
        first files asks about those alone. With several queries (`all`), a file is read when
        the index names each query in some part of it, however common each query alone is.
        """
        everything = page.query.match_mode == "all"
        named = _named(view, page.query, everything)
        last_path, last_line = (after[0], after[1]) if after else ("", 0)
        every = set(range(len(matcher.needles)))
        walk = walk_named(view, spans, named, len(named) if everything else 1, last_path,
                          page.room)
        for pos, relpath, spots in view.named(walk, page.room):
            found, rows, hits = self._read(view, disk, matcher, pos, relpath, spots, every,
                                            everything)
            if not found or everything and found != every:
                continue
            origin = _provenance(view.namespaces, *view.origin(pos, relpath))
            for number, which in hits:
                if relpath == last_path and number <= last_line:
                    continue
                if not page.add(relpath, rows, number, which, origin):
                    last = page.results[-1]
                    return page.results, [last["path"], last["line_number"]]
        return page.results, None

    def _ranked(self, view: View, disk: CacheFiles, page: _Page, matcher: Matcher,
                spans: list[range], after: list[Any] | None) -> tuple[list[dict[str, Any]],
                                                                      list[Any] | None]:
        """Several queries, any of them: files matching more of them first, then path order.

        Group m is the files holding exactly m of the k queries. It is walked in path order
        among the files the index names for at least m queries, each file read once to verify
        it, so a page stops reading as soon as it is full; no count over all files is needed
        first. A file read in an earlier group is read again only if it is in this one.
        """
        count = len(matcher.needles)
        every = set(range(count))
        named = _named(view, page.query, False)
        first, start, skip = (-after[0], after[1], after[2]) if after else (count, "", 0)
        held: dict[int, int] = {}  # file (owner) -> how many queries it holds, once read
        last: list[Any] | None = None  # the key of the last result on the page
        for group in range(first, 0, -1):
            walk = walk_named(view, spans, named, group, start if group == first else "")
            kept = ((p, s) for p, s in walk if held.get(view.owners[p], group) == group)
            for pos, relpath, spots in view.named(kept, page.room):
                found, rows, hits = self._read(view, disk, matcher, pos, relpath, spots, every,
                                                False)
                held[view.owners[pos]] = len(found)
                if len(found) != group:
                    continue
                origin = _provenance(view.namespaces, *view.origin(pos, relpath))
                for number, which in hits:
                    if group == first and relpath == start and number <= skip:
                        continue
                    if not page.add(relpath, rows, number, which, origin):
                        return page.results, last
                    last = [-group, relpath, number]
        return page.results, None

    def _read(self, view: View, disk: CacheFiles, matcher: Matcher, pos: int, relpath: str,
              spots: Spots | None, wanted: set[int], each: bool) -> tuple[
                  set[int], _Lines, Iterator[tuple[int, list[int]]]]:
        """The queries a file holds, its lines, and each line holding one of them, in order.

        Each query is looked for only in the parts of a file the index named for it (no other
        part can hold it), so a rare query is not looked for through a large file where a
        common one is named everywhere; a file of `_PARTS_ALONE` parts or more is read whole
        only once it holds a query, so one whose named parts do not hold it costs just those.
        With `each` (a file counts only if it holds every query) the sparsest is looked for
        first, and a file lacking one is left at once. The lines holding a query are found part
        by part as the page takes them, and a line is decoded only when a result shows it.
        """
        self.scanned += 1
        spots, cut = spots or {}, view.cut(pos)
        found: set[int] | None = None
        if cut is not None and len(cut.bounds) > _PARTS_ALONE:
            found, data = _read_parts(disk, relpath, cut, spots, matcher, wanted, each)
        else:
            data = read_cached(disk, relpath)
        if data is None:
            return set(), _Lines(b""), iter(())
        whole, size = data, len(data)

        def piece(lo: int, hi: int) -> bytes:
            return whole if (lo, hi) == (0, size) else whole[lo:hi]

        lines = _Lines(data)
        if cut is not None and size != cut.bounds[-1]:
            cut = found = None  # not the bytes the index cut: all of them, as they are now
        if found is None:
            found = matcher.which(data, wanted) if cut is None else _held(
                piece, cut, spots, matcher, wanted, each)
        if not found:
            return set(), lines, iter(())
        ranges = [(0, size)] if cut is None else regions(
            cut, spots.values() if wanted <= spots.keys() else None)
        return found, lines, _hits(data, [(lo, piece(lo, hi)) for lo, hi in ranges], matcher,
                                   lines)


def _named(view: View, query: Query, dense: bool) -> list[Named]:
    """What the index names for each query: by its folded text, its accented words.

    Its folded text keeps its ASCII capitals when the query is case-sensitive and not
    `normalized`, as the index's trigrams do; otherwise it is asked in any case. The accented
    words only when the query is not `normalized` (`folding.accented_keys`).
    """
    keep = query.case_sensitive and not query.normalized
    return [Named(view, [normalize(q, keep_case=keep)], dense,
                  () if query.normalized else accented_keys(q), any_case=not keep)
            for q in query.queries]


def _held(read: Callable[[int, int], bytes], cut: Cut, spots: Spots, matcher: Matcher,
          wanted: set[int], each: bool) -> set[int]:
    """The queries a file cut in parts holds, each looked for only in the parts named for it.

    A query not named is looked for in every part. The sparsest is looked for first: with
    `each`, a file lacking one is left at once.
    """
    found: set[int] = set()
    for key in sorted(wanted, key=lambda k: (k not in spots, len(spots.get(k, ())))):
        # parts side by side are read and looked in at once
        if any(matcher.which(read(lo, hi), (key,))
               for lo, hi in _joined(regions(cut, (spots[key],) if key in spots else None))):
            found.add(key)
        elif each:
            return set()
    return found


def _read_parts(disk: CacheFiles, relpath: str, cut: Cut, spots: Spots, matcher: Matcher,
                wanted: set[int], each: bool) -> tuple[set[int] | None, bytes | None]:
    """`_held` of a large file, reading just the parts it looks in; its bytes once it holds one.

    None for the queries of a file that is not the size the index cut (the caller looks in it
    whole), and for the bytes of a missing file or one that holds none.
    """
    try:
        stream = disk.open(relpath)
    except SharedMemoryError:
        return None, None
    if stream is None:
        return None, None
    with stream:
        size = os.fstat(stream.fileno()).st_size
        if size != cut.bounds[-1]:
            return None, stream.readall()
        ranges = _Ranges(stream, size)
        found = _held(ranges.read, cut, spots, matcher, wanted, each)
        return found, ranges.whole() if found else None


class _Ranges:
    """A large cached file read a range at a time, and whole once a range is most of it."""

    def __init__(self, stream: BinaryIO, size: int) -> None:
        self.stream, self.size = stream, size
        self.data: bytes | None = None

    def read(self, lo: int, hi: int) -> bytes:
        """Bytes `lo` to `hi`: from the whole once it is read, else read alone."""
        if self.data is None and 2 * (hi - lo) > self.size:
            self.whole()
        if self.data is not None:
            return self.data if (lo, hi) == (0, self.size) else self.data[lo:hi]
        self.stream.seek(lo)
        return self.stream.read(hi - lo)

    def whole(self) -> bytes:
        """All of the file, read once: its lines are counted from its start."""
        if self.data is None:
            self.stream.seek(0)
            self.data = self.stream.readall()
        return self.data


def _joined(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The byte ranges with those side by side made one."""
    out: list[tuple[int, int]] = []
    for lo, hi in ranges:
        if out and out[-1][1] == lo:
            out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return out


def _hits(data: bytes, pieces: list[tuple[int, bytes]], matcher: Matcher,
          lines: _Lines) -> Iterator[tuple[int, list[int]]]:
    """Each line of the pieces holding a query, and the queries it holds, in line order."""
    line, counted = 0, 0  # line breaks before the piece
    for lo, piece in pieces:
        line += data.count(b"\n", counted, lo)
        counted = lo
        lines.parts.append((line + 1, lo, piece))
        yield from ((n + line, which) for n, which in _merge(matcher.numbers(piece)).items())


class _Lines:
    """A file's lines by number, each decoded when a result shows it (a few, of many)."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.parts: list[tuple[int, int, bytes]] = []  # (first line, start, bytes) of parts read
        self.rows: dict[int, list[bytes]] = {}  # part (its first line) -> its lines

    def get(self, number: int) -> str | None:
        """The text of line `number`, None past the last line.

        A line of a part read comes from that part's lines, split once; one around it (a
        result's context) is walked to from the nearest part, a few lines.
        """
        if number < 1:
            return None
        data, line, at = self.data, 1, 0
        for first, lo, piece in self.parts:
            if first > number:
                if first - number <= _CLOSE:  # a few lines before this part
                    line, at = first, lo
                    while line > number:
                        at = data.rfind(b"\n", 0, at - 1) + 1
                        line -= 1
                break
            rows = self.rows.get(first)
            if rows is None:
                rows = self.rows[first] = piece.split(b"\n")
                if piece.endswith(b"\n"):
                    rows.pop()
            if number < first + len(rows):
                return rows[number - first].decode("utf-8", "replace")
            line, at = first + len(rows), lo + len(piece)  # the line after the part
        while line < number:
            end = data.find(b"\n", at)
            if end < 0 or end + 1 >= len(data):
                return None
            line, at = line + 1, end + 1
        if at >= len(data):
            return None
        end = data.find(b"\n", at)
        return data[at:end if end >= 0 else len(data)].decode("utf-8", "replace")


def _merge(hits: list[set[int]]) -> dict[int, list[int]]:
    """Line number -> indexes of the queries found on it, in line order."""
    out: dict[int, list[int]] = {}
    for i, lines in enumerate(hits):
        for number in lines:
            out.setdefault(number, []).append(i)
    return dict(sorted(out.items()))


def _clip(line: str) -> str:
    line = line.rstrip("\r")
    return line if len(line) <= LINE_CHARS else line[:LINE_CHARS] + "…"


def _result(query: Query, relpath: str, lines: _Lines, number: int,
            which: Iterable[int], origin: dict[str, Any]) -> dict[str, Any]:
    width = query.context_lines
    return {
        "path": relpath,
        "line_number": number,
        "line": _clip(lines.get(number) or ""),
        "context_before": [_clip(lines.get(n) or "")
                           for n in range(max(1, number - width), number)],
        "context_after": [_clip(text) for n in range(number + 1, number + width + 1)
                          if (text := lines.get(n)) is not None],
        "matched_queries": [query.queries[i] for i in which],
        **origin,
    }


def provenance(manifest: Manifest, relpath: str) -> dict[str, Any]:
    """Where a cached file came from: machine, source, content address, when it was synced."""
    meta = manifest.files.get(relpath)
    return _provenance(manifest.namespaces, *((meta.sha256, meta.namespace) if meta else
                                              (None, None)))


def _provenance(namespaces: dict[str, NamespaceInfo], sha256: str | None,
                namespace: str | None) -> dict[str, Any]:
    info = namespaces.get(namespace) if namespace is not None else None
    return {
        "machine": info.machine if info else None,
        "source": info.source if info else None,
        "sha256": sha256,
        "synced_at": info.synced_at if info else None,
    }


_SEARCHERS: dict[str, Searcher] = {}


def searcher(cache: Cache) -> Searcher:
    """The long-lived searcher for this cache root (one per process)."""
    key = os.fspath(cache.root)
    if key not in _SEARCHERS:
        _SEARCHERS[key] = Searcher(cache)
    return _SEARCHERS[key]
