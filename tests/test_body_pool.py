"""The bodies a session holds, over a real store: admitted, redacted, stored in batches, released."""

from __future__ import annotations

import pytest

from sharedmem.hashing import sha256_bytes
from sharedmem.protocol import PeerError
from sharedmem.rules import Limits
from sharedmem.server import body_pool
from sharedmem.server.body_pool import BodyPool
from sharedmem.server.store import Store


def body(text: str) -> tuple[str, bytes]:
    data = text.encode()
    return sha256_bytes(data), data


def test_a_body_over_the_file_limit_or_past_the_quota_is_refused_and_kept_as_a_refusal(
        st: Store) -> None:
    pool = BodyPool(st, Limits(file_bytes=10, namespace_bytes=15))
    pool.exchange()
    big, fits, past = body("x" * 11), body("y" * 10), body("z" * 10)
    assert not pool.admit(*big, ahead=False)
    assert pool.admit(*fits, ahead=False)
    assert not pool.admit(*past, ahead=False)  # 20 bytes of a 15-byte exchange
    assert pool.refused == {big[0]: ("too-large", 11), past[0]: ("quota", 10)}
    assert big[0] in pool and fits[0] not in pool  # decided on: refused; not yet kept
    assert pool.admit(*past, ahead=True)  # bodies ahead count against ahead_bytes instead


def test_bodies_ahead_past_ahead_bytes_end_the_session(st: Store) -> None:
    pool = BodyPool(st, Limits(namespace_bytes=100))
    pool.count_ahead(100)
    with pytest.raises(PeerError) as exc:
        pool.count_ahead(1)
    assert exc.value.code == "ahead-full"


def test_kept_bodies_are_redacted_and_stored_once_they_add_up(st: Store, monkeypatch) -> None:
    monkeypatch.setattr(body_pool, "STORE_AHEAD_BYTES", 100)
    pool = BodyPool(st, Limits())
    secret = "password = 'Zq8vN2mL" + "p4Rt7Ws1'\n"
    plain, redacted = body("a" * 90), body(secret)
    pool.keep(dict([plain]))
    assert st.counts()["blobs"] == 0 and pool.pool[plain[0]][0] == plain[1]  # held, under 100
    pool.keep(dict([redacted]))
    assert st.counts()["blobs"] == 2  # stored together once they passed 100 bytes
    assert pool.pool[plain[0]][0] is None and pool.unstored == []
    _, counts, _, stored_as = pool.pool[redacted[0]]
    assert counts and stored_as != redacted[0]  # stored redacted, under its own address
    files = pool.incoming([("a.md", plain[0], 90, 0), ("b.md", "c" * 64, 5, 0)])
    assert files[0].redactions == {} and files[0].text is None
    assert files[1].text is None and files[1].redactions is None  # the store may have it


def test_the_bodies_a_commit_listed_leave_at_the_next_settle(st: Store) -> None:
    pool = BodyPool(st, Limits(file_bytes=10))
    kept, refused = body("kept"), body("x" * 11)
    pool.keep(dict([kept]))
    assert not pool.admit(*refused, ahead=True)
    pool.listed({kept[0], refused[0]})
    assert kept[0] in pool and refused[0] in pool  # until the next message that reads them
    pool.settle()
    assert kept[0] not in pool and refused[0] not in pool and pool.unstored == []
