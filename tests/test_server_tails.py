"""Tests for sharedmem.server.tails: a stored body and a tail joined (protocol version 3).

Over a real `serve` (`Session._on_tails` takes the joined text as a body sent ahead) and store.
tests/test_client_tails.py has the client's choice of a tail and whole syncs; test_send_ahead.py
the sender.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import LOG_BASE, LOG_TAIL, enc, exported, talk

from sharedmem.hashing import digest_of, sha256_text
from sharedmem.protocol import encode_raw_texts
from sharedmem.server.store import Store

HELLO = {"type": "hello", "versions": [3], "machine": "laptop"}
SECRET = "password = 'Zq8vN2mL" + "p4Rt7Ws1'\n"


def publish(files: list[tuple[str, str]], bodies: bool = True) -> list[bytes]:
    """A manifest of `files` in the markdown source `notes`, then its bodies and commit.

    Version 3: a manifest that needs nothing commits at once, so `bodies=False` sends the
    manifest alone; bodies are the texts alone.
    """
    entries = [[p, sha256_text(t), len(t.encode()), 0] for p, t in files]
    lines = [enc({"type": "manifest", "source": "notes", "kind": "markdown",
                  "digest": digest_of((e[0], e[1]) for e in entries), "files": entries})]
    if bodies:
        lines.append(encode_raw_texts([t.encode() for _, t in files], "notes"))
        lines.append(enc({"type": "commit", "source": "notes"}))
    return lines


def tails(*pairs: tuple[str, str]) -> bytes:
    return enc({"type": "tails", "tails": [list(p) for p in pairs]})


def test_a_tail_against_a_stored_body_is_joined_and_the_manifest_needs_nothing(
        tmp_path: Path) -> None:
    store = tmp_path / "store.sqlite3"
    first = talk(store, [enc(HELLO), *publish([("log.md", LOG_BASE)])])
    assert first[-1]["type"] == "result" and first[-1]["accepted"] == 1
    replies = talk(store, [enc(HELLO), tails((sha256_text(LOG_BASE), LOG_TAIL)),
                           *publish([("log.md", LOG_BASE + LOG_TAIL)], bodies=False)])
    assert [r["type"] for r in replies] == ["hello", "result"], replies  # no need, no commit
    assert replies[1]["accepted"] == 1
    with Store.open(store) as st:
        assert exported(st) == {"machines/laptop/notes/log.md": LOG_BASE + LOG_TAIL}


def test_a_joined_text_is_redacted_as_a_whole(tmp_path: Path) -> None:
    # A credential the tail completes: the joined text is redacted, as the whole body would be.
    store = tmp_path / "store.sqlite3"
    base = LOG_BASE + "password = 'Zq8vN2mL"
    talk(store, [enc(HELLO), *publish([("log.md", base)])])
    replies = talk(store, [enc(HELLO), tails((sha256_text(base), "p4Rt7Ws1'\n")),
                           *publish([("log.md", base + "p4Rt7Ws1'\n")], bodies=False)])
    assert [r["type"] for r in replies] == ["hello", "result"] and replies[1]["redacted"], replies
    with Store.open(store) as st:
        text = exported(st)["machines/laptop/notes/log.md"]
    assert "p4Rt7Ws1" not in text and "[REDACTED:" in text


@pytest.mark.parametrize("base", ["never stored", "stored redacted", "forgotten"])
def test_a_base_the_store_lacks_is_dropped_and_need_asks_for_the_whole_body(
        tmp_path: Path, base: str) -> None:
    store = tmp_path / "store.sqlite3"
    old = LOG_BASE + SECRET if base == "stored redacted" else LOG_BASE
    if base != "never stored":
        talk(store, [enc(HELLO), *publish([("log.md", old)])])
    if base == "forgotten":
        with Store.open(store) as st:
            st.forget("laptop", "notes")
    new = old + LOG_TAIL
    replies = talk(store, [enc(HELLO), tails((sha256_text(old), LOG_TAIL)),
                           *publish([("log.md", new)])])
    assert [r["type"] for r in replies] == ["hello", "need", "result"], replies
    assert replies[1]["index"] == [0]  # the tail was not taken: the whole body is needed
    assert replies[2]["accepted"] == 1 and replies[2]["refused"] == []
    with Store.open(store) as st:
        text = exported(st)["machines/laptop/notes/log.md"]
    assert text == new if base != "stored redacted" else (
        text.startswith(LOG_BASE) and text.endswith(LOG_TAIL) and "p4Rt7Ws1" not in text)


def test_a_tail_that_would_pass_the_file_limit_is_refused_as_too_large(tmp_path: Path) -> None:
    store = tmp_path / "store.sqlite3"
    limit = len(LOG_BASE.encode()) + 100
    talk(store, [enc(HELLO), *publish([("log.md", LOG_BASE)])], "--limit", f"file_bytes={limit}")
    grown = LOG_BASE + "x" * 200 + "\n"
    replies = talk(store, [enc(HELLO), tails((sha256_text(LOG_BASE), grown[len(LOG_BASE):])),
                           *publish([("log.md", grown)], bodies=False)],
                   "--limit", f"file_bytes={limit}")
    # Refused at once, as a body over the limit is: nothing is needed, the manifest commits.
    assert [r["type"] for r in replies] == ["hello", "result"], replies
    assert [r["reason"] for r in replies[1]["refused"]] == ["too-large"]
    with Store.open(store) as st:
        assert exported(st) == {}


def test_tails_count_their_joined_size_against_ahead_bytes(tmp_path: Path) -> None:
    store = tmp_path / "store.sqlite3"
    quota = "namespace_bytes=3000"  # the base is ~1,800 bytes: two joined texts pass 3,000
    talk(store, [enc(HELLO), *publish([("log.md", LOG_BASE)])], "--limit", quota)
    base = sha256_text(LOG_BASE)
    one = talk(store, [enc(HELLO), tails((base, "a\n"))], "--limit", quota)
    assert [r["type"] for r in one] == ["hello"]
    two = talk(store, [enc(HELLO), tails((base, "a\n"), (base, "b\n"))], "--limit", quota)
    assert two[-1]["type"] == "error" and two[-1]["code"] == "ahead-full", two
    # Bases the store lacks cost their address: no entry is free, even with an empty tail.
    lacking = talk(store, [enc(HELLO), tails(*[(f"{i:064x}", "") for i in range(50)])],
                   "--limit", quota)
    assert lacking[-1]["type"] == "error" and lacking[-1]["code"] == "ahead-full", lacking


@pytest.mark.parametrize("entry", [["nothex", "x"], ["a" * 64], ["a" * 64, 5], "x"])
def test_malformed_tails_end_the_session(tmp_path: Path, entry: object) -> None:
    replies = talk(tmp_path / "store.sqlite3", [enc(HELLO),
                                                enc({"type": "tails", "tails": [entry]})])
    assert replies[-1]["type"] == "error" and replies[-1]["code"] == "bad-field", replies


def test_a_forged_tail_on_another_machines_body_stores_nothing_unlisted(tmp_path: Path) -> None:
    # desktop's body as a base, a tail the laptop never lists: nothing is kept of the joined
    # text, and the laptop learns nothing (no reply names it). See docs/THREAT-MODEL.md.
    store = tmp_path / "store.sqlite3"
    theirs = LOG_BASE + "desktop's own line\n"
    talk(store, [enc({**HELLO, "machine": "desktop"}), *publish([("log.md", theirs)])])
    with Store.open(store) as st:
        before = st.counts()["blobs"]
    replies = talk(store, [enc(HELLO), tails((sha256_text(theirs), LOG_TAIL)),
                           *publish([("mine.md", "# mine\n")]), enc({"type": "status"})])
    assert [r["type"] for r in replies] == ["hello", "need", "result", "status"], replies
    with Store.open(store) as st:
        assert st.counts()["blobs"] == before + 1  # mine.md only
        assert sha256_text(theirs + LOG_TAIL) in st.need([sha256_text(theirs + LOG_TAIL)])


