"""Credential detection and redaction: on the client before sending, on the server before storing.

Each rule (``credentials.py``) finds candidate spans; overlapping candidates merge into one span
reported under the most specific kind; every span becomes ``[REDACTED:<kind>]``. Markers are
never rewritten and redact() repeats until a pass finds nothing, so redacting twice changes
nothing. Speed: a rule's full pattern is tried only where one of its literal leads occurs (found
by the regex engine's fast literal search), a match is never rescanned, and PEM blocks are
paired with ``str.find``, so the cost stays linear in the length of the text.
"""

from __future__ import annotations

import bisect
import itertools
import re
from collections import namedtuple
from collections.abc import Iterator

from sharedmem.redact.credentials import (
    KEYWORD_STARTS,
    MARKER_PATTERN,
    MARKER_PREFIX,
    URL_PART,
    Rule,
    Span,
    folded_leads,
    group_span,
    marker,
    pem_spans,
    rules,
)
from sharedmem.rules import check_note


class Finding(namedtuple("Finding", "kind start end line")):
    """One credential: its kind and where it sits (never its text), so reports cannot leak it.

    `start` and `end` are offsets in the text, `line` is 1-based.
    """

    __slots__ = ()


def _lowered(text: str) -> str | None:
    """`text.lower()` as far as the leads can tell, or None where that changes its length.

    The leads match ASCII alone, and the only characters whose lower case holds ASCII are the
    Kelvin sign and U+0130 (whose lower form is longer), so lowering the ASCII letters alone
    finds the same leads: as bytes, about half what `str.lower` costs over non-ASCII text.
    """
    if text.isascii():
        return text.lower()
    if "\u0130" in text:
        return None
    if "\u212a" in text:
        return text.lower()
    return text.encode("utf-8", "surrogatepass").lower().decode("utf-8", "surrogatepass")


def _lead_positions(rule: Rule, text: str, lowered: str | None) -> list[int]:
    """Where the rule's leads match, in order: the only places its full pattern can start."""
    if rule.folded and lowered is None:  # lower() changed the length: offsets would not line up
        return [m.start() for m in folded_leads(rule.kind).finditer(text)]
    hay = lowered if rule.folded and lowered is not None else text
    found: list[int] = []
    for lead in rule.lead:
        found.extend(m.start() for m in lead.finditer(hay))
    if len(rule.lead) > 1:
        found.sort()
    return found


def _operator_windows(lowered: str) -> list[tuple[int, int]]:
    """The stretches of a lowered text from a keyword to the ':' or '=' after it, in order.

    Found backwards from each ':' or '=' as the batch screens find them: a keyword within
    reach before one, with only letters, quotes and blanks between. Each stretch starts at the
    farthest such keyword (the screen's letters are greedy) and ends after its ':' or '=', and
    none holds another, so every lead of a rule in `_OPERATOR_KINDS` lies in one of them.
    """
    backwards = lowered[::-1]
    last = len(lowered)
    return sorted((last - m.end(), last - m.start()) for screen in _OPERATOR_SCREENS
                  for m in re.compile(screen).finditer(backwards))


def _leads_within(rule: Rule, lowered: str, windows: list[tuple[int, int]]) -> list[int]:
    """`_lead_positions` of a rule in `_OPERATOR_KINDS`, looked for inside `windows` alone.

    Its eight keywords are common words, so scanning a whole text for each would cost more than
    the screen that found the window. A lead is
    looked for again one character on, as one keyword may end inside another ("secretoken").
    """
    leads = folded_leads(rule.kind, caseless=False)
    found: list[int] = []
    for start, end in windows:
        m = leads.search(lowered, start, end)
        while m is not None:
            found.append(m.start())
            m = leads.search(lowered, m.start() + 1, end)
    return found


def _inside_marker(text: str, at: int) -> bool:
    """True inside an earlier ``[REDACTED:generic-secret]``, whose kind reads like a keyword."""
    i = text.rfind(MARKER_PREFIX, max(0, at - 48), at)
    return i != -1 and "]" not in text[i:at]


