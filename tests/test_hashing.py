"""Tests for sharedmem.hashing: content addresses."""

from __future__ import annotations

from sharedmem import hashing

NFC_E = "\u00e9"  # 'é' composed


def test_sha256_of_text_is_that_of_its_utf8() -> None:
    assert hashing.sha256_text("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    assert hashing.sha256_text(NFC_E) == hashing.sha256_bytes(NFC_E.encode("utf-8"))


def test_digest_of_ignores_order() -> None:
    pairs = [("b.md", "2"), ("a.md", "1")]
    assert hashing.digest_of(pairs) == hashing.digest_of(reversed(pairs))
    assert hashing.digest_of(pairs) != hashing.digest_of(pairs[:1])


def test_digest_of_sorted_pairs_is_their_digest_without_a_sort() -> None:
    pairs = [("a.md", "1"), ("b/c.md", "2"), ("caf\u00e9.md", "3"), ("\u65e5.md", "4")]
    assert hashing.digest_of_sorted(pairs) == hashing.digest_of(reversed(pairs))
    assert hashing.digest_of_sorted(reversed(pairs)) != hashing.digest_of(pairs)  # it trusts


def test_digest_of_orders_by_path_as_the_sorted_digest_does() -> None:
    # A path that is another's prefix, and characters on either side of "/" and of NUL's place.
    paths = ["a", "a/b.md", "a.md", "a-b/c.md", "a/b/c.md", "ab.md", "A.md", "é.md", "a b.md"]
    pairs = [(p, hashing.sha256_text(p)) for p in paths]
    assert hashing.digest_of(pairs) == hashing.digest_of_sorted(sorted(pairs))
    assert hashing.digest_of(reversed(pairs)) == hashing.digest_of_sorted(sorted(pairs))
