"""The folding of a `normalized` search: case, accents, Unicode forms and runs of blanks.

The search index holds each file's text folded this way, and a `normalized` query is folded the
same before it is compared with a file's folded lines. Beside it, the index keeps what the fold
loses that an exact query can still narrow by: its accented words.
"""

from __future__ import annotations

import re
import unicodedata

_MARKED = re.compile(r"[^\x00-\u02ff]")
# The combining diacritical marks that casefold leaves as they are (not U+0345, which it makes
# an iota) and that are marks (not U+034F, the grapheme joiner).
_ACCENTS = "".join(c for c in map(chr, range(0x300, 0x370))
                   if unicodedata.combining(c) and c.casefold() == c)
_PAST_ACCENTS = re.compile(f"[^\\x00-\\x7f{_ACCENTS}]")
# The blanks (str.isspace, but the line break) that NFKC leaves as they are: it makes the others
# a space. tests/test_folding.py checks this against Python's own Unicode tables.
FOLDED_BLANKS = "\t\x0b\x0c\r\x1c\x1d\x1e\x1f\x85\u1680\u2028\u2029"
_TO_SPACE = str.maketrans(dict.fromkeys(FOLDED_BLANKS, " "))
_SPACE_RUN = re.compile("  +")
_NOT_CAPITALS = re.compile("[^A-Z]+")


def normalize(text: str, keep_case: bool = False) -> str:
    """NFKC, casefold, drop accents, collapse blanks: so `decision` finds `Décision`.

    The carriage return of a CRLF line goes first, so a line folds alike with either ending.
    Line breaks survive, so line numbers in the normalized text are those of the original.
    ASCII is only lowered (the Unicode steps leave it as it is). In a text mostly ASCII, only
    the lines holding other characters take the Unicode steps, each line on its own: a line
    break never combines with a neighbour, so that is the same as folding the whole text.
    With `keep_case`, ASCII capitals stay as they are (those NFKC makes too): the search
    index's trigrams keep them, and `lower_ascii` of that text is the text normalized.
    """
    if "\r" in text:
        text = text.replace("\r\n", "\n")
    if text.isascii():
        text = text if keep_case else text.lower()
    elif (len(text.encode("utf-8", "surrogatepass")) - len(text)) * 8 > len(text):
        text = unicode_fold(text, keep_case)  # much of it is not ASCII: at once
    else:
        lines = text.split("\n")
        for i, line in enumerate(lines):
            if not line.isascii():
                lines[i] = unicode_fold(line, keep_case)
            elif not keep_case:
                lines[i] = line.lower()
        text = "\n".join(lines)
    return squeeze_blanks(text)


def lower_ascii(text: str) -> str:
    """`text` with its ASCII capitals lowered, and nothing else changed.

    Through its UTF-8 bytes, whose `lower` touches ASCII alone: `str.translate` took thirty
    times as long.
    """
    if text.isascii():
        return text.lower()
    return text.encode("utf-8", "surrogatepass").lower().decode("utf-8", "surrogatepass")


def squeeze_blanks(text: str) -> str:
    """Every blank a space, and a run of them one: `normalize`'s last step."""
    if any(c in text for c in FOLDED_BLANKS):
        text = text.translate(_TO_SPACE)
    return _SPACE_RUN.sub(" ", text) if "  " in text else text


def accented_words(text: str) -> set[str]:
    """The words of `text` (runs between blanks), casefolded, that hold an accented letter.

    That is, a character with a canonical decomposition (or marks out of canonical order):
    what NFD changes. The search index keeps them beside a part's folded text, so a query that
    is not `normalized` narrows by its accents too (`à` to the parts holding `à`, not every
    part holding `a`). A query's own accented words are asked: each is a piece of such a word
    of any text holding the query, and what NFD changes in a piece it changes in the whole.
    """
    if text.isascii():
        return set()
    folded = "\n".join(line for line in text.split("\n") if not line.isascii()).casefold()
    if unicodedata.is_normalized("NFD", folded):
        return set()
    return {word for word in folded.split()
            if not word.isascii() and not unicodedata.is_normalized("NFD", word)}


def accented_keys(query: str) -> set[str]:
    """A query's accented words, each with a line break on a side where a blank bounds it.

    The index keeps each accented word of a part on a line of its own, and a word of the query
    with a blank on one side has that blank in any text holding the query, so it is the whole
    word there on that side: ` é ` is asked as the one trigram of a line holding `é` alone, not
    as every trigram beginning with `é`.
    """
    accented = accented_words(query)
    if not accented:
        return set()
    folded = query.casefold()
    words = folded.split()
    before, after = folded[:1].isspace(), folded[-1:].isspace()
    return {("\n" if i or before else "") + word + ("\n" if i < len(words) - 1 or after else "")
            for i, word in enumerate(words) if word in accented}


def unicode_fold(text: str, keep_case: bool = False) -> str:
    """The Unicode steps alone: NFKC, casefold, then NFD with the combining marks taken out.

    `normalize` but for its blanks, and for the carriage return of a CRLF line. A text whose
    canonical decomposition is ASCII and accents (`_ACCENTS`) folds to that ASCII lowered: each
    step of the three leaves such a text as the accents on ASCII, lowered. With `keep_case`,
    casefold leaves ASCII capitals as they are.
    """
    decomposed = unicodedata.normalize("NFD", text)
    if _PAST_ACCENTS.search(decomposed) is None:
        ascii_text = decomposed.encode("ascii", "ignore").decode("ascii")
        return ascii_text if keep_case else ascii_text.lower()
    if keep_case:  # decomposed first, so that `É` keeps its capital as `E + U+0301` does
        text = _NOT_CAPITALS.sub(lambda run: run.group().casefold(),
                                 unicodedata.normalize("NFKD", text))
    else:
        text = unicodedata.normalize("NFKC", text).casefold()
    text = unicodedata.normalize("NFD", text)
    if not text.isascii():
        for mark in {c for c in _MARKED.findall(text) if unicodedata.combining(c)}:
            text = text.replace(mark, "")
    return text
