"""Credential detection and redaction: on the client before sending, on the server before storing.

Each rule finds candidate spans; overlapping candidates merge into one span reported under the most
specific kind; every span becomes ``[REDACTED:<kind>]``. Markers are never rewritten and redact()
repeats until a pass finds nothing, so redacting twice changes nothing. Speed: a rule's full
pattern is tried only where one of its literal leads occurs (found by the regex engine's fast
literal search), a match is never rescanned, and PEM blocks are paired with ``str.find``, so the
cost stays linear in the length of the text.
"""

from __future__ import annotations

import bisect
import itertools
import re
from collections import namedtuple
from collections.abc import Callable, Iterator

MARKER_PREFIX = "[REDACTED:"
# The patterns below are compiled where they are used, on first need, and cached by `re`: most
# texts never need them, and compiling them all at import cost a process 2.5 ms.
_MARKER = r"\[REDACTED:[a-z-]{1,40}\]"


class Finding(namedtuple("Finding", "kind start end line")):
    """One credential: its kind and where it sits (never its text), so reports cannot leak it.

    `start` and `end` are offsets in the text, `line` is 1-based.
    """

    __slots__ = ()


def marker(kind: str) -> str:
    """The text that replaces a credential of this kind."""
    return f"{MARKER_PREFIX}{kind}]"


Span = tuple[int, int]
_Check = Callable[[re.Match[str]], Span | None]


class _Rule(namedtuple("_Rule", "kind lead regex priority check folded")):
    """One rule, written as strings and compiled by `_rules` on first need.

    `regex` (tried with .match) can only start where one of the `lead` patterns matches; a
    lower `priority` is more specific and names a merged span; `check` accepts a match (None:
    take group "s" or the whole match as it is); `folded` leads are lower-case and run over the
    lower-cased text.
    """

    __slots__ = ()


_NB = r"(?<![A-Za-z0-9])"  # a token must not start inside a longer word
_PLACEHOLDER = (
    r"(?i)(?:(.)\1*|none|null|nil|true|false|undefined|changeme|change[_-]?me|redacted|hidden"
    r"|placeholder|example|dummy|todo|tbd|secret|password|passwd|token|api[_-]?key|value"
    r"|your[\w-]*|my[_-]?(?:password|secret|token|key)|[\w-]*[_-]here|\.\.\.|…)"
)
_DOTTED_NAME = r"[A-Za-z_$][\w$]*(?:\.[A-Za-z_$][\w$]*)+"
_PATH = r"(?:~|\.{1,2})?/[\w.-]+(?:/[\w.-]*)*"
_WORDY = r"[a-z_-]+"
_SHORT_WORD = r"[a-z]{1,7}"
_IDENTIFIER = r"[A-Za-z_]+"
_CODE_GLUE = r"""['"] ?[+,)]|[+,(] ?['"]"""


def _is_placeholder(value: str) -> bool:
    """Tell templating, variable references and stand-in words apart from real values."""
    v = re.compile(_MARKER).sub("", value).strip()  # whatever is left besides earlier markers
    if not v or re.compile(_PLACEHOLDER).fullmatch(v):
        return True
    if v[0] in "$%<{" or "${" in v or "{{" in v:
        return True
    if v[0] in "!*&" and v[1:].replace("_", "").isalpha():
        return True  # a YAML tag, alias or anchor: !vault, *default, &creds
    return bool(re.compile(_DOTTED_NAME).fullmatch(v))


def _group_span(m: re.Match[str]) -> Span | None:
    """Default check: the "s" group (or the whole match) unless it already holds a marker."""
    name = "s" if "s" in m.re.groupindex else 0
    if MARKER_PREFIX in m.group(name):
        return None
    return m.span(name)


def _not_wordy(m: re.Match[str]) -> Span | None:
    """Reject slugs like ``sk-learn-tutorial-for-beginners`` that share a token's prefix."""
    body = m.group("s")
    if re.compile(_WORDY).fullmatch(body.split("-", 1)[-1]):
        return None
    return _group_span(m)


