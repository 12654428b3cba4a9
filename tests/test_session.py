"""`serve` against a hostile client: raw lines on the real server's stdin, nothing stored."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import sqlite3
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from conftest import LAUNCHER, Sshd, collections_in, enc, exported, flat_release, run_cli, talk, write_config

from sharedmem.hashing import digest_of, sha256_bytes, sha256_text
from sharedmem.protocol import MAX_LINE_BYTES, Channel, encode_raw_texts
from sharedmem.rules import MIB, Limits
from sharedmem.server import body_pool
from sharedmem.server import session as server_module
from sharedmem.server.session import Session
from sharedmem.server.store import Store

HELLO = {"type": "hello", "versions": [1, 2], "machine": "laptop"}


def stored(store: Path) -> dict:
    with Store.open(store) as s:
        return {"files": s.counts()["files"], "notes": s.counts()["notes"]}


def manifest(source: str, kind: str, files: list[tuple[str, str]]) -> list[bytes]:
    entries = [[p, sha256_text(t), len(t.encode()), 0] for p, t in files]
    return [enc({"type": "manifest", "source": source, "kind": kind,
                 "digest": digest_of((e[0], e[1]) for e in entries), "files": entries}),
            enc({"type": "bodies", "source": source,
                 "bodies": [[sha256_text(t), t] for _, t in files]}),
            enc({"type": "commit", "source": source})]


BAD_SESSIONS = {
    "malformed json": [b"{not json\n"],
    "not an object": [b"[1, 2, 3]\n"],
    "no type": [enc({"versions": [2]})],
    "invalid utf-8": [b"\xff\xfe{}\n"],
    "unknown type first": [enc({"type": "gimme"})],
    "publish before hello": [enc({"type": "manifest", "source": "codex", "kind": "codex"})],
    "no shared version": [enc({"type": "hello", "versions": [7], "machine": "laptop"})],
    "bad machine name": [enc({"type": "hello", "versions": [2], "machine": "../etc"})],
    "unknown type after hello": [enc(HELLO), enc({"type": "drop_tables"})],
    "v1 message in v2": [enc(HELLO), enc({"type": "publish", "source": "codex", "kind": "codex"})],
    "commit out of order": [enc(HELLO), enc({"type": "commit", "source": "codex"})],
    "bodies in version 1": [enc({**HELLO, "versions": [1]}), enc({"type": "bodies", "bodies": []})],
    "bad bodies ahead": [enc(HELLO), enc({"type": "bodies", "bodies": [["abc"]]})],
    "kind mismatch": [enc(HELLO), enc({"type": "manifest", "source": "codex",
                                       "kind": "markdown", "digest": "x", "files": []})],
    "bad manifest entry": [enc(HELLO), enc({"type": "manifest", "source": "notes",
                                            "kind": "markdown", "digest": "x",
                                            "files": [["a.md", 5, 1, 0]]})],
    "oversized line": [enc(HELLO), b'{"type":"note","text":"' + b"x" * (MAX_LINE_BYTES + 10)
                       + b'"}\n'],
}


@pytest.mark.parametrize("name", sorted(BAD_SESSIONS))
def test_hostile_client_is_refused(tmp_path, name):
    store = tmp_path / "store.sqlite3"
    replies = talk(store, BAD_SESSIONS[name] + manifest("notes", "markdown",
                                                        [("after.md", "must not land")]))
    assert replies, "the server must answer with an error"
    assert replies[-1]["type"] == "error", replies
    assert replies[-1]["code"] in {"bad-json", "out-of-order", "unknown-type", "version",
                                   "bad-field", "line-too-long"}
    assert replies[-1]["message"]
    if store.exists():
        assert stored(store) == {"files": 0, "notes": 0}


def test_rule_breaking_paths_are_refused_and_not_stored(tmp_path):
    store = tmp_path / "store.sqlite3"
    files = [("MEMORY.md", "ok"), ("raw_memories.md", "raw"), ("../escape.md", "x"),
             ("/abs.md", "x"), ("skills/s.md", "x"), ("CON.md", "x"), ("a\\b.md", "x"),
             ("rollout_summaries/deep/x.md", "x")]
    replies = talk(store, [enc(HELLO)] + manifest("codex", "codex", files) + [enc({"type": "bye"})])
    result = replies[-1]
    assert result["type"] == "result" and result["accepted"] == 1
    refused = {r["path"] for r in result["refused"]}
    assert refused == {p for p, _ in files} - {"MEMORY.md"}
    with Store.open(store) as s:
        assert list(s.manifest()) == ["machines/laptop/codex/MEMORY.md"]


def test_pinned_machine_mismatch_writes_nothing(tmp_path):
    store = tmp_path / "store.sqlite3"
    replies = talk(store, [enc({**HELLO, "machine": "desktop"})]
                   + manifest("notes", "markdown", [("a.md", "x")]), "--machine", "laptop")
    assert replies == [replies[0]] and replies[0]["code"] == "machine-mismatch"
    assert "pinned to machine 'laptop'" in replies[0]["message"]
    assert not store.exists() or stored(store)["files"] == 0


def test_disconnect_mid_namespace_leaves_nothing_partial(tmp_path):
    store = tmp_path / "store.sqlite3"
    first = manifest("notes", "markdown", [("a.md", "one"), ("b.md", "two")])
    talk(store, [enc(HELLO)] + first + [enc({"type": "bye"})])
    second = manifest("notes", "markdown", [("a.md", "ONE"), ("c.md", "three")])
    talk(store, [enc(HELLO)] + second[:2])
    with Store.open(store) as s:
        assert sorted(s.manifest()) == ["machines/laptop/notes/a.md", "machines/laptop/notes/b.md"]
        assert s.verify() == []


def test_body_with_wrong_hash_is_not_stored(tmp_path):
    store = tmp_path / "store.sqlite3"
    sha = sha256_text("real")
    lines = [enc(HELLO), enc({"type": "manifest", "source": "notes", "kind": "markdown",
                              "digest": digest_of([("a.md", sha)]),
                              "files": [["a.md", sha, 4, 0]]}),
             enc({"type": "bodies", "bodies": [[sha, "forged"]]}),
             enc({"type": "commit"})]
    result = talk(store, lines)[-1]
    assert result["accepted"] == 0 and result["refused"][0]["reason"] == "missing-body"


def test_v1_publish_and_export(tmp_path):
    store = tmp_path / "store.sqlite3"
    lines = [enc({**HELLO, "versions": [1]}),
             enc({"type": "publish", "source": "notes", "kind": "markdown"}),
             enc({"type": "files", "files": [{"path": "x.md", "text": "hello", "mtime_ns": 1}]}),
             enc({"type": "commit"}), enc({"type": "export"}), enc({"type": "bye"})]
    replies = talk(store, lines)
    assert replies[0]["version"] == 1
    assert replies[1]["type"] == "result" and replies[1]["accepted"] == 1
    files = [f for r in replies if r["type"] == "files" for f in r["files"]]
    assert files == [["machines/laptop/notes/x.md", sha256_text("hello"), "hello"]]
    assert replies[-1]["type"] == "end"


def test_a_line_with_a_lone_surrogate_is_refused_where_it_is_decoded(tmp_path):
    # A lone surrogate has no UTF-8 form: the line carrying one is refused whole, as not JSON
    # in UTF-8, before any handler reads it (here a version 1 text; any field alike).
    store = tmp_path / "store.sqlite3"
    lines = [enc({**HELLO, "versions": [1]}),
             enc({"type": "publish", "source": "notes", "kind": "markdown"}),
             b'{"type": "files", "files": [{"path": "bad.md", "text": "a\\ud800b"}, '
             b'{"path": "good.md", "text": "fine", "mtime_ns": 7}]}\n',
             enc({"type": "commit"})]
    failure = talk(store, lines)[-1]
    assert failure["type"] == "error" and failure["code"] == "bad-json"
    assert "lone surrogate (U+D800)" in failure["message"]
    assert stored(store) == {"files": 0, "notes": 0}
    pair = enc({**HELLO, "versions": [1]}) + b'{"type": "status", "x": "\\ud83d\\ude00"}\n'
    assert talk(store, [pair])[-1]["type"] == "status"  # a surrogate pair is one character


def test_a_session_pauses_the_cycle_collector_and_restores_it(tmp_path):
    # A manifest of thousands of entries is thousands of lists: with the collector on, its
    # parse alone runs several collections, each walking everything the session holds.
    texts = {f"{i:04d}.md": f"text {i}" for i in range(3000)}
    entries = [[p, sha256_text(t), len(t.encode()), 0] for p, t in texts.items()]
    lines = [enc(HELLO3), raw(list(texts.values())),
             enc({"type": "manifest", "source": "notes", "kind": "markdown",
                  "digest": digest_of((e[0], e[1]) for e in entries), "files": entries}),
             enc({"type": "bye"})]
    out = io.BytesIO()
    session = Session(tmp_path / "store.sqlite3", Channel(io.BytesIO(b"".join(lines)), out,
                                                          "client"), None)
    assert collections_in(session.run) == (0, [])
    result = [json.loads(line) for line in out.getvalue().splitlines()][-1]
    assert result["type"] == "result" and result["accepted"] == 3000


def ahead(texts: list[str]) -> bytes:
    return enc({"type": "bodies", "bodies": [[sha256_text(t), t] for t in texts]})


def test_bodies_sent_ahead_are_not_asked_for_again(tmp_path):
    store = tmp_path / "store.sqlite3"
    value = "Zq8vN2mL" + "p4Rt7Ws1"  # built from pieces: the release check scans for tokens
    secret = "token = '" + value + "'"
    early, late, forged = "sent early", secret, "named in need"
    entries = [[p, sha256_text(t), len(t.encode()), 0]
               for p, t in (("a.md", early), ("b.md", late), ("c.md", forged))]
    lines = [enc(HELLO), ahead([early, late]),
             enc({"type": "bodies", "bodies": [[sha256_text(forged), "forged"]]}),
             enc({"type": "manifest", "source": "notes", "kind": "markdown",
                  "digest": digest_of((e[0], e[1]) for e in entries), "files": entries}),
             ahead([forged]), enc({"type": "commit"}), enc({"type": "bye"})]
    hello, need, result = talk(store, lines)
    assert hello["ahead_bytes"] > 0
    assert need["sha256"] == [sha256_text(forged)]  # the forged body was dropped, not kept
    assert result["accepted"] == 3 and result["redacted"] == {"generic-secret": 1}
    with Store.open(store) as s:
        texts = {p: t for p, _, t in s.export()}
    assert texts["machines/laptop/notes/a.md"] == early
    assert value not in texts["machines/laptop/notes/b.md"]


def test_version_1_hello_offers_no_bodies_ahead(tmp_path):
    hello = talk(tmp_path / "store.sqlite3", [enc({**HELLO, "versions": [1]})])[0]
    assert hello["version"] == 1 and "ahead_bytes" not in hello


def test_a_version_3_hello_that_offers_zlib_compresses_both_ways(tmp_path):
    """A real `serve`: after the hello lines, both streams are zlib; the hellos are plain."""
    deflate = zlib.compressobj()
    rest = deflate.compress(enc({"type": "status"}) + enc({"type": "bye"}))
    rest += deflate.flush(zlib.Z_SYNC_FLUSH)
    hello = enc({**HELLO, "versions": [1, 2, 3], "compress": ["br", "zlib"]})
    proc = subprocess.run([sys.executable, str(LAUNCHER), "serve", "--store",
                           str(tmp_path / "store.sqlite3")], input=hello + rest,
                          capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    first, _, after = proc.stdout.partition(b"\n")
    assert json.loads(first)["compress"] == "zlib"
    status = json.loads(zlib.decompressobj().decompress(after))
    assert status["type"] == "status"


@pytest.mark.parametrize(("versions", "args"), [([1, 2, 3], ["--max-protocol", "2"]),
                                                ([1, 2], [])])
def test_compression_is_only_answered_in_version_3(tmp_path, versions, args):
    replies = talk(tmp_path / "store.sqlite3", [enc({**HELLO, "versions": versions,
                                                     "compress": ["zlib"]}),
                                                enc({"type": "status"})], *args)
    assert replies[0]["version"] == 2 and "compress" not in replies[0]
    assert replies[1]["type"] == "status"  # plain, as before


def test_a_compress_offer_that_is_not_a_list_of_names_is_refused(tmp_path):
    replies = talk(tmp_path / "store.sqlite3",
                   [enc({**HELLO, "versions": [3], "compress": "zlib"})])
    assert replies[-1]["code"] == "bad-field" and "hello.compress" in replies[-1]["message"]


def test_bodies_ahead_past_the_limit_end_the_session_and_store_nothing(tmp_path):
    store = tmp_path / "store.sqlite3"
    texts = [f"file {i} " + "x" * 400 for i in range(4)]
    entries = [[f"{i}.md", sha256_text(t), len(t.encode()), 0] for i, t in enumerate(texts)]
    lines = [enc(HELLO), ahead(texts[:2]), ahead(texts[2:]),
             enc({"type": "manifest", "source": "notes", "kind": "markdown",
                  "digest": digest_of((e[0], e[1]) for e in entries), "files": entries}),
             enc({"type": "commit"})]
    out = io.BytesIO()
    session = Session(store, Channel(io.BytesIO(b"".join(lines)), out, "client"), None,
                      limits=Limits(namespace_bytes=1000))
    assert session.run() == 1
    hello, failure = [json.loads(line) for line in out.getvalue().splitlines()]
    assert hello["ahead_bytes"] == 1000
    assert failure["code"] == "ahead-full" and "1000 bytes" in failure["message"]
    assert stored(store) == {"files": 0, "notes": 0}


def test_a_pull_leaves_out_what_the_client_just_published_at_that_digest(tmp_path):
    store = tmp_path / "store.sqlite3"
    talk(store, [enc({**HELLO, "machine": "desktop"})]
         + manifest("notes", "markdown", [("d.md", "desktop's")]) + [enc({"type": "bye"})])
    mine = [("a.md", "one"), ("b.md", "two")]
    digest = digest_of((p, sha256_text(t)) for p, t in mine)
    replies = talk(store, [enc(HELLO)] + manifest("notes", "markdown", mine) + [
        enc({"type": "pull", "known": {}, "published": {
            "machines/laptop/notes": digest, "machines/desktop/notes": "any"}}),
        enc({"type": "pull", "known": {}, "published": {"machines/laptop/notes": "stale"}}),
        enc({"type": "bye"})])
    heads, files = [], []
    for reply in replies:
        if reply["type"] == "namespaces":
            heads.append(reply)
            files.append([])
        elif reply["type"] == "files":
            files[-1] += [f[0] for f in reply["files"]]
    assert heads[0]["skipped"] == ["machines/laptop/notes"]  # never another machine's
    assert files[0] == ["machines/desktop/notes/d.md"]
    assert heads[1]["skipped"] == []
    assert files[1] == ["machines/desktop/notes/d.md", "machines/laptop/notes/a.md",
                        "machines/laptop/notes/b.md"]


def test_a_pull_with_a_malformed_published_map_is_refused(tmp_path):
    replies = talk(tmp_path / "store.sqlite3", [
        enc(HELLO), enc({"type": "pull", "known": {}, "published": {"machines/laptop/x": 1}})])
    assert replies[-1]["type"] == "error" and replies[-1]["code"] == "bad-field"
    assert "pull.published" in replies[-1]["message"]


def blob_count(store: Path) -> int:
    with Store.open(store) as s:
        return s.counts()["blobs"]


@pytest.mark.parametrize("batch", [1, 1 << 20])  # stored as they come; left to the commit
def test_bodies_sent_ahead_are_stored_and_dropped_if_no_file_uses_them(tmp_path, monkeypatch,
                                                                       batch):
    monkeypatch.setattr(body_pool, "STORE_AHEAD_BYTES", batch)
    store = tmp_path / "store.sqlite3"
    past_a_batch = [f"{i} " + "w" * 900_000 for i in range(5)]  # stored by the real serve
    talk(store, [enc(HELLO), ahead(past_a_batch), ahead(["never listed", "nor this"]),
                 enc({"type": "status"})])  # then the client is gone
    assert blob_count(store) == 0
    texts = ["listed " + "y" * 600, "too big " + "z" * 2000, "never listed"]
    entries = [[f"{i}.md", sha256_text(t), len(t.encode()), 0] for i, t in enumerate(texts[:2])]
    lines = [enc(HELLO), ahead(texts),
             enc({"type": "manifest", "source": "notes", "kind": "markdown",
                  "digest": digest_of((e[0], e[1]) for e in entries), "files": entries}),
             enc({"type": "commit"}), enc({"type": "bye"})]
    out = io.BytesIO()
    session = Session(store, Channel(io.BytesIO(b"".join(lines)), out, "client"), None,
                      limits=Limits(file_bytes=1000))
    assert session.run() == 0
    result = [json.loads(line) for line in out.getvalue().splitlines()][-1]
    assert result["accepted"] == 1 and result["refused"][0]["reason"] == "too-large"
    with Store.open(store) as s:
        assert s.counts()["blobs"] == 1 and s.verify() == []
        assert exported(s) == {"machines/laptop/notes/0.md": texts[0]}


def test_bodies_ahead_serve_every_manifest_of_the_session(tmp_path):
    store = tmp_path / "store.sqlite3"
    first, second = ["one " + "a" * 300, "shared " + "b" * 300], ["shared " + "b" * 300, "two"]

    def listing(source: str, texts: list[str]) -> bytes:
        entries = [[f"{i}.md", sha256_text(t), len(t.encode()), 0] for i, t in enumerate(texts)]
        return enc({"type": "manifest", "source": source, "kind": "markdown",
                    "digest": digest_of((e[0], e[1]) for e in entries), "files": entries})

    replies = talk(store, [enc(HELLO), ahead(first + second[1:]),
                           listing("alpha", first), enc({"type": "commit"}),
                           listing("beta", second), enc({"type": "commit"}), enc({"type": "bye"})])
    needs = [r["sha256"] for r in replies if r["type"] == "need"]
    results = [r for r in replies if r["type"] == "result"]
    assert needs == [[], []]  # the body both list was sent once, ahead of both
    assert [r["accepted"] for r in results] == [2, 2]
    with Store.open(store) as s:
        assert s.counts()["blobs"] == 3 and s.verify() == []
        assert exported(s)["machines/laptop/beta/0.md"] == second[0]


# What each protocol version accepts after hello, pinned here apart from the session's table.
ACCEPTED = {1: {"publish", "note", "export", "verify", "status"},
            2: {"manifest", "bodies", "note", "pull", "verify", "status", "history", "show"}}
ACCEPTED[3] = ACCEPTED[2] | {"tails"}
EVERY_TYPE = sorted(ACCEPTED[1] | ACCEPTED[3] | {"files", "commit", "hello", "gimme"})


def test_the_session_table_has_a_row_for_each_protocol_version() -> None:
    from sharedmem.protocol import VERSIONS
    assert {v: set(row.handlers) for v, row in server_module.HANDLERS.items()} == {
        v: ACCEPTED[v] for v in VERSIONS}
    assert all(row.number == v for v, row in server_module.HANDLERS.items())


@pytest.mark.parametrize("version", [1, 2, 3])
def test_each_version_takes_its_own_message_types_and_refuses_the_rest(tmp_path: Path,
                                                                       version: int) -> None:
    for kind in EVERY_TYPE:
        out = io.BytesIO()
        lines = [enc({**HELLO, "versions": [version]}), enc({"type": kind})]
        Session(tmp_path / "store.sqlite3", Channel(io.BytesIO(b"".join(lines)), out, "client"),
                None).run()
        replies = [json.loads(line) for line in out.getvalue().splitlines()][1:]
        if kind in ACCEPTED[version]:
            assert all(r.get("code") not in {"out-of-order", "unknown-type"} for r in replies), kind
        else:
            code = "out-of-order" if kind in {"files", "bodies", "commit"} else "unknown-type"
            assert replies == [{"type": "error", "code": code, "message": f"message type {kind!r} "
                                f"is not allowed here in protocol version {version}"}], kind


@pytest.mark.parametrize("secret", ["", "password = 'Zq8vN2mL" + "p4Rt7Ws1'\n"])
def test_bodies_ahead_that_no_manifest_lists_are_stored_not_held(tmp_path: Path, monkeypatch,
                                                                  secret: str) -> None:
    # Bodies ahead in rounds below a batch, between manifests that list none of them: the
    # session must store them as they add up, not keep them all as text; bodies redaction
    # changes too (stored as redacted).
    monkeypatch.setattr(body_pool, "STORE_AHEAD_BYTES", 100_000)
    lines = [enc(HELLO)]
    for round_ in range(6):
        lines.append(ahead([f"{secret}round {round_} body {i} " + "r" * 30_000
                            for i in range(3)]))
        lines += manifest(f"s{round_}", "markdown", [("a.md", f"listed {round_}")])
    session = Session(tmp_path / "store.sqlite3",
                      Channel(io.BytesIO(b"".join(lines)), io.BytesIO(), "client"), None)
    assert session.run() == 0
    held = sum(len(body[0]) for body in session.bodies.pool.values() if body[0] is not None)
    assert held < 100_000
    assert blob_count(tmp_path / "store.sqlite3") == 6  # the listed ones; the rest dropped


class _Reader(io.RawIOBase):
    """What a client reads of a pull: each `files` message's (path, sha256), texts dropped.

    `on_first` runs once the first `files` message is written, while the pull goes on.
    """

    def __init__(self, on_first: Callable[[], None] | None) -> None:
        self.files: list[tuple[str, str]] = []
        self.on_first = on_first
        self.pending = b""

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self.pending += bytes(data)
        *lines, self.pending = self.pending.split(b"\n")
        for line in lines:
            if line.startswith(b'{"type":"files"'):
                self.files += [(p.decode(), s.decode()) for p, s in _FILE_ROW.findall(line)]
                if self.on_first is not None:
                    self.on_first, run = None, self.on_first
                    run()
        return len(data)


_FILE_ROW = re.compile(rb'\["([^"]+)","([0-9a-f]{64})"')


@pytest.mark.parametrize("version", [2, 1])
def test_a_pull_streams_the_store_in_bounded_memory_as_one_snapshot(tmp_path: Path,
                                                                     version: int) -> None:
    # Two namespaces of 25 MiB: the pull is sent as the store's cursor gives it, never held
    # whole, and a commit while it goes out changes nothing in it: the files sent are those of
    # the generations it announced. The memory bound is a guard, not a speed target: every
    # client's pull of a store of any size runs in serve at once.
    import tracemalloc

    from sharedmem.protocol import CHUNK_BYTES
    from sharedmem.server.ingest import IncomingFile, ingest
    store = tmp_path / "store.sqlite3"
    texts = {f"{i:03d}.md": f"{i:03d} " + "x" * (128 << 10) for i in range(200)}
    with Store.open(store) as st:
        st.put_blobs([(sha256_text(t), len(t), t.encode()) for t in texts.values()])
        for source in ("a", "b"):
            ingest(st, "desktop", source, "markdown",
                   [IncomingFile(p, sha256_text(t), len(t), 0, None, {}) for p, t in texts.items()])

    def commit_meanwhile() -> None:  # another machine's sync, while the pull goes out
        with Store.open(store) as other:
            ingest(other, "desktop", "b", "markdown",
                   [IncomingFile(p, sha256_text("new"), 3, 0, "new") for p in texts])

    reader = _Reader(commit_meanwhile)
    request = {"type": "pull", "known": {}} if version == 2 else {"type": "export"}
    session = Session(store, Channel(io.BytesIO(enc({**HELLO, "versions": [version]})
                                                + enc(request)), reader, "client"), None)
    tracemalloc.start()
    try:
        assert session.run() == 0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 3 * CHUNK_BYTES, peak
    assert sorted(reader.files) == sorted(
        (f"machines/desktop/{source}/{p}", sha256_text(t))
        for source in ("a", "b") for p, t in texts.items())
    with Store.open(store) as st:  # the commit went in, after the pull's snapshot
        assert set(st.manifest().values()) >= {sha256_text("new")}


# --- version 3: compact bodies, needs by index, pipelining, no `have` --------------------------

HELLO3 = {**HELLO, "versions": [1, 2, 3]}


def manifest3(source: str, files: list[tuple[str, str]], **extra: object) -> bytes:
    entries = [[p, sha256_text(t), len(t.encode()), 0] for p, t in files]
    return enc({"type": "manifest", "source": source, "kind": "markdown",
                "digest": digest_of((e[0], e[1]) for e in entries), "files": entries, **extra})


def test_version_3_takes_every_message_pipelined_and_answers_in_order(tmp_path: Path) -> None:
    # The whole session is written before serve reads a line, as a v3 client pipelines it:
    # a manifest that needs one body (b.md: not ahead), a manifest that needs none (its body
    # went ahead, as a text alone), a note and a pull; only then the body and the commit.
    store = tmp_path / "store.sqlite3"
    first = [("a.md", "sent ahead"), ("b.md", "named in need"), ("c.md", "sent ahead")]
    lines = [enc(HELLO3), raw(["sent ahead", "second ahead"]),
             manifest3("one", first), manifest3("two", [("x.md", "second ahead")]),
             enc({"type": "note", "note_id": "note-0001", "filename":
                  "2026-01-01T00-00-00-hi.md", "text": "hello"}),
             enc({"type": "pull", "known": {}}),
             raw(["named in need"], "one"),
             enc({"type": "commit", "source": "one"}), enc({"type": "bye"})]
    replies = talk(store, lines)
    assert [r["type"] for r in replies[:6]] == ["hello", "need", "result", "result",
                                                "note_result", "namespaces"], replies
    assert replies[0]["version"] == 3
    assert replies[1] == {"type": "need", "source": "one", "index": [1]}  # by position
    assert replies[2]["source"] == "one" and replies[2]["accepted"] == 3
    assert replies[3]["source"] == "two" and replies[3]["accepted"] == 1
    assert replies[4]["status"] == "stored"
    files = {f[0]: f[2] for r in replies if r["type"] == "files" for f in r["files"]}
    # No `have` list: the bodies this session received come back as null, the note whole.
    assert files["machines/laptop/one/b.md"] is None
    assert files["machines/laptop/two/x.md"] is None
    assert files["extensions/ad_hoc/notes/2026-01-01T00-00-00-hi.md"] is not None
    assert replies[-1]["type"] == "end"


def test_version_3_sends_a_text_it_stored_redacted(tmp_path: Path) -> None:
    secret = "token = '" + "Zq8vN2mL" + "p4Rt7Ws1'"  # built from pieces, see above
    replies = talk(tmp_path / "store.sqlite3", [
        enc(HELLO3), manifest3("one", [("s.md", secret)]),
        raw([secret], "one"),
        enc({"type": "commit", "source": "one"}), enc({"type": "pull", "known": {}})])
    assert replies[2]["redacted"] == {"generic-secret": 1}
    sent = [f for r in replies if r["type"] == "files" for f in r["files"]]
    assert sent[0][0] == "machines/laptop/one/s.md" and "Zq8vN2mL" not in sent[0][2]


def test_version_3_answers_a_stale_delta_with_need_stale_then_takes_the_whole(
        tmp_path: Path) -> None:
    store = tmp_path / "store.sqlite3"
    files = [("a.md", "one"), ("b.md", "two")]
    lines = [enc(HELLO3), manifest3("one", files[:1], base="0" * 64, removed=[]),
             manifest3("two", [("x.md", "other")]), manifest3("one", files),
             raw(["one", "two"], "one"),
             enc({"type": "commit", "source": "one"}),
             raw(["other"], "two"),
             enc({"type": "commit", "source": "two"})]
    replies = talk(store, lines)
    assert replies[1] == {"type": "need", "source": "one", "stale": True, "index": []}
    assert replies[2] == {"type": "need", "source": "one", "index": [0, 1]}
    assert replies[3]["source"] == "one" and replies[3]["accepted"] == 2
    assert replies[4] == {"type": "need", "source": "two", "index": [0]}
    assert replies[5]["source"] == "two" and replies[5]["accepted"] == 1


class Live:
    """A real `serve` driven a line at a time, so the test can act between two messages."""

    def __init__(self, store: Path, *args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, str(LAUNCHER), "serve", "--store",
                                      str(store), *args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE)

    def send(self, *lines: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"".join(lines))
        self.proc.stdin.flush()

    def read(self) -> dict:
        assert self.proc.stdout is not None
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        self.send(enc({"type": "bye"}))
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        assert self.proc.wait(timeout=30) == 0


@pytest.mark.parametrize("hello,stale", [
    (HELLO3, {"type": "need", "source": "one", "stale": True, "index": []}),
    ({**HELLO3, "versions": [2]}, None)])
def test_a_delta_whose_base_is_forgotten_before_its_commit_is_taken_whole(
        tmp_path: Path, hello: dict, stale: dict | None) -> None:
    # `forget` between the manifest and its commit: version 3 answers the commit `need stale`
    # and takes the whole manifest in the same exchange; version 2 answers `stale-base`.
    store = tmp_path / "store.sqlite3"
    first = [("a.md", "one")]
    talk(store, [enc(HELLO3), manifest3("one", first),
                 raw(["one"], "one"),
                 enc({"type": "commit", "source": "one"})])
    base = digest_of([("a.md", sha256_text("one"))])
    both = [*first, ("b.md", "two")]
    delta = enc({"type": "manifest", "source": "one", "kind": "markdown", "base": base,
                 "digest": digest_of((p, sha256_text(t)) for p, t in both), "removed": [],
                 "files": [["b.md", sha256_text("two"), 3, 0]]})
    v3 = stale is not None
    live = Live(store)
    try:
        live.send(enc(hello))
        assert live.read()["version"] == (3 if v3 else 2)
        live.send(delta)
        need = live.read()
        assert need["type"] == "need"
        with Store.open(store) as s:
            s.forget("laptop", "one")
        live.send(raw(["two"], "one") if v3 else enc({"type": "bodies", "source": "one",
                                                     "bodies": [[sha256_text("two"), "two"]]}),
                  enc({"type": "commit", "source": "one"}))
        answer = live.read()
        if not v3:
            assert answer["type"] == "error" and answer["code"] == "stale-base"
            return
        assert answer == stale
        live.send(manifest3("one", both))
        need = live.read()
        assert need == {"type": "need", "source": "one", "index": [0]}  # a.md: forgotten too
        live.send(raw(["one"], "one"),
                  enc({"type": "commit", "source": "one"}))
        result = live.read()
        assert result["type"] == "result" and result["accepted"] == 2
        live.close()
    finally:
        live.proc.kill()
        live.proc.wait()
    with Store.open(store) as s:
        assert set(exported(s)) == {"machines/laptop/one/a.md", "machines/laptop/one/b.md"}


def test_version_3_bodies_are_texts_alone(tmp_path: Path) -> None:
    replies = talk(tmp_path / "store.sqlite3", [
        enc(HELLO3), enc({"type": "bodies", "bodies": [[sha256_text("x"), "x"]]})])
    assert replies[-1]["code"] == "bad-field" and "texts" in replies[-1]["message"]


@pytest.mark.parametrize("bound", ["messages", "bytes"])
def test_version_3_holds_a_bounded_number_of_messages_past_a_waiting_manifest(
        tmp_path: Path, bound: str) -> None:
    store = tmp_path / "store.sqlite3"
    waiting = [enc(HELLO3), manifest3("one", [("a.md", "needed")])]
    body = [raw(["needed"], "one"),
            enc({"type": "commit", "source": "one"})]
    if bound == "bytes":  # a few status messages padded to more than 8 MiB in all
        pad = "p" * (8 * 1024 * 1024 // 3)
        over = [enc({"type": "status", "pad": pad})] * 4
        replies = talk(store, waiting + over + body)
        assert replies[-1]["code"] == "out-of-order", replies[-1]
        assert str(8 * 1024 * 1024) in replies[-1]["message"]
        assert stored(store)["files"] == 0
        return
    held = 64  # server_module.DEFERRED_MESSAGES
    replies = talk(store, waiting + [enc({"type": "status"})] * held + body)
    assert [r["type"] for r in replies] == ["hello", "need", "result"] + ["status"] * held
    store = tmp_path / "another.sqlite3"
    replies = talk(store, waiting + [enc({"type": "status"})] * (held + 1) + body)
    assert [r["type"] for r in replies] == ["hello", "need", "error"]
    assert replies[-1]["code"] == "out-of-order" and "pipelined" in replies[-1]["message"]
    assert stored(store)["files"] == 0


def placed(source: str, files: list[tuple[str, str, object]]) -> bytes:
    """A version 3 manifest whose entries give (path, text, what names its body)."""
    entries = [[p, named, len(t.encode()), 0] for p, t, named in files]
    return enc({"type": "manifest", "source": source, "kind": "markdown",
                "digest": digest_of((p, sha256_text(t)) for p, t, _ in files), "files": entries})


def test_version_3_manifest_names_bodies_sent_ahead_by_their_place(tmp_path: Path) -> None:
    # Places count every text sent ahead, in order, over every `bodies` message (a duplicate
    # too); a body sent in answer to a need is not one of them.
    store = tmp_path / "store.sqlite3"
    lines = [enc(HELLO3), raw(["zero", "one"]), raw(["zero", "three"]),
             placed("one", [("a.md", "zero", 0), ("b.md", "one", 1), ("c.md", "three", 3),
                            ("d.md", "four", sha256_text("four"))]),
             raw(["four"], "one"),
             enc({"type": "commit", "source": "one"}),
             placed("two", [("x.md", "zero", 2)])]
    replies = talk(store, lines)
    assert replies[1] == {"type": "need", "source": "one", "index": [3]}
    assert replies[2]["accepted"] == 4 and replies[3]["accepted"] == 1, replies
    with Store.open(store) as s:
        texts = {p: t for p, _, t in s.export()}
    assert {p: texts[f"machines/laptop/one/{p}"] for p in ("a.md", "b.md", "c.md", "d.md")} \
        == {"a.md": "zero", "b.md": "one", "c.md": "three", "d.md": "four"}
    assert texts["machines/laptop/two/x.md"] == "zero"


@pytest.mark.parametrize("place,why", [(2, "took 2 texts ahead"), (-1, "took 2 texts ahead"),
                                        (1, "in UTF-8"), (True, "sha256")])
def test_a_place_that_names_no_text_sent_ahead_is_refused(tmp_path: Path, place: object,
                                                          why: str) -> None:
    store = tmp_path / "store.sqlite3"
    lines = [enc(HELLO3), raw(["zero", b"not \xff UTF-8"]), placed("one", [("a.md", "zero", place)])]
    replies = talk(store, lines)
    assert replies[-1]["code"] == "bad-field" and why in replies[-1]["message"], replies
    assert "a.md" in replies[-1]["message"] or place is True
    assert stored(store)["files"] == 0


def test_version_2_manifest_entries_are_sha256s_only(tmp_path: Path) -> None:
    replies = talk(tmp_path / "store.sqlite3", [
        enc(HELLO), ahead(["zero"]), placed("one", [("a.md", "zero", 0)])])
    assert replies[-1]["code"] == "bad-field" and "place" not in replies[-1]["message"]


# --- version 3: raw texts after a `bodies` line ------------------------------------------------

SECRET = "token = '" + "Zq8vN2mL" + "p4Rt7Ws1'"  # built from pieces, see above


def raw(texts: list[str | bytes], source: str | None = None) -> bytes:
    return encode_raw_texts([t.encode() if isinstance(t, str) else t for t in texts], source)


def placed3(source: str, files: list[tuple[str, str | bytes, int | None]]) -> bytes:
    """A manifest naming each body by its place ahead (an int), or else by its sha256."""
    entries = []
    for path, text, place in files:
        data = text.encode() if isinstance(text, str) else text
        entries.append([path, sha256_bytes(data), len(data), 0, place])
    return enc({"type": "manifest", "source": source, "kind": "markdown",
                "digest": digest_of((e[0], e[1]) for e in entries),
                "files": [[p, sha if place is None else place, size, m]
                          for p, sha, size, m, place in entries]})


def test_version_3_takes_raw_texts_ahead_and_answering_a_need(tmp_path: Path) -> None:
    store = tmp_path / "store.sqlite3"
    ahead_texts = ['"quoted" {json}\n\\ back\n', "d\u00e9j\u00e0 vu \u65e5\u672c\n", SECRET, ""]
    needed = "named in need, \u00e9\n"
    files = [("a.md", ahead_texts[0], 0), ("b.md", ahead_texts[1], 1), ("s.md", SECRET, 2),
             ("e.md", "", 3), ("n.md", needed, None)]
    replies = talk(store, [enc(HELLO3), raw(ahead_texts), placed3("one", files),
                           raw([needed], "one"), enc({"type": "commit", "source": "one"}),
                           enc({"type": "bye"})])
    assert replies[0]["version"] == 3
    assert replies[1] == {"type": "need", "source": "one", "index": [4]}
    assert replies[2]["accepted"] == 5 and replies[2]["refused"] == []
    assert replies[2]["redacted"] == {"generic-secret": 1}  # the screen touched it: decoded
    with Store.open(store) as st:
        got = exported(st, "machines/laptop/one/")
        # Stored from the bytes as they came, as TEXT (a BLOB would read back as bytes).
        assert st.conn.execute("SELECT count(*) FROM blobs WHERE typeof(body) <> 'text'"
                               ).fetchone()[0] == 0
    assert {k.rsplit("/", 1)[1]: v for k, v in got.items() if not k.endswith("s.md")} == {
        "a.md": ahead_texts[0], "b.md": ahead_texts[1], "e.md": "", "n.md": needed}
    assert "Zq8vN2mL" not in got["machines/laptop/one/s.md"]
    assert replies[2]["stored"]["s.md"] == sha256_text(got["machines/laptop/one/s.md"])


def test_raw_texts_through_a_compressed_session(tmp_path: Path) -> None:
    texts = [f"note {i} \u00e9 " + "words " * 3000 for i in range(5)]
    deflate = zlib.compressobj()
    rest = deflate.compress(raw(texts[:3]) + placed3("one", [(f"{i}.md", t, i if i < 3 else None)
                                                              for i, t in enumerate(texts)])
                            + raw(texts[3:], "one") + enc({"type": "commit", "source": "one"})
                            + enc({"type": "bye"})) + deflate.flush(zlib.Z_SYNC_FLUSH)
    out = io.BytesIO()
    hello = enc({**HELLO3, "compress": ["zlib"]})
    session = Session(tmp_path / "store.sqlite3", Channel(io.BytesIO(hello + rest), out,
                                                          "client"), None)
    assert session.run() == 0
    first, _, after = out.getvalue().partition(b"\n")
    assert json.loads(first)["version"] == 3
    need, result = [json.loads(line) for line in
                    zlib.decompressobj().decompress(after).splitlines()]
    assert need["index"] == [3, 4] and result["accepted"] == 5
    assert session.channel.received < len("".join(texts)) / 10  # the texts came compressed


def reported_session(tmp_path: Path, hello: dict) -> tuple[list[dict], int]:
    """A real `serve` over a compressed session: four bodies ahead of 600 kB, their manifest.

    What it wrote, and how many bytes it read.
    """
    texts = [os.urandom(300_000).hex() for _ in range(4)]  # half their size once compressed
    deflate = zlib.compressobj(1)
    rest = b"".join(deflate.compress(raw([text])) + deflate.flush(zlib.Z_SYNC_FLUSH)
                    for text in texts)
    rest += deflate.compress(placed3("one", [(f"{i}.md", t, i) for i, t in enumerate(texts)])
                             + enc({"type": "bye"})) + deflate.flush(zlib.Z_SYNC_FLUSH)
    proc = subprocess.run([sys.executable, str(LAUNCHER), "serve", "--store",
                           str(tmp_path / "store.sqlite3")], input=enc(hello) + rest,
                          capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    first, _, after = proc.stdout.partition(b"\n")
    replies = [json.loads(first)]
    replies += [json.loads(line) for line in zlib.decompressobj().decompress(after).splitlines()]
    assert replies[-1]["type"] == "result" and replies[-1]["accepted"] == 4
    return replies, len(enc(hello) + rest)


def test_a_session_that_asks_reports_the_bytes_that_came_until_its_first_manifest(
        tmp_path: Path) -> None:
    replies, size = reported_session(tmp_path, {**HELLO3, "compress": ["zlib"], "reports": True})
    assert replies[0]["reports"] is True
    reports = replies[1:-1]
    assert [r["type"] for r in reports] == ["received"] * len(reports)
    assert [r.get("last") for r in reports] == [None] * (len(reports) - 1) + [True]
    assert len(reports) >= 2  # the last, and one at least while the bodies came
    wire = [r["bytes"] for r in reports]
    assert wire == sorted(wire) and 0 < wire[0] and wire[-1] <= size
    assert [r["seconds"] for r in reports] == sorted(r["seconds"] for r in reports)


@pytest.mark.parametrize("hello", [{**HELLO3, "compress": ["zlib"]},  # not asked for
                                   {**HELLO3, "versions": [2], "reports": True}])  # no zlib
def test_a_session_reports_nothing_unless_asked_and_compressed(tmp_path: Path,
                                                               hello: dict) -> None:
    if hello["versions"] == [2]:
        replies = talk(tmp_path / "store.sqlite3", [enc(hello), *manifest(
            "one", "markdown", [("a.md", "# a\n")])])
    else:
        replies = reported_session(tmp_path, hello)[0]
    assert "reports" not in replies[0]
    assert "received" not in [r["type"] for r in replies]


@pytest.mark.parametrize("sizes", [[-1], "12", [1.5], [True], [MAX_LINE_BYTES + 1],
                                   [MAX_LINE_BYTES, 1]])
def test_raw_bodies_with_bad_sizes_end_the_session_and_store_nothing(tmp_path: Path,
                                                                      sizes: object) -> None:
    store = tmp_path / "store.sqlite3"
    replies = talk(store, [enc(HELLO3), enc({"type": "bodies", "sizes": sizes}), b"x" * 20]
                   + manifest("notes", "markdown", [("after.md", "must not land")]))
    assert replies[-1]["type"] == "error" and replies[-1]["code"] == "bad-field"
    assert "bodies.sizes" in replies[-1]["message"]
    assert stored(store) == {"files": 0, "notes": 0}


def test_raw_texts_that_end_early_end_the_session_naming_what_is_missing(tmp_path: Path) -> None:
    store = tmp_path / "store.sqlite3"
    replies = talk(store, [enc(HELLO3), raw(["abcdef", "ghij"])[:-2]])
    assert replies[-1]["type"] == "error"
    assert "2 bytes short of the 10 bytes of texts" in replies[-1]["message"]
    assert stored(store) == {"files": 0, "notes": 0}


def test_a_raw_text_that_is_not_utf8_is_dropped_as_a_json_one_is(tmp_path: Path) -> None:
    store = tmp_path / "store.sqlite3"
    broken = b"bad \xff text"  # its sha256 is named, and matches: still not taken
    surrogate = b"lone \xed\xa0\x80 surrogate"  # UTF-8's form of U+D800 is not valid UTF-8
    replies = talk(store, [enc(HELLO3), raw(["first", broken, "third"]),
                           placed3("one", [("a.md", "first", 0), ("c.md", "third", 2),
                                           ("b.md", broken, None), ("d.md", surrogate, None)]),
                           raw([broken, surrogate], "one"),
                           enc({"type": "commit", "source": "one"}), enc({"type": "bye"})])
    assert replies[1]["index"] == [2, 3]
    result = replies[2]
    assert result["accepted"] == 2
    assert sorted((r["path"], r["reason"]) for r in result["refused"]) == [
        ("b.md", "missing-body"), ("d.md", "missing-body")]
    with Store.open(store) as st:
        assert sorted(exported(st, "machines/laptop/one/").values()) == ["first", "third"]
    # A manifest cannot name the text that was not UTF-8 by its place.
    refused = talk(tmp_path / "other.sqlite3", [enc(HELLO3), raw(["first", broken]),
                                                placed3("one", [("b.md", broken, 1)])])
    assert refused[-1]["code"] == "bad-field" and "names text 1 sent ahead" in refused[-1][
        "message"]


def test_version_3_bodies_are_raw_texts_only(tmp_path: Path) -> None:
    # One wire shape a version: texts in the JSON of a version 3 `bodies` message are refused.
    store = tmp_path / "store.sqlite3"
    replies = talk(store, [enc(HELLO3), enc({"type": "bodies", "bodies": ["json \u00e9"]}),
                           placed3("one", [("a.md", "json \u00e9", 0)]), enc({"type": "bye"})])
    assert replies[-1]["code"] == "bad-field" and "raw after its line" in replies[-1]["message"]
    assert stored(store) == {"files": 0, "notes": 0}


def test_a_version_2_session_reads_no_raw_texts(tmp_path: Path) -> None:
    # A version 2 session reads a `sizes` field as nothing: what follows is its next line.
    replies = talk(tmp_path / "store.sqlite3", [enc(HELLO), enc({"type": "bodies", "sizes": [2],
                                                                 "bodies": []}), b"{}\n"])
    assert replies[-1]["code"] == "bad-json"


def test_raw_bodies_ahead_count_against_ahead_bytes(tmp_path: Path) -> None:
    store = tmp_path / "store.sqlite3"
    texts = [f"file {i} " + "x" * 400 for i in range(4)]
    out = io.BytesIO()
    session = Session(store, Channel(io.BytesIO(b"".join([enc(HELLO3), raw(texts[:2]),
                                                          raw(texts[2:])])), out, "client"),
                      None, limits=Limits(namespace_bytes=1000))
    assert session.run() == 1
    hello, failure = [json.loads(line) for line in out.getvalue().splitlines()]
    assert hello["version"] == 3
    assert failure["code"] == "ahead-full" and "1000 bytes" in failure["message"]
    assert stored(store) == {"files": 0, "notes": 0}


# What `serve` must not load before its hello: each costs its start milliseconds, and a sync that
# changed nothing needs none of them (docs/BENCHMARKS.md).
NOT_BEFORE_HELLO = ("hashlib", "_hashlib", "typing", "pathlib", "urllib.parse",
                    "sharedmem.server.ingest", "path patterns")


def test_serve_loads_no_more_than_it_needs_before_its_hello(tmp_path: Path) -> None:
    """The modules loaded when `serve`, run as the forced command runs it, writes its hello."""
    store = tmp_path / "store.sqlite3"
    Store.open(store).close()  # an existing, current store: what every sync but the first meets
    probe = (
        "import sys\n"
        "class Hello:\n"  # stdout: notes the modules at the first line written, the hello
        "    def __init__(self): self.modules, self.lines = None, []\n"
        "    def write(self, data):\n"
        "        if self.modules is None:\n"
        "            rules = sys.modules['sharedmem.rules']\n"  # its path patterns not compiled
        "            self.modules = sorted(sys.modules) + [rules._SAFE_FILE is not None and 'path "
        "patterns']\n"
        "        self.lines.append(bytes(data)); return len(data)\n"
        "    def flush(self): pass\n"
        "class Out: buffer = Hello()\n"
        "sys.stdout = Out\n"
        f"sys.path.insert(0, {str(LAUNCHER.parent)!r})\n"  # as the launcher does, then its call
        "from sharedmem.cli.main import main\n"
        f"code = main(['serve', '--store', {str(store)!r}, '--machine', 'm'])\n"
        "sys.__stdout__.write(repr((code, Out.buffer.lines[0][:40], Out.buffer.modules)))\n")
    run = subprocess.run([sys.executable, "-S", "-c", probe], input=enc({
        "type": "hello", "versions": [3], "client": "t", "machine": "m"}) + enc({"type": "bye"}),
        capture_output=True, check=True)
    code, first, modules = eval(run.stdout)  # noqa: S307 (our own probe's repr)
    assert code == 0 and first.startswith(b'{"type":"hello"'), run.stderr
    assert "sharedmem.server.store" in modules  # the list is from the hello, after the store opened
    assert [name for name in NOT_BEFORE_HELLO if name in modules] == []


def test_serve_loads_what_a_change_needs_while_it_waits_after_its_hello(tmp_path: Path) -> None:
    """The redactor, hashlib, ingest and tails load on a thread, not on a change's answer."""
    store = tmp_path / "store.sqlite3"
    Store.open(store).close()
    probe = (
        "import sys, threading\n"
        f"sys.path.insert(0, {str(LAUNCHER.parent)!r})\n"
        "from sharedmem.cli.main import main\n"
        f"code = main(['serve', '--store', {str(store)!r}, '--machine', 'm'])\n"
        "for thread in threading.enumerate():\n"
        "    if thread.name == 'sharedmem-load': thread.join()\n"
        "wanted = ['sharedmem.redact.redactor', 'hashlib', 'sharedmem.server.ingest',\n"
        "          'sharedmem.server.tails']\n"
        "sys.stderr.write(repr((code, [m for m in wanted if m not in sys.modules])))\n")
    run = subprocess.run([sys.executable, "-S", "-c", probe], input=enc({
        "type": "hello", "versions": [3], "client": "t", "machine": "m"}) + enc({"type": "bye"}),
        capture_output=True, check=True)
    assert eval(run.stderr) == (0, [])  # noqa: S307 (our own probe's repr); a bye loads none


