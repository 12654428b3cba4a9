"""Which lines of a file hold a search's substrings, under its folding: as is, casefold, normalized.

A search asks this of each file it reads, so it works on the file's bytes as far as it can:

- A case-sensitive needle is looked for in the bytes themselves: UTF-8 is self-synchronizing,
  so that is the same as in the decoded text, unless the needle holds U+FFFD, which stands for
  bytes that are not UTF-8 (then the text is decoded).
- An ASCII needle ignoring case (or `normalized`, when it holds no blank) is found in a line of
  ASCII just where that line's bytes with ASCII lowered hold it, and wherever those bytes hold
  it in another line it is in that line folded too (what folds to ASCII there only adds to
  it). So the lowered bytes are searched, and the lines that are not ASCII, usually few, are
  decoded and folded one by one for what they add.
- Anything else is looked for in the whole text, decoded and folded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from sharedmem.cache.folding import normalize, unicode_fold

KINDS = ("exact", "casefold", "normalized")


def utf8(text: str) -> bytes | None:
    """`text` as UTF-8; None when it holds a lone surrogate, which no file's text can."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return None


class Matcher:
    """The needles of one search, and the files they are looked for in, one at a time."""

    def __init__(self, queries: list[str], kind: str) -> None:
        self.kind = kind
        self.fold: Callable[[str], str] = normalize if kind == "normalized" else \
            str.casefold if kind == "casefold" else str
        self.queries = queries
        self.needles = [self.fold(q) for q in queries]
        self.raw = [None if "\ufffd" in n else utf8(n) for n in self.needles]
        if kind == "exact":
            self.by_line = [False] * len(queries)
        else:  # an ASCII needle, with no blank when normalized (a run of blanks is one there)
            self.by_line = [r is not None and r.isascii() and (kind == "casefold" or b" " not in r)
                            for r in self.raw]
        self._data = b""  # the file these are of, by identity:
        self._folded: str | None = None  # its text folded
        self._lowered: bytes | None = None  # its bytes with ASCII lowered
        self._others: list[tuple[int, str]] | None = None  # its lines not ASCII, folded

    def _of(self, data: bytes) -> None:
        if data is not self._data:
            self._data, self._folded, self._lowered, self._others = data, None, None, None

    def folded(self, data: bytes) -> str:
        """The file's text under the search's folding; once per file, however often asked."""
        self._of(data)
        if self._folded is None:
            self._folded = self.fold(data.decode("utf-8", "replace"))
        return self._folded

    def lowered(self, data: bytes) -> bytes:
        """The file's bytes with ASCII lowered; once per file."""
        self._of(data)
        if self._lowered is None:
            self._lowered = data.lower()
        return self._lowered

    def others(self, data: bytes) -> list[tuple[int, str]]:
        """(1-based number, text folded) of each line holding a byte past ASCII; once per file.

        Only for the needles `by_line`: the Unicode steps alone when normalized.
        """
        self._of(data)
        if self._others is None:
                # For a needle with no blank, the blanks of a line do not matter.
            fold = unicode_fold if self.kind == "normalized" else self.fold
            self._others = [] if data.isascii() else [
                (number, fold(line.decode("utf-8", "replace")))
                for number, line in enumerate(data.split(b"\n"), 1) if not line.isascii()]
        return self._others

    def which(self, data: bytes, wanted: Iterable[int]) -> set[int]:
        """Indexes (among `wanted`) of the needles found in the file `data`."""
        found = set()
        for i in wanted:
            raw = self.raw[i]
            if self.kind == "exact" and raw is not None:
                hit = raw in data
            elif self.by_line[i]:
                hit = raw in self.lowered(data) or any(
                    self.needles[i] in text for _, text in self.others(data))
            else:
                hit = self.needles[i] in self.folded(data)
            if hit:
                found.add(i)
        return found

    def numbers(self, data: bytes) -> list[set[int]]:
        """Per needle, the 1-based numbers of the lines of `data` holding it."""
        hits = []
        for i, needle in enumerate(self.needles):
            raw = self.raw[i]
            if self.kind == "exact" and raw is not None:
                found = _numbers(data, raw, b"\n")
            elif self.by_line[i]:
                found = _numbers(self.lowered(data), raw, b"\n")  # type: ignore[arg-type]
                found.update(n for n, text in self.others(data) if needle in text)
            else:
                found = _numbers(self.folded(data), needle, "\n")
            hits.append(found)
        return hits


def _numbers(hay: str | bytes, needle: str | bytes, newline: str | bytes) -> set[int]:
    """The 1-based numbers of the lines of `hay` holding `needle` (which holds no line break)."""
    lines: set[int] = set()
    pos, line, counted = hay.find(needle), 1, 0  # type: ignore[arg-type]
    while pos >= 0:
        line += hay.count(newline, counted, pos)  # type: ignore[arg-type]
        lines.add(line)
        counted = hay.find(newline, pos)  # type: ignore[arg-type]
        if counted < 0:
            break
        pos = hay.find(needle, counted)  # type: ignore[arg-type]
    return lines