def _check_url(m: re.Match[str]) -> Span | None:
    """Only a real password in ``scheme://user:password@host``, not ``${PASS}`` or ``****``."""
    return None if _is_placeholder(m.group("s")) else m.span("s")


def _check_auth(m: re.Match[str]) -> Span | None:
    """Reject prose such as ``Authorization: required`` or ``Authorization: Negotiate``."""
    cred = m.group("s")
    if cred.isalpha() and (cred.islower() or not m.group("scheme")):
        return None
    return _group_span(m)


def _check_generic(m: re.Match[str]) -> Span | None:
    """Accept a keyword assignment only when its value looks like a literal secret."""
    for name in ("dq", "sq"):
        value = m.group(name)
        if value is not None:
            if (len(value.strip()) < 3 or _is_placeholder(value)
                    or re.compile(_SHORT_WORD).fullmatch(value)):
                return None  # "minutes", "days": a setting's name or unit, not a secret
            if value[0] in " \t,;)+'\"" or re.compile(_CODE_GLUE).search(value):
                return None  # source code between two string literals: '"k = ", f(x), "'
            if m.string[m.end() : m.end() + 4].lstrip(" \t").startswith("+"):
                return None  # the first piece of a concatenation: "ghp_" + rest
            return m.span(name)
    value = m.group("bare").rstrip(".:!?")
    start = m.start("bare")
    end = start + len(value)
    following = m.string[end : end + 1]
    if len(value) < 4 or following in ("(", "[") or _is_placeholder(value):
        return None
    if re.compile(_IDENTIFIER).fullmatch(value) or (value.isdigit() and len(value) < 8):
        return None  # a variable name, an English word, a small number
    if re.compile(_PATH).fullmatch(value):
        return None
    return start, end


_KEYWORD = (
    r"(?:" + _NB + r"(?i:passw(?:or)?d|pwd|secret|token|api[_-]?key|access[_-]?key"
    r"|private[_-]?key|auth[_-]?key)"
    r"|(?<=[a-z0-9])(?:Passw(?:or)?d|Pwd|Secret|Token|Api[_-]?Key|AccessKey|PrivateKey))"
    r"(?i:[_-]?(?:key|value))?(?![A-Za-z0-9])"
)
_GENERIC = (
    _KEYWORD + r"[\"'`*\]]{0,3}[ \t]{0,16}(?:=>|:=|=(?!=)|:(?!:))[ \t]{0,16}"
    r"(?:\"(?P<dq>[^\"\r\n]{0,4096})\"|'(?P<sq>[^'\r\n]{0,4096})'"
    r"|(?P<bare>(?:[^\s\"'`,;&(){}\[\]<>]|&(?![\w.-]{1,64}=)){1,4096}))"  # stop at "&next="
)
_KEYWORD_STARTS = ("passw", "pwd", "secret", "token", "api", "access", "private", "auth")
_NEAR_OPERATOR = r"""(?=[a-z_-]{0,16}["'`*\]]{0,3}[ \t]{0,16}[:=])"""  # skips prose in the C engine
_B64 = r"A-Za-z0-9/+"


def _rule(kind: str, lead: str | tuple[str, ...], pattern: str, priority: int = 1,
          check: _Check | None = None, folded: bool = False) -> _Rule:
    """One rule, as text; `_rules` compiles them all the first time a text needs them.

    Each `lead` pattern starts with a literal, so the regex engine skips to it as fast as
    str.find; the full pattern is then tried only at those places. Most texts match no lead at
    all (`redact_many` finds that out with the leads alone), so compiling the full patterns is
    left until one does.
    """
    return _Rule(kind, (lead,) if isinstance(lead, str) else lead, pattern, priority, check,
                 folded)