def test_the_bodies_a_commit_listed_leave_after_the_pull_not_before_it(tmp_path: Path) -> None:
    # Forgetting a first sync's bodies takes time the pull's answer would wait for
    # (docs/BENCHMARKS.md): they leave before the next message that reads them, and a pull is
    # none.
    texts = [f"body {i}\n" for i in range(5)]
    listed = {sha256_text(t) for t in texts}
    first = [ahead(texts), *manifest("notes", "markdown", [(f"{i}.md", t)
                                                          for i, t in enumerate(texts)])]
    pull = enc({"type": "pull", "known": {}})
    for then, kept in (([pull], True), ([pull, *manifest("more", "markdown", [("m.md", "m\n")])],
                                         False)):
        out = io.BytesIO()
        session = Session(tmp_path / f"store-{kept}.sqlite3",
                          Channel(io.BytesIO(b"".join([enc(HELLO), *first, *then])), out,
                                  "client"), None)
        assert session.run() == 0
        replies = [json.loads(line) for line in out.getvalue().splitlines()]
        assert [r["type"] for r in replies if r["type"] in ("result", "namespaces")][:2] == [
            "result", "namespaces"]
        assert (listed <= session.bodies.pool.keys()) is kept
        assert listed.isdisjoint(session.bodies.pool) is not kept


