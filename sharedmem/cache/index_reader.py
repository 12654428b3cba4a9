"""The search index as a search reads it: what it names for a query, a chunk of files at a time.

A search (search.py) reads the index in one read transaction (`IndexReader`), through a view of
every searchable file's parts in path order (`View`), and asks which positions can hold its
queries (`Named`), a chunk of positions at a time in path order (`walk_named`), so that a page
that fills within its first files asks about those alone. The index only ever narrows: each
position it names is verified against the real file.
"""

from __future__ import annotations

import os
import re
import sqlite3
import stat
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Generator, Iterable, Iterator
from itertools import islice, pairwise, product
from typing import Any, NamedTuple

from sharedmem.cache.cache import Cache, Manifest, NamespaceInfo
from sharedmem.cache.folding import lower_ascii
from sharedmem.cache.matching import utf8
from sharedmem.cache.search_index import (
    READ_ERRORS,
    TEXT_END,
    delete_damaged,
    index_path,
    inverse,
    is_busy,
    is_planted,
    read_only_uri,
)
from sharedmem.core import CacheError

_MAX_GRAMS = 16  # trigrams of one key asked of the index, at most
_DENSE = 0.3  # an index naming more than this share of files does not narrow a page in order
_CHUNK = 1024  # positions a walk first asks the index about; each next chunk doubles
_SCATTERED = 8  # more than 1/8 of a chunk's ids far from path order: the index asked whole
_FEW = 128  # candidates under 1/128 of a chunk are verified by reading, other keys unasked
_WHOLE = 4096  # a key that names at most about this many files is asked of the whole index
_RUNS_KEPT = 1024  # chunks whose runs of ids a view keeps (`View.run`)
_BATCH = 500  # paths asked of the index in one query (under SQLite's old 999-parameter cap)
_SHORT_TERMS = 512  # a short key beginning more trigrams than this is not looked up (scanned)
_SHORT_ASKED = 64  # nor one of more whose trigrams' files add up past `_DENSE` (`_short`)
_SEPARATORS = re.compile(r"[\x00-\x2f\x3a-\x40\x5b-\x60\x7b-\x7f]+")  # ASCII, not a letter or digit
_WORD = re.compile(r"[^\x00-\x2f\x3a-\x40\x5b-\x60\x7b-\x7f]+")  # what FTS5's `ascii` keeps
_LAST_WORD = re.compile(_WORD.pattern + r"\Z")
_CAPITAL = re.compile("[A-Z]")
_PREFIX = 3  # the words table's prefix length (`prefix='3'`), to which a last word is cut
_ENDINGS_ALONE = 32  # as many, for a phrase of one whole word after its first
_ENDINGS = 8  # words ending with a phrase's first that are asked; more: the phrase starts after it
_TRIED, _YIELD = 32, 4  # a phrase whose first 32 files or more gave under a result in 4: `then`
_KEPT = 0.5  # its last word whole kept only if it names under half as many parts


class IndexLost(CacheError):
    """The index failed in the middle of a search: that search starts again without it.

    Never seen outside `Searcher.search`.
    """


