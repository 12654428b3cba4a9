"""The search index's parts as a search walks them: in path order, a chunk at a time.

A search (search.py) reads the index (index_reader.py) through a view of every searchable
file's parts in path order (`View`), and asks which positions can hold its queries (`Named`), a
chunk of positions at a time in path order (`walk_named`), so that a page that fills within its
first files asks about those alone. The index only ever narrows: each position it names is
verified against the real file.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Generator, Iterable, Iterator
from itertools import islice, pairwise
from typing import Any

from sharedmem.cache.cache import Manifest, NamespaceInfo
from sharedmem.cache.index_reader import DENSE, Cut, IndexReader, Match
from sharedmem.cache.search_index import STRAYS, inverse, strays

_CHUNK = 1024  # positions a walk first asks the index about; each next chunk doubles
_SCATTERED = 8  # more than 1/8 of a chunk's ids far from path order: the index asked whole
_FEW = 128  # candidates under 1/128 of a chunk are verified by reading, other keys unasked
_WHOLE = 4096  # a key that names at most about this many files is asked of the whole index
_RUNS_KEPT = 1024  # chunks whose runs of ids a view keeps (`View.run`)
_BATCH = 500  # paths asked of the index in one query (under SQLite's old 999-parameter cap)
_TRIED, _YIELD = 32, 4  # a key whose first 32 files or more gave under a result in 4: `then`
_KEPT = 0.5  # its last word whole kept only if it names under half as many parts
_STRAYS_READ = 8  # positions out of path order this few are read unasked (`Named._strays`)

Spots = dict[int, set[int]]
"""Of a chunk of positions, those the index named for each key asked about them, by the key's
place among the search's queries. A key not there may be in any part."""