# --- what one session may cost the server -------------------------------------------------------

def run_session(store: Path, wire: bytes, limits: Limits | None = None,
                compressed: bool = False) -> tuple[int, list[dict]]:
    """An in-process session over `wire`: its exit status and its replies (inflated after hello)."""
    out = io.BytesIO()
    status = Session(store, Channel(io.BytesIO(wire), out, "client"), None, limits=limits).run()
    first, _, rest = out.getvalue().partition(b"\n")
    if compressed:
        rest = zlib.decompressobj().decompress(rest)
    return status, [json.loads(first), *(json.loads(line) for line in rest.splitlines())]


def test_what_a_session_sends_is_bounded_as_it_decompresses(tmp_path: Path) -> None:
    # A megabyte a line that compresses to a kilobyte: the bound counts what the lines inflate
    # to, so the sixth is refused having read about the bound and no more.
    deflate = zlib.compressobj()
    pad = enc({"type": "status", "pad": "a" * 1_000_000})
    wire = (enc({**HELLO3, "compress": ["zlib"]}) + deflate.compress(pad * 20)
            + deflate.flush())
    assert len(wire) < 40_000
    status, replies = run_session(tmp_path / "store.sqlite3", wire,
                                  Limits(session_bytes=5_000_000), compressed=True)
    assert status == 1 and [r["type"] for r in replies[1:-1]] == ["status"] * 4
    assert replies[-1]["code"] == "session-limit"
    assert "more than 5000000 bytes (decompressed)" in replies[-1]["message"]
    assert "serve --limit session_bytes=N" in replies[-1]["message"]
    status, replies = run_session(tmp_path / "store.sqlite3", wire, compressed=True)
    assert status == 0 and len(replies) == 21  # the default bound is far above this