def _scan(rule: Rule, text: str, leads: list[int]) -> Iterator[Span]:
    """Accepted spans of one rule, trying its full pattern only where a lead (`leads`) occurs."""
    check = rule.check or group_span
    pos = 0
    regex = None
    for at in leads:
        if at < pos or _inside_marker(text, at):
            continue
        if regex is None:  # compiled where a lead first matches (`credentials.rules`)
            regex = re.compile(rule.regex)
        m = regex.match(text, at)
        if m is None:
            continue
        pos = m.end()  # accepted or not, never rescan a match: that would be quadratic
        span = check(m)
        if span is not None and span[1] > span[0]:
            yield span


def _candidates(text: str, kinds: frozenset[str] | None = None) -> list[tuple[int, int, int, str]]:
    """Every rule's accepted spans as (start, end, priority, kind); only `kinds`' rules if given."""
    lowered = _lowered(text)
    found = ([(s, e, 0, "private-key") for s, e in pem_spans(text)]
             if kinds is None or "private-key" in kinds else [])
    windows = None
    for rule in rules():
        if kinds is not None and rule.kind not in kinds:
            continue
        if rule.kind in _OPERATOR_KINDS and lowered is not None:
            if windows is None:
                windows = _operator_windows(lowered)
            leads = _leads_within(rule, lowered, windows)
        else:
            leads = _lead_positions(rule, text, lowered)
        found.extend((s, e, rule.priority, rule.kind) for s, e in _scan(rule, text, leads))
    return found


def _merged(text: str, kinds: frozenset[str] | None = None) -> list[tuple[int, int, str]]:
    """Merge overlapping candidates so a secret is replaced once, under its most specific kind."""
    merged: list[tuple[int, int, str]] = []
    best = 0
    for start, end, priority, kind in sorted(_candidates(text, kinds)):
        if merged and start < merged[-1][1]:
            m_start, m_end, m_kind = merged[-1]
            if priority < best:
                best, m_kind = priority, kind
            merged[-1] = (m_start, max(m_end, end), m_kind)
        else:
            merged.append((start, end, kind))
            best = priority
    return merged