class IndexReader:
    """A read-only view of the index file, read in one transaction per search."""

    def __init__(self, cache: Cache) -> None:
        self.cache, self.path = cache, index_path(cache)
        self.conn: sqlite3.Connection | None = None
        self._identity: tuple[int, int] | None = None  # the file this connection reads
        self._vocab = False  # the connection's view of the index's terms is made (`_short`)
        self.read_only: str | None = None  # what the last `begin` met on a read-only cache

    def begin(self) -> dict[str, str] | None:
        """Start a read transaction; the index's meta rows, or None when there is no index.

        A file put in place of the one this connection reads (a rebuild) is reopened. An index
        that cannot be read is deleted (see `_unreadable`), so the searches scan and the next
        refresh builds it again. On a cache this process cannot write, SQLite cannot open the
        index as usual (WAL needs its shared-memory file): see `_frozen`.
        """
        try:
            try:
                info = os.stat(self.path)
            except OSError:
                info = None
            if self.conn is not None and (info is None or (info.st_dev, info.st_ino)
                                          != self._identity or self.read_only is not None
                                          and os.access(self.path.parent, os.W_OK)):
                self.close()  # replaced, or a read-only cache that can be written again
            if self.conn is None:
                self.read_only = None
                if is_planted(self.path):
                    delete_damaged(self.cache)
                    return None
                if info is None or not stat.S_ISREG(info.st_mode):
                    return None
                self._open(info, "")
            return self._meta()
        except (*READ_ERRORS, OSError) as exc:
            meta = self._frozen(exc)
            if meta is None and self.read_only is None:
                self._unreadable(exc)
            return meta

    def _open(self, info: os.stat_result, options: str) -> None:
        assert self.conn is None
        self.conn = sqlite3.connect(read_only_uri(self.path, options), uri=True,
                                    timeout=10, isolation_level=None, check_same_thread=False)
        self._identity = (info.st_dev, info.st_ino)

    def _meta(self) -> dict[str, str]:
        assert self.conn is not None
        self.conn.execute("BEGIN")
        return {str(k): str(v) for k, v in self.conn.execute("SELECT key, value FROM meta")}

    def _frozen(self, exc: Exception) -> dict[str, str] | None:
        """The meta rows of an index read as it stands on a read-only file system, or None.

        Only when SQLite could not open it (SQLITE_CANTOPEN or SQLITE_READONLY) and its folder
        cannot be written; then nothing is deleted, and `read_only` says what the search did.
        On a read-only file system with no WAL left beside the index, no writer can change it,
        so it is read as an immutable file; otherwise the search reads every file.
        """
        code = getattr(exc, "sqlite_errorcode", 0) if isinstance(exc, sqlite3.Error) else 0
        if code & 0xFF not in (8, 14) or os.access(self.path.parent, os.W_OK):
            return None
        self.close()
        self.read_only = ("the cache is read-only and its search index cannot be opened "
                          "there: every file was read (the same results, slower)")
        try:
            info = os.stat(self.path)
            frozen = os.statvfs(self.path).f_flag & os.ST_RDONLY  # type: ignore[attr-defined]
            if frozen and not os.path.lexists(f"{self.path}-wal"):
                self._open(info, "&immutable=1")
                meta = self._meta()
                self.read_only = "the cache is read-only: its search index was read as it stands"
                return meta
        except (*READ_ERRORS, OSError, AttributeError):
            self.close()
        return None

    def end(self) -> None:
        """End the read transaction (a later search sees what a refresh committed since)."""
        if self.conn is not None and self.conn.in_transaction:
            try:
                self.conn.execute("COMMIT")
            except READ_ERRORS:
                self.close()

    def close(self) -> None:
        """Forget the connection so the next search reopens (or scans)."""
        if self.conn is not None:
            self.conn.close()
        self.conn, self._identity, self._vocab, self.read_only = None, None, False, None

    def _unreadable(self, exc: Exception) -> None:
        """Close, and delete the file unless it is only locked by SQLite.

        Only the very file this connection read is deleted, not one a refresh has put in its
        place since, and none while a writer holds the index (see `delete_damaged`).
        """
        identity = self._identity
        self.close()
        if not isinstance(exc, OSError) and not is_busy(exc) and identity is not None:
            delete_damaged(self.cache, identity)

    def damaged(self) -> IndexLost:
        """Values of the wrong kind where the index vouches: damage, deleted like any other."""
        self._unreadable(TypeError("a value of the wrong kind"))
        return IndexLost()

    def rows(self, sql: str, args: tuple[Any, ...] = ()) -> list[Any]:
        """Run a query in the current transaction; a failure is `IndexLost`."""
        if self.conn is None:
            raise IndexLost
        try:
            return self.conn.execute(sql, args).fetchall()
        except READ_ERRORS as exc:
            self._unreadable(exc)
            raise IndexLost from None

    def order(self, meta: dict[str, str]) -> tuple[array[int], array[int], array[int] | None]:
        """The parts' rows in path order, whose file each is, and where each row stands.

        From `orders` when the index has it stored for this generation, else from `files`.
        """
        key = meta.get("order", "")
        if key.split("/")[0] == meta.get("generation"):
            rows = self.rows("SELECT ids, owners, positions FROM orders WHERE key=?", (key,))
            if rows and all(isinstance(v, bytes) and len(v) % 8 == 0 for v in rows[0]):
                ids, owners, where = array("q"), array("q"), array("q")
                for values, blob in zip((ids, owners, where), rows[0], strict=True):
                    values.frombytes(blob)
                if len(owners) == len(ids) and len(where) >= len(ids):  # as it is stored
                    return ids, owners, where
        ids, owners = array("q"), array("q")
        for file_id, first, parts in self.rows("SELECT id, first, parts FROM files ORDER BY path"):
            if not all(type(v) is int for v in (file_id, first, parts)):
                raise self.damaged()
            ids.extend(range(first, first + parts))
            owners.extend([file_id] * parts)
        return ids, owners, None

    def matching(self, match: Match) -> array[int]:
        """Ids of the parts `match` names."""
        return self._ids(match, ())

    def expression(self, keys: Iterable[str], files: int, accented: Iterable[str] = (),
                   any_case: bool = False) -> Match | None:
        """What names the parts that may hold every key; None when no key narrows them.

        A key of two words or more is the phrase of its words (`_phrase`); another of three
        characters or more is its trigrams (`_grams`); a shorter one is any of the trigrams it
        begins (`_short`; `files`, how many the index holds, tells it when the key is in too
        many of them to narrow). All of them go in one MATCH per table, so SQLite intersects
        them: a few parts can hold all of several common words. The trigrams keep ASCII case:
        a key is asked as written, or, `any_case` (a search ignoring case or `normalized`, whose
        key is folded), each trigram as any of its spellings in ASCII capitals and small
        letters. The `accented` words of a query not `normalized` (`folding.accented_keys`) are
        asked as trigrams alone, as the index keeps them beside the folded text, casefolded,
        not among its words. A phrase's trigrams are asked only in its `Match.then`, and those
        holding an ASCII capital or a separator in the middle, which its words cannot tell, in
        its `sieve`: a phrase asked with trigrams is asked a chunk at a time, where its words
        alone are asked only as far as its page needs (`_ahead`).
        """
        keys, accented = list(keys), list(accented)
        phrases = {key: p for key in keys if (p := self._phrase(lower_ascii(key))) is not None}
        parts = [grams for grams in (_grams([k for k in keys if k not in phrases], any_case),
                                     _grams(accented)) if grams]
        for key, folded in [(key, any_case) for key in keys] + [(key, False) for key in accented]:
            if 0 < len(key) < 3 and (expr := self._short(key, files, folded)) is not None:
                parts.append(expr)
        if not parts and not phrases:
            return None
        then = None
        if phrases:  # with the trigrams of each phrase's key, and its last word whole
            more = _grams(list(phrases), any_case)
            then = Match(" AND ".join(parts + ([more] if more else [])),
                         " AND ".join(p.whole or p.words for p in phrases.values()),
                         sieve=_grams(list(phrases), any_case, _sifts if not any_case
                                      else _across) or "")
        return Match(" AND ".join(parts), " AND ".join(p.words for p in phrases.values()), then)

    def _phrase(self, key: str) -> _Phrase | None:
        """The FTS5 phrase of `key`'s words, or those of each word its first may end; or None.

        A word is what the words table takes for one (`ascii`: cut at ASCII punctuation and
        blanks), so the key's words are its text cut at those alike. Its first word may be the
        end of a longer one in the text: the phrase is asked with each word of the index that
        ends with it (`_ending`), or, when those are more than `_ENDINGS`, from its second word
        on; when that would leave one word whole (no phrase at all), up to `_ENDINGS_ALONE` of
        them are asked, and its last word is not asked whole later (each of them merges that
        word's list again). Its last word may be the start of a longer one: unless the key ends
        in a separator, it is asked as a prefix of its first `_PREFIX` characters, the length
        the words table keeps a list of (SQLite reads that one list only as far as asked, where
        a longer prefix has it read and merge the whole list of every word it begins), or left
        out when shorter (too many words begin it to ask). None when fewer than two words are
        left (one word narrows little), or for a lone surrogate. Beside the phrase, what it
        leaves out, for `Match.then`.
        """
        cut = _SEPARATORS.search(key)
        if cut is None or utf8(key) is None:
            return None
        first, rest = key[:cut.start()], key[cut.end():]
        if len(_WORD.findall(rest)) < (2 if not first else 1):
            return None
        star = "" if _SEPARATORS.fullmatch(key[-1]) else "*"
        whole, short = "", False  # with its last word whole when cut; a short one left out
        if star and (last := _LAST_WORD.search(rest)):
            if len(last.group()) > _PREFIX:
                whole = rest
            short = len(last.group()) < _PREFIX
            rest, star = (rest[:last.start()], "") if short else (rest[:last.start() + _PREFIX],
                                                                  star)
        after = len(_WORD.findall(rest))
        longer = self._ending(first, _ENDINGS_ALONE if after == 1 and not short else _ENDINGS) \
            if first and after else None
        if longer is None and after < 2:
            return None
        if longer is not None and len(longer) > _ENDINGS:
            whole = ""

        def phrase(words: str) -> str:
            if longer is None:
                return _quoted(words) + star
            return "(" + " OR ".join(_quoted(f"{word} {words}") + star
                                     for word in (first, *longer)) + ")"

        return _Phrase(phrase(rest), phrase(whole) if whole else "")

    def _ending(self, word: str, most: int) -> list[str] | None:
        """The words of the index longer than `word` that end with it; None if over `most`."""
        backwards = word[::-1]
        query, args = "SELECT word FROM ends WHERE word > ?", (backwards,)
        if (past := _past(backwards)) is not None:
            query, args = query + " AND word < ?", (backwards, past)
        found = self.rows(f"{query} LIMIT {most + 1}", args)
        if len(found) > most:
            return None
        if not all(type(w) is str for (w,) in found):
            raise self.damaged()
        return [w[::-1] for (w,) in found]

    def _short(self, key: str, files: int, any_case: bool = False) -> str | None:
        """Any trigram of the index that `key` (one or two characters) begins; None if too many.

        With `any_case`, any trigram one of its spellings in ASCII capitals and small letters
        begins.

        The index's terms from `key` on are read in order up to the first the key cannot begin
        (`fts5vocab`, which reads each term's list to count its files), and no further once
        they are more than `_SHORT_TERMS` or one of them names more than `_DENSE` of the
        `files`: a key that common fills a page from the first files read in path order. Their
        counts added up only bound how many files hold the key (a file may hold `- a` and
        `- b`), so past `_DENSE` they end the reading once they are more than `_SHORT_ASKED`
        or add up to more than `files`: a question of a few terms costs less than reading
        files that do not hold the key, and reading on through the lists of a key in every
        file costs more. None of them: no file holds the key, and the MATCH of the key padded
        with line breaks, a trigram it would begin, names none.
        """
        if self.conn is None or utf8(key) is None:
            return None
        if not self._vocab:
            self.rows("CREATE VIRTUAL TABLE IF NOT EXISTS temp.vocab USING "
                      "fts5vocab(main, grams, 'row')")
            self._vocab = True
        terms: list[str] = []
        named = widest = 0  # the files the terms name between them (an upper bound), and one
        try:
            for begun in _spellings(key) if any_case else [key]:
                query, args = "SELECT term, doc FROM temp.vocab WHERE term >= ?", (begun,)
                if (past := _past(begun)) is not None:
                    query, args = query + " AND term < ?", (begun, past)
                for term, docs in self.conn.execute(query, args):
                    if not isinstance(term, str) or not isinstance(docs, int):
                        raise self.damaged()
                    if not term.startswith(begun):
                        break
                    terms.append(term)
                    named, widest = named + docs, max(widest, docs)
                    if len(terms) > _SHORT_TERMS or widest > _DENSE * files or named > files or (
                            named > _DENSE * files and len(terms) > _SHORT_ASKED):
                        return None
        except READ_ERRORS as exc:
            self._unreadable(exc)
            raise IndexLost from None
        return "(" + " OR ".join(_quoted(t) for t in terms or [key + TEXT_END[:3 - len(key)]]) + ")"

    def between(self, match: Match, lo: int, hi: int) -> array[int]:
        """Ids from `lo` to `hi` of the parts `match` names: one seek into each list."""
        return self._ids(match, (lo, hi))

    def among(self, grams: str, ids: array[int]) -> array[int]:
        """Of `ids` (in order), those of the parts the trigrams `grams` name.

        One question over their range, which SQLite filters by them, so that a sieve that
        names most parts there costs no list of them here.
        """
        kept = ",".join(map(str, ids))
        found = self.rows("SELECT group_concat(rowid) FROM (SELECT rowid FROM grams WHERE grams "
                          f"MATCH ? AND rowid BETWEEN ? AND ? AND +rowid IN ({kept}))",
                          (grams, ids[0], ids[-1]))[0][0]
        if found is not None and not isinstance(found, str):
            raise self.damaged()
        return array("q", map(int, found.split(","))) if found else array("q")

    def first(self, words: str, lo: int, hi: int, most: int) -> array[int]:
        """The first `most` ids from `lo` to `hi` of the parts a phrase names, in order.

        SQLite walks the words' places only as far as the last of them.
        """
        found = self.rows("SELECT group_concat(rowid) FROM (SELECT rowid FROM words WHERE "
                          "words MATCH ? AND rowid BETWEEN ? AND ? ORDER BY rowid LIMIT ?)",
                          (words, lo, hi, most))[0][0]
        if found is not None and not isinstance(found, str):
            raise self.damaged()
        return array("q", map(int, found.split(","))) if found else array("q")

    def _ids(self, match: Match, bounds: tuple[int, int] | tuple[()]) -> array[int]:
        where = " AND rowid BETWEEN ? AND ?" if bounds else ""
        asked = [(table, expr) for table, expr in (("grams", match.grams), ("words", match.words))
                 if expr]
        sql = " INTERSECT ".join(f"SELECT rowid FROM {table} WHERE {table} MATCH ?{where}"
                                 for table, _ in asked)
        args = tuple(value for _, expr in asked for value in (expr, *bounds))
        found = self.rows(f"SELECT group_concat(rowid) FROM ({sql})", args)[0][0]
        if found is not None and not isinstance(found, str):
            raise self.damaged()
        return array("q", map(int, found.split(","))) if found else array("q")