def test_what_a_session_sends_is_bounded_in_messages(tmp_path: Path) -> None:
    wire = enc(HELLO) + enc({"type": "status"}) * 20
    status, replies = run_session(tmp_path / "store.sqlite3", wire, Limits(session_messages=10))
    assert status == 1 and [r["type"] for r in replies[1:]] == ["status"] * 9 + ["error"]
    assert replies[-1]["code"] == "session-limit" and "more than 10 messages" in replies[-1][
        "message"]


def test_raw_texts_count_against_what_a_session_may_send(tmp_path: Path) -> None:
    wire = enc(HELLO3) + raw(["x" * 600_000]) + raw(["y" * 600_000])
    status, replies = run_session(tmp_path / "store.sqlite3", wire, Limits(session_bytes=1_000_000))
    assert status == 1 and replies[-1]["code"] == "session-limit"


def test_verify_is_answered_once_a_session(tmp_path: Path) -> None:
    # Each reads the whole store: a session asking it again and again would cost the server
    # the store's size each time for a few bytes on the wire.
    status, replies = run_session(tmp_path / "store.sqlite3",
                                  enc(HELLO) + enc({"type": "verify"}) * 2)
    assert status == 1 and replies[1]["type"] == "verified"
    assert replies[2]["code"] == "out-of-order" and "once" in replies[2]["message"]


