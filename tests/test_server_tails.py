"""Tail deltas (protocol version 3): a file that only grew sends its new tail.

The client's choice (`client/tails.py`), the server joining a stored body and a tail
(`server/tails.py`, `Session._on_tails`) over a real `serve`, the sender (`Ahead.offer_tail`)
against a recording server, and whole syncs against a real store.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from conftest import cache_files, config_for, enc, exported, make_memories, sync_json, talk, write_config

from sharedmem.client import config as config_mod
from sharedmem.client.send_ahead import TAIL_BATCH, Ahead
from sharedmem.client.tails import MIN_BYTES, grown_from
from sharedmem.client.transport import Connection
from sharedmem.hashing import digest_of, sha256_text
from sharedmem.protocol import encode_raw_texts
from sharedmem.server.store import Store

HELLO = {"type": "hello", "versions": [3], "machine": "laptop"}
BASE = "# log\n\n" + "".join(f"- line {i}: what happened then\n" for i in range(60))  # ~1.8 KB
TAIL = "- line 60: and then this\n"
SECRET = "password = 'Zq8vN2mL" + "p4Rt7Ws1'\n"


def record(text: str) -> list:
    """A saved source record for a file published as `text`."""
    data = text.encode()
    return [len(data), 0, sha256_text(text), len(data), {}]


# --- the client's choice ------------------------------------------------------------------------

def test_an_append_to_the_acknowledged_version_is_a_tail() -> None:
    data = (BASE + TAIL).encode()
    assert grown_from(record(BASE), data, {sha256_text(BASE)}) == (
        sha256_text(BASE), len(BASE.encode()))


@pytest.mark.parametrize("case", ["edited", "not acked", "small", "tail too long", "same",
                                  "shorter", "no record", "damaged record"])
def test_anything_else_goes_whole(case: str) -> None:
    base, new, acked = BASE, BASE + TAIL, {sha256_text(BASE)}
    rec: object = record(base)
    if case == "edited":
        new = "#" + BASE + TAIL
    elif case == "not acked":
        acked = set()
    elif case == "small":
        base = BASE[:MIN_BYTES // 2]
        new, rec, acked = base + TAIL, record(base), {sha256_text(base)}
    elif case == "tail too long":
        new = BASE + BASE
    elif case == "same":
        new = BASE
    elif case == "shorter":
        new = BASE[:-10]
    elif case == "no record":
        rec = None
    else:
        rec = [1, 2, sha256_text(BASE), "1800", {}]
    assert grown_from(rec, new.encode(), acked) is None


def test_a_tail_may_start_inside_what_looks_like_one_character() -> None:
    # The base ends on a whole character, so the tail starts on one: both are valid UTF-8.
    base = BASE + "café "
    grown = grown_from(record(base), (base + "naïve\n").encode(), {sha256_text(base)})
    assert grown is not None
    assert (base + "naïve\n").encode()[grown[1]:].decode() == "naïve\n"


# --- the server joins them ----------------------------------------------------------------------

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
    first = talk(store, [enc(HELLO), *publish([("log.md", BASE)])])
    assert first[-1]["type"] == "result" and first[-1]["accepted"] == 1
    replies = talk(store, [enc(HELLO), tails((sha256_text(BASE), TAIL)),
                           *publish([("log.md", BASE + TAIL)], bodies=False)])
    assert [r["type"] for r in replies] == ["hello", "result"], replies  # no need, no commit
    assert replies[1]["accepted"] == 1
    with Store.open(store) as st:
        assert exported(st) == {"machines/laptop/notes/log.md": BASE + TAIL}


def test_a_joined_text_is_redacted_as_a_whole(tmp_path: Path) -> None:
    # A credential the tail completes: the joined text is redacted, as the whole body would be.
    store = tmp_path / "store.sqlite3"
    base = BASE + "password = 'Zq8vN2mL"
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
    old = BASE + SECRET if base == "stored redacted" else BASE
    if base != "never stored":
        talk(store, [enc(HELLO), *publish([("log.md", old)])])
    if base == "forgotten":
        with Store.open(store) as st:
            st.forget("laptop", "notes")
    new = old + TAIL
    replies = talk(store, [enc(HELLO), tails((sha256_text(old), TAIL)),
                           *publish([("log.md", new)])])
    assert [r["type"] for r in replies] == ["hello", "need", "result"], replies
    assert replies[1]["index"] == [0]  # the tail was not taken: the whole body is needed
    assert replies[2]["accepted"] == 1 and replies[2]["refused"] == []
    with Store.open(store) as st:
        text = exported(st)["machines/laptop/notes/log.md"]
    assert text == new if base != "stored redacted" else (
        text.startswith(BASE) and text.endswith(TAIL) and "p4Rt7Ws1" not in text)


def test_a_tail_that_would_pass_the_file_limit_is_refused_as_too_large(tmp_path: Path) -> None:
    store = tmp_path / "store.sqlite3"
    limit = len(BASE.encode()) + 100
    talk(store, [enc(HELLO), *publish([("log.md", BASE)])], "--limit", f"file_bytes={limit}")
    grown = BASE + "x" * 200 + "\n"
    replies = talk(store, [enc(HELLO), tails((sha256_text(BASE), grown[len(BASE):])),
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
    talk(store, [enc(HELLO), *publish([("log.md", BASE)])], "--limit", quota)
    base = sha256_text(BASE)
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
    theirs = BASE + "desktop's own line\n"
    talk(store, [enc({**HELLO, "machine": "desktop"}), *publish([("log.md", theirs)])])
    with Store.open(store) as st:
        before = st.counts()["blobs"]
    replies = talk(store, [enc(HELLO), tails((sha256_text(theirs), TAIL)),
                           *publish([("mine.md", "# mine\n")]), enc({"type": "status"})])
    assert [r["type"] for r in replies] == ["hello", "need", "result", "status"], replies
    with Store.open(store) as st:
        assert st.counts()["blobs"] == before + 1  # mine.md only
        assert sha256_text(theirs + TAIL) in st.need([sha256_text(theirs + TAIL)])


# --- the sender ---------------------------------------------------------------------------------

RECORDER = r'''
import json, sys, time
version, log, delay = int(sys.argv[1]), open(sys.argv[2], "w"), float(sys.argv[3])
hello = {"type": "hello", "version": version, "versions": [version], "server": "recorder",
         "ahead_bytes": 1 << 20}
for line in sys.stdin:
    m = json.loads(line)
    log.write(json.dumps([m["type"], m.get("bodies", m.get("tails", []))]) + "\n"); log.flush()
    if m["type"] == "hello":
        time.sleep(delay)
        sys.stdout.write(json.dumps(hello) + "\n"); sys.stdout.flush()
'''


@pytest.mark.parametrize("version", [3, 2])
@pytest.mark.parametrize("before_hello", [False, True])
def test_a_tail_goes_as_tails_to_version_3_and_whole_to_version_2(
        tmp_path: Path, sshd, version: int, before_hello: bool) -> None:
    script, log = tmp_path / "recorder.py", tmp_path / "log.jsonl"
    script.write_text(RECORDER)
    path = write_config(tmp_path / "client.json", "laptop", sshd.transport(
        pinned=False, remote_command=[sys.executable, str(script), str(version), str(log),
                                      "1" if before_hello else "0"]), [], tmp_path / "cache")
    data = (BASE + TAIL).encode()
    with Connection(config_mod.load(path, {"HOME": str(tmp_path)})) as conn:
        ahead = Ahead(conn)

        def walk() -> None:
            if not before_hello:
                deadline = time.monotonic() + 30
                while conn.early is None and time.monotonic() < deadline:
                    time.sleep(0.01)
            ahead.offer_tail(sha256_text(BASE + TAIL), sha256_text(BASE), data, len(BASE))
            ahead.finish()
            ahead.wait()

        with conn.handshake():
            walk()
        ahead.send_waiting()
        assert ahead.sent_bytes == len(data)  # the whole size, as the server counts it
        conn.channel.send({"type": "status"})
        deadline = time.monotonic() + 30
        while '"status"' not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.01)
    received = [json.loads(line) for line in log.read_text().splitlines()]
    assert [kind for kind, _ in received][:3] == [
        "hello", "tails" if version == 3 else "bodies", "status"]
    assert received[1][1] == ([[sha256_text(BASE), TAIL]] if version == 3
                              else [[sha256_text(BASE + TAIL), BASE + TAIL]])


def test_tails_go_in_batches_while_the_walk_goes_on(tmp_path: Path, sshd) -> None:
    """Once the hello has come, every TAIL_BATCH tails go at once: the server joins them then."""
    script, log = tmp_path / "recorder.py", tmp_path / "log.jsonl"
    script.write_text(RECORDER)
    path = write_config(tmp_path / "client.json", "laptop", sshd.transport(
        pinned=False, remote_command=[sys.executable, str(script), "3", str(log), "0"]),
        [], tmp_path / "cache")
    grown = [(BASE + f"- {i}: appended\n") for i in range(TAIL_BATCH + 3)]

    def logged() -> list:
        return [json.loads(line) for line in log.read_text().splitlines()]

    with Connection(config_mod.load(path, {"HOME": str(tmp_path)})) as conn:
        ahead = Ahead(conn)

        def walk() -> None:
            deadline = time.monotonic() + 30
            while conn.early is None and time.monotonic() < deadline:
                time.sleep(0.01)
            for text in grown:
                ahead.offer_tail(sha256_text(text), sha256_text(BASE), text.encode(), len(BASE))
            deadline = time.monotonic() + 30  # before `finish`: the walk is not over
            while len(logged()) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert [kind for kind, _ in logged()] == ["hello", "tails"]
            ahead.finish()
            ahead.wait()

        with conn.handshake():
            walk()
        conn.channel.send({"type": "status"})
        deadline = time.monotonic() + 30
        while '"status"' not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.01)
    received = logged()
    assert [kind for kind, _ in received][:4] == ["hello", "tails", "tails", "status"]
    assert [len(tails) for _, tails in received[1:3]] == [TAIL_BATCH, 3]
    assert [tail for _, batch in received[1:3] for _, tail in batch] == [
        text[len(BASE):] for text in grown]


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