_RULE_TEXT: tuple[_Rule, ...] = (
    _rule("aws-access-key", r"A(?:KIA|SIA|BIA|CCA)",
          _NB + r"(?:AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}(?![A-Za-z0-9])"),
    _rule("aws-secret-key", "secret",
          r"(?i)(?:(?:(?<=aws)|(?<=aws[_\-. ]))secret(?:[_\-. ]?access)?(?:[_\-. ]?key)?"
          r"|" + _NB + r"secret[_\-. ]?access[_\-. ]?key)[\s\"'`*:=>|,(]{1,12}"
          r"(?P<s>[" + _B64 + r"]{40})(?![" + _B64 + r"=])", folded=True),
    _rule("github-token", (r"gh[pousr]_", "github_pat_"),
          _NB + r"(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{22,})"),
    _rule("anthropic-key", r"sk-ant-", r"(?<![A-Za-z0-9_-])sk-ant-[A-Za-z0-9_-]{20,}", 0),
    _rule("openai-key", r"sk-", r"(?<![A-Za-z0-9_-])(?P<s>sk-(?!ant-)[A-Za-z0-9_-]{20,})",
          check=_not_wordy),
    _rule("slack-token", r"x(?:ox|app-)",
          _NB + r"(?P<s>(?:xox[abposre]|xapp)-[A-Za-z0-9-]{10,})", check=_not_wordy),
    _rule("slack-webhook", r"https?://hooks\.slack\.com/",
          r"(?i)https?://hooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9_/+-]{8,}",
          folded=True),
    _rule("google-api-key", r"AIza", r"(?<![A-Za-z0-9_-])AIza[0-9A-Za-z_-]{35,}"),
    _rule("stripe-key", (r"sk_(?:live|test)_", r"rk_(?:live|test)_"),
          _NB + r"[sr]k_(?:live|test)_[A-Za-z0-9]{10,}"),
    _rule("huggingface-token", r"hf_", _NB + r"hf_[A-Za-z0-9]{30,}"),
    _rule("gitlab-token", r"gl(?:pat|dt|rt|ptt|cbt|oas|ft|imt)-",
          _NB + r"gl(?:pat|dt|rt|ptt|cbt|oas|ft|imt)-[A-Za-z0-9_-]{20,}"),
    _rule("npm-token", r"npm_", _NB + r"npm_[A-Za-z0-9]{36,}"),
    _rule("pypi-token", r"pypi-AgEI", _NB + r"pypi-AgEI[A-Za-z0-9_-]{50,}"),
    _rule("jwt", r"eyJ",
          r"(?<![A-Za-z0-9_.-])eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*"),
    _rule("authorization-header", r"authorization",
          r"(?i)\bauthorization[\"']?[ \t]{0,16}[:=][ \t]{0,16}[\"']?"
          r"(?:(?P<scheme>bearer|basic|token|bot|apikey|negotiate|ntlm)[ \t]{1,16})?"
          r"(?P<s>[A-Za-z0-9._~+/=-]{8,})", 2, _check_auth, folded=True),
    _rule("url-password", r"://",
          r"(?<=[A-Za-z0-9])://[^\s:/@?#\"'<>]{1,256}:(?P<s>[^\s/@?#\"'<>]{1,256})@",
          2, _check_url),
    _rule("generic-secret", tuple(k + _NEAR_OPERATOR for k in _KEYWORD_STARTS), _GENERIC, 3,
          _check_generic, folded=True),
)
_COMPILED: list[tuple[tuple[_Rule, ...], dict[str, re.Pattern[str]]]] = []


def _rules() -> tuple[tuple[_Rule, ...], dict[str, re.Pattern[str]]]:
    """The rules compiled, and each folded rule's leads as one case-insensitive pattern."""
    if not _COMPILED:
        rules = tuple(r._replace(lead=tuple(re.compile(x) for x in r.lead),
                                 regex=re.compile(r.regex)) for r in _RULE_TEXT)
        folded = {r.kind: re.compile("|".join(r.lead), re.IGNORECASE)
                  for r in _RULE_TEXT if r.folded}
        _COMPILED.append((rules, folded))
    return _COMPILED[0]