@pytest.mark.parametrize("hello", [HELLO, HELLO3])
@pytest.mark.parametrize("part", ["commit", "bodies"])
def test_a_part_naming_another_source_is_out_of_order(tmp_path: Path, hello: dict,
                                                      part: str) -> None:
    # The exchange waits for source a's bodies and commit: one for source b is out of order
    # (docs/PROTOCOL.md), and nothing of a is committed.
    store = tmp_path / "store.sqlite3"
    lines = [enc(hello), manifest3("a", [("x.md", "text of x")])]
    if part == "bodies":
        lines.append(raw(["text of x"], "b") if hello is HELLO3 else enc({
            "type": "bodies", "source": "b", "bodies": [[sha256_text("text of x"), "text of x"]]}))
    lines.append(enc({"type": "commit", "source": "b"}))
    replies = talk(store, lines)
    assert replies[1]["type"] == "need" and replies[-1]["code"] == "out-of-order", replies
    assert "source 'b'" in replies[-1]["message"] and "source 'a'" in replies[-1]["message"]
    assert stored(store) == {"files": 0, "notes": 0}


def test_a_sync_the_server_turns_away_as_busy_says_so(tmp_path: Path) -> None:
    from conftest import run_cli, write_config

    from sharedmem.server.session_slots import take
    store = tmp_path / "server" / "store.sqlite3"
    store.parent.mkdir()
    source = tmp_path / "notes"
    source.mkdir()
    (source / "a.md").write_text("hello\n")
    config = write_config(tmp_path / "client" / "client.json", "laptop",
                          {"kind": "local", "store": str(store)},
                          [{"name": "notes", "kind": "markdown", "path": str(source)}],
                          tmp_path / "cache")
    env = {**os.environ, "HOME": str(tmp_path / "home")}
    held = [take(store, 8) for _ in range(8)]  # every slot of the default count
    started = time.monotonic()
    done = run_cli("sync", "--config", str(config), env=env)
    assert time.monotonic() - started >= 10  # it waited for one to come free, then gave up
    assert talk(store, [enc(HELLO)], "--limit", "sessions=9")[-1]["type"] == "hello"
    for slot in held:
        slot.release()
    assert done.returncode == 2, done.stderr
    assert "the server is busy: 8 sessions already run on store" in done.stderr
    assert "try again in a minute" in done.stderr
    assert run_cli("sync", "--config", str(config), env=env).returncode == 0


