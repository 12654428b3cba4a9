"""Tests for sharedmem.redact.redactor: idempotency, merging, markers, the batch scan, hostile input.

The credential shapes, near misses and private-key blocks are tested in test_credentials.py;
the documents here are built from the same invented credentials (credential_samples.py).
"""

from __future__ import annotations

import random
import re
import string
import time

import pytest
from credential_samples import ALNUM, B64, JWT, NEGATIVES, PEM_LABELS, POSITIVES, UPPER_DIGITS, m, pem, tok

from sharedmem.core import NoteError
from sharedmem.redact.redactor import Finding, find, redact, redact_many, redact_note
from sharedmem.rules import NOTE_MAX_BYTES


@pytest.mark.parametrize("text", [p[1] + p[2] + p[3] for p in POSITIVES], ids=[p[0] for p in POSITIVES])
def test_redaction_is_idempotent(text: str) -> None:
    once, _ = redact(text)
    assert redact(once) == (once, {})
    assert find(once) == []


def test_counts_per_kind_and_multi_secret_document() -> None:
    gh1, gh2 = "ghp_" + tok(36), "gho_" + tok(36)
    akia, aws_secret, pw = "AKIA" + tok(16, UPPER_DIGITS), tok(40, B64), "Qz9!" + tok(8)
    doc = (
        "# Deploy notes\n\n"
        f"- CI uses {gh1} for pushes\n"
        f"- the bot uses {gh2}\n"
        f"- aws_access_key_id = {akia}\n"
        f"- aws_secret_access_key = {aws_secret}\n"
        f"- DB_PASSWORD={pw}\n"
        f"- session: {JWT}\n"
        "The token is stored in the keychain.\n"
    )
    out, counts = redact(doc)
    assert counts == {
        "github-token": 2,
        "aws-access-key": 1,
        "aws-secret-key": 1,
        "generic-secret": 1,
        "jwt": 1,
    }
    for secret in (gh1, gh2, akia, aws_secret, pw, JWT):
        assert secret not in out
    assert out.startswith("# Deploy notes\n\n- CI uses [REDACTED:github-token] for pushes\n")
    assert "- aws_access_key_id = [REDACTED:aws-access-key]\n" in out
    assert out.endswith("The token is stored in the keychain.\n")
    findings = find(doc)
    assert [f.line for f in findings] == [3, 4, 5, 6, 7, 8]
    assert [f.start for f in findings] == sorted(f.start for f in findings)
    assert all(a.end <= b.start for a, b in zip(findings, findings[1:], strict=False))


def test_report_never_contains_the_secret() -> None:
    secrets = [p[2] for p in POSITIVES]
    doc = "\n".join(p[1] + p[2] + p[3] for p in POSITIVES)
    out, counts = redact(doc)
    findings = find(doc)
    report = repr(counts) + repr(findings) + "".join(counts)
    for secret in secrets:
        assert secret not in out
        assert secret not in report
    assert Finding._fields == ("kind", "start", "end", "line")
    assert all(isinstance(v, int) for v in counts.values())


def test_crlf_line_endings() -> None:
    gh, pw = "ghp_" + tok(36), "p4ss" + tok(10)
    block = pem("EC PRIVATE KEY", newline="\r\n")
    doc = f"first\r\npassword: {pw}\r\ntoken {gh}\r\n{block}\r\nlast\r\n"
    out, counts = redact(doc)
    assert counts == {"generic-secret": 1, "github-token": 1, "private-key": 1}
    assert out == (
        f"first\r\npassword: {m('generic-secret')}\r\ntoken {m('github-token')}\r\n"
        f"{m('private-key')}\r\nlast\r\n"
    )
    assert [f.line for f in find(doc)] == [2, 3, 4]
    assert redact(out) == (out, {})


def test_offsets_hold_when_lowercasing_changes_length() -> None:
    # "İ".lower() is two characters; offsets must still point into the original text.
    gh = "ghp_" + tok(36)
    text = "İİİ password: " + "hunter2" + "xyz and " + gh + " İ"
    out, counts = redact(text)
    assert counts == {"generic-secret": 1, "github-token": 1}
    assert out == "İİİ password: [REDACTED:generic-secret] and [REDACTED:github-token] İ"


