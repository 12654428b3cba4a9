"""The folding of a `normalized` search: case, accents, Unicode forms and runs of blanks.

The search index holds each file's text folded this way, and a `normalized` query is folded the
same before it is compared with a file's folded lines. Beside it, the index keeps what the fold
loses that an exact query can still narrow by: accented words and the text around capitals.
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


def normalize(text: str) -> str:
    """NFKC, casefold, drop accents, collapse blanks: so `decision` finds `Décision`.

    The carriage return of a CRLF line goes first, so a line folds alike with either ending.
    Line breaks survive, so line numbers in the normalized text are those of the original.
    ASCII is only lowered (the Unicode steps leave it as it is). In a text mostly ASCII, only
    the lines holding other characters take the Unicode steps, each line on its own: a line
    break never combines with a neighbour, so that is the same as folding the whole text.
    """
    if "\r" in text:
        text = text.replace("\r\n", "\n")
    if text.isascii():
        text = text.lower()
    elif (len(text.encode("utf-8", "surrogatepass")) - len(text)) * 8 > len(text):
        text = unicode_fold(text)  # much of it is not ASCII: at once
    else:
        lines = text.split("\n")
        for i, line in enumerate(lines):
            lines[i] = line.lower() if line.isascii() else unicode_fold(line)
        text = "\n".join(lines)
    return squeeze_blanks(text)


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


# Runs of ASCII capitals, those at most four characters apart in one.
_CAPITALS = re.compile(r"[A-Z](?:.{0,4}[A-Z])*", re.DOTALL)
_CAPITAL = re.compile(r"[A-Z]")


def capital_stretches(text: str) -> set[str]:
    """Each run of ASCII capitals in `text` with the two characters either side, as written.

    So every trigram of `text` that holds an ASCII capital is in one of them. The search index,
    which is case-folded, keeps them beside a part's folded text, so a case-sensitive query
    narrows by its capitals too (`Version` to the parts holding `Version`, not every part
    holding `version`): it asks its own such trigrams (`capital_trigrams`).
    """
    return {text[max(m.start() - 2, 0):m.end() + 2] for m in _CAPITALS.finditer(text)}


def capital_trigrams(query: str) -> list[str]:
    """The trigrams of `query` that hold an ASCII capital: any text holding it holds them."""
    return list(dict.fromkeys(query[i:i + 3] for i in range(len(query) - 2)
                              if _CAPITAL.search(query, i, i + 3)))


def unicode_fold(text: str) -> str:
    """The Unicode steps alone: NFKC, casefold, then NFD with the combining marks taken out.

    `normalize` but for its blanks, and for the carriage return of a CRLF line. A text whose
    canonical decomposition is ASCII and accents (`_ACCENTS`) folds to that ASCII lowered: each
    step of the three leaves such a text as the accents on ASCII, lowered.
    """
    decomposed = unicodedata.normalize("NFD", text)
    if _PAST_ACCENTS.search(decomposed) is None:
        return decomposed.encode("ascii", "ignore").decode("ascii").lower()
    text = unicodedata.normalize("NFD", unicodedata.normalize("NFKC", text).casefold())
    if not text.isascii():
        for mark in {c for c in _MARKED.findall(text) if unicodedata.combining(c)}:
            text = text.replace(mark, "")
    return text