class Cut(NamedTuple):
    """A file's parts in its bytes: the position of its first part and each part's bounds."""

    head: int
    bounds: list[int]


def regions(cut: Cut, named: Iterable[set[int]] | None) -> list[tuple[int, int]]:
    """The byte ranges, in order, of the parts of a file at positions in any of `named`.

    Each of its parts for None.
    """
    bounds, head = cut.bounds, cut.head
    parts = range(len(bounds) - 1)
    if named is not None:
        parts = sorted({k for positions in named for k in parts if head + k in positions})
    return [(bounds[k], bounds[k + 1]) for k in parts]


Spots = dict[int, set[int]]
"""Of a chunk of positions, those the index named for each key asked about them, by the key's
place among the search's queries. A key not there may be in any part."""


class Match(NamedTuple):
    """An FTS5 MATCH of the trigrams (`grams`) and one of the words (`words`), "" for none.

    `then`: what a phrase is asked as once it proves to name many parts that do not hold it
    (`Named.tighten`): with its last word whole as the prefix, not its first three characters
    (`for these` named 2,323 parts of the AWS documentation, where `"for these"*` names 75),
    and with its key's trigrams, which hold a first word the phrase left out and the separators
    the words table does not tell apart (`https docs` named 5,782 parts holding
    `https://docs`; with its trigrams, 23), and those of a case-sensitive key that hold a
    capital (`The project` named 945 parts of prose where 27 hold it). These cost more to
    ask, so not from the start: a prefix past three characters has SQLite read and merge the
    whole list of every word it begins for each question, and the trigrams, asked a chunk at
    a time, made `e is not` take twice as long.
    """

    grams: str
    words: str
    then: Match | None = None
    sieve: str = ""  # of the parts each question of `words` names, those these trigrams name


