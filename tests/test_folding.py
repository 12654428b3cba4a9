"""The folding of `normalized` searches against its definition, written out slowly."""

from __future__ import annotations

import random
import re
import unicodedata

from sharedmem.cache.folding import (
    FOLDED_BLANKS,
    accented_keys,
    accented_words,
    lower_ascii,
    normalize,
)


def definition(text: str) -> str:
    """NFKC, casefold, NFD without combining marks, each run of blanks one space; CRLF as LF."""
    text = text.replace("\r\n", "\n")
    text = unicodedata.normalize("NFD", unicodedata.normalize("NFKC", text).casefold())
    text = "".join(c for c in text if not unicodedata.combining(c))
    return re.sub(r"[^\S\n]+", " ", text)


PIECES = ["e\u0301", "E\u0301", "I\u0307", "\u0345", "\u1fb3", "\u13a0", "\uab70", "\ufb01",
          "\u212a", "ß", "İ", "한", "\u1100\u1161\u11a8", "\U0001d400", "\u216b", "½", "\u0300\u0301",
          "Décision", "café", "ΣΊΣΥΦΟΣ", "Привет", "日本語", "Ｆｕｌｌ", "a", "A", "Z", "abc ",
          " ", "  ", "\t", "\r", "\r\n", "\n", "\x0b", "\x0c", "\x1c", "\x85", "\xa0", "\u1680",
          "\u2003", "\u2028", "\u2029", "\u3000", "plain ascii words here"]


def test_normalize_is_its_definition_on_awkward_text() -> None:
    # Mostly ASCII (folded line by line) and mostly not (folded at once) alike.
    rng = random.Random(5)
    pool = PIECES + [chr(rng.randrange(0xa0, 0x30000)) for _ in range(2000)]
    pool = [p for p in pool if not 0xd800 <= ord(p[0]) < 0xe000]
    for _ in range(20000):
        text = "".join(rng.choice(pool) for _ in range(rng.randint(0, 30)))
        if rng.random() < 0.5:
            text = "An ASCII line,  with blanks\n" * rng.randint(1, 12) + text + "\nEnd\t.\n"
        assert normalize(text) == definition(text), repr(text)


def test_a_crlf_line_folds_as_its_lf_line() -> None:
    assert normalize("Fin \r\nnext\r\n") == normalize("Fin \nnext\n") == "fin \nnext\n"
    assert normalize("Fin\r\n") == "fin\n"  # no blank where the carriage return was
    assert normalize("a\rb") == "a b"  # a carriage return inside a line is a blank


def test_folded_blanks_are_those_nfkc_leaves() -> None:
    blanks = [chr(c) for c in range(0x110000) if chr(c).isspace() and c != 0x0a]
    assert "".join(c for c in blanks if unicodedata.normalize("NFKC", c) != " ") == FOLDED_BLANKS


def test_text_of_ascii_and_accents_folds_as_its_definition() -> None:
    # Such text takes a shorter way; every character of the BMP is tried where it may take it.
    marks = [chr(c) for c in range(0x300, 0x370)]
    for c in map(chr, range(0x80, 0x10000)):
        if not 0xd800 <= ord(c) < 0xe000:
            for text in ("I" + c + "\u0301", c + "\u0345", "=" + c + "\u0338"):
                assert normalize(text) == definition(text), repr(text)
    rng = random.Random(9)
    pool = [chr(c) for c in range(0xc0, 0x250)] + [chr(c) for c in range(0x1e00, 0x1f00)] + \
        marks + ["\u212a", "\u212b", "a", "K", "i", "=", " "]
    for _ in range(20000):
        text = "".join(rng.choice(pool) for _ in range(rng.randint(1, 8)))
        assert normalize(text) == definition(text), repr(text)


def test_a_text_folded_keeping_its_case_is_the_text_normalized_but_for_its_capitals() -> None:
    # The index keeps the trigrams of each text folded with its ASCII capitals; its words are
    # that text with them lowered, which must be the text normalized, or a phrase would miss.
    # (Every single character, alone and beside an ASCII letter, was checked so by hand.)
    rng = random.Random(13)
    pool = PIECES + ["É", "E\u0301", "\u212a", "Ａ", "ǅ", "ß", "ΣΑΣ", "DŽ"]
    for _ in range(3000):
        text = "".join(rng.choice(pool) for _ in range(rng.randint(1, 8)))
        assert lower_ascii(normalize(text, keep_case=True)) == normalize(text), repr(text)


def test_every_trigram_of_a_piece_of_a_text_folded_keeping_case_is_in_the_text_so_folded(
        ) -> None:
    # Any piece of a text, as a case-sensitive query: its trigrams folded keeping case are in
    # the text's, so the index names every part holding it.
    rng = random.Random(14)
    pool = ["a", "A", "Z", " ", "É", "e\u0301", "E\u0301", "ß", "\u212a", "İ", "日", "\t", "ab"]
    for _ in range(3000):
        text = "".join(rng.choice(pool) for _ in range(rng.randint(0, 30)))
        folded = normalize(text, keep_case=True)
        for _ in range(10):
            lo = rng.randint(0, len(text))
            piece = normalize(text[lo:rng.randint(lo, len(text))], keep_case=True)
            for i in range(len(piece) - 2):
                assert piece[i:i + 3] in folded, (text, piece)


def test_keeping_case() -> None:
    assert normalize("Version É  x", keep_case=True) == "Version E x"
    assert normalize("E\u0301 \u212a ﬁ", keep_case=True) == "E K fi"
    assert lower_ascii("ÀB ΣC") == "Àb Σc"


def test_every_accented_key_of_a_query_is_in_the_lines_of_accented_words_of_its_text() -> None:
    # Any piece of a text, as is or in another case, as a query: each of its accented keys is
    # within a line of the accented words the index keeps for the text, line breaks included.
    rng = random.Random(12)
    pool = ["é", "É", "e\u0301", "à", "한", "ß", "İ", "a", "B", " ", "  ", "\t", "\xa0", "\x1c",
            ":", "-", "\n", "ab", "더 많은"]
    for _ in range(3000):
        text = "".join(rng.choice(pool) for _ in range(rng.randint(0, 30)))
        lines = [f"\n{word}\n" for word in accented_words(text)]
        for _ in range(10):
            lo = rng.randint(0, len(text))
            query = text[lo:rng.randint(lo, len(text))]
            query = rng.choice([query, query.upper(), query.swapcase()])
            if query.casefold() not in text.casefold():
                continue
            for key in accented_keys(query):
                assert any(key in line for line in lines), (text, query, key)


def test_accented_keys() -> None:
    assert accented_keys("더 많은 정보 https") == {"더\n", "\n많은\n", "\n정보\n"}
    assert accented_keys("é") == {"é"}
    assert accented_keys(" É\t") == {"\né\n"}
    assert accented_keys("café au lait") == {"café\n"}
    assert accented_keys("plain words") == set()