_PEM_BEGIN = r"-----BEGIN (?P<label>[A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?)-----"
_PEM_TAIL = r"[^\r\n]*(?:\r?\n[^\r\n]+)*"  # an unterminated block: up to a blank line


def _pem_spans(text: str) -> Iterator[Span]:
    """Whole private-key blocks, BEGIN to END (or to a blank line when the END is missing)."""
    ends: dict[str, int] = {}  # label -> next END position at or after the last search
    pos = 0
    for m in re.compile(_PEM_BEGIN).finditer(text):
        if m.start() < pos:
            continue
        label = m.group("label")
        footer = f"-----END {label}-----"
        where = ends.get(label)
        if where is None or (where != -1 and where < m.end()):
            where = text.find(footer, m.end())
            ends[label] = where
        if where == -1:
            tail = re.compile(_PEM_TAIL).match(text, m.end())
            pos = tail.end() if tail else m.end()
        else:
            pos = where + len(footer)
        yield m.start(), pos


def _lead_positions(rule: _Rule, text: str, lowered: str | None) -> list[int]:
    """Where the rule's leads match, in order: the only places its full pattern can start."""
    if rule.folded and lowered is None:  # lower() changed the length: offsets would not line up
        return [m.start() for m in _rules()[1][rule.kind].finditer(text)]
    hay = lowered if rule.folded and lowered is not None else text
    found: list[int] = []
    for lead in rule.lead:
        found.extend(m.start() for m in lead.finditer(hay))
    if len(rule.lead) > 1:
        found.sort()
    return found


def _inside_marker(text: str, at: int) -> bool:
    """True inside an earlier ``[REDACTED:generic-secret]``, whose kind reads like a keyword."""
    i = text.rfind(MARKER_PREFIX, max(0, at - 48), at)
    return i != -1 and "]" not in text[i:at]


def _scan(rule: _Rule, text: str, lowered: str | None) -> Iterator[Span]:
    """Accepted spans of one rule, trying its full pattern only where a lead literal occurs."""
    check = rule.check or _group_span
    pos = 0
    for at in _lead_positions(rule, text, lowered):
        if at < pos or _inside_marker(text, at):
            continue
        m = rule.regex.match(text, at)
        if m is None:
            continue
        pos = m.end()  # accepted or not, never rescan a match: that would be quadratic
        span = check(m)
        if span is not None and span[1] > span[0]:
            yield span


def _candidates(text: str) -> list[tuple[int, int, int, str]]:
    """Every rule's accepted spans as (start, end, priority, kind)."""
    lowered: str | None = text.lower()
    if len(lowered) != len(text):
        lowered = None
    found = [(s, e, 0, "private-key") for s, e in _pem_spans(text)]
    for rule in _rules()[0]:
        found.extend((s, e, rule.priority, rule.kind) for s, e in _scan(rule, text, lowered))
    return found


def _merged(text: str) -> list[tuple[int, int, str]]:
    """Merge overlapping candidates so a secret is replaced once, under its most specific kind."""
    merged: list[tuple[int, int, str]] = []
    best = 0
    for start, end, priority, kind in sorted(_candidates(text)):
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
    markers = [m.span() for m in re.compile(_MARKER).finditer(text)]
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
    counts: dict[str, int] = {}
    while True:
        spans = _outside_markers(text, _merged(text))
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