# --- hostile sessions against the real `serve`: one table row a case ---------------------------

# A row is (session, arguments, check): the raw lines a hostile client sends (made when the row
# runs, since some are large), the `serve` options, and what must hold afterwards: the replies,
# the SQLite store it leaves (queried directly) and, for the memory rows, serve's peak RSS. Every
# row also requires a session that ends cleanly (no traceback on stderr) and a sound store. The
# last row is legitimate traffic the bounds must let through.
# serve runs as the child of a small Python that reports its peak RSS (`ru_maxrss` from wait4): a
# child forked straight from pytest would inherit pytest's high-water mark across exec.

HELLO_V1 = {**HELLO, "versions": [1]}
LIMITS = Limits()
# A guard against a hostile client, not a target: a session that held what such a client sends
# (100 MB of bodies, an 8 MiB line of values) would pass it; serve itself starts near 20 MiB.
PEAK_MIB = 90
SURROGATE = "\ud800"
WRAP = ("import os, subprocess, sys\n"
        "child = subprocess.Popen(sys.argv[1:])\n"
        "if hasattr(os, 'wait4'):\n"
        "    _, status, usage = os.wait4(child.pid, 0)\n"
        "    code, peak = os.waitstatus_to_exitcode(status), usage.ru_maxrss\n"
        "    peak //= 1024 if sys.platform == 'darwin' else 1\n"  # bytes there, KiB on Linux
        "else:\n"
        "    code, peak = child.wait(), -1\n"
        "sys.stderr.write(f'\\npeak-rss-kib={peak}\\n')\n"
        "sys.exit(code)\n")


class Run(NamedTuple):
    """What one session left: serve's replies, stderr, exit status, peak RSS and its store."""

    replies: list[dict[str, Any]]
    stderr: str
    status: int
    peak_mib: float
    store: Path

    def last(self, kind: str) -> dict[str, Any]:
        """The last reply of this type."""
        found = [r for r in self.replies if r["type"] == kind]
        assert found, (kind, self.replies[-3:], self.stderr[-2000:])
        return found[-1]

    def error(self) -> dict[str, Any]:
        """The error that ended the session (its last reply)."""
        assert self.replies and self.replies[-1]["type"] == "error", (self.replies[-3:],
                                                                       self.stderr[-2000:])
        assert self.status == 1
        return self.replies[-1]

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        """Rows of a query on the store serve left."""
        conn = sqlite3.connect(self.store)
        try:
            return conn.execute(sql).fetchall()
        finally:
            conn.close()

    def count(self, table: str) -> int:
        return self.rows(f"SELECT count(*) FROM {table}")[0][0]


