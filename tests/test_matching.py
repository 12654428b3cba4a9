"""Which lines hold a search's substrings: the bytes' shortcuts against each line folded whole."""

from __future__ import annotations

import random
import unicodedata

import pytest

from sharedmem.cache.folding import normalize
from sharedmem.cache.matching import KINDS, Matcher

WORDS = ["alpha", "Beta", "GAMMA", "café", unicodedata.normalize("NFD", "café"), "Décision",
         "decision", "straße", "STRASSE", "\ufb01le", "file", "\u212aelvin", "kelvin", "İstanbul",
         "ΣΊΣΥΦΟΣ", "日本語", "Ｆｕｌｌ", "½", "e\u0301", "\ufffd", "a", "ab", " ", "  ", "\t",
         "\xa0", "ss", "i\u0307", "\x0c", "\x1f", "\x85", "\u2028", "\u3000", "\r", "a\r"]
BLANKS = [" ", "  ", "\t", " \t ", "\xa0", "\x0b"]


def brute(text: str, needles: list[str], kind: str) -> list[set[int]]:
    """Each line folded on its own (a CRLF line's carriage return dropped when normalized)."""
    fold = normalize if kind == "normalized" else str.casefold if kind == "casefold" else str
    lines = text.split("\n")
    if kind == "normalized":
        lines = [line[:-1] if line.endswith("\r") else line for line in lines[:-1]] + lines[-1:]
    return [{n for n, line in enumerate(lines, 1) if fold(needle) in fold(line)}
            for needle in needles]


@pytest.mark.parametrize("kind", KINDS)
def test_lines_and_which_are_those_of_each_line_folded(kind: str) -> None:
    rng = random.Random(KINDS.index(kind))
    for _ in range(3000):
        rows = ["".join(rng.choice(WORDS) + rng.choice(["", " "]) for _ in range(rng.randint(0, 6)))
                + rng.choice(["", "", "\r"]) for _ in range(rng.randint(1, 6))]
        text = "\n".join(rows) + rng.choice(["", "\n"])
        data = text.encode("utf-8")
        if rng.random() < 0.1:
            data += b"\xe2\x84 broken\n"
            text = data.decode("utf-8", "replace")
        needles = [rng.choice(WORDS).strip() or "x" for _ in range(rng.randint(1, 3))]
        if rng.random() < 0.3:
            needles[0] = "alpha beta"
        elif rng.random() < 0.4:  # a needle with blanks inside: a run of them is one space
            needles[0] = rng.choice(WORDS) + rng.choice(BLANKS) + rng.choice(WORDS)
        if kind == "normalized":
            needles = [n for n in needles if normalize(n).strip()] or ["file"]
        matcher = Matcher(needles, kind)
        expected = brute(text, needles, kind)
        assert matcher.numbers(data) == expected, (text, needles)
        assert matcher.which(data, range(len(needles))) == {
            i for i, lines in enumerate(expected) if lines}, (text, needles)