def _outside_markers(text: str, spans: list[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    """Cut earlier markers out of the spans: a marker is never rewritten, so redaction converges."""
    if not spans or MARKER_PREFIX not in text:
        return spans
    markers = [m.span() for m in re.compile(MARKER_PATTERN).finditer(text)]
    kept: list[tuple[int, int, str]] = []
    j = 0
    for start, end, kind in spans:
        while j < len(markers) and markers[j][1] <= start:
            j += 1
        cur, k = start, j
        while k < len(markers) and markers[k][0] < end:
            if markers[k][0] > cur:
                kept.append((cur, markers[k][0], kind))
            cur = max(cur, markers[k][1])
            k += 1
        if cur < end:
            kept.append((cur, end, kind))
    return kept


def find(text: str) -> list[Finding]:
    """Credentials in text: non-overlapping, ordered by start, with 1-based line numbers.

    This is one pass; redact() repeats passes until nothing is left, so in rare nested layouts
    (a token glued inside a rejected value) it can replace a little more than find() reports.
    """
    findings: list[Finding] = []
    line, last = 1, 0
    for start, end, kind in _outside_markers(text, _merged(text)):
        line += text.count("\n", last, start)
        last = start
        findings.append(Finding(kind, start, end, line))
    return findings


def redact(text: str) -> tuple[str, dict[str, int]]:
    """Replace every credential with its marker; return the new text and a count per kind.

    Passes repeat until one finds nothing, so redact(redact(x)[0]) never changes anything.
    Each pass turns at least one character that is not a marker into a marker, so it ends.
    """
    return _redact(text, None)


def _redact(text: str, first: frozenset[str] | None) -> tuple[str, dict[str, int]]:
    """`redact`, its first pass trying only the rules of `first` (all when None).

    `redact_many` names the rules a batch screen found a lead of in the text: no other rule can
    match it, so that pass finds what one of every rule would: a text with a password in a URL
    and nothing else is tried by one rule, not seventeen. Later passes, over a text with
    markers in it, try every rule.
    """
    counts: dict[str, int] = {}
    while True:
        spans = _outside_markers(text, _merged(text, first))
        first = None
        if not spans:
            return text, counts
        parts: list[str] = []
        pos = 0
        for start, end, kind in spans:
            parts.append(text[pos:start])
            parts.append(marker(kind))
            counts[kind] = counts.get(kind, 0) + 1
            pos = end
        parts.append(text[pos:])
        text = "".join(parts)


def redact_note(filename: str, text: str) -> tuple[str, dict[str, int]]:
    """A note's text redacted, with the note rule checked on what came and on what is kept."""
    clean, counts = redact(check_note(filename, text))
    return check_note(filename, clean, redacted=True), counts


def redact_many(texts: list[str] | None,
                encoded: list[bytes] | None = None) -> list[tuple[str | None, dict[str, int]]]:
    """`redact` of each text, the same results, at a fraction of the cost for many small texts.

    Every rule's leads (ASCII patterns) are searched once, as bytes, over all the texts in UTF-8
    joined by line breaks (no lead can span one), so a text none of them touches is returned as
    it is without a pass of its own, and one they touch is tried first by the rules whose leads
    they found (`_touched`). Bytes keep the scan at one byte a character; lower-casing
    bytes agrees with `str.lower` on ASCII, and the only two characters whose `lower()` is ASCII
    (the Kelvin sign, and capital I with dot, whose lower form is longer) send the whole batch
    the slow way. `encoded`, when the caller has them, are the texts in UTF-8.

    With `texts` None, `encoded` alone (valid UTF-8): only the texts something touches are
    decoded, and each of the others comes back as (None, {}), its bytes unchanged.
    """
    if texts is None:
        assert encoded is not None
        if any(b"\xe2" in data and b"\xe2\x84\xaa" in data or b"\xc4" in data
               and b"\xc4\xb0" in data for data in encoded):  # U+212A, U+0130 (memchr first)
            return [redact(data.decode("utf-8")) for data in encoded]
        dirty = _touched(encoded)
        return [_redact(data.decode("utf-8"), dirty[i]) if i in dirty else (None, {})
                for i, data in enumerate(encoded)]
    try:
        if any("\u212a" in t or "\u0130" in t for t in texts):
            raise UnicodeError
        if encoded is None:
            encoded = [t.encode("utf-8") for t in texts]
    except UnicodeError:
        return [redact(t) for t in texts]
    dirty = _touched(encoded)
    return [_redact(t, dirty[i]) if i in dirty else (t, {}) for i, t in enumerate(texts)]


def _touched(encoded: list[bytes]) -> dict[int, frozenset[str] | None]:
    """The texts (in UTF-8) some lead, screen or earlier marker touches, by index.

    Each with the kinds of the rules a screen found a lead of in it: None for all of them,
    for a text with a marker in it.
    """
    joined = b"\n".join(encoded)
    backwards = joined.lower()[::-1]
    last = len(joined) - 1
    starts = list(itertools.accumulate((len(b) + 1 for b in encoded[:-1]), initial=0))
    touched: dict[int, frozenset[str] | None] = {}

    def touch(at: int, kinds: frozenset[str] | None) -> None:
        i = bisect.bisect_right(starts, at) - 1
        if i not in touched:
            touched[i] = kinds
        elif (known := touched[i]) is not None:
            touched[i] = None if kinds is None else known | kinds

    for (reverse, lead), kinds in zip(_byte_leads(), _SCREEN_KINDS, strict=True):
        if reverse:
            for m in lead.finditer(backwards):
                touch(last - m.start(), kinds)
        else:
            for m in lead.finditer(joined):
                touch(m.start(), kinds)
    for word, kinds in _FOLDED_WORDS:
        at = backwards.find(word.encode("ascii"))
        while at != -1:
            touch(last - at, kinds)
            at = backwards.find(word.encode("ascii"), at + 1)
    needle = MARKER_PREFIX.encode()
    at = joined.find(needle)
    while at != -1:
        touch(at, None)
        at = joined.find(needle, at + 1)
    return touched


_BYTE_LEADS: list[tuple[bool, re.Pattern[bytes]]] = []


def prepare() -> None:
    """Compile what `redact_many` needs first, ahead of the texts (the server does it meanwhile)."""
    _byte_leads()


# The rules matched without case are screened backwards, over the lower-cased bytes reversed:
# every generic lead (a keyword, then `_NEAR_OPERATOR`) ends at a ':' or '=', a byte the scan
# finds at memchr speed, where a scan for the keywords stops at every common letter; 2 scans do
# the work of 10. Each is `_NEAR_OPERATOR` read
# from its end. The AWS rule's "secret" implies the generic "secret" lead; "authorization"
# followed by ":" or "=" is the generic "auth" lead. The blanks and the quotes are taken
# possessively: neither class holds a character of the next, so giving one back never makes a
# match, and the engine keeps no place to return to.
_BACKWARDS = (r"""[ \t]{0,16}+["'`*\]]{0,3}+[a-z_-]{0,16}(?:"""
              + "|".join(k[::-1] for k in KEYWORD_STARTS) + ")")
_OPERATOR_KINDS = frozenset({"generic-secret", "authorization-header"})  # a keyword, ':' or '='
# url-password's match ("://", a user, ':', a password, '@') read from its '@', which is rare
# where the "://" of every link is not: its user and password hold no '/', white space or '@'
# (the bytes' white space is ASCII's, so this screen takes what the rule's would, and more),
# at most URL_PART characters of at most four bytes each. Case plays no part in it.
_PASSWORD_BACKWARDS = (rf"""@[^\s/@?#"'<>]{{1,{4 * URL_PART}}}:"""
                       rf"""[^\s:/@?#"'<>]{{1,{4 * URL_PART}}}//:""")
_OPERATOR_SCREENS = (":" + _BACKWARDS, "=" + _BACKWARDS)  # also `_operator_windows`' own
_FOLDED_SCREENS: tuple[tuple[str, frozenset[str]], ...] = (
    *((screen, _OPERATOR_KINDS) for screen in _OPERATOR_SCREENS),
    (_PASSWORD_BACKWARDS, frozenset({"url-password"})),
)
# Words looked for in the lower-cased bytes reversed with `bytes.find`, which skips through a
# word of common letters faster than the regex engine; the
# Slack webhook's host, right after its "://", is one.
_FOLDED_WORDS: tuple[tuple[str, frozenset[str]], ...] = (
    ("terces", frozenset({"aws-secret-key", "generic-secret"})),
    ("/moc.kcals.skooh//:", frozenset({"slack-webhook"})),
)

# What the batch scan looks for in place of the leads of the rules matched with case: every
# match of those rules' patterns (and every PEM block) holds one of these. Each starts with one
# byte the scan finds at memchr speed and looks around it only there, so 4 scans (and the '@'
# screen above) do the work of 15. test_redact checks
# that they cover every such rule.
_SCREENS: tuple[tuple[str, frozenset[str]], ...] = (
    (r"A(?:KIA|SIA|BIA|CCA|Iza)", frozenset({"aws-access-key", "google-api-key"})),
    (r"_(?:(?<=gh[pousr]_)|(?<=github_)|(?<=[sr]k_live_)|(?<=[sr]k_test_)|(?<=hf_)|(?<=npm_))",
     frozenset({"github-token", "stripe-key", "huggingface-token", "npm-token"})),
    # (a '-' is common: one class of the bytes that may come before it saves trying each lead)
    (r"-(?:(?<=[kabposreit]-)(?:(?<=sk-)|(?<=xox[abposre]-)|(?<=xapp-)|(?<=pypi-)|(?<=glpat-)"
     r"|(?<=gldt-)|(?<=glrt-)|(?<=glptt-)|(?<=glcbt-)|(?<=gloas-)|(?<=glft-)|(?<=glimt-))"
     r"|(?=----BEGIN))",
     frozenset({"anthropic-key", "openai-key", "slack-token", "pypi-token", "gitlab-token",
                "private-key"})),
    (r"J(?<=eyJ)", frozenset({"jwt"})),
)


_SCREEN_KINDS = tuple(kinds for _, kinds in _FOLDED_SCREENS + _SCREENS)  # `_byte_leads`' order


def _byte_leads() -> list[tuple[bool, re.Pattern[bytes]]]:
    """(backwards, pattern) for the batch scan, compiled for bytes on first use."""
    if not _BYTE_LEADS:
        # Replaced whole in one step: a thread never sees part of the list, and two threads
        # compiling at once (`serve` does on a thread while its session may redact) each store
        # the same list, where appending would leave two copies.
        _BYTE_LEADS[:] = (
            [(True, re.compile(screen.encode("ascii"))) for screen, _ in _FOLDED_SCREENS]
            + [(False, re.compile(screen.encode("ascii"))) for screen, _ in _SCREENS])
    return _BYTE_LEADS