class View:
    """Every searchable file in path order, each in its parts, by position.

    A position is one part of a file the index vouches for (its `grams` row in `ids`, its file
    in `owners`; a file's parts stand side by side), or a whole file it does not (id -1, an owner
    of its own below 0), which is always read. Built once per manifest and index generation.
    When the index covers the manifest whole only these arrays are held (paths are asked of the
    index); otherwise the manifest is loaded and each position's path is held.
    """

    def __init__(self, index: IndexReader, ids: array[int], owners: array[int],
                 paths: list[str] | None, manifest: Manifest | None,
                 namespaces: dict[str, NamespaceInfo], where: array[int] | None = None) -> None:
        self.index, self.ids, self.owners, self.paths = index, ids, owners, paths
        self.manifest, self.namespaces = manifest, namespaces
        # Only a view from the manifest has positions the index does not vouch for.
        self.stale = [pos for pos, i in enumerate(ids) if i < 0] if paths is not None else []
        self.where = where if where is not None else inverse(ids)
        self.runs: dict[tuple[int, int], tuple[int, int, list[int]] | None] = {}  # `run`
        self._order: tuple[array[int], list[int]] | bool | None = None  # `order`
        # file id -> (sha256, namespace, first, parts, bounds) of the files `named` gave last,
        # asked with their paths, for `origin` and `cut`.
        self.batch: dict[Any, tuple[Any, ...]] = {}

    @classmethod
    def of_manifest(cls, index: IndexReader, manifest: Manifest, indexed: bool) -> View:
        """The view of the whole manifest, each file vouched for only at its sha256."""
        known = {row[1]: row for row in index.rows(
            "SELECT id, path, lower(hex(sha256)), first, parts FROM files")} if indexed else {}
        ids, owners, paths = array("q"), array("q"), []
        for relpath, meta in sorted(manifest.files.items()):
            row = known.get(relpath)
            if row is not None and row[2] == meta.sha256:
                file_id, _, _, first, parts = row
                if not all(type(v) is int for v in (file_id, first, parts)):
                    raise index.damaged()
                ids.extend(range(first, first + parts))
                owners.extend([file_id] * parts)
                paths.extend([relpath] * parts)
            else:
                ids.append(-1)
                owners.append(-1 - len(paths))
                paths.append(relpath)
        return cls(index, ids, owners, paths, manifest, manifest.namespaces)

    def __len__(self) -> int:
        return len(self.ids)

    def path(self, pos: int) -> str:
        """The path of the file at a position."""
        if self.paths is not None:
            return self.paths[pos]
        rows = self.index.rows("SELECT path FROM files WHERE id=?", (self.owners[pos],))
        if not rows or not isinstance(rows[0][0], str):
            raise self.index.damaged()
        return rows[0][0]

    def cut(self, pos: int) -> Cut | None:
        """The first position of the file at `pos` and the byte bounds of its parts.

        None when it is read whole: a file of one part, or one the index does not vouch for.
        """
        owners, owner = self.owners, self.owners[pos]
        if self.ids[pos] < 0 or (pos == 0 or owners[pos - 1] != owner) and (
                pos + 1 == len(owners) or owners[pos + 1] != owner):
            return None
        row = self.batch.get(owner)
        if row is None:
            rows = self.index.rows("SELECT lower(hex(sha256)), namespace, first, parts, bounds "
                                   "FROM files WHERE id=?", (owner,))
            row = rows[0] if rows else (None,) * 5
        first, parts, blob = row[2:]
        if type(first) is not int or type(parts) is not int or not isinstance(blob, bytes) or \
                not 0 <= self.ids[pos] - first < parts or len(blob) != 8 * (parts + 1):
            raise self.index.damaged()
        bounds = array("q", blob).tolist()
        if bounds[0] != 0 or any(lo >= hi for lo, hi in pairwise(bounds)):
            raise self.index.damaged()
        return Cut(pos - (self.ids[pos] - first), bounds)

    def named(self, items: Iterable[tuple[int, Spots | None]],
              room: Callable[[], int] = lambda: _BATCH) -> Iterator[tuple[int, str,
                                                                          Spots | None]]:
        """Each item (a position of a file and the positions named, `Spots`) with its path.

        The paths are asked of the index a batch at a time. Batches start small and double,
        never past `room()` (what the page could still take if each file held one result): each
        item taken into a batch is one the walk had to find, and finding items past those the
        page reads asks the index about chunks it never needed.
        """
        if self.paths is not None:
            yield from ((pos, self.paths[pos], spots) for pos, spots in items)
            return
        walk, size = iter(items), 16
        while batch := list(islice(walk, max(1, min(size, room())))):
            wanted = [self.owners[pos] for pos, _ in batch]
            found: dict[Any, Any] = {}
            rows = self.batch = {}
            for row_id, relpath, *row in self.index.rows(
                    "SELECT id, path, lower(hex(sha256)), namespace, first, parts, bounds "
                    f"FROM files WHERE id IN ({','.join('?' * len(wanted))})", tuple(wanted)):
                found[row_id] = relpath
                rows[row_id] = tuple(row)
            for (pos, spots), row_id in zip(batch, wanted, strict=True):
                relpath = found.get(row_id)
                if not isinstance(relpath, str):
                    raise self.index.damaged()
                yield pos, relpath, spots
            size = min(size * 2, _BATCH)

    def origin(self, pos: int, relpath: str) -> tuple[str | None, str | None]:
        """The file's sha256 and namespace, as the manifest has them.

        A file `named` just gave has them from the same query as its path.
        """
        if self.manifest is not None:
            meta = self.manifest.files.get(relpath)
            return (meta.sha256, meta.namespace) if meta else (None, None)
        row = self.batch.get(self.owners[pos])
        if row is None:
            rows = self.index.rows("SELECT lower(hex(sha256)), namespace FROM files WHERE id=?",
                                   (self.owners[pos],))
            row = rows[0] if rows else (None, None)
        if not all(isinstance(v, str) for v in row[:2]) or len(row[0]) != 64:
            raise self.index.damaged()
        return row[0], row[1]

    def find(self, relpath: str, lo: int = 0) -> int:
        """The first position whose path is not below `relpath`."""
        hi = len(self.ids)
        while lo < hi:
            mid = (lo + hi) // 2
            if self.path(mid) < relpath:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def scope(self, folder: str | None) -> list[range]:
        """The positions under `folder` (a contiguous run in path order), and the file itself."""
        if not folder:
            return [range(len(self.ids))]
        prefix = folder.rstrip("/") + "/"
        own = self.find(folder)
        spans = [range(own, self.find(folder + "\x00", own))] \
            if own < len(self.ids) and self.path(own) == folder else []
        lo = self.find(prefix)
        return spans + [range(lo, self.find(prefix[:-1] + "0", lo))]

    def run(self, lo: int, hi: int) -> tuple[int, int, list[int]] | None:
        """The first and last id of the main run of the ids at [lo, hi), and those beside it.

        A run is ids no further apart than the chunk's length: all of them in an index built
        whole in path order. None when the index vouches for none of the positions.
        """
        if (lo, hi) in self.runs:
            return self.runs[lo, hi]
        ids = sorted(self.ids[lo:hi])
        ids = ids[bisect_left(ids, 0):]
        found: tuple[int, int, list[int]] | None = (ids[0], ids[-1], []) if ids else None
        size = hi - lo
        if ids and ids[-1] - ids[0] > 2 * size:
            runs, begin = [], 0
            for n in range(1, len(ids) + 1):
                if n == len(ids) or ids[n] - ids[n - 1] > size:
                    runs.append((n - begin, begin, n))
                    begin = n
            _, begin, stop = max(runs)
            found = (ids[begin], ids[stop - 1], ids[:begin] + ids[stop:])
        if len(self.runs) >= _RUNS_KEPT:
            self.runs.clear()
        self.runs[lo, hi] = found
        return found

    def order(self) -> tuple[array[int], list[int]] | None:
        """The ids in path order at each position, and the positions out of it (`strays`).

        The first array holds at each position the highest id in order up to it: it never
        falls, so the rows of the positions in order from `lo` to `hi` are those between its
        values there. None when the index does not vouch for some positions (`stale`), or more
        than 1/`STRAYS` of them stray (the next refresh builds it anew).
        """
        if self._order is None:
            self._order = False
            found = strays(self.ids.tolist()) if not self.stale else None
            if found is not None and len(found) * STRAYS <= len(self.ids):
                floor = array("q", self.ids)
                for pos in found:
                    floor[pos] = floor[pos - 1] if pos else 0
                self._order = (floor, found)
        return self._order or None

    def at(self, ids: Iterable[int], lo: int, hi: int) -> set[int]:
        """Positions in [lo, hi) of these ids."""
        where, top = self.where, len(self.where)
        return {pos for i in ids if i < top and lo <= (pos := where[i]) < hi}