class _Phrase(NamedTuple):
    """A phrase's words (`Match.words`), and with its last word whole (for `Match.then`).

    `whole` is "" unless the last word was cut to `_PREFIX`.
    """

    words: str
    whole: str


def _grams(keys: Iterable[str], any_case: bool = False,
           kept: Callable[[str, int], bool] | None = None) -> str | None:
    """The FTS5 MATCH of every key's trigrams (those `kept`, by key and place); None if none.

    Every trigram of a key, so those across the words of a phrase narrow it too (each is in
    fewer files than the words alone), and at most `_MAX_GRAMS` of them, spread along a long
    key; with `any_case`, each as any of its spellings (`_spellings`). Also None for a lone
    surrogate, which SQLite cannot take.
    """
    grams: set[str] = set()
    for key in keys:
        found = dict.fromkeys(key[i:i + 3] for i in range(len(key) - 2)
                              if kept is None or kept(key, i))
        grams.update(_spread(list(found)))
    if not grams:
        return None
    expr = " AND ".join("(" + " OR ".join(map(_quoted, _spellings(gram))) + ")" if any_case
                        else _quoted(gram) for gram in sorted(grams))
    return expr if utf8(expr) is not None else None


def _spellings(text: str) -> list[str]:
    """`text` with each ASCII letter a capital or a small letter, every way.

    The index's trigrams keep ASCII case, so a search ignoring it asks each.
    """
    return ["".join(chars) for chars in product(*(
        (c, c.upper()) if "a" <= c <= "z" else (c, c.lower()) if "A" <= c <= "Z" else (c,)
        for c in text))]


