"""Content addresses: the SHA-256 of a file and the digest of a namespace, computed alike on both ends."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import Any, BinaryIO


def _load_sha256(data: bytes) -> Any:
    """The sha256 of hashlib, loaded at the first hash: `serve` loads this module before its hello.

    hashlib loads OpenSSL, and a sync that changed nothing hashes nothing on the
    server. Once loaded, `_sha256` is hashlib's own function: no call in between.
    """
    global _sha256
    import hashlib
    _sha256 = hashlib.sha256
    return _sha256(data)


_sha256: Callable[..., Any] = _load_sha256


def sha256_bytes(data: bytes) -> str:
    """Hex SHA-256 of `data`."""
    return _sha256(data).hexdigest()


def sha256_text(text: str) -> str:
    """Hex SHA-256 of `text` as UTF-8: the content address of a published file."""
    return _sha256(text.encode("utf-8")).hexdigest()


def sha256_file(handle: BinaryIO) -> str:
    """Hex SHA-256 of an open binary file's bytes, read a chunk at a time."""
    import hashlib
    return hashlib.file_digest(handle, "sha256").hexdigest()


def digest_of(entries: Iterable[tuple[str, str]]) -> str:
    """Order-independent digest of a namespace's (path, sha256) pairs, computed alike on both ends.

    Its lines sorted are the pairs sorted by path: a path holds no NUL (`rules.path_problems`),
    which sorts before every other character. Sorting the strings costs about half what sorting
    the pairs does.
    """
    return sha256_text("".join(sorted([f"{p}\0{s}\n" for p, s in entries])))


def digest_of_sorted(entries: Iterable[tuple[str, str]]) -> str:
    """`digest_of` pairs already in path order, each path once: without sorting them again."""
    return sha256_text("".join([f"{p}\0{s}\n" for p, s in entries]))