def serve(store: Path, lines: Iterator[bytes] | list[bytes], *args: str) -> Run:
    """Feed `lines` to a real `serve` as they are made; collect what it answers."""
    proc = subprocess.Popen([sys.executable, "-c", WRAP, sys.executable, str(LAUNCHER), "serve",
                             "--store", str(store), *args],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    err: list[bytes] = []
    failed: list[BaseException] = []

    def feed() -> None:
        try:
            for line in lines:
                proc.stdin.write(line)
        except (BrokenPipeError, OSError):
            pass  # serve ended the session first: what it answered says why
        except BaseException as exc:  # a broken row: raised in the test, serve not left waiting
            failed.append(exc)
        finally:
            try:
                proc.stdin.close()
            except OSError:
                pass

    threads = [threading.Thread(target=feed, daemon=True),
               threading.Thread(target=lambda: err.append(proc.stderr.read()), daemon=True)]
    for thread in threads:
        thread.start()
    out = proc.stdout.read()
    status = proc.wait(timeout=120)
    for thread in threads:
        thread.join(30)
    if failed:
        raise failed[0]
    stderr = b"".join(err).decode("utf-8", "replace")
    peak = re.search(r"\npeak-rss-kib=(-?\d+)\n", stderr)
    assert peak, stderr[-2000:]
    return Run([json.loads(line) for line in out.splitlines()], stderr[:peak.start()], status,
               int(peak.group(1)) / 1024, store)


# --- what hostile clients send --------------------------------------------------------------

def entries(files: list[tuple[str, str]]) -> list[list[Any]]:
    return [[p, sha256_of(t), len(t.encode("utf-8", "surrogatepass")), 0] for p, t in files]


def sha256_of(text: str) -> str:
    """A text's address; one with a lone surrogate (which has none) gets its bytes' anyway."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def manifest_line(source: str, files: list[tuple[str, str]], **extra: Any) -> bytes:
    listed = entries(files)
    try:
        digest = digest_of((e[0], e[1]) for e in listed)
    except UnicodeEncodeError:  # a hostile path: the server makes its own digest of it
        digest = "0" * 64
    return enc({"type": "manifest", "source": source, "kind": "markdown", "digest": digest,
                "files": listed, **extra})


def bodies(texts: list[str], per_line: int = 3, **extra: Any) -> Iterator[bytes]:
    for i in range(0, len(texts), per_line):
        yield enc({"type": "bodies", "bodies": [[sha256_of(t), t]
                                                for t in texts[i:i + per_line]], **extra})


def publish(source: str, files: list[tuple[str, str]]) -> Iterator[bytes]:
    """Version 1: the snapshot in `files` messages of three files, then commit."""
    yield enc({"type": "publish", "source": source, "kind": "markdown"})
    for i in range(0, len(files), 3):
        yield enc({"type": "files", "files": [{"path": p, "text": t, "mtime_ns": 0}
                                              for p, t in files[i:i + 3]]})
    yield enc({"type": "commit"})


def texts(count: int, size: int, tag: str = "") -> list[str]:
    """`count` distinct texts of `size` bytes."""
    return [(f"{tag}{i} " + "x" * size)[:size] for i in range(count)]


def exchange(source: str, files: list[tuple[str, str]]) -> Iterator[bytes]:
    """A whole version 2 exchange that sends every body after the manifest, then commits."""
    yield manifest_line(source, files)
    yield from bodies([t for _, t in files])
    yield enc({"type": "commit"})


def then_status(*parts: Any) -> Iterator[bytes]:
    """The session's lines, then a `status`: its answer shows the session went on."""
    for part in parts:
        if isinstance(part, bytes):
            yield part
        else:
            yield from part
    yield enc({"type": "status"})


# --- the checks -----------------------------------------------------------------------------

Check = Callable[[Run], None]


def nothing_stored(run: Run) -> None:
    assert run.count("files") == 0 and run.count("blobs") == 0 and run.count("notes") == 0


def went_on(run: Run) -> None:
    """The session answered the `status` after the hostile part, and ended at its input's end."""
    assert run.replies[-1]["type"] == "status" and run.status == 0, run.replies[-2:]


def bounded(run: Run) -> None:
    if run.peak_mib >= 0:  # known where the system reports a child's peak (wait4)
        assert run.peak_mib < PEAK_MIB, f"serve peaked at {run.peak_mib:.0f} MiB"


# Item 1: every rule on every path into the store -------------------------------------------

def over() -> list[str]:
    """4.4 MB sent ahead, a batch the session stores, of bodies each over the file limit."""
    return texts(4, LIMITS.file_bytes + 100_000, "over ")


def check_oversized_ahead(run: Run) -> None:
    results = [r for r in run.replies if r["type"] == "result"]
    assert [r["accepted"] for r in results] == [0, 0]
    for result in results:
        assert {r["reason"] for r in result["refused"]} == {"too-large"}, result["refused"]
        assert f"over the {LIMITS.file_bytes}-byte file limit" in result["refused"][0]["message"]
    assert run.count("files") == 0 and run.count("blobs") == 0
    went_on(run)


def check_oversized_stored_before(run: Run) -> None:
    result = run.last("result")
    assert result["accepted"] == 1, result
    assert [(r["path"], r["reason"]) for r in result["refused"]] == [("big.md", "too-large")]
    assert run.rows("SELECT path FROM files") == [("small.md",)]
    went_on(run)


# Item 2: what one session holds ------------------------------------------------------------

def many() -> list[tuple[str, str]]:
    """100 files of 1 MB: far past the 64 MiB namespace quota."""
    return [(f"{i}.md", t) for i, t in enumerate(texts(100, 1_000_000, "need "))]


def check_need_bounded(run: Run) -> None:
    bounded(run)
    result = run.last("result")
    fit = LIMITS.namespace_bytes // 1_000_000
    assert result["accepted"] == fit
    assert {r["reason"] for r in result["refused"]} == {"quota"}
    assert run.count("files") == fit and run.count("blobs") == fit  # nothing else left behind
    went_on(run)


def many_values(kind: bytes, size: int = 8 * MIB) -> bytes:
    """One legal line of `size` bytes that is nothing but small JSON values."""
    if kind == b"{":
        items = b",".join(b'"%d":0' % i for i in range(size // 10))
        return b'{"type":"status","x":{' + items + b"}}\n"
    return b'{"type":"status","x":[' + b"[]," * (size // 3) + b"[]]}\n"


def check_too_many_values(run: Run) -> None:
    bounded(run)
    failure = run.error()
    assert failure["code"] == "too-many-values" and "1000000 JSON values" in failure["message"]
    nothing_stored(run)


def check_too_many_files(run: Run) -> None:
    failure = run.error()
    assert failure["code"] == "too-many-files"
    assert f"more than {LIMITS.namespace_files} files for source 'notes'" in failure["message"]
    assert "serve --limit namespace_files=N" in failure["message"]
    nothing_stored(run)


# Item 3: a machine's totals over all its namespaces ---------------------------------------

def check_namespace_count(run: Run) -> None:
    results = [r for r in run.replies if r["type"] == "result"]
    assert [r["accepted"] for r in results] == [1] * LIMITS.machine_namespaces + [0]
    refusal = results[-1]["refused"][0]
    assert refusal["reason"] == "machine-quota" and results[-1]["digest"] is None
    for words in ("machine 'laptop' already has 64 namespaces", "forget --store STORE "
                  "--machine laptop", "serve --limit machine_namespaces=N"):
        assert words in refusal["message"], refusal["message"]
    assert run.count("namespaces") == LIMITS.machine_namespaces
    went_on(run)


def check_machine_totals(run: Run) -> None:
    results = {r["source"]: r for r in run.replies if r["type"] == "result"}
    assert results["a"]["accepted"] == 2 and results["b"]["accepted"] == 1
    assert [(r["path"], r["reason"]) for r in results["b"]["refused"]] == [
        ("2.md", "machine-quota")]
    assert [r["reason"] for r in results["c"]["refused"]] == ["machine-quota"]
    message = results["c"]["refused"][0]["message"]
    for words in ("machine 'laptop' past its total", "3 files, 100 bytes",
                  "other 2 namespaces hold 3 files, 30 bytes", "forget --store STORE",
                  "serve --limit machine_bytes=N"):
        assert words in message, message
    assert run.count("files") == 3
    went_on(run)


def check_bad_limit(run: Run) -> None:
    assert run.status == 2 and run.replies == []
    assert "unknown limit 'machine_byte=5'" in run.stderr
    assert "machine_bytes, machine_files, machine_namespaces" in run.stderr
    assert "limit machine_files must be a positive integer, not 'lots'" in run.stderr


# Item 4: lone surrogates, and other malformed items ---------------------------------------

GOOD = ("good.md", "fine")


def bad_field(fragment: str) -> Check:
    def check(run: Run) -> None:
        failure = run.error()
        assert failure["code"] == "bad-field" and fragment in failure["message"], failure
        nothing_stored(run)
    return check


def lone_surrogate(*files: str) -> Check:
    """The line holding it is refused where it is decoded; what came before it stays stored."""
    def check(run: Run) -> None:
        failure = run.error()
        assert failure["code"] == "bad-json" and "lone surrogate (U+D800)" in failure["message"]
        assert run.rows("SELECT path FROM files") == [(f,) for f in files]
        assert run.count("notes") == 0
    return check


def delta_with(path: str, removed: list[str]) -> Iterator[bytes]:
    """A first whole manifest, then a delta against it listing `path` and removing `removed`."""
    yield from exchange("notes", [GOOD])
    base = digest_of([(GOOD[0], sha256_text(GOOD[1]))])
    listed = entries([(path, "x")])
    yield enc({"type": "manifest", "source": "notes", "kind": "markdown", "digest": "e" * 64,
               "base": base, "files": listed, "removed": removed})
    yield from bodies(["x"])
    yield enc({"type": "commit"})


# Legit traffic the bounds must never refuse (a guard: this row held before the bounds too) ---

ESCAPING = "".join(chr(c) for c in range(1, 32) if c not in (9, 10, 13)) * 36_000  # ~1 MiB
LEGIT_FILES = [(f"d{i // 1000}/f{i}.md", f"file {i}") for i in range(LIMITS.namespace_files)]


def check_legit(run: Run) -> None:
    results = [r for r in run.replies if r["type"] == "result"]
    assert [r["refused"] for r in results] == [[], []], [r["refused"][:3] for r in results]
    assert [r["accepted"] for r in results] == [1, LIMITS.namespace_files]
    assert run.count("files") == 1 + LIMITS.namespace_files
    went_on(run)


def setup_big_blob(store: Path) -> None:
    """A body over today's file limit already in the store: an orphan of a killed session, or
    stored under a larger limit before."""
    big = texts(1, LIMITS.file_bytes + 1)[0]
    with Store.open(store) as s:
        s.put_blobs([(sha256_text(big), len(big), big.encode())])


class Row(NamedTuple):
    """A hostile session: its lines (made when it runs), serve's options, the check, a setup."""

    lines: Callable[[], Any]
    args: tuple[str, ...]
    check: Check
    setup: Callable[[Path], None] | None = None


ROWS: dict[str, Row] = {
    # 1. the file limit on every path into the store
    "a body over the file limit sent ahead, stored in a batch, named by two manifests": Row(
        lambda: then_status(enc(HELLO), bodies(over(), 2),
                            exchange("a", [(f"{i}.md", t) for i, t in enumerate(over())]),
                            exchange("b", [(f"{i}.md", t) for i, t in enumerate(over())])),
        (), check_oversized_ahead),
    "a body over the file limit already in the store, named by a manifest": Row(
        lambda: then_status(enc(HELLO), manifest_line("notes", [("big.md", texts(
            1, LIMITS.file_bytes + 1)[0]), ("small.md", "s")]), bodies(["s"]),
            enc({"type": "commit"})),
        (), check_oversized_stored_before, setup_big_blob),
    # 2. what one session holds
    "100 MB of bodies answering one need": Row(
        lambda: then_status(enc(HELLO), exchange("notes", many())),
        (), check_need_bounded),
    "100 MB in one version 1 publish": Row(
        lambda: then_status(enc(HELLO_V1), publish("notes", many())),
        (), check_need_bounded),
    "an 8 MiB line of empty lists": Row(
        lambda: [enc(HELLO), many_values(b"[")], (), check_too_many_values),
    "an 8 MiB line of one object's small members": Row(
        lambda: [enc(HELLO), many_values(b"{")], (), check_too_many_values),
    "a manifest of more files than a namespace holds": Row(
        lambda: [enc(HELLO), manifest_line("notes", [(f"{i}.md", "x") for i in range(
            LIMITS.namespace_files + 1)])], (), check_too_many_files),
    "a version 1 publish of more files than a namespace holds": Row(
        lambda: [enc(HELLO_V1), *publish("notes", [(f"{i}.md", "") for i in range(
            LIMITS.namespace_files + 1)])], (), check_too_many_files),
    # 3. a machine's totals
    "one namespace more than a machine may have": Row(
        lambda: then_status(enc(HELLO), *(exchange(f"s{i}", [("a.md", "x")])
                                          for i in range(LIMITS.machine_namespaces + 1))),
        (), check_namespace_count),
    "files and bytes past a machine's totals, set with serve --limit": Row(
        lambda: then_status(enc(HELLO), exchange("a", [("1.md", "a" * 10), ("2.md", "b" * 10)]),
                            exchange("b", [("1.md", "c" * 10), ("2.md", "d" * 10)]),
                            exchange("c", [("1.md", "e" * 90)])),
        ("--limit", "machine_files=3", "--limit", "machine_bytes=100"), check_machine_totals),
    "a bad serve --limit": Row(
        lambda: [enc(HELLO)], ("--limit", "machine_byte=5", "--limit", "machine_files=lots"),
        check_bad_limit),
    # 4. lone surrogates (refused where JSON is decoded) and other malformed items
    "a path with a lone surrogate": Row(
        lambda: then_status(enc(HELLO), exchange("notes", [GOOD, ("b" + SURROGATE + ".md", "x")])),
        (), lone_surrogate()),
    "a version 1 path with a lone surrogate": Row(
        lambda: then_status(enc(HELLO_V1), publish("notes", [GOOD, ("b" + SURROGATE + ".md",
                                                                    "x")])),
        (), lone_surrogate()),
    "a delta's path with a lone surrogate": Row(
        lambda: then_status(enc(HELLO), delta_with("b" + SURROGATE + ".md", [])), (),
        lone_surrogate(GOOD[0])),
    "a delta removing a path with a lone surrogate": Row(
        lambda: then_status(enc(HELLO), delta_with("c.md", ["z" + SURROGATE + ".md"])), (),
        lone_surrogate(GOOD[0])),
    "a note id with a lone surrogate": Row(
        lambda: then_status(enc(HELLO), enc({"type": "note", "note_id": "abcdefgh" + SURROGATE,
                                             "filename": "2026-01-01T00-00-00-x.md",
                                             "text": "hi"})),
        (), lone_surrogate()),
    "a manifest sha256 with lone surrogates": Row(
        lambda: [enc(HELLO), enc({"type": "manifest", "source": "notes", "kind": "markdown",
                                  "digest": "a" * 64, "files": [["a.md", SURROGATE * 64, 1, 0]]})],
        (), lone_surrogate()),
    "the client's own error, with lone surrogates": Row(
        lambda: [enc(HELLO), enc({"type": "error", "code": "x" + SURROGATE,
                                  "message": ("y" + SURROGATE) * 5000})],
        (), lone_surrogate()),
    "a manifest digest that is not hex": Row(
        lambda: [enc(HELLO), enc({"type": "manifest", "source": "notes", "kind": "markdown",
                                  "digest": "A" * 64, "files": []})],
        (), bad_field("manifest.digest must be a sha256")),
    "a pull from a generation SQLite cannot hold": Row(
        lambda: [enc(HELLO), enc({"type": "pull", "known": {"extensions/ad_hoc/notes": -2**70}})],
        (), bad_field("pull.known must map namespace keys to generations")),
    "a pull whose have holds lists": Row(
        lambda: [enc(HELLO), enc({"type": "pull", "known": {}, "have": [[1]]})],
        (), bad_field("pull.have must be a list of sha256 strings")),
    "legit: a 1 MiB file that escapes to 6 MiB, then 20,000 files with a bodies batch": Row(
        lambda: then_status(enc(HELLO), exchange("escapes", [("e.md", ESCAPING)]),
                            manifest_line("many", LEGIT_FILES),
                            bodies([t for _, t in LEGIT_FILES], per_line=20_000),
                            enc({"type": "commit"})),
        (), check_legit),
}



@pytest.mark.parametrize("name", list(ROWS))
def test_hostile_session(tmp_path: Path, name: str) -> None:
    row = ROWS[name]
    store = tmp_path / "store.sqlite3"
    if row.setup is not None:
        row.setup(store)
    run = serve(store, row.lines(), *row.args)
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    row.check(run)
    if store.exists():
        with Store.open(store) as s:
            assert s.verify() == []


@pytest.mark.parametrize("version", [2, 1])
def test_a_client_of_the_flat_release_syncs_with_this_server(tmp_path: Path, sshd: Sshd,
                                                           version: int) -> None:
    """The server keeps speaking versions 1 and 2: a client of an earlier release keeps working.

    The flat-layout release's own client (it speaks versions 1 and 2) publishes, adds a note
    and pulls, over ssh, from this release's `serve`; a client of this release reads it all.
    """
    old = flat_release(tmp_path / "flat")
    home = tmp_path / "home"
    notes = home / "notes"
    notes.mkdir(parents=True)
    (notes / "a.md").write_text("# from the old client\n", encoding="utf-8")
    store = tmp_path / "store.sqlite3"
    serve = [sys.executable, str(LAUNCHER), "serve", "--store", str(store)]
    transport = sshd.transport(pinned=False, remote_command=serve)
    source = [{"name": "notes", "kind": "markdown", "path": str(notes)}]
    old_cfg = write_config(tmp_path / "old" / "client.json", "oldbox", transport, source,
                           tmp_path / "old" / "cache")
    run_old = [sys.executable, str(old / "shared_memory.py")]
    env = {**os.environ, "HOME": str(home)}
    noted = subprocess.run([*run_old, "note", "--config", str(old_cfg),
                            "2026-12-01T00-00-00-from-old.md", "an old client's note"],
                           capture_output=True, text=True, env=env, timeout=120)
    assert noted.returncode == 0, noted.stderr
    synced = subprocess.run([*run_old, "sync", "--config", str(old_cfg), "--json",
                             "--max-protocol", str(version)], capture_output=True, text=True,
                            env=env, timeout=120)
    assert synced.returncode == 0, synced.stderr + synced.stdout
    assert json.loads(synced.stdout)["protocol"] == version
    old_cache = tmp_path / "old" / "cache"
    assert (old_cache / "machines/oldbox/notes/a.md").read_text() == "# from the old client\n"
    assert "an old client's note" in (
        old_cache / "extensions/ad_hoc/notes/2026-12-01T00-00-00-from-old.md").read_text()
    new_cfg = write_config(tmp_path / "new" / "client.json", "newbox", transport, [],
                           tmp_path / "new" / "cache")
    done = run_cli("sync", "--config", str(new_cfg), "--json", env=env)
    assert done.returncode == 0, done.stderr
    new_cache = tmp_path / "new" / "cache"
    assert (new_cache / "machines/oldbox/notes/a.md").read_text() == "# from the old client\n"
    assert "an old client's note" in (
        new_cache / "extensions/ad_hoc/notes/2026-12-01T00-00-00-from-old.md").read_text()