def _sifts(key: str, at: int) -> bool:
    """Whether a phrase's trigram tells what its words cannot: a separator, or case.

    A capital, and the start of a word, which the text may hold capitalized where the key
    does not (`Developer Guide` for `developer guide`).
    """
    return _CAPITAL.search(key, at, at + 3) is not None or \
        _SEPARATORS.match(key, at + 1, at + 2) is not None or \
        (at == 0 or _SEPARATORS.match(key, at - 1, at) is not None) and \
        _SEPARATORS.match(key, at, at + 1) is None


def _across(key: str, at: int) -> bool:
    """Whether a phrase's trigram has a separator in the middle, which its words cannot tell."""
    return _SEPARATORS.match(key, at + 1, at + 2) is not None


def _spread(grams: list[str]) -> list[str]:
    """At most `_MAX_GRAMS` of `grams`, spread along them."""
    if len(grams) <= _MAX_GRAMS:
        return grams
    step = (len(grams) - 1) / (_MAX_GRAMS - 1)
    return [grams[round(i * step)] for i in range(_MAX_GRAMS)]


def _past(prefix: str) -> str | None:
    """The first string past every one that begins with `prefix`; None past the last character."""
    after = ord(prefix[-1]) + 1
    if after > 0x10FFFF:
        return None
    return prefix[:-1] + chr(0xE000 if 0xD800 <= after < 0xE000 else after)  # no surrogates


