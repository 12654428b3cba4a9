"""Which lines of a file hold a search's substrings, under its folding: as is, casefold, normalized.

A search asks this of each file it reads, so it works on the file's bytes as far as it can:

- A case-sensitive needle is looked for in the bytes themselves: UTF-8 is self-synchronizing,
  so that is the same as in the decoded text, unless the needle holds U+FFFD, which stands for
  bytes that are not UTF-8.
- An ASCII needle ignoring case or `normalized` is found in a line of ASCII just where that
  line's bytes with ASCII lowered hold it; when normalized, with each of its blanks standing
  for a run of blanks there (`_BLANK_RUN`). Wherever those bytes hold it in another line it
  is in that line folded too: what folds to ASCII there only adds to it, and a blank past
  ASCII only joins a run. So the lowered bytes are searched, and the lines that are not ASCII,
  usually few, are decoded and folded together for what they add (`others`).
- Any other needle (past ASCII once folded, or holding U+FFFD) cannot be in a line of ASCII,
  which folds to ASCII: it is looked for in those other lines alone.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

from sharedmem.cache.folding import FOLDED_BLANKS, normalize, squeeze_blanks, unicode_fold

KINDS = ("exact", "casefold", "normalized")
# A run of the ASCII blanks `normalize` makes one space; not the carriage return of a CRLF line.
_BLANK_RUN = b"(?:[ " + re.escape(bytes(
    ord(c) for c in FOLDED_BLANKS if c.isascii() and c != "\r")) + rb"]|\r(?!\n))+"


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
        # Each needle as the bytes (exact) or the lowered bytes hold it, or None when only the
        # lines past ASCII can: see the module's docstring.
        self.in_bytes: list[bytes | re.Pattern[bytes] | None] = []
        for needle in self.needles:
            raw = None if "\ufffd" in needle else utf8(needle)
            if raw is not None and kind == "normalized" and raw.isascii() and b" " in raw:
                self.in_bytes.append(re.compile(_BLANK_RUN.join(map(re.escape, raw.split(b" ")))))
            else:
                self.in_bytes.append(raw if kind == "exact" or raw and raw.isascii() else None)
        self._data = b""  # the file these are of, by identity:
        self._lowered: bytes | None = None  # its bytes with ASCII lowered
        self._others: tuple[str, list[int]] | None = None  # its lines not ASCII, folded

    def _of(self, data: bytes) -> None:
        if data is not self._data:
            self._data, self._lowered, self._others = data, None, None

    def _bytes(self, data: bytes) -> bytes:
        """The file's bytes as the needles' bytes are looked for in them; once per file."""
        if self.kind == "exact":
            return data
        self._of(data)
        if self._lowered is None:
            self._lowered = data.lower()
        return self._lowered

    def others(self, data: bytes) -> tuple[str, list[int]]:
        """The lines holding a byte past ASCII, folded, as one text; and each one's number.

        When normalized, the Unicode steps take each line alone (most are ASCII and accents,
        which fold the short way: see `unicode_fold`), and the blanks of all at once.
        """
        self._of(data)
        if self._others is None:
            rows = [] if data.isascii() else data.split(b"\n")
            numbers = [n for n, line in enumerate(rows, 1) if not line.isascii()]
            if self.kind == "normalized":  # without the carriage return of a CRLF line
                text = squeeze_blanks("\n".join(unicode_fold(
                    (rows[n - 1][:-1] if n < len(rows) and rows[n - 1].endswith(b"\r")
                     else rows[n - 1]).decode("utf-8", "replace")) for n in numbers))
            else:
                text = self.fold(b"\n".join(rows[n - 1] for n in numbers).decode(
                    "utf-8", "replace"))
            self._others = text, numbers
        return self._others

    def _in_others(self, i: int) -> bool:
        """Whether needle `i` may be in a line past ASCII that its bytes are not found in."""
        return self.kind != "exact" or self.in_bytes[i] is None

    def which(self, data: bytes, wanted: Iterable[int]) -> set[int]:
        """Indexes (among `wanted`) of the needles found in the file `data`."""
        found = set()
        for i in wanted:
            form = self.in_bytes[i]
            if form is not None and _find(self._bytes(data), form) >= 0:
                found.add(i)
            elif self._in_others(i) and self.needles[i] in self.others(data)[0]:
                found.add(i)
        return found

    def numbers(self, data: bytes) -> list[set[int]]:
        """Per needle, the 1-based numbers of the lines of `data` holding it."""
        hits = []
        for i, needle in enumerate(self.needles):
            form = self.in_bytes[i]
            found = set() if form is None else _numbers(self._bytes(data), form, b"\n")
            if self._in_others(i):
                text, numbers = self.others(data)
                found.update(numbers[k - 1] for k in _numbers(text, needle, "\n")
                             if k <= len(numbers))
            hits.append(found)
        return hits


def _numbers(hay: Any, needle: Any, newline: Any) -> set[int]:
    """The 1-based numbers of the lines of `hay` holding `needle`, a string or a bytes pattern.

    Neither ever spans a line break.
    """
    lines: set[int] = set()
    pos, line, counted = _find(hay, needle), 1, 0
    while pos >= 0:
        line += hay.count(newline, counted, pos)
        lines.add(line)
        counted = hay.find(newline, pos)
        if counted < 0:
            break
        pos = _find(hay, needle, counted)
    return lines


def _find(hay: Any, needle: Any, at: int = 0) -> int:
    """Where `needle` (a string, or a bytes pattern) first is in `hay` from `at`; -1 if not."""
    if isinstance(needle, re.Pattern):
        found = needle.search(hay, at)
        return -1 if found is None else found.start()
    return hay.find(needle, at)