class Named:
    """The positions the index names for some keys (ANDed), asked a chunk of positions at a time.

    A walk in path order that fills its page within its first files asks only about those; one
    through every file asks in a few chunks that double in size, on a grid fixed from the span's
    start, so a later group's walk reuses what an earlier one asked. Each question costs about
    as much as reading several files, so a key that named few positions in its first chunk is
    asked once for the whole index instead; not a phrase (`Match.phrase`), though: its words may
    be in every file, and SQLite reads their places in each file asked about, so asking about
    all of them costs a walk of the whole index where the page may fill halfway. Positions out
    of path order (files added or grown since the index was built that found no rows free
    beside their neighbours', `View.order`) are asked apart, all of them in one range of rows:
    named unasked, each would be a file read; unless they are so few that reading them costs
    less than the question (`_STRAYS_READ`). A key the index cannot narrow names every
    position; so does one that names more than `DENSE` of the positions asked about, from then
    on, unless it is `dense`: one of several keys every file must hold (`all`), where even
    common keys can meet in few files.
    """

    def __init__(self, view: View, keys: list[str], dense: bool = False,
                 accented: Iterable[str] = (), any_case: bool = False) -> None:
        self.view = view
        usable = view.index.conn is not None and len(view.stale) < len(view)
        self.expr = view.index.expression(keys, len(view), accented, any_case) if usable \
            else None
        self.keys, self.dense = keys, dense
        self.asked: dict[int, set[int]] = {}  # chunk start -> the positions named in it
        self.whole: list[int] | None = None  # every position named, when the ids are scattered
        self.seen = [0, 0]  # positions named, positions asked about: how dense the key is
        # a phrase as asked before its last word was made whole (or its case asked), and its
        # rate, until asked
        self.untried: tuple[Match, float] | None = None
        self.sifted = False  # whether the sieve once left under `_KEPT` of the parts named
        # the strays the key names, for the form of it asked (`_strays`)
        self.strayed: tuple[tuple[str, str, str], list[int]] | None = None

    def rate(self) -> float:
        """The share of positions named so far (a half until asked): sparse keys go first."""
        return self.seen[0] / self.seen[1] if self.seen[1] else 0.5

    def everywhere(self) -> bool:
        """Whether the key names every position, unasked."""
        return self.expr is None or not self.dense and bool(self.seen[1]) and \
            self.rate() > DENSE

    def tighten(self, words_only: bool) -> bool:
        """Ask `Match.then` from now on, or only its words and sieve; False when nothing is new.

        Its words and sieve alone keep the rest of it for later. A `then` of pairs
        (`Match.pairs`) is asked whole: its trigrams are those asked before it, and its own
        `then` comes next.
        """
        expr = self.expr
        if expr is None or (then := expr.then) is None:
            return False
        words_only &= not then.pairs  # asked whole: its trigrams are those asked before
        if words_only and (then.words, then.sieve) == (expr.words, expr.sieve):
            return False
        self.untried = (expr, self.rate()) if words_only and then.words != expr.words \
            else None
        self.expr = Match(expr.grams, then.words, then, then.sieve, then.pairs,
                          bool(then.words)) if words_only \
            else then
        self.whole, self.seen = None, [0, 0]
        return True

    def recount(self) -> None:
        """Judge anew how dense the key is: what it named so far was a cluster of its files."""
        self.seen = [0, 0]

    def order(self, lo: int) -> tuple[bool, float]:
        """Keys known without a question first, then the sparsest."""
        known = lo in self.asked or self.whole is not None or self.everywhere()
        return not known, self.rate()

    def within(self, lo: int, hi: int) -> set[int] | None:
        """Positions in [lo, hi) whose part may hold the keys; None when it may be any of them.

        A phrase that proves to name more than `DENSE` of the positions asked about is asked
        as its `Match.then` from then on, as `_ahead` does, before every file is read.
        """
        if lo in self.asked:
            return self.asked[lo]
        if self.everywhere() and not self.tighten(False):
            return None
        view = self.view
        stale = view.stale[bisect_left(view.stale, lo):bisect_left(view.stale, hi)]
        assert self.expr is not None
        sparse = bool(self.seen[1]) and self.rate() * len(view) <= _WHOLE and not (
            self.expr.words and self.expr.phrase)
        found = self._from_whole(lo, hi) if self.whole is not None or sparse else \
            self._asked(lo, hi)
        found.update(stale)
        self.asked[lo] = found
        self.seen[0] += len(found)
        self.seen[1] += hi - lo
        return found

    def ahead(self, lo: int, stop: int, most: int) -> tuple[set[int], int]:
        """The positions from `lo` named by the phrase's first `most` parts, and where they end.

        The end is that of the file of the last of them, or `stop` when they are fewer: every
        position named in between is there, and no file is cut. Only for a view in `order`
        and a phrase alone (`words`, no `grams`); positions out of it are asked apart
        (`_strays`). Of them, only the parts its `sieve` names are kept, asked over the
        same ids; the sieve is asked again only if its first question left under `_KEPT` of
        them. The first question after `tighten` made its last word whole goes back to the
        words before, unless it names under `_KEPT` as many parts as they did.
        """
        assert self.expr is not None
        view, owners = self.view, self.view.owners
        order = view.order()
        assert order is not None
        floor = order[0]
        start = floor[lo - 1] + 1 if lo else 0
        ids = view.index.first(self.expr, start, floor[stop - 1], most)
        hi = stop
        if len(ids) == most:  # up to the last id named, then to the end of its file
            hi = bisect_right(floor, ids[-1], lo, stop)
            while hi < stop and owners[hi] == owners[hi - 1]:
                hi += 1
            if floor[hi - 1] > ids[-1]:
                ids.extend(view.index.between(self.expr, ids[-1] + 1, floor[hi - 1]))
        found = view.at(ids, lo, hi)
        if self.untried is not None:  # its last word whole: kept if it names under `_KEPT`
            before, rate = self.untried
            if len(found) > _KEPT * rate * (hi - lo):
                words, pairs = before.words, before.pairs
                self.expr = self.expr._replace(words=words, pairs=pairs, then=self.expr.then.
                                               _replace(words=words, pairs=pairs)
                                               if self.expr.then else None)
            self.untried = None
        if self.expr.sieve and ids:
            kept = view.index.among(self.expr.sieve, ids)
            if self.sifted or len(kept) < _KEPT * len(ids):
                found, self.sifted = view.at(kept, lo, hi), True
            else:  # and `then`'s too, so that `tighten` does not bring it back
                then = self.expr.then
                self.expr = self.expr._replace(sieve="", then=then._replace(sieve="")
                                               if then else None)
        found.update(self._strays(lo, hi))
        self.seen[0] += len(found)
        self.seen[1] += hi - lo
        return found, hi

    def _asked(self, lo: int, hi: int) -> set[int]:
        """Ask the index for the chunk's ids in one range, and its strays apart.

        In a view not in `order`, ids far from the chunk's main run are named unasked, or,
        when they are many, the whole index is asked once.
        """
        view = self.view
        order = view.order()
        if order is not None:
            floor = order[0]
            ids = view.index.between(self.expr, floor[lo - 1] + 1 if lo else 0, floor[hi - 1])
            return view.at(ids, lo, hi) | self._strays(lo, hi)
        run = view.run(lo, hi)
        if run is None:
            return set()
        first, end, stray = run
        if len(stray) * _SCATTERED > hi - lo:  # scattered ids: ask once for the whole index
            return self._from_whole(lo, hi)
        return view.at(view.index.between(self.expr, first, end), lo, hi) | view.at(stray, lo, hi)

    def _strays(self, lo: int, hi: int) -> set[int]:
        """The strays in [lo, hi) the key names (`View.order`).

        All of them are asked at once, for each form of the key: their rows, past those of the
        build, make one short range, where each stray named unasked would be a file read. A few
        are named unasked: SQLite looks up each of the key's words for that short range as for
        a chunk's, which costs more than reading them (`_STRAYS_READ`).
        """
        view, expr = self.view, self.expr
        order = view.order()
        assert expr is not None and order is not None
        strays = order[1]
        if len(strays) <= _STRAYS_READ:
            return set(strays[bisect_left(strays, lo):bisect_left(strays, hi)])
        key = (expr.grams, expr.words, expr.pairs)
        if self.strayed is None or self.strayed[0] != key:
            ids = [view.ids[pos] for pos in strays]
            named = view.at(view.index.between(expr, min(ids), max(ids)), 0, len(view))
            self.strayed = (key, sorted(named.intersection(strays)))
        found = self.strayed[1]
        return set(found[bisect_left(found, lo):bisect_left(found, hi)])

    def _from_whole(self, lo: int, hi: int) -> set[int]:
        """The chunk's positions among all the index names, asked of it once for every chunk."""
        if self.whole is None:
            named = self.view.index.matching(self.expr)
            self.whole = sorted(self.view.at(named, 0, len(self.view)))
        return set(self.whole[bisect_left(self.whole, lo):bisect_left(self.whole, hi)])