def test_secret_inside_generic_value_is_redacted_once() -> None:
    gh = "ghp_" + tok(36)
    text = "token=" + "abcd1234-" + gh + "\n"
    out, counts = redact(text)
    assert sum(counts.values()) == 1
    assert gh not in out and "abcd1234" not in out
    assert redact(out) == (out, {})


def _prose_megabyte() -> str:
    para = (
        "## Notes on tokens and passwords\n\n"
        "The token is stored in the keychain; set your password in settings. See "
        "https://example.com/docs/auth?x=1 for the API key rotation policy and the secret manager. "
        "Authorization is required for every endpoint; commit 3f2a9c1d8e7b6a5f4e3d2c1b0a9f8e7d6c5b4a39 "
        "fixed request 123e4567-e89b-12d3-a456-426614174000. max_tokens: 4096\n\n"
    )
    return para * (1_000_000 // len(para) + 1)


def test_a_large_prose_document_is_untouched() -> None:
    # How fast it goes is measured by scripts/bench.py sync (serve redacts every body), not here.
    doc = _prose_megabyte()
    out, counts = redact(doc)
    assert counts == {}
    assert out == doc


@pytest.mark.parametrize(
    "text",
    [
        "a." * 300_000,
        ("-----BEGIN " + "PRIVATE KEY-----\n") * 30_000,
        "eyJ" + "a" * 600_000,
        "password=" * 60_000,
        "a://b:" * 100_000,
        "x://" + "a" * 300_000,
        "Authorization: " * 40_000,
        "aws secret " * 60_000,
        "password: " + "a" * 600_000,
        ("sk-" + "a" * 30 + " ") * 20_000,
        ("token=" * 600 + "x(\n") * 200,
        ('token="' + "token=" * 600 + "\n") * 200,
    ],
    ids=["dots", "pem-no-end", "eyj-run", "assign-run", "url-run", "scheme-run", "auth-run",
         "aws-run", "long-value", "sk-run", "rejected-values", "unclosed-quotes"],
)
def test_pathological_inputs_stay_bounded(text: str) -> None:
    # A guard against a hang, not a speed target: a file or note anyone publishes is redacted on
    # the server, and a rule that backtracks on such input would never finish (seconds here
    # against hours or more).
    started = time.perf_counter()
    out, _ = redact(text)
    assert time.perf_counter() - started < 2.0
    assert redact(out)[0] == out


def test_own_sources_hold_nothing_that_looks_like_a_secret() -> None:
    # release_check scans tracked files with this module: its own code and tests must come out clean.
    import sharedmem.redact.redactor as module

    for path in (__file__, module.__file__):
        with open(path, encoding="utf-8") as handle:
            assert find(handle.read()) == [], path


def test_existing_markers_are_kept_and_text_beside_them_still_redacted() -> None:
    pw = "hunter" + tok(6, string.digits)
    text = 'note [REDACTED:jwt] stays; password: "[REDACTED:jwt] ' + pw + '"'
    out, counts = redact(text)
    assert counts == {"generic-secret": 1}
    assert pw not in out
    assert out.startswith("note [REDACTED:jwt] stays; password: \"[REDACTED:jwt]")
    assert redact(out) == (out, {})


def test_fuzzed_mixtures_converge_in_one_call() -> None:
    # Glue positives, near misses and PEM blocks together with separators that change token
    # boundaries; whatever one call leaves behind, a second call must find nothing in it.
    rng = random.Random(7)
    fragments = [p[1] + p[2] + p[3] for p in POSITIVES] + NEGATIVES + [pem(x) for x in PEM_LABELS]
    separators = ["", " ", "\n", "\r\n", "=", ":", '"', "'", "@", "/", "&", ",", "\n\n", "-", "_", "."]
    for _ in range(600):
        parts = [rng.choice(fragments) + rng.choice(separators) for _ in range(rng.randint(1, 6))]
        out, counts = redact("".join(parts))
        assert find(out) == []
        assert redact(out) == (out, {})
        assert sum(counts.values()) == out.count("[REDACTED:") - "".join(parts).count("[REDACTED:")


def test_redact_many_equals_redact_of_each() -> None:
    # The batch only skips texts no lead touches; any difference from one call per text is a bug.
    rng = random.Random(11)
    fragments = ([p[1] + p[2] + p[3] for p in POSITIVES] + NEGATIVES + [pem(x) for x in PEM_LABELS]
                 + ["plain prose with no secret at all", "to", "ken = '" + tok(14, ALNUM) + "'", "",
                    "note [REDACTED:jwt] stays", "-----BEGIN", "\u212a" + "ey=abc", "sk-",
                    "Ünïcödé ≠ ascii 🙂", "AKIA"])
    batches = [[p[1] + p[2] + p[3] for p in POSITIVES], NEGATIVES, [], [""], ["a", "", "b"]]
    for _ in range(150):
        batches.append(["".join(rng.choice(fragments) for _ in range(rng.randint(0, 4)))
                        for _ in range(rng.randint(1, 12))])
    for texts in batches:
        assert redact_many(texts) == [redact(t) for t in texts]


def test_a_touched_text_is_tried_first_by_every_rule_that_finds_something_in_it() -> None:
    # redact_many's first pass over a touched text tries only the rules whose leads the screens
    # found in it: a rule with a candidate there but left out would let that secret through.
    from sharedmem.redact.redactor import _candidates, _touched
    rng = random.Random(23)
    fragments = ([p[1] + p[2] + p[3] for p in POSITIVES] + [p[2] for p in POSITIVES] + NEGATIVES
                 + [pem(x) for x in PEM_LABELS]
                 + ["see https://example.com/x", "https://u:" + tok(12, ALNUM) + "@host/",
                    "https://hooks.slack.com/services/" + tok(24, ALNUM), "token://x", "://",
                    "password: " + tok(14, ALNUM), "note [REDACTED:jwt] stays", " ", "\n"])
    tried = 0
    for _ in range(400):
        texts = ["".join(rng.choice(fragments) for _ in range(rng.randint(1, 4)))
                 for _ in range(rng.randint(1, 6))]
        touched = _touched([t.encode() for t in texts])
        for i, text in enumerate(texts):
            found = {kind for _, _, _, kind in _candidates(text)}
            if found:
                tried += 1
                assert i in touched and (touched[i] is None or found <= touched[i]), text
    assert tried > 800


def test_a_link_touches_only_the_url_rule_it_may_hold() -> None:
    # Most notes hold links; one with no '@' within reach and no Slack host touches no rule.
    from sharedmem.redact.credentials import URL_PART
    from sharedmem.redact.redactor import _touched
    texts = ["read https://example.com/page first, or https://npmjs.com/package/@scope/x",
             "clone https://me:" + tok(12, ALNUM) + "@git.example.com/r.git",
             "post to https://Hooks.Slack.com/services/" + tok(24, ALNUM),
             "a token: here and https://x.org/", "plain",
             "https://" + "é" * URL_PART + ":" + "ü" * (URL_PART - 56) + tok(56, ALNUM) + "@h/",
             "db at postgres://app:" + tok(8, ALNUM) + ":" + tok(8, ALNUM) + "@db.internal/x",
             "clone https://me@git.example.com/r.git"]  # a user without a password
    touched = _touched([t.encode() for t in texts])
    assert 0 not in touched and 4 not in touched and 7 not in touched
    assert touched[1] == touched[5] == touched[6] == {"url-password"}
    assert redact(texts[6])[1] == {"url-password": 1}  # a password may hold a ':'
    assert touched[2] == {"slack-webhook"}
    assert touched[3] == {"generic-secret", "authorization-header"}
    assert redact(texts[5])[1] == {"url-password": 1}  # its '@' is 975 bytes past the ':'
    assert redact_many(texts) == [redact(t) for t in texts]


SECRETISH = " = '" + tok(14, ALNUM) + "'"


@pytest.mark.parametrize("odd", ["TO\u212aEN" + SECRETISH, "\u0130 password" + SECRETISH,
                                 "lone \ud800 surrogate"])
def test_redact_many_falls_back_for_characters_that_break_the_byte_scan(odd: str) -> None:
    texts = ["clean text", odd, "api_key" + SECRETISH]
    assert redact_many(texts) == [redact(t) for t in texts]


@pytest.mark.parametrize("odd", ["", "TO\u212aEN" + SECRETISH, "\u0130 password" + SECRETISH])
def test_redact_many_of_bytes_alone_decodes_only_what_it_touches(odd: str) -> None:
    # The server's form (raw texts): UTF-8 alone; an untouched text comes back as None, its
    # bytes unchanged; every other result is redact's of the decoded text.
    texts = ["clean text \u00e9", "api_key" + SECRETISH, odd, "note [REDACTED:jwt] stays"]
    got = redact_many(None, [t.encode("utf-8") for t in texts])
    want = [redact(t) for t in texts]
    assert [(w[0] if g[0] is not None else None, w[1]) for g, w in zip(got, want, strict=True)] == got
    assert got[0] == ((texts[0], {}) if odd else (None, {}))
    assert got[1][1] and got[3][0] == texts[3]
    if odd:  # the whole batch the slow way, as with strings
        assert got == want


def test_the_batch_screens_cover_every_rule_matched_with_case() -> None:
    # A rule matched with case is found by the batch scan only through a screen; one left out
    # would let its secrets through redact_many untouched.
    from sharedmem.redact.credentials import _RULE_TEXT
    from sharedmem.redact.redactor import _FOLDED_SCREENS, _SCREENS
    cased = {rule.kind for rule in _RULE_TEXT if not rule.folded} | {"private-key"}
    screened = set().union(*(kinds for _, kinds in _SCREENS + _FOLDED_SCREENS))
    assert cased <= screened
    assert screened - cased <= {rule.kind for rule in _RULE_TEXT}


@pytest.mark.parametrize("positive", POSITIVES, ids=[p[0] for p in POSITIVES])
def test_redact_many_finds_each_token_without_its_usual_context(positive: tuple) -> None:
    # The usual context ("password = ", "://") is itself a lead, which hides a screen that
    # misses the token; alone in plain words, the token must be found through its own.
    texts = ["plain words", "before " + positive[2] + " after", "more plain words"]
    assert redact_many(texts) == [redact(t) for t in texts]


def test_the_backward_screens_touch_every_text_a_caseless_lead_touches() -> None:
    # The rules matched without case are screened from the ':' or '=' back to the keyword; any
    # text one of their patterns matches must be touched, or redact_many would pass it unread.
    from sharedmem.redact.credentials import _RULE_TEXT
    from sharedmem.redact.redactor import _FOLDED_SCREENS, _FOLDED_WORDS, _SCREENS, _touched
    folded = [rule for rule in _RULE_TEXT if rule.folded]
    screened = set().union(*(kinds for _, kinds in _FOLDED_SCREENS + _FOLDED_WORDS + _SCREENS))
    assert {rule.kind for rule in folded} <= screened
    patterns = [(rule.kind, re.compile(rule.regex)) for rule in folded]
    pieces = ["Token", "PASSWORD", "passwd", "Pwd", "SeCrEt", "api", "ApiKey", "Access", "private",
              "auth", "Authorization", "AWS", "_", "-", "key", "=", ":", "=>", " ", "\t", '"', "'",
              "`", "*", "]", "x", "\n", "https://Hooks.slack.com/", "é", "value", "/", "(",
              "Aws Secret ", tok(40, ALNUM)]
    rng = random.Random(5)
    seen = 0
    for _ in range(4000):
        texts = ["".join(rng.choice(pieces) for _ in range(rng.randint(0, 9))) for _ in range(4)]
        touched = _touched([t.encode() for t in texts])
        for i, text in enumerate(texts):
            kinds = {kind for kind, p in patterns if p.search(text)}
            seen += bool(kinds)
            # Touched, and tried first by every rule that matches it.
            assert not kinds or i in touched and (touched[i] is None or kinds <= touched[i]), text
    assert seen > 300  # the pieces do make matches often


def test_the_operator_rules_leads_are_all_inside_the_backward_windows() -> None:
    # Their leads are looked for only between a keyword and the ':' or '=' the backward screens
    # stop at; a lead outside every window where the rule's pattern matches would be a secret
    # never tried.
    from sharedmem.redact.credentials import rules
    from sharedmem.redact.redactor import (
        _OPERATOR_KINDS,
        _lead_positions,
        _leads_within,
        _operator_windows,
    )
    operator_rules = [(rule, re.compile(rule.regex)) for rule in rules()
                      if rule.kind in _OPERATOR_KINDS]
    pieces = ["secret", "secretoken", "secreToken", "accesSecret", "passwd", "PWD", "Token",
              "api", "Api_Key", "access", "private", "auth", "authorization", "x" * 16, "y" * 17,
              "_", "-", "key",
              '"', "'''", "`*]", " " * 16, "\t", " ", ":", "=", "=>", ":=", "\n", "é", "ß", "z"]
    rng = random.Random(29)
    seen = 0
    for _ in range(6000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 12)))
        lowered = text.lower()
        windows = _operator_windows(lowered)
        for rule, regex in operator_rules:
            every = _lead_positions(rule, text, lowered)
            got = _leads_within(rule, lowered, windows)
            assert set(got) <= set(every) and got == sorted(got), (rule.kind, text)
            want = [at for at in every if regex.match(text, at)]
            seen += len(want)
            assert [at for at in got if regex.match(text, at)] == want, (rule.kind, text)
    assert seen > 300  # the pieces make matches often


