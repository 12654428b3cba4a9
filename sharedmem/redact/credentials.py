"""What each kind of credential looks like, and how a real one differs from a stand-in for one.

A rule per kind: the literal leads where its pattern can start, the pattern, how specific it is,
and a check that turns down templating, variable names, stand-in words and prose that only look
like a value. Private keys are the one kind without a rule: their PEM blocks are paired with
``str.find``. A marker left by an earlier redaction is never a credential (``redact.py`` does
the finding and replacing).
"""

from __future__ import annotations

import re
from collections import namedtuple
from collections.abc import Callable, Iterator

MARKER_PREFIX = "[REDACTED:"
# The patterns below are compiled where they are used, on first need, and cached by `re`: most
# texts never need them, and compiling them all at import would cost every process.
MARKER_PATTERN = r"\[REDACTED:[a-z-]{1,40}\]"


def marker(kind: str) -> str:
    """The text that replaces a credential of this kind."""
    return f"{MARKER_PREFIX}{kind}]"


Span = tuple[int, int]
_Check = Callable[[re.Match[str]], Span | None]


class Rule(namedtuple("Rule", "kind lead regex priority check folded")):
    """One rule, written as strings; `rules` compiles the leads, `regex` where one matches.

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
    v = re.compile(MARKER_PATTERN).sub("", value).strip()  # whatever is left besides earlier markers
    if not v or re.compile(_PLACEHOLDER).fullmatch(v):
        return True
    if v[0] in "$%<{" or "${" in v or "{{" in v:
        return True
    if v[0] in "!*&" and v[1:].replace("_", "").isalpha():
        return True  # a YAML tag, alias or anchor: !vault, *default, &creds
    return bool(re.compile(_DOTTED_NAME).fullmatch(v))


def group_span(m: re.Match[str]) -> Span | None:
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
    return group_span(m)


def _check_url(m: re.Match[str]) -> Span | None:
    """Only a real password in ``scheme://user:password@host``, not ``${PASS}`` or ``****``."""
    return None if _is_placeholder(m.group("s")) else m.span("s")


def _check_auth(m: re.Match[str]) -> Span | None:
    """Reject prose such as ``Authorization: required`` or ``Authorization: Negotiate``."""
    cred = m.group("s")
    if cred.isalpha() and (cred.islower() or not m.group("scheme")):
        return None
    return group_span(m)


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
URL_PART = 256  # characters at most of a URL's user, and of its password (url-password)
KEYWORD_STARTS = ("passw", "pwd", "secret", "token", "api", "access", "private", "auth")
_NEAR_OPERATOR = r"""(?=[a-z_-]{0,16}["'`*\]]{0,3}[ \t]{0,16}[:=])"""  # skips prose in the C engine
_B64 = r"A-Za-z0-9/+"


def _rule(kind: str, lead: str | tuple[str, ...], pattern: str, priority: int = 1,
          check: _Check | None = None, folded: bool = False) -> Rule:
    """One rule, as text; `rules` compiles its leads the first time a text needs them.

    Each `lead` pattern starts with a literal, so the regex engine skips to it as fast as
    str.find; the full pattern is then tried only at those places. Most texts match no lead at
    all (`redact.redact_many` finds that out with the leads alone), so compiling the full
    patterns is left until one does.
    """
    return Rule(kind, (lead,) if isinstance(lead, str) else lead, pattern, priority, check, folded)


_RULE_TEXT: tuple[Rule, ...] = (
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
          rf"(?<=[A-Za-z0-9])://[^\s:/@?#\"'<>]{{1,{URL_PART}}}:"
          rf"(?P<s>[^\s/@?#\"'<>]{{1,{URL_PART}}})@", 2, _check_url),
    _rule("generic-secret", tuple(k + _NEAR_OPERATOR for k in KEYWORD_STARTS), _GENERIC, 3,
          _check_generic, folded=True),
)
_COMPILED: list[tuple[Rule, ...]] = []
# Each folded rule's leads as one pattern matched without case, for a text whose lower case
# is not as long as it is (`folded_leads`).
_FOLDED_LEADS = {r.kind: "|".join(r.lead) for r in _RULE_TEXT if r.folded}


def rules() -> tuple[Rule, ...]:
    """The rules with their leads compiled, on first need; each full pattern stays text.

    A full pattern is compiled (and cached by `re`) where one of its leads first matches: a
    text a screen touched matches the leads of a rule or two, so compiling all the patterns
    and the folded leads would cost each process that redacts anything most of its redaction.
    """
    if not _COMPILED:  # replaced whole in one step, as `redactor._byte_leads` does
        _COMPILED[:] = [tuple(r._replace(lead=tuple(re.compile(x) for x in r.lead))
                              for r in _RULE_TEXT)]
    return _COMPILED[0]


def folded_leads(kind: str, caseless: bool = True) -> re.Pattern[str]:
    """The leads of the folded rule `kind` as one pattern, matched without case.

    Or (`caseless` false) as they are, for a text already lower-cased.
    """
    return re.compile(_FOLDED_LEADS[kind], re.IGNORECASE if caseless else 0)


_PEM_BEGIN = r"-----BEGIN (?P<label>[A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?)-----"
_PEM_TAIL = r"[^\r\n]*(?:\r?\n[^\r\n]+)*"  # an unterminated block: up to a blank line


def pem_spans(text: str) -> Iterator[Span]:
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