def _chunks(view: View, span: range) -> Iterator[tuple[int, int]]:
    """The span cut into chunks of _CHUNK positions, then each twice the one before.

    A chunk never ends inside a file: all of a file's parts are asked about together.
    """
    lo, size, owners = span.start, _CHUNK, view.owners
    while lo < span.stop:
        hi = min(lo + size, span.stop)
        while hi < span.stop and owners[hi] == owners[hi - 1]:
            hi += 1
        yield lo, hi
        lo, size = hi, size * 2


def walk_named(view: View, spans: list[range], named: list[Named], group: int,
                start: str, room: Callable[[], int] | None = None
                ) -> Iterator[tuple[int, Spots | None]]:
    """Files in the spans, in order from the path `start` on, named for >= `group` keys.

    Each as a position of it named, and the positions each key named (None: any part). A
    phrase alone, with `room` (the results its page still takes), is asked `_ahead`. A lone key
    with more to ask (`Match.then`) is asked as that from the next file on once the files read
    (`_TRIED` or more) give under one result in `_YIELD`, as `_ahead` does: the rest of the
    chunk is asked again.
    """
    key = named[0]
    alone = room if len(named) == 1 and key.expr is not None else None
    paced = alone if view.order() else None
    watch = _Yield(alone) if alone and key.expr.then else None  # type: ignore[union-attr]
    for span in spans:
        lo = min(max(view.find(start, span.start) if start else span.start, span.start),
                 span.stop)
        for first, end in _chunks(view, span):
            asked = first  # the chunk, or what is left of it once `then` is asked
            while lo < end:
                if paced and (key.expr.words or key.expr.pairs) and not \
                        key.expr.grams:  # type: ignore[union-attr]
                    lo = asked = yield from _ahead(view, key, lo, span.stop, paced)
                else:
                    lo = asked = yield from _chunk(named, group, asked, end, lo, watch)