def test_the_leads_lower_case_finds_what_str_lower_finds() -> None:
    # Only the ASCII letters are lowered for the leads; where str.lower would turn a character
    # into ASCII (the Kelvin sign) or change the length (U+0130), its own result must be used.
    from sharedmem.redact.redactor import _lowered
    pieces = ["Token", "PASSWORD", "é", "É", "ß", "Σ", "🙂", "\u212a", "\u0130", "\ud800", "ǅ",
              "Ａ", "x", ": ", "\n"]
    rng = random.Random(31)
    for _ in range(2000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 8)))
        full = text.lower()
        got = _lowered(text)
        if len(full) != len(text):
            assert got is None, text
            continue
        assert got is not None and len(got) == len(text), text
        assert all(a == b for a, b in zip(got, full, strict=True) if a.isascii() or b.isascii()), text


BODY = "A1b2C3d4E5f6G7h8J9k0" * 3  # not wordy, long enough for every rule
EVERY_LEAD = (
    [f"xox{c}-{BODY}" for c in "abposre"] + [f"xapp-{BODY}"]
    + [f"gl{kind}-{BODY}" for kind in ("pat", "dt", "rt", "ptt", "cbt", "oas", "ft", "imt")]
    + [f"gh{c}_{BODY[:40]}" for c in "pousr"] + [f"github_pat_{BODY}"]
    + [f"{c}k_{mode}_{BODY}" for c in "sr" for mode in ("live", "test")]
    + [f"hf_{BODY}", f"npm_{BODY}", f"pypi-AgEI{BODY}", f"sk-ant-{BODY}", f"sk-{BODY}"]
    + [f"{lead}{BODY[:16].upper()}" for lead in ("AKIA", "ASIA", "ABIA", "ACCA")]
    + [f"AIza{BODY}", f"eyJ{BODY}.{BODY}.{BODY}"])


