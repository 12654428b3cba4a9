"""Tests for sharedmem.redact.credentials: every credential shape, near misses, private-key blocks.

The invented credentials come from credential_samples.py (made at run time, never literals).
"""

from __future__ import annotations

import re

import credential_samples
import pytest
from credential_samples import B64, NEGATIVES, PEM_LABELS, POSITIVES, URLSAFE, m, pem, tok

from sharedmem.redact.redactor import find, redact


@pytest.mark.parametrize(("before", "secret", "after", "kind"),
                         [p[1:] for p in POSITIVES], ids=[p[0] for p in POSITIVES])
def test_positive_detected_and_replaced(before: str, secret: str, after: str, kind: str) -> None:
    text = before + secret + after
    out, counts = redact(text)
    assert counts == {kind: 1}
    assert secret not in out
    assert out == before + m(kind) + after
    findings = find(text)
    assert [(f.kind, text[f.start:f.end]) for f in findings] == [(kind, secret)]


def test_enough_positive_cases() -> None:
    assert len(POSITIVES) >= 40
    assert len({p[4] for p in POSITIVES}) >= 17


@pytest.mark.parametrize("text", NEGATIVES)
def test_near_miss_unchanged(text: str) -> None:
    assert redact(text) == (text, {})
    assert find(text) == []


def test_enough_negative_cases() -> None:
    assert len(NEGATIVES) >= 20


def test_negatives_survive_together_in_one_document() -> None:
    doc = "\n\n".join(NEGATIVES) + "\n"
    assert redact(doc) == (doc, {})


@pytest.mark.parametrize("label", PEM_LABELS)
def test_pem_block_replaced_whole(label: str) -> None:
    block = pem(label)
    text = f"Key for the box:\n\n{block}\n\nKeep it offline.\n"
    out, counts = redact(text)
    assert counts == {"private-key": 1}
    assert out == f"Key for the box:\n\n{m('private-key')}\n\nKeep it offline.\n"
    assert redact(out) == (out, {})


def test_several_pem_blocks_and_public_material() -> None:
    cert = "-----BEGIN CERTIFICATE-----\nMIIDdzCCAl+gAwIBAgIE\n-----END CERTIFICATE-----"
    blocks = [pem(label) for label in PEM_LABELS]
    doc = cert + "\n" + "\nbetween\n".join(blocks) + "\ntail\n"
    out, counts = redact(doc)
    assert counts == {"private-key": len(PEM_LABELS)}
    assert out.startswith(cert + "\n")
    assert out.count("between") == len(PEM_LABELS) - 1
    assert out.endswith(m("private-key") + "\ntail\n")
    assert "BEGIN" not in out.replace("BEGIN CERTIFICATE", "")


def test_pem_in_json_string_with_escaped_newlines() -> None:
    block = pem("RSA PRIVATE KEY").replace("\n", "\\n")
    text = '{"privateKey": "' + block + '\\n"}'
    out, counts = redact(text)
    assert "private-key" in counts
    assert "BEGIN RSA" not in out and block[40:80] not in out


def test_truncated_pem_block_redacted_up_to_blank_line() -> None:
    body = "\n".join(tok(64, B64) for _ in range(3))
    begin = "-----BEGIN " + "OPENSSH PRIVATE KEY-----"
    text = f"before\n{begin}\n{body}\n\nafter the blank line\n"
    out, counts = redact(text)
    assert counts == {"private-key": 1}
    assert out == f"before\n{m('private-key')}\n\nafter the blank line\n"


def test_anthropic_key_is_not_reported_as_openai() -> None:
    text = "sk-ant-api03-" + tok(80, URLSAFE) + " and sk-proj-" + tok(80, URLSAFE)
    _, counts = redact(text)
    assert counts == {"anthropic-key": 1, "openai-key": 1}


def test_own_sources_hold_nothing_that_looks_like_a_secret() -> None:
    # release_check scans tracked files with the detector: the rules, their tests and the
    # invented credentials must come out clean.
    import sharedmem.redact.credentials as module

    for path in (__file__, credential_samples.__file__, module.__file__):
        with open(path, encoding="utf-8") as handle:
            assert find(handle.read()) == [], path


def test_rules_compile_the_leads_and_leave_each_full_pattern_until_a_lead_matches() -> None:
    # Compiling every full pattern costs each process that redacts a text a start-up it mostly
    # does not need (docs/BENCHMARKS.md); a rule's pattern is compiled in _scan, where used.
    from sharedmem.redact.credentials import rules
    assert all(isinstance(lead, re.Pattern) for rule in rules() for lead in rule.lead)
    assert all(isinstance(rule.regex, str) for rule in rules())