def _chunk(named: list[Named], group: int, first: int, end: int, lo: int,
           watch: _Yield | None) -> Generator[tuple[int, Spots | None], None, int]:
    """The files from `lo` named for >= `group` keys in positions `first` to `end`; where it ends.

    It ends early, at the next file, once the files taken prove to mostly lack the key and it
    is asked as its `Match.then` from then on (`watch`).
    """
    allowed = _at_least(named, group, first, end)
    if allowed is None:
        yield from _every_file(named[0].view, max(lo, first), end)
        return end
    for pos, spots in allowed:
        if pos < lo:
            continue
        if watch is not None:
            if watch.poor() and named[0].tighten(False):
                watch.reset()
                return pos
            watch.took()
        yield pos, spots
    return end


class _Yield:
    """The files a walk took since it last asked anew, and the results they gave its page.

    Once `_TRIED` or more give under one result in `_YIELD`, the key is worth asking as its
    `Match.then`. Files are taken a batch ahead of the results (`View.named`), so this tells
    sooner than the files read would.
    """

    def __init__(self, room: Callable[[], int]) -> None:
        self.room = room
        self.taken, self.before = 0, room()

    def took(self) -> None:
        self.taken += 1

    def poor(self) -> bool:
        """Whether the files taken prove to mostly lack the key."""
        return self.taken >= _TRIED and (self.before - self.room()) * _YIELD < self.taken

    def reset(self) -> None:
        self.taken, self.before = 0, self.room()


