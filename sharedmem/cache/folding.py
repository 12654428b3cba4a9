"""The folding of a `normalized` search: case, accents, Unicode forms and runs of blanks.

The search index holds each file's text folded this way, and a `normalized` query is folded the
same before it is compared with a file's folded lines.
"""

from __future__ import annotations

import re
import unicodedata

_SPACES = re.compile(r" [^\S\n]+|[^\S\n ][^\S\n]*")
_UNCOLLAPSED = re.compile(r"[^\S\n ]|  ")  # what _SPACES would change: a cheap test first
_MARKED = re.compile(r"[^\x00-\u02ff]")


def normalize(text: str) -> str:
    """NFKC, casefold, drop accents, collapse blanks: so `decision` finds `Décision`.

    Line breaks survive, so line numbers in the normalized text are those of the original.
    ASCII text skips the Unicode steps, which leave it as it is (casefold is lower there).
    """
    if text.isascii():
        text = text.lower()
    else:
        text = unicodedata.normalize("NFD", unicodedata.normalize("NFKC", text).casefold())
        if not text.isascii():
            for mark in {c for c in _MARKED.findall(text) if unicodedata.combining(c)}:
                text = text.replace(mark, "")
    return _SPACES.sub(" ", text) if _UNCOLLAPSED.search(text) else text