def redact_many(texts: list[str],
                encoded: list[bytes] | None = None) -> list[tuple[str, dict[str, int]]]:
    """`redact` of each text, the same results, at a fraction of the cost for many small texts.

    Every rule's leads (ASCII patterns) are searched once, as bytes, over all the texts in UTF-8
    joined by line breaks (no lead can span one), so a text none of them touches is returned as
    it is without a pass of its own. Bytes keep the scan at one byte a character; lower-casing
    bytes agrees with `str.lower` on ASCII, and the only two characters whose `lower()` is ASCII
    (the Kelvin sign, and capital I with dot, whose lower form is longer) send the whole batch
    the slow way. `encoded`, when the caller has them, are the texts in UTF-8.
    """
    try:
        if any("\u212a" in t or "\u0130" in t for t in texts):
            raise UnicodeError
        if encoded is None:
            encoded = [t.encode("utf-8") for t in texts]
    except UnicodeError:
        return [redact(t) for t in texts]
    dirty = _touched(encoded)
    return [redact(t) if i in dirty else (t, {}) for i, t in enumerate(texts)]


def _touched(encoded: list[bytes]) -> set[int]:
    """Indexes of the texts (in UTF-8) that some lead, screen or earlier marker touches."""
    joined = b"\n".join(encoded)
    backwards = joined.lower()[::-1]
    last = len(joined) - 1
    hits: list[int] = []
    for reverse, lead in _byte_leads():
        if reverse:
            hits.extend(last - m.start() for m in lead.finditer(backwards))
        else:
            hits.extend(m.start() for m in lead.finditer(joined))
    needle = MARKER_PREFIX.encode()
    at = joined.find(needle)
    while at != -1:
        hits.append(at)
        at = joined.find(needle, at + 1)
    starts = list(itertools.accumulate((len(b) + 1 for b in encoded[:-1]), initial=0))
    return {bisect.bisect_right(starts, at) - 1 for at in hits}


_BYTE_LEADS: list[tuple[bool, re.Pattern[bytes]]] = []


def prepare() -> None:
    """Compile what `redact_many` needs first, ahead of the texts (the server does it meanwhile)."""
    _byte_leads()


# The rules matched without case are screened backwards, over the lower-cased bytes reversed:
# every generic lead (a keyword, then `_NEAR_OPERATOR`) ends at a ':' or '=', a byte the scan
# finds at memchr speed, where a scan for the keywords stops at every common letter; 3 scans do
# the work of 10 (28 MB of Markdown: 40-85 ms instead of 150). Each is `_NEAR_OPERATOR` read
# from its end. The AWS rule's "secret" implies the generic "secret" lead; "authorization"
# followed by ":" or "=" is the generic "auth" lead; the Slack webhook's "://" is found by the
# ":" screen of the rules matched with case below (case plays no part there).
_BACKWARDS = (r"""[ \t]{0,16}["'`*\]]{0,3}[a-z_-]{0,16}(?:"""
              + "|".join(k[::-1] for k in _KEYWORD_STARTS) + ")")
_FOLDED_SCREENS: tuple[tuple[str, frozenset[str]], ...] = (
    (":" + _BACKWARDS, frozenset({"generic-secret", "authorization-header"})),
    ("=" + _BACKWARDS, frozenset({"generic-secret", "authorization-header"})),
    ("terces", frozenset({"aws-secret-key", "generic-secret"})),
)

# What the batch scan looks for in place of the leads of the rules matched with case: every
# match of those rules' patterns (and every PEM block) holds one of these. Each starts with one
# byte the scan finds at memchr speed and looks around it only there, so 5 scans do the work of
# 15 (one scan of 28 MB costs 8 to 18 ms). test_redact checks that they cover every such rule.
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
    (r":(?=//)", frozenset({"url-password", "slack-webhook"})),
)


def _byte_leads() -> list[tuple[bool, re.Pattern[bytes]]]:
    """(backwards, pattern) for the batch scan, compiled for bytes on first use."""
    if not _BYTE_LEADS:  # filled in one step: a thread never sees part of the list
        _BYTE_LEADS.extend(
            [(True, re.compile(screen.encode("ascii"))) for screen, _ in _FOLDED_SCREENS]
            + [(False, re.compile(screen.encode("ascii"))) for screen, _ in _SCREENS])
    return _BYTE_LEADS