def _ahead(view: View, key: Named, lo: int, stop: int,
           room: Callable[[], int]) -> Generator[tuple[int, Spots | None], None, int]:
    """The files from `lo` a phrase names, asked for half again as many as the page takes.

    Its words may be in every part, and SQLite then walks their places in every part a
    question covers: a question for the next matches stops where the page will fill, where a
    chunk of fixed size walks on to its end, and each question costs as much as walking
    thousands of parts. A page that needs more (most of the files named do not hold the
    query) asks twice as many each time. Once the phrase names more than `DENSE` of the
    positions asked about, every file is read from then on, unasked, while they give results:
    a phrase may name a cluster of files together (a folder of one service's pages), and past
    it is asked again, its density judged anew (`Named.recount`). Once the files read
    (`_TRIED` or more) give under one result in `_YIELD`, the phrase is asked as its
    `Match.then`: its words and sieve alone, asked ahead as before, or, when it names more
    than `DENSE`, all of it, a chunk at a time by the caller from where this returns (asked
    a chunk at a time, its trigrams cost `e is not` more than reading the files it names,
    and a phrase in most files whose files give results is read faster file by file). Its
    words alone are kept only if the first question names under `_KEPT` of the parts the
    phrase named before: SQLite merges the list of every word a whole last word begins for
    each question, 3.5-4.3 ms for `default` at 100,000 files where it begins no other word.
    """
    owners, most, watch = view.owners, 0, _Yield(room)
    while lo < stop:
        if watch.poor():
            if key.tighten(words_only=not key.everywhere()):
                most = 0
                watch.reset()
            elif key.everywhere():  # the files read lack it: it named a cluster of them
                key.recount()
                watch.reset()
        if key.everywhere():
            lo = yield from _every_file(view, lo, stop, watch)
            continue
        if key.expr.grams:  # type: ignore[union-attr]
            return lo
        most = max(room() * 3 // 2 + 1, 2 * most)
        found, hi = key.ahead(lo, stop, most)
        spots: Spots = {0: found}
        files: set[int] = set()
        for pos in sorted(found):
            if owners[pos] not in files:
                files.add(owners[pos])
                watch.took()
                yield pos, spots
        lo = hi
    return lo


def _every_file(view: View, lo: int, hi: int, watch: _Yield | None = None
                ) -> Generator[tuple[int, Spots | None], None, int]:
    """Each file from position `lo` (a file's first) to `hi`, any part of it possibly named.

    With `watch`, only until the files taken prove to mostly lack the key; where it ended.
    """
    owners = view.owners
    for p in range(lo, hi):
        if p == lo or owners[p] != owners[p - 1]:
            if watch is not None:
                if watch.poor():
                    return p
                watch.took()
            yield p, None
    return hi


def _at_least(named: list[Named], group: int, lo: int,
              hi: int) -> list[tuple[int, Spots]] | None:
    """Files with positions in [lo, hi) named for at least `group` of the keys; None for all.

    Each as a position of it, with the positions each key asked named in the chunk (`Spots`,
    one for all its files). Keys known without a question come first, then the sparsest. Once
    few files can still reach `group`, the others are not asked: reading those few verifies
    them for less. Every key is asked at least once, though: its first answer tells a sparse
    key, which is then asked of the whole index at once (see `Named`).
    """
    owners = named[0].view.owners
    counts: dict[int, int] = {}  # file -> keys naming it
    first: dict[int, int] = {}  # file -> a position of it named
    spots: Spots = {}
    order = sorted(range(len(named)), key=lambda k: named[k].order(lo))
    left, anywhere = len(order), 0
    for done, key in enumerate(order, 1):
        found = named[key].within(lo, hi)
        left -= 1
        if found is None:
            anywhere += 1
        else:
            spots[key] = found
            mine: set[int] = set()
            for pos in found:
                owner = owners[pos]
                if owner not in mine:
                    mine.add(owner)
                    counts[owner] = counts.get(owner, 0) + 1
                    first.setdefault(owner, pos)
        need = group - anywhere - left  # what a file must have been named for so far
        if left + anywhere < group and len(counts) * _FEW <= hi - lo and all(
                named[k].seen[1] for k in order[done:]):
            return _files(counts, first, need, spots)
    need = group - anywhere
    return None if need <= 0 else _files(counts, first, need, spots)


def _files(counts: dict[int, int], first: dict[int, int], need: int,
           spots: Spots) -> list[tuple[int, Spots]]:
    """The files named for at least `need` keys, in path order: see `_at_least`."""
    return sorted(((first[owner], spots) for owner, n in counts.items() if n >= need),
                  key=lambda item: item[0])
