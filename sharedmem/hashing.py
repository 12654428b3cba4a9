"""Content addresses: the SHA-256 of a file and the digest of a namespace, computed alike on both ends."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable


def sha256_bytes(data: bytes) -> str:
    """Hex SHA-256 of `data`."""
    return hashlib.sha256(data).hexdigest()


def sha256_text(text: str) -> str:
    """Hex SHA-256 of `text` as UTF-8: the content address of a published file."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def digest_of(entries: Iterable[tuple[str, str]]) -> str:
    """Order-independent digest of a namespace's (path, sha256) pairs, computed alike on both ends."""
    return digest_of_sorted(sorted(entries))


def digest_of_sorted(entries: Iterable[tuple[str, str]]) -> str:
    """`digest_of` pairs already in path order, each path once: without sorting them again."""
    return sha256_text("".join([f"{p}\0{s}\n" for p, s in entries]))
