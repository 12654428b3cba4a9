"""The search index as a search reads it: one read transaction, and what it asks the index.

A search (search.py) reads the index in one read transaction (`IndexReader`), which turns each
query into the question the index answers (`IndexReader.expression`: trigrams, a phrase of the
words, and what is asked once a phrase proves to name many parts that lack it, `Match.then`)
and asks it of a range of the index's rows. index_view.py walks the index's parts in path order
with it. The index only ever narrows: each part it names is verified against the real file.
"""

from __future__ import annotations

import math
import os
import re
import sqlite3
import stat
from array import array
from collections.abc import Callable, Iterable
from itertools import pairwise, product
from typing import Any, NamedTuple

from sharedmem.cache.cache import Cache
from sharedmem.cache.folding import lower_ascii
from sharedmem.cache.matching import utf8
from sharedmem.cache.search_index import (
    FOLDED,
    ORDER_TYPE,
    PAIRED,
    READ_ERRORS,
    TEXT_END,
    delete_damaged,
    in_case,
    index_path,
    is_busy,
    is_planted,
    last_pages,
    pair_token,
    pair_words,
    punctuation_apart,
    read_only_uri,
)
from sharedmem.core import CacheError

_MAX_GRAMS = 16  # trigrams of one key asked of the index, at most
DENSE = 0.3  # an index naming more than this share of files does not narrow a page in order
_SHORT_TERMS = 512  # a short key beginning more trigrams than this is not looked up (scanned)
_SHORT_ASKED = 64  # nor one of more whose trigrams' files add up past `DENSE` (`_short`)
_SEPARATORS = re.compile(r"[\x00-\x2f\x3a-\x40\x5b-\x60\x7b-\x7f]+")  # ASCII, not a letter or digit
_WORD = re.compile(r"[^\x00-\x2f\x3a-\x40\x5b-\x60\x7b-\x7f]+")  # what FTS5's `ascii` keeps
_LAST_WORD = re.compile(_WORD.pattern + r"\Z")
_CAPITAL = re.compile("[A-Z]")
_PREFIX = 3  # the words table's prefix length (`prefix='3'`), to which a last word is cut
_ENDINGS_ALONE = 32  # as many, for a phrase of one whole word after its first
_ENDINGS_LATER = 128  # more, asked only once the trigrams' files prove to mostly lack the key
_LATER_PAGES = 8  # pages the first word's list may fill for those: each question walks it
_LATER_RARE = 128  # or parts the phrase of the first word itself may be in, past that
_LATER_ROWS = 65536  # counted among the rows below this one: that question walks its places
_MERGED = 32  # pages the words a short last word begins may fill, for it to be asked as a prefix
_RARE = 128  # parts a short last word's lead is in, at most, for its trigrams to be asked
_ENDED = 32  # parts the words ending with that lead may name, to be asked alone beside it
_ONE_PAGES = 2  # pages a key's one word after a first ending too many words may fill, alone
_ONE_SHARE = 1 / 16  # and parts that word may be in, at most, for it to be asked alone
_ENDINGS = 8  # words ending with a phrase's first that are asked; more: the phrase starts after it


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
        self._vocab = False  # the connection's views of the index's terms are made (`_terms`)
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
            width = array(ORDER_TYPE).itemsize
            if rows and all(isinstance(v, bytes) and len(v) % width == 0 for v in rows[0]):
                ids, owners, where = array(ORDER_TYPE), array(ORDER_TYPE), array(ORDER_TYPE)
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
        characters or more is its trigrams (`_grams`), and for a word and a short last word (no
        phrase, not even in its case), the words that may end where its first does (`_lone`,
        not beside `accented` words); a shorter
        one is any of the trigrams it begins (`_short`; `files`, how many the index holds, tells
        it when the key is in too many of them to narrow). All of them go in one MATCH per
        table, so SQLite intersects them: a few parts can hold all of several common words. The
        trigrams keep ASCII case: a key is asked as written, or, `any_case` (a search ignoring
        case or `normalized`, whose key is folded), each trigram as any of its spellings in
        ASCII capitals and small letters. The `accented` words of a query not `normalized`
        (`folding.accented_keys`) are asked as trigrams alone, as the index keeps them beside
        the folded text, casefolded, not among its words; one of one or two characters only when
        no longer one is asked (it is any of hundreds of trigrams, and narrows little past a
        longer one). A phrase's trigrams are asked only in its `Match.then`, and those holding
        an ASCII capital, beginning a word or with a separator in the middle, which its words
        cannot tell, in its `sieve`: a phrase asked with trigrams is asked a chunk at a time,
        where its words alone are asked only as far as its page needs (`_ahead`). A key's word
        pairs (`_paired`) tell what its folded words cannot, case and a first word that ends
        too many words: a case-sensitive key with no folded phrase (a short last word is merged
        in `words` only ignoring case) is asked by its pairs from the start, if at all; a
        case-sensitive phrase, or one that starts after its first word (`_Phrase.after`), asks
        them in its `then`, alone (beside the phrase where a last word of one character is not
        among them), before its last word whole and its trigrams. A key asked by its trigrams
        because its first word ends too many words for a phrase from the start is asked by its
        pairs in its `then`, once its files prove to lack it, and after them as the phrase of
        each word its first may end (`_Phrase.later`).
        """
        keys, accented = list(keys), list(accented)
        # A short last word's words are merged only for a phrase asked alone (not with trigrams
        # a chunk at a time, each chunk merging them again), and in its case when case counts.
        merge = any_case and not accented
        phrases = {key: p for key in keys if (p := self._phrase(
            lower_ascii(key), merge, files, any_case or not _CAPITAL.search(key))) is not None}
        later = {key: phrases.pop(key) for key, p in list(phrases.items()) if p.later}
        paired = {} if any_case or accented or phrases else {
            key: c for key in keys if (c := self._paired(key, False)) is not None}
        lone = [w for key in keys if not accented and key not in phrases and key not in paired
                and (w := self._lone(lower_ascii(key), files)) is not None]
        parts = [grams for grams in (_grams([k for k in keys if k not in phrases and
                                             k not in paired], any_case),
                                     _grams(accented)) if grams]
        short = [(key, any_case) for key in keys if 0 < len(key) < 3]
        if all(len(key) < 3 for key in accented):  # beside a longer one, little for its cost
            short += [(key, False) for key in accented if key]
        for key, folded in short:
            if (expr := self._short(key, files, folded)) is not None:
                parts.append(expr)
        if not parts and not phrases and not paired:
            return None
        if paired:  # asked in its case from the start, sieved as `then` would be
            return Match(" AND ".join(parts), "", sieve=_grams(paired, kept=_told) or "",
                         pairs=" AND ".join(paired.values()), phrase=False)
        then = None
        if later:
            then = Match("", " AND ".join([p.words for p in later.values()] + lone))
            pairs = [self._paired(key, any_case) for key in later]
            if all(pairs):  # their pairs before: each question costs little
                then = Match("", " AND ".join(lone), then, pairs=" AND ".join(filter(None, pairs)),
                             phrase=bool(lone))
        if phrases:  # with the trigrams of each phrase's key, and its last word whole
            more = _grams(phrases, any_case)
            sieve = _grams(phrases, any_case, _across if any_case else _sifts) or ""
            then = Match(" AND ".join(parts + ([more] if more else [])), " AND ".join(
                [p.whole or p.words for p in phrases.values()] + lone), sieve=sieve)
            after = any(p.after for p in phrases.values())
            # their pairs, where they tell what the words cannot: a first word that ends many
            # words, or case; before the rest, as each question of them costs little
            pairs = [self._paired(key, any_case) for key in phrases] \
                if not accented and (after or not any_case) else []
            if pairs and all(pairs):  # beside the words, where a short last word's pair
                short = [p.words for k, p in phrases.items() if _short_last(k) is not None]
                told = sieve if any_case else _grams(phrases, kept=_told) or ""  # case, starts
                then = Match(" AND ".join(parts), " AND ".join(short + lone), then, told,
                             " AND ".join(filter(None, pairs)), phrase=bool(short or lone))
        return Match(" AND ".join(parts), " AND ".join(
            [p.words for p in phrases.values()] + lone), then, phrase=bool(phrases) or not lone)

    def _phrase(self, key: str, merge: bool, files: int, word_alone: bool = True
                ) -> _Phrase | None:
        """The FTS5 phrase of `key`'s words, or those of each word its first may end; or None.

        A word is what the words tables take for one (`punctuation_apart`: cut at blanks, each
        ASCII punctuation character a word of its own), so the key's words are its text cut
        alike; the separators between its words are in the phrase, their punctuation as words.
        Its first word may be the end of a longer one in the text: the phrase is asked with each
        word of the index that ends with it (`_ending`), or, when those are more than
        `_ENDINGS`, from its second word on; when that would leave one word whole (no phrase at
        all), up to `_ENDINGS_ALONE` of them are asked, and its last word is not asked whole
        later (each of them merges that word's list again). Where that would leave no phrase, up
        to `_ENDINGS_LATER` of them make one asked only in `Match.then` (`_Phrase.later`), while
        they cost little to walk (`_walks_little`). From the start, each would merge the list
        of its last word again, and where the key's trigrams already name few parts (`group
        named`) that costs more than it saves.
        Where the phrase starts after its first word (`_Phrase.after`), its word pairs tell
        the first (`expression`): `file in the` names most parts from `in` on, and so do its
        trigrams, where its pairs name 110 of the documentation's 41,906 rows.
        Its last word may be the start of a longer one: unless the key ends in a separator, it
        is asked as a prefix of its first `_PREFIX` characters, the length the words table keeps
        a list of (SQLite reads that one list only as far as asked, where a longer prefix has it
        read and merge the whole list of every word it begins), or left out when shorter (too
        many words begin it to ask). With `merge`, when leaving it out would leave one word (the
        first not counted where more than `_ENDINGS_LATER` words end with it, as the phrase
        then starts after it: `is used by`), it
        is asked whole as a prefix if the words it begins fill few pages (`_merges_little`) and
        the word before it is common (`_worth_merging`); each longer word ending with the first
        is then asked alone (`_either`). None when fewer than two words are left (one word
        narrows little), but for the one word after a first that ends too many words: its
        trigrams name every part holding its pieces apart (`to supply`: 1,457 of 10,000 man
        pages, where `supply` is in 91 parts), so it is asked alone, whole, as the prefix it
        may be, while its list fills at most `_ONE_PAGES` pages and it is in at most
        `_ONE_SHARE` of the `files` parts; not with `word_alone` False (a key in its case
        holding an ASCII capital, whose trigrams in its case name fewer parts than the word
        folded). None for a lone surrogate too; with `merge`, punctuation counts among them,
        but one word beside it is asked only while in at most `DENSE` of the `files` parts
        (`_count`). Beside the phrase, what it leaves out, for `Match.then`.
        """
        cut = _SEPARATORS.search(key)
        if cut is None or utf8(key) is None:
            return None
        first, rest = key[:cut.start()], key[cut.end():]
        # With `merge`, punctuation counts among the words: see `_count`.
        count = _count if merge else _count_words
        if count(cut.group() + rest) < (2 if not first else 1) or not (first or _WORD.search(rest)):
            return None
        star = "" if _SEPARATORS.fullmatch(key[-1]) else "*"
        ended = self._ending(first, _ENDINGS_LATER) if first else None  # None: none, or too many
        whole, short, merged = "", False, False  # its last word whole when cut; a short one
        if star and (last := _LAST_WORD.search(rest)):
            if len(last.group()) > _PREFIX:
                whole = rest
            short = len(last.group()) < _PREFIX
            if merge and short and len(_WORD.findall(rest, 0, last.start())) < (
                    2 if ended is None else 1) and self._merges_little(last.group()):
                short, merged = False, True  # asked as the prefix it may be: one word is no phrase
            if not merged:
                rest, star = (rest[:last.start()], "") if short else (
                    rest[:last.start() + _PREFIX], star)
        after, left = len(_WORD.findall(rest)), cut.group() + rest
        longer = ended if count(left) else None
        # the words asked without the first; beside a short last word left out, no punctuation
        alone = after if short else count(left)
        # more words end with the first than are asked from the start: asked later, if at all
        later = longer is not None and len(longer) > (
            _ENDINGS_ALONE if after == 1 and not short else _ENDINGS)
        if later and not (short or merged) and alone >= 2 and after:  # starts after the first
            longer, later = None, False
        elif later and (short and after != 1 or merged or
                        not self._walks_little(first, left, star)):
            longer, later = None, False
        one = word_alone and longer is None and alone == after == 1 and not (short or merged)
        if longer is None and (alone < 2 and not one or not after) or merged and not \
                self._worth_merging(first if longer is not None else
                                    _WORD.findall(rest)[0], longer or []):
            return None
        if one:  # a rare word alone, whole: the few words it begins cost little to merge
            rest, whole = whole or rest, ""
            word = _WORD.findall(rest)[0]
            if self._pages("words", word) > _ONE_PAGES or self._dense([word], files, _ONE_SHARE):
                return None
        elif (longer is not None) + after < 2 and self._dense(  # one word beside punctuation
                [first, *longer] if longer is not None else _WORD.findall(whole or rest), files):
            return None  # (its last word as the key has it, not cut to `_PREFIX`)
        if longer is not None and len(longer) > _ENDINGS:
            whole = ""

        def phrase(words: str) -> str:
            return _words(cut.group() + words) + star if longer is None else \
                _either(first, longer, cut.group() + words, star, merged)

        return _Phrase(phrase(rest), phrase(whole) if whole else "", later,
                       bool(first) and longer is None)

    def _lone(self, key: str, files: int) -> str | None:
        """For a key of a word, blanks and a short last word: the words its first may be; or None.

        That last word (under `_PREFIX` characters) is left out of a phrase, which leaves one
        word: no phrase (`_phrase`), and in its case no pairs either where it is one
        character (`_paired`). The key's trigrams name every part holding its pieces anywhere
        (`enter` of `entered`, `r a` of `for a`); the first word whole, or one of at most
        `_ENDINGS_ALONE` words ending with it, asked beside them, names only the parts that may
        hold the key, in any case (the words are folded: a case-sensitive key's file tells).
        None when more words end with it, or when they are in more than `DENSE` of the `files`
        parts between them: they would narrow little for the cost of reading their lists.
        """
        cut, last = _SEPARATORS.search(key), _LAST_WORD.search(key)
        if cut is None or not cut.start() or last is None or last.start() != cut.end() or \
                len(last.group()) >= _PREFIX or _count(cut.group()) or utf8(key) is None:
            return None
        first = key[:cut.start()]
        longer = self._ending(first, _ENDINGS_ALONE)
        if longer is None or self._dense([first, *longer], files):
            return None
        return _either(first, longer, "", "", True)

    def _paired(self, key: str, any_case: bool) -> str | None:
        """The word pairs of `key` (the `pairs` table, `search_index.pairs_text`), ANDed; or None.

        Every part holding the key holds each pair of its words one after the other: the first
        two characters of the second, the last four of the first. The key's first word may be
        the end of a longer one, so its four are the prefix they may be, unless the key starts
        with a separator or that word is four characters or more; its last word may be the
        start of a longer one, so the pair ending with it is left out when it is one character
        and the key does not end with a separator. In its case, or, `any_case`, either way it
        may be kept (`FOLDED`). A prefix whose pairs fill more than `_MERGED` pages is left out:
        each question merges their lists. None when no pair is left, or for a lone surrogate.
        """
        words = pair_words(key)
        if len(words) < 2 or utf8(key) is None:
            return None
        whole_first = len(words[0]) >= 4 or _SEPARATORS.match(key) is not None
        whole_last = len(words[-1]) >= 2 or _SEPARATORS.fullmatch(key[-1]) is not None
        asked = []
        for at, (first, second) in enumerate(pairwise(words)):
            if at + 2 == len(words) and not whole_last:
                continue
            pair = pair_token(first, second)
            star = "" if at or whole_first else "*"
            if star and self._pages("pairs", in_case(pair), begun=True) > _MERGED:
                continue
            asked.append("(" + " OR ".join(_quoted(p) + star for p in (
                pair, pair.replace(PAIRED, FOLDED))) + ")" if any_case
                else _quoted(in_case(pair)) + star)
        return " AND ".join(asked) or None

    def _walks_little(self, first: str, left: str, star: str) -> bool:
        """Whether the phrases of `first`, and of each word ending with it, then `left` cost little.

        Each question of them walks the list of `first` as far as its page needs: little where
        that list fills at most `_LATER_PAGES` pages, or where the phrase of `first` itself is
        in at most `_LATER_RARE` parts, so that they name few and one question reaches the end
        (`of tables`: `of` fills 12 pages of the documentation's words; the phrases of it and
        of the 47 words ending with it name 7 parts, where its trigrams named 249 files). That
        phrase is counted among the first `_LATER_ROWS` rows only: where it is rare, the
        question walks its places in every part it covers, up to 1.7 ms over the 41,758 rows
        of the documentation's index, 9 ms over eight copies of it. Not for `left` holding
        punctuation, whose places may be in every part: counting took up to 3.5 ms.
        """
        if self._pages("words", first) <= _LATER_PAGES:
            return True
        return _count(left) == _count_words(left) and len(self.rows(
            "SELECT rowid FROM words WHERE words MATCH ? AND rowid < ? LIMIT ?",
            (_words(first + left) + star, _LATER_ROWS, _LATER_RARE + 1))) <= _LATER_RARE

    def _merges_little(self, word: str) -> bool:
        """Whether the folded words that begin with `word` fill at most `_MERGED` pages.

        Asked as a prefix of fewer characters than a list of prefixes is kept for (`pairs`
        keeps none), `word` has SQLite read and merge the list of every word it begins, for each
        question.
        """
        return self._pages("words", word, begun=True) <= _MERGED

    def _pages(self, table: str, word: str, begun: bool = False) -> float:
        """How many pages of `table` the list of `word` fills, or those of every word it begins.

        FTS5 keeps in the table's `_idx`, for each segment, the first word of each page that
        begins one (as `0` and the word's UTF-8, in small letters; its page number doubled):
        the words lie from the last such page at or before the first of them to the first past
        them all (which may begin with the end of their list), or to the segment's last page
        (`last_pages`). So counted, a word in no part of a segment takes one or two of its
        pages: of a segment but the largest (the ones later refreshes add, `_scattered`),
        only the pages between, which its list fills whole, count. Infinite, as if they filled
        too many, for an answer of the wrong kind.
        """
        word = lower_ascii(word)  # as the tables' tokenizer keeps it
        past = _past(word) if begun else word + "\x01"  # no word holds U+0001: just past it
        if past is None or self.conn is None:
            return math.inf
        try:
            found = self.conn.execute(
                last_pages(table) + f"SELECT (SELECT pgno >> 1 FROM {table}_idx WHERE segid = "
                "segment AND term <= ? ORDER BY term DESC LIMIT 1), coalesce((SELECT pgno >> 1 "
                f"FROM {table}_idx WHERE segid = segment AND term >= ? ORDER BY term LIMIT 1), "
                "page), page FROM last", (b"0" + word.encode(), b"0" + past.encode())).fetchall()
        except sqlite3.Error:
            return math.inf
        if not all(type(end) is type(size) is int and type(first or 0) is int
                   for first, end, size in found):
            return math.inf
        largest = max(range(len(found)), key=lambda k: found[k][2], default=None)
        return sum(end - (first or 1) + 1 if k == largest else max(0, end - (first or 1) - 1)
                   for k, (first, end, _) in enumerate(found))

    def _worth_merging(self, lead: str, longer: list[str]) -> bool:
        """Whether a phrase of `lead` and a short last word is asked, that word as a prefix.

        Not when the words `longer` that end with `lead`, asked alone beside it, name more than
        `_ENDED` parts: each of those is read (`made` and `code`, for `de la`, name thousands).
        Nor when `lead` and they name at most `_RARE`: the key's trigrams, which cost no merge,
        name few parts too (`temporárias de`).
        """
        return self._rare(longer, _ENDED) and not self._rare([lead, *longer], _RARE)

    def _rare(self, words: list[str], most: int) -> bool:
        """Whether the folded `words` are in at most `most` parts between them."""
        if not words:
            return True
        named = self.rows("SELECT rowid FROM words WHERE words MATCH ? LIMIT ?",
                          (" OR ".join(map(_quoted, words)), most + 1))
        return len(named) <= most

    def _ending(self, word: str, most: int) -> list[str] | None:
        """The words of the index longer than `word` that end with it; None if over `most`."""
        backwards = lower_ascii(word)[::-1]
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
        they are more than `_SHORT_TERMS` or one of them names more than `DENSE` of the
        `files`: a key that common fills a page from the first files read in path order. Their
        counts added up only bound how many files hold the key (a file may hold `- a` and
        `- b`), so past `DENSE` they end the reading once they are more than `_SHORT_ASKED`
        or add up to more than `files`: a question of a few terms costs less than reading
        files that do not hold the key, and reading on through the lists of a key in every
        file costs more. None of them: no file holds the key, and the MATCH of the key padded
        with line breaks, a trigram it would begin, names none.
        """
        if self.conn is None or utf8(key) is None:
            return None
        self._terms()
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
                    if len(terms) > _SHORT_TERMS or widest > DENSE * files or named > files or (
                            named > DENSE * files and len(terms) > _SHORT_ASKED):
                        return None
        except READ_ERRORS as exc:
            self._unreadable(exc)
            raise IndexLost from None
        return "(" + " OR ".join(_quoted(t) for t in terms or [key + TEXT_END[:3 - len(key)]]) + ")"

    def _terms(self) -> None:
        """Make the connection's views of the terms of `grams` and `words`, once."""
        if not self._vocab:
            for name, table in (("vocab", "grams"), ("word_vocab", "words")):
                self.rows(f"CREATE VIRTUAL TABLE IF NOT EXISTS temp.{name} USING "
                          f"fts5vocab(main, {table}, 'row')")
            self._vocab = True

    def _dense(self, words: list[str], files: int, share: float = DENSE) -> bool:
        """Whether `words` are in more than `share` of the `files` parts between them.

        Counted by `fts5vocab`, which reads each word's list: 0.5 ms for a word in 5,000 parts,
        where asking for them took 2.4. Read one word at a time, and no further than that share.
        """
        if self.conn is None:
            raise IndexLost
        self._terms()
        found = 0
        try:
            for (docs,) in self.conn.execute("SELECT doc FROM temp.word_vocab WHERE term IN "
                                             f"({', '.join('?' * len(words))})", tuple(words)):
                if type(docs) is not int:
                    raise self.damaged()
                found += docs
                if found > share * files:
                    return True
        except READ_ERRORS as exc:
            self._unreadable(exc)
            raise IndexLost from None
        return False

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

    def first(self, match: Match, lo: int, hi: int, most: int) -> array[int]:
        """The first `most` ids from `lo` to `hi` of the parts a phrase names, in order.

        SQLite walks the words' places only as far as the last of them; its pairs, asked over
        the same ids, are only looked up there.
        """
        table, expr = ("words", match.words) if match.words else ("pairs", match.pairs)
        paired = " AND +rowid IN (SELECT rowid FROM pairs WHERE pairs MATCH ? AND rowid " \
            "BETWEEN ? AND ?)" if match.words and match.pairs else ""
        args = (match.pairs, lo, hi) if paired else ()
        found = self.rows(f"SELECT group_concat(rowid) FROM (SELECT rowid FROM {table} WHERE "
                          f"{table} MATCH ? AND rowid BETWEEN ? AND ?{paired} ORDER BY rowid "
                          "LIMIT ?)", (expr, lo, hi, *args, most))[0][0]
        if found is not None and not isinstance(found, str):
            raise self.damaged()
        return array("q", map(int, found.split(","))) if found else array("q")

    def _ids(self, match: Match, bounds: tuple[int, int] | tuple[()]) -> array[int]:
        where = " AND rowid BETWEEN ? AND ?" if bounds else ""
        asked = [(table, expr) for table, expr in (("grams", match.grams), ("words", match.words),
                                                   ("pairs", match.pairs)) if expr]
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


class Match(NamedTuple):
    """FTS5 MATCHes of the trigrams (`grams`), the words (`words`) and the word pairs (`pairs`).

    "" for none; the parts every one names. `then`: what a key is asked as once it proves to
    name many parts that do not hold it (`Named.tighten`). For a key asked by its trigrams, its
    pairs, then the phrases of its first word's many endings (`_Phrase.later`), alone: they
    name the parts holding the key (`value set`, whose first word ends 104 words: 4 parts of
    the documentation, where its trigrams name 308 files). For a phrase in its case, or one
    that starts after its first word, its pairs first (`for more information` named 5,939
    parts of the AWS documentation that hold `For more information`; its pairs in their case,
    125). Then with its last word whole as the prefix, not its first three characters (`for
    these` named 2,323 parts of the AWS documentation, where `"for these"*` names 75), and with
    its key's trigrams, which hold a first word the phrase left out and the blanks beside
    punctuation the words tables do not tell apart (`https:// docs` from `https://docs`).
    These cost more to ask, so not from the start: a prefix past three characters has SQLite
    read and merge the whole list of every word it begins for each question, and the
    trigrams, asked a chunk at a time, made `e is not` take twice as long.
    """

    grams: str
    words: str
    then: Match | None = None
    sieve: str = ""  # of the parts each question of `words` names, those these trigrams name
    pairs: str = ""  # of the `pairs` table: the pairs of a key's words (`_paired`)
    phrase: bool = True  # `words` holds a phrase (whose places SQLite walks), not words alone


class _Phrase(NamedTuple):
    """A phrase's words (`Match.words`), and with its last word whole (for `Match.then`).

    `whole` is "" unless the last word was cut to `_PREFIX`.
    """

    words: str
    whole: str
    later: bool = False  # asked only in `Match.then`, alone: see `_phrase`
    after: bool = False  # it starts after the key's first word, which ends too many words


def _either(first: str, longer: list[str], rest: str, star: str, alone: bool) -> str:
    """The phrase of `first` and `rest`, or of each of the `longer` words ending with `first`.

    `alone`: each longer word asked by itself beside the phrase, not as a phrase of its own,
    which would merge again the words a short last word begins.
    """
    if alone:
        return "(" + " OR ".join([_words(first + rest) + star, *map(_quoted, longer)]) + ")"
    return "(" + " OR ".join(_words(word + rest) + star for word in (first, *longer)) + ")"


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


def _short_last(key: str) -> int | None:
    """Where the key's last word begins, if it is one character: its pair is not asked."""
    last = _LAST_WORD.search(key, max(len(key) - 2, 0))
    return last.start() if last is not None and len(last.group()) == 1 else None


def _told(key: str, at: int) -> bool:
    """Whether a trigram of a key asked by its pairs tells what they cannot.

    A separator in the middle, or a piece of a last word of one character, whose pair is not
    asked.
    """
    last = _short_last(key)
    return _across(key, at) or last is not None and at + 3 > last


def _across(key: str, at: int) -> bool:
    """Whether a phrase's trigram has a separator in the middle, which its words cannot tell."""
    return _SEPARATORS.match(key, at + 1, at + 2) is not None


def _sifts(key: str, at: int) -> bool:
    """Whether a phrase's trigram tells what its words cannot: a separator, or case.

    A capital, and the start of a word, which the text may hold capitalized where the key
    does not (`Developer Guide` for `developer guide`).
    """
    return _CAPITAL.search(key, at, at + 3) is not None or _across(key, at) or \
        (at == 0 or _SEPARATORS.match(key, at - 1, at) is not None) and \
        _SEPARATORS.match(key, at, at + 1) is None


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


def _count(text: str) -> int:
    """How many words the words tables take `text` for, its punctuation among them.

    A key's punctuation makes it a phrase only ignoring case (`merge`), and only beside a
    word in at most `DENSE` of the parts: one word beside punctuation (`"resources":`, whose
    trigrams ignoring case are in JSON everywhere) then names the few parts holding it, where
    in its case its trigrams name about as few, and a phrase of a word in most parts costs a
    walk of the places of its punctuation, which may be in every part (`{ "Name":`).
    """
    return len(punctuation_apart(text).split())


def _count_words(text: str) -> int:
    """How many words `text` holds, but its punctuation."""
    return len(_WORD.findall(text))


def _words(text: str) -> str:
    """A phrase of the words tables, as they cut a text (`punctuation_apart`).

    Its words one space apart: a folded key holds no other blank but the line break.
    """
    return _quoted(" ".join(punctuation_apart(text).split()))


def _quoted(term: str) -> str:
    """A term as an FTS5 string."""
    return '"' + term.replace('"', '""') + '"'
