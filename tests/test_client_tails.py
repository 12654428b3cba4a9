"""Tests for sharedmem.client.tails: whether a file only grew, and where; then whole syncs.

A file that only grew since the version the server acknowledged is sent as its new tail
(protocol version 3); the server's side is in test_server_tails.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import LOG_BASE, LOG_TAIL, cache_files, config_for, exported, make_memories, sync_json

from sharedmem.client.tails import MIN_BYTES, grown_from
from sharedmem.hashing import sha256_text
from sharedmem.server.store import Store


def record(text: str) -> list:
    """A saved source record for a file published as `text`."""
    data = text.encode()
    return [len(data), 0, sha256_text(text), len(data), {}]


# --- the client's choice ------------------------------------------------------------------------

def test_an_append_to_the_acknowledged_version_is_a_tail() -> None:
    data = (LOG_BASE + LOG_TAIL).encode()
    assert grown_from(record(LOG_BASE), data, {sha256_text(LOG_BASE)}) == (
        sha256_text(LOG_BASE), len(LOG_BASE.encode()))


@pytest.mark.parametrize("case", ["edited", "not acked", "small", "tail too long", "same",
                                  "shorter", "no record", "damaged record"])
def test_anything_else_goes_whole(case: str) -> None:
    base, new, acked = LOG_BASE, LOG_BASE + LOG_TAIL, {sha256_text(LOG_BASE)}
    rec: object = record(base)
    if case == "edited":
        new = "#" + LOG_BASE + LOG_TAIL
    elif case == "not acked":
        acked = set()
    elif case == "small":
        base = LOG_BASE[:MIN_BYTES // 2]
        new, rec, acked = base + LOG_TAIL, record(base), {sha256_text(base)}
    elif case == "tail too long":
        new = LOG_BASE + LOG_BASE
    elif case == "same":
        new = LOG_BASE
    elif case == "shorter":
        new = LOG_BASE[:-10]
    elif case == "no record":
        rec = None
    else:
        rec = [1, 2, sha256_text(LOG_BASE), "1800", {}]
    assert grown_from(rec, new.encode(), acked) is None


def test_a_tail_may_start_inside_what_looks_like_one_character() -> None:
    # The base ends on a whole character, so the tail starts on one: both are valid UTF-8.
    base = LOG_BASE + "café "
    grown = grown_from(record(base), (base + "naïve\n").encode(), {sha256_text(base)})
    assert grown is not None
    assert (base + "naïve\n").encode()[grown[1]:].decode() == "naïve\n"


# --- whole syncs --------------------------------------------------------------------------------

def test_a_sync_sends_only_what_was_appended_and_the_store_holds_the_whole(
        tmp_path: Path) -> None:
    home = tmp_path / "laptop-home"
    notes = make_memories(home, files=4)
    log = notes / "log.md"
    text = "# log\n\n" + "".join(f"- {i}: a line of what happened that day\n"
                                 for i in range(500))  # ~20 KB
    log.write_text(text, encoding="utf-8")
    store = tmp_path / "server" / "store.sqlite3"
    cfg = config_for(tmp_path, home, "laptop", {"kind": "local", "store": str(store)})
    cache = tmp_path / "laptop" / "cache"
    key = "machines/laptop/notes/log.md"

    def synced(expected: str, *extra: str) -> int:
        log.write_text(expected, encoding="utf-8")
        code, report = sync_json(cfg, *extra)
        assert code == 0, report
        assert cache_files(cache)[key] == expected
        with Store.open(store) as st:
            assert exported(st)[key] == expected
        return report["bytes"]["sent"]

    synced(text)
    text += "- 500: appended\n"
    assert synced(text) < 4000  # the tail, the manifest and the pull; not the 20 KB
    text = "# Log\n" + text[6:] + "- 501: an edit, then an append\n"
    assert synced(text) > 20_000  # not an append: the whole body
    text += "- 502: appended to a version 2 server\n"
    assert synced(text, "--max-protocol", "2") > 20_000  # it takes no tails: the whole body
    with Store.open(store) as st:  # the server no longer holds what the client acknowledged
        st.forget("laptop", "notes")
    text += "- 503: appended after a forget\n"
    assert synced(text) > 20_000  # the tail is dropped: need asks for the whole