def _quoted(term: str) -> str:
    """A term as an FTS5 string."""
    return '"' + term.replace('"', '""') + '"'


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
        self._in_order: bool | None = None  # `in_order`
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

    def in_order(self) -> bool:
        """Whether every position's id is past the one before: an index built in path order."""
        if self._in_order is None:
            ids = self.ids.tolist()
            self._in_order = not self.stale and ids == sorted(ids)
        return self._in_order

    def positions(self, ids: array[int] | None) -> set[int] | None:
        """Positions of these ids that the index vouches for, and every stale position."""
        if ids is None:
            return None
        where, top = self.where, len(self.where)
        found = {where[i] for i in ids if i < top}
        found.discard(-1)
        found.update(self.stale)
        return found


class Named:
    """The positions the index names for some keys (ANDed), asked a chunk of positions at a time.

    A walk in path order that fills its page within its first files asks only about those; one
    through every file asks in a few chunks that double in size, on a grid fixed from the span's
    start, so a later group's walk reuses what an earlier one asked. Each question costs about
    as much as reading several files, so a key that named few positions in its first chunk is asked
    once for the whole index instead; not a phrase, though: its words may be in every file, and
    SQLite reads their places in each file asked about, so asking about all of them costs a walk
    of the whole index where the page may fill halfway. Ids that stand far from path order
    (files added since the index was built whole) are simply named: verifying a few files costs
    less than asking for them. A key the index cannot narrow names every position; so does one
    that names more than `_DENSE` of the positions asked about, from then on, unless it is
    `dense`: one of several keys every file must hold (`all`), where even common keys can meet
    in few files.
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
        # the words and rate of a phrase before its last word was made whole, until asked
        self.untried: tuple[str, float] | None = None
        self.sifted = False  # whether the sieve once left under `_KEPT` of the parts named

    def rate(self) -> float:
        """The share of positions named so far (a half until asked): sparse keys go first."""
        return self.seen[0] / self.seen[1] if self.seen[1] else 0.5

    def everywhere(self) -> bool:
        """Whether the key names every position, unasked."""
        return self.expr is None or not self.dense and bool(self.seen[1]) and \
            self.rate() > _DENSE

    def tighten(self, words_only: bool) -> bool:
        """Ask `Match.then` from now on, or only its words and sieve; False when nothing is new.

        Its words and sieve alone keep the rest of it for later.
        """
        expr = self.expr
        if expr is None or (then := expr.then) is None or words_only and \
                (then.words, then.sieve) == (expr.words, expr.sieve):
            return False
        self.untried = (expr.words, self.rate()) if words_only and then.words != expr.words \
            else None
        self.expr = Match(expr.grams, then.words, then, then.sieve) if words_only else then
        self.whole, self.seen = None, [0, 0]
        return True

    def order(self, lo: int) -> tuple[bool, float]:
        """Keys known without a question first, then the sparsest."""
        known = lo in self.asked or self.whole is not None or self.everywhere()
        return not known, self.rate()

    def within(self, lo: int, hi: int) -> set[int] | None:
        """Positions in [lo, hi) whose part may hold the keys; None when it may be any of them."""
        if lo in self.asked:
            return self.asked[lo]
        if self.everywhere():
            return None
        view = self.view
        stale = view.stale[bisect_left(view.stale, lo):bisect_left(view.stale, hi)]
        assert self.expr is not None
        sparse = bool(self.seen[1]) and self.rate() * len(view) <= _WHOLE and not self.expr.words
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
        position named in between is there, and no file is cut. Only for a view `in_order`
        (position order is id order) and a phrase alone (`words`, no `grams`). Of them, only the
        parts its `sieve` names are kept, asked over the same ids; the sieve is asked again only
        if its first question left under `_KEPT` of them. The first question after
        `tighten` made its last word whole goes back to the words before, unless it names under
        `_KEPT` as many parts as they did.
        """
        assert self.expr is not None
        view, owners = self.view, self.view.owners
        ids = view.index.first(self.expr.words, view.ids[lo], view.ids[stop - 1], most)
        hi = stop
        if len(ids) == most:  # up to the last id named, then to the end of its file
            hi = bisect_right(view.ids, ids[-1], lo, stop)
            while hi < stop and owners[hi] == owners[hi - 1]:
                hi += 1
            if view.ids[hi - 1] > ids[-1]:
                ids.extend(view.index.between(self.expr, ids[-1] + 1, view.ids[hi - 1]))
        found = view.positions(ids) or set()
        if self.untried is not None:  # its last word whole: kept if it names under `_KEPT`
            words, rate = self.untried
            if len(found) > _KEPT * rate * (hi - lo):
                self.expr = self.expr._replace(words=words, then=self.expr.then._replace(
                    words=words) if self.expr.then else None)
            self.untried = None
        if self.expr.sieve and ids:
            kept = view.index.among(self.expr.sieve, ids)
            if self.sifted or len(kept) < _KEPT * len(ids):
                found, self.sifted = view.positions(kept) or set(), True
            else:  # and `then`'s too, so that `tighten` does not bring it back
                then = self.expr.then
                self.expr = self.expr._replace(sieve="", then=then._replace(sieve="")
                                               if then else None)
        self.seen[0] += len(found)
        self.seen[1] += hi - lo
        return found, hi

    def _asked(self, lo: int, hi: int) -> set[int]:
        """Ask the index for the chunk's ids in one range; stray ids are named unasked."""
        view = self.view
        run = view.run(lo, hi)
        if run is None:
            return set()
        first, end, stray = run
        if len(stray) * _SCATTERED > hi - lo:  # scattered ids: ask once for the whole index
            return self._from_whole(lo, hi)
        where, top = view.where, len(view.where)
        found = {where[i] for i in view.index.between(self.expr, first, end) if i < top}
        found.update(where[i] for i in stray if i < top)
        return {pos for pos in found if lo <= pos < hi}

    def _from_whole(self, lo: int, hi: int) -> set[int]:
        """The chunk's positions among all the index names, asked of it once for every chunk."""
        if self.whole is None:
            named = self.view.index.matching(self.expr)
            self.whole = sorted(self.view.positions(named) or ())
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
    phrase alone, with `room` (the results its page still takes), is asked `_ahead`.
    """
    key = named[0]
    paced = room if len(named) == 1 and key.expr is not None and key.expr.words and \
        not key.expr.grams and view.in_order() else None
    for span in spans:
        lo = min(max(view.find(start, span.start) if start else span.start, span.start),
                 span.stop)
        if paced is not None and not key.expr.grams:  # type: ignore[union-attr]
            lo = yield from _ahead(view, key, lo, span.stop, paced)
        for first, end in _chunks(view, span):
            if end <= lo:
                continue
            allowed = _at_least(named, group, first, end)
            if allowed is None:
                yield from _every_file(view, max(lo, first), end)
            else:
                yield from (item for item in allowed if item[0] >= lo)


def _ahead(view: View, key: Named, lo: int, stop: int,
           room: Callable[[], int]) -> Generator[tuple[int, Spots | None], None, int]:
    """The files from `lo` a phrase names, asked for half again as many as the page takes.

    Its words may be in every part, and SQLite then walks their places in every part a
    question covers: a question for the next matches stops where the page will fill, where a
    chunk of fixed size walks on to its end, and each question costs as much as walking
    thousands of parts. A page that needs more (most of the files named do not hold the
    query) asks twice as many each time. Once the phrase names more than `_DENSE` of the
    positions asked about, every file is read from then on, unasked. Once the files read
    (`_TRIED` or more) give under one result in `_YIELD`, the phrase is asked as its
    `Match.then`: its words and sieve alone, asked ahead as before, or, when it names more
    than `_DENSE`, all of it, a chunk at a time by the caller from where this returns (asked
    a chunk at a time, its trigrams cost `e is not` more than reading the files it names,
    and a phrase in most files whose files give results is read faster file by file). Its
    words alone are kept only if the first question names under `_KEPT` of the parts the
    phrase named before: SQLite merges the list of every word a whole last word begins for
    each question, 3.5-4.3 ms for `default` at 100,000 files where it begins no other word.
    """
    owners, most, read, before = view.owners, 0, 0, room()
    while lo < stop:
        if read >= _TRIED and (before - room()) * _YIELD < read and \
                key.tighten(words_only=not key.everywhere()):
            most, read, before = 0, 0, room()
        if key.everywhere():
            yield from _every_file(view, lo, stop)
            return stop
        if key.expr.grams:  # type: ignore[union-attr]
            return lo
        most = max(room() * 3 // 2 + 1, 2 * most)
        found, hi = key.ahead(lo, stop, most)
        spots: Spots = {0: found}
        files: set[int] = set()
        for pos in sorted(found):
            if owners[pos] not in files:
                files.add(owners[pos])
                read += 1
                yield pos, spots
        lo = hi
    return lo


def _every_file(view: View, lo: int, hi: int) -> Iterator[tuple[int, Spots | None]]:
    """Each file from position `lo` (a file's first) to `hi`, any part of it possibly named."""
    owners = view.owners
    return ((p, None) for p in range(lo, hi) if p == lo or owners[p] != owners[p - 1])


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