@pytest.mark.parametrize("token", EVERY_LEAD, ids=[t[:8] for t in EVERY_LEAD])
def test_every_lead_of_the_rules_matched_with_case_is_screened(token: str) -> None:
    # Each variant of each lead, alone in plain words: a screen missing one would let it pass.
    text = f"plain words {token} more words"
    assert redact(text)[1], token
    assert redact_many([text, "x"]) == [redact(text), ("x", {})]


def test_a_note_is_checked_by_the_note_rule_around_its_redaction() -> None:
    gh = "ghp_" + tok(36)
    text, counts = redact_note("2026-01-31T09-30-00-ci.md", f"use {gh} for CI")
    assert gh not in text and "[REDACTED:" in text and sum(counts.values()) == 1
    for filename, note, why in (("notes.md", f"use {gh}", "invalid"),
                                ("2026-01-31T09-30-00-ci.md", "   ", "non-empty"),
                                ("2026-01-31T09-30-00-ci.md", "x" * (NOTE_MAX_BYTES + 1), "longer")):
        with pytest.raises(NoteError, match=why):
            redact_note(filename, note)


def test_threads_that_redact_first_at_once_each_see_every_screen_once() -> None:
    # `serve` compiles the screens on a thread (session._load_for_changes) while its session
    # may already redact the first bodies: two first uses at once must leave one set of them.
    import sys
    import threading

    from sharedmem.redact import redactor
    texts = ["plain", "api_key" + SECRETISH, "see https://u:" + tok(12, ALNUM) + "@h/"]
    want = [redact(t) for t in texts]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often, inside the first compile too
    try:
        for _ in range(100):
            redactor._BYTE_LEADS.clear()
            got: list[object] = []
            threads = [threading.Thread(target=lambda out=got: out.append(
                redactor.redact_many(texts))) for _ in range(4)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            assert got == [want] * 4
            assert len(redactor._byte_leads()) == len(redactor._SCREEN_KINDS)
    finally:
        sys.setswitchinterval(interval)
