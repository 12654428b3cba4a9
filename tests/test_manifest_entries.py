"""Tests for sharedmem.server.manifest_entries: a manifest's entries and addresses, checked once."""

from __future__ import annotations

import pytest

from sharedmem.hashing import sha256_text
from sharedmem.protocol import PeerError
from sharedmem.server.body_pool import NO_REF
from sharedmem.server.manifest_entries import address, mtime_ns, parse_entries

A, B = sha256_text("a"), sha256_text("b")


def test_entries_come_back_as_tuples_and_a_place_names_the_text_sent_there() -> None:
    refs = bytearray(bytes.fromhex(A) + NO_REF + bytes.fromhex(B))
    assert parse_entries([["x.md", A, 1, 5], ["y.md", 2, 1, None]], refs) == [
        ("x.md", A, 1, 5), ("y.md", B, 1, 0)]
    assert parse_entries([], None) == []


@pytest.mark.parametrize(("raw", "refs", "why"), [
    ([["x.md", A, 1]], None, "must be [path, sha256, size, mtime_ns]"),
    ([["x.md", A, True, 0]], None, "must be [path, sha256, size, mtime_ns]"),
    ([[7, A, 1, 0]], None, "must be [path, sha256, size, mtime_ns]"),
    ([["x.md", 0, 1, 0]], None, "must be [path, sha256, size, mtime_ns]"),
    ([["x.md", 1.5, 1, 0]], bytearray(), "may be the place of a text sent ahead"),
    ([["x.md", 1, 1, 0]], bytearray(bytes.fromhex(A) + NO_REF), "names text 1 sent ahead"),
    ([["x.md", -1, 1, 0]], bytearray(bytes.fromhex(A)), "names text -1 sent ahead"),
    ([["x.md", A.upper(), 1, 0]], None, "64 lower-case hex digits"),
    ([["x.md", A, 1, -1]], None, "mtime_ns must be a non-negative integer"),
    ([["x.md", A, 1, False]], None, "mtime_ns must be a non-negative integer"),
])
def test_a_bad_entry_is_refused_saying_what_an_entry_is(raw: list, refs: bytearray | None,
                                                        why: str) -> None:
    with pytest.raises(PeerError, match=why.replace("[", r"\[").replace("]", r"\]")) as exc:
        parse_entries(raw, refs)
    assert exc.value.code == "bad-field"


def test_an_address_is_64_lower_case_hex_digits_and_an_mtime_a_whole_number() -> None:
    assert address(A, "manifest.digest") == A
    for bad in (A[:-1], A.upper(), "g" * 64):
        with pytest.raises(PeerError, match="manifest.digest must be a sha256"):
            address(bad, "manifest.digest")
    assert mtime_ns(None) == 0 and mtime_ns(2**63 - 1) == 2**63 - 1
    with pytest.raises(PeerError):
        mtime_ns(2**63)
