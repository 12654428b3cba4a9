"""Tests for sharedmem.server.ingest on real SQLite files: one namespace replaced, every rule re-checked."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import exported, files, raw_rows

from sharedmem.core import NameRuleError, SharedMemoryError, StoreError
from sharedmem.hashing import digest_of, sha256_text
from sharedmem.rules import NOTES_DIR, Limits
from sharedmem.server.ingest import MAX_MESSAGE_CHARS, IncomingFile, StaleBase, ingest
from sharedmem.server.store import Store

GITHUB_TOKEN = "ghp_" + "a" * 36
NOTE = "2026-01-31T09-30-00-release-checklist.md"


def test_ingest_replaces_exactly_one_namespace(st: Store) -> None:
    ingest(st, "m1", "codex", "codex", files({"MEMORY.md": "one", "memory_summary.md": "sum"}))
    ingest(st, "m1", "notes", "markdown", files({"a.md": "A", "b/c.md": "C"}))
    ingest(st, "m2", "codex", "codex", files({"MEMORY.md": "two"}))
    ingest(st, "m2", "claude-code", "claude-code", files({"proj/x.md": "X", "proj/y.md": "one"}))
    st.append_note("m1", NOTE, "a note")
    others = [("m1", "codex"), ("m2", "codex"), ("m2", "claude-code")]
    before_rows = {ns: raw_rows(st, *ns) for ns in others}
    before_export = {ns: exported(st, f"machines/{ns[0]}/{ns[1]}/") for ns in others}
    before_notes = exported(st, NOTES_DIR)
    report = ingest(st, "m1", "notes", "markdown", files({"a.md": "A2", "d.md": "D"}))
    assert report.accepted == 2 and not report.refused and not report.unchanged
    assert exported(st, "machines/m1/notes/") == {"machines/m1/notes/a.md": "A2",
                                                   "machines/m1/notes/d.md": "D"}
    for ns in others:
        assert raw_rows(st, *ns) == before_rows[ns], ns
        assert exported(st, f"machines/{ns[0]}/{ns[1]}/") == before_export[ns], ns
    assert exported(st, NOTES_DIR) == before_notes
    assert st.verify() == []


def test_a_reader_sees_the_old_snapshot_or_the_new_one(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite3"
    with Store.open(path) as writer, Store.open(path) as reader:
        ingest(writer, "m1", "notes", "markdown", files({f"f{i}.md": "old" for i in range(20)}))
        reader.conn.execute("BEGIN")
        seen_before = sorted(reader.manifest().items())
        ingest(writer, "m1", "notes", "markdown", files({f"f{i}.md": "new" for i in range(10, 30)}))
        assert sorted(reader.manifest().items()) == seen_before  # still the old snapshot
        reader.conn.execute("COMMIT")
        assert set(reader.manifest().values()) == {sha256_text("new")}
        assert len(reader.manifest()) == 20


@pytest.mark.parametrize(("kind", "source", "path"), [
    ("codex", "codex", "raw_memories.md"),
    ("codex", "codex", "skills/x.md"),
    ("codex", "codex", "rollout_summaries/a/b.md"),
    ("codex", "codex", "notes.md"),
    ("codex", "codex", "memories_v2/raw_memories.md"),
    ("codex", "codex", "memories_v2/phase2_workspace_diff.md"),
    ("codex", "codex", "skills/deploy/scripts/run.md"),
    ("claude-code", "claude-code", "x.md"),
    ("claude-code", "claude-code", "p/q/x.md"),
    ("markdown", "notes", "a/b/c/d/e/x.md"),
    ("markdown", "notes", "../x.md"),
    ("markdown", "notes", "/etc/x.md"),
    ("markdown", "notes", "a\\b.md"),
    ("markdown", "notes", "CON.md"),
    ("markdown", "notes", ".hidden.md"),
    ("markdown", "notes", "e\u0301.md"),
    ("markdown", "notes", "a//b.md"),
    ("markdown", "notes", "x.txt"),
    ("markdown", "notes", "a\x00.md"),
])
def test_ingest_rechecks_the_path_rule_and_allowlist(st: Store, kind: str, source: str,
                                                     path: str) -> None:
    good = {"codex": "MEMORY.md", "claude-code": "proj/ok.md", "markdown": "a/b/c/d/ok.md"}[kind]
    report = ingest(st, "m1", source, kind, files({good: "fine", path: "hostile"}))
    assert [r["path"] for r in report.refused] == [path]
    assert report.refused[0]["reason"] == "bad-path"
    assert report.accepted == 1
    assert st.manifest() == {f"machines/m1/{source}/{good}": sha256_text("fine")}
    assert st.conn.execute("SELECT count(*) FROM blobs WHERE body='hostile'").fetchone()[0] == 0


def test_allowlist_accepts_what_each_kind_publishes(st: Store) -> None:
    ingest(st, "m1", "codex", "codex", files({"MEMORY.md": "a", "memory_summary.md": "b",
                                             "rollout_summaries/r.md": "c",
                                             "memories_v2/MEMORY.md": "g",
                                             "memories_v2/skills/s/SKILL.md": "h"}))
    ingest(st, "m1", "claude-code", "claude-code", files({"-home-u-app/x.md": "d",
                                                         "agent-memory/rev/MEMORY.md": "i"}))
    ingest(st, "m1", "notes", "markdown", files({"a/b/c/d/x.md": "e", "top.md": "f"}))
    assert sorted(st.manifest()) == [
        "machines/m1/claude-code/-home-u-app/x.md",
        "machines/m1/claude-code/agent-memory/rev/MEMORY.md", "machines/m1/codex/MEMORY.md",
        "machines/m1/codex/memories_v2/MEMORY.md", "machines/m1/codex/memories_v2/skills/s/SKILL.md",
        "machines/m1/codex/memory_summary.md", "machines/m1/codex/rollout_summaries/r.md",
        "machines/m1/notes/a/b/c/d/x.md", "machines/m1/notes/top.md"]


def test_ingest_limits_and_collisions(st: Store) -> None:
    limits = Limits(file_bytes=10, namespace_bytes=25, namespace_files=3)
    report = ingest(st, "m1", "notes", "markdown", [
        *files({"a.md": "a" * 10, "b.md": "b" * 11, "c.md": "c" * 10, "d.md": "d" * 10,
                "e.md": "e", "f.md": "f", "A.md": "upper"}),
        IncomingFile("STRASSE.md", text="x"), IncomingFile("straße.md", text="y"),
    ], limits=limits)
    reasons = {r["path"]: r["reason"] for r in report.refused}
    # Sorted order: A.md, STRASSE.md, a.md(collides), b.md, c.md, d.md, e.md, f.md, straße.md
    assert reasons == {"a.md": "collision", "straße.md": "collision", "b.md": "too-large",
                       "d.md": "quota", "e.md": "quota", "f.md": "quota"}
    assert sorted(st.manifest()) == ["machines/m1/notes/A.md", "machines/m1/notes/STRASSE.md",
                                     "machines/m1/notes/c.md"]
    for r in report.refused:
        assert r["path"] in r["message"]
    bodies = {r[0] for r in st.conn.execute("SELECT body FROM blobs")}
    assert bodies == {"upper", "x", "c" * 10}  # nothing refused was stored


def test_ingest_refuses_odd_items(st: Store) -> None:
    report = ingest(st, "m1", "notes", "markdown", [
        IncomingFile("a.md", text="first"), IncomingFile("a.md", text="second"),
        IncomingFile(None, text="no path"), IncomingFile(b"b.md", text="bytes path"),  # type: ignore[arg-type]
        IncomingFile("c.md"),
    ])
    assert sorted((r["path"], r["reason"]) for r in report.refused) == [
        ("None", "bad-path"), ("a.md", "collision"), ("b'b.md'", "bad-path"), ("c.md", "missing-body")]
    assert exported(st) == {"machines/m1/notes/a.md": "first"}


def test_namespace_byte_quota(st: Store) -> None:
    report = ingest(st, "m1", "notes", "markdown", files({"a.md": "a" * 6, "b.md": "b" * 6}),
                       limits=Limits(file_bytes=100, namespace_bytes=10, namespace_files=100))
    assert [(r["path"], r["reason"]) for r in report.refused] == [("b.md", "quota")]
    assert report.accepted == 1


def test_ingest_redacts_again(st: Store) -> None:
    text = f"deploy with {GITHUB_TOKEN} please\n"
    report = ingest(st, "m1", "notes", "markdown", files({"secret.md": text}))
    stored = exported(st)["machines/m1/notes/secret.md"]
    assert GITHUB_TOKEN not in stored and "ghp_" not in stored
    assert stored == "deploy with [REDACTED:github-token] please\n"
    assert report.redacted == {"github-token": 1}
    assert report.stored == {"secret.md": sha256_text(stored)}
    dump = "\n".join(st.conn.iterdump())
    assert GITHUB_TOKEN not in dump
    path, _ = st.append_note("m1", NOTE, f"note with {GITHUB_TOKEN}")
    assert GITHUB_TOKEN not in exported(st)[path]
    assert GITHUB_TOKEN not in "\n".join(st.conn.iterdump())


@pytest.mark.parametrize(("machine", "source", "kind", "error"), [
    ("m1", "notes", "codex", StoreError),
    ("m1", "codex", "claude-code", StoreError),
    ("m1", "claude-code", "codex", StoreError),
    ("m1", "codex", "markdown", NameRuleError),
    ("m1", "claude-code", "markdown", NameRuleError),
    ("m1", "Bad Name", "markdown", NameRuleError),
    ("m1", "notes", "html", StoreError),
    ("M1", "codex", "codex", NameRuleError),
    ("../m1", "codex", "codex", NameRuleError),
])
def test_source_and_kind_must_match(st: Store, machine: str, source: str, kind: str,
                                    error: type[Exception]) -> None:
    with pytest.raises(error) as caught:
        ingest(st, machine, source, kind, files({"MEMORY.md": "x"}))
    assert isinstance(caught.value, SharedMemoryError)
    assert st.counts() == {"namespaces": 0, "files": 0, "blobs": 0, "notes": 0, "versions": 0}


def test_delta_ingest_and_stale_base(st: Store) -> None:
    first = ingest(st, "m1", "notes", "markdown", files({"a.md": "A", "b.md": "B", "c.md": "C"}))
    base = st.namespace_digest("m1", "notes")
    assert base == digest_of([("a.md", sha256_text("A")), ("b.md", sha256_text("B")),
                              ("c.md", sha256_text("C"))])
    report = ingest(st, "m1", "notes", "markdown", files({"b.md": "B2", "d.md": "D"}),
                       removed=["c.md"], base_digest=base)
    assert report.generation > first.generation
    assert exported(st) == {"machines/m1/notes/a.md": "A", "machines/m1/notes/b.md": "B2",
                            "machines/m1/notes/d.md": "D"}
    with pytest.raises(StaleBase, match="send the whole manifest"):
        ingest(st, "m1", "notes", "markdown", files({"e.md": "E"}), base_digest=base)
    with pytest.raises(StaleBase):
        ingest(st, "m1", "other", "markdown", files({"e.md": "E"}), base_digest=base)
    assert "machines/m1/notes/e.md" not in st.manifest()
    assert issubclass(StaleBase, StoreError)


def test_a_whole_snapshot_digest_is_that_of_the_files_accepted(st: Store) -> None:
    # Sent in no order, with non-ASCII names (each checked one by one), a collision, a bad
    # path and a missing body: the digest is taken from the accepted files in path order.
    sent = [*files({"z.md": "Z", "caf\u00e9.md": "E", "A.md": "A1", "b/x.md": "X"}),
            *files({"a.md": "A2", "../up.md": "U", "\u65e5\u8a18.md": "J"}),
            IncomingFile("m.md", "ab" * 32, 5, 0)]
    report = ingest(st, "m1", "notes", "markdown", sent)
    assert sorted((r["path"], r["reason"]) for r in report.refused) == [
        ("../up.md", "bad-path"), ("a.md", "collision"), ("m.md", "missing-body")]
    accepted = {"z.md": "Z", "caf\u00e9.md": "E", "A.md": "A1", "b/x.md": "X",
                "\u65e5\u8a18.md": "J"}
    expected = digest_of((p, sha256_text(t)) for p, t in accepted.items())
    assert st.namespace_digest("m1", "notes") == expected
    assert exported(st, "machines/m1/notes/") == {f"machines/m1/notes/{p}": t
                                                   for p, t in accepted.items()}


def test_a_snapshot_naming_stored_bodies_reads_their_sizes_in_few_queries(st: Store) -> None:
    # Sent again whole, a namespace's own files take their sizes from their rows; bodies that
    # other files hold are read a few hundred at a time; an unknown one is a missing body.
    mine = {f"{i:04d}.md": f"mine {i}" for i in range(600)}
    theirs = {f"{i:04d}.md": f"theirs {i}" * 3 for i in range(700)}
    ingest(st, "m1", "notes", "markdown", files(mine))
    ingest(st, "m2", "notes", "markdown", files(theirs))
    sent = [IncomingFile(p, sha256_text(t), 0, 0) for p, t in mine.items()]
    sent += [IncomingFile(f"t/{p}", sha256_text(t), 0, 0) for p, t in theirs.items()]
    sent.append(IncomingFile("gone.md", "ab" * 32, 3, 0))
    statements: list[str] = []
    st.conn.set_trace_callback(statements.append)
    report = ingest(st, "m1", "notes", "markdown", sent)
    st.conn.set_trace_callback(None)
    assert [r["path"] for r in report.refused] == ["gone.md"] and report.accepted == 1300
    assert len([s for s in statements if "FROM blobs" in s]) == 2  # 701 bodies, 500 a query
    size = sum(len(t.encode()) for t in [*mine.values(), *theirs.values()])
    assert st.conn.execute("SELECT file_count, byte_count FROM namespaces WHERE machine='m1'"
                           ).fetchone() == (1300, size)
    assert st.conn.execute("SELECT sum(size) FROM files f JOIN namespaces n ON n.id = "
                           "f.namespace_id WHERE n.machine='m1'").fetchone() == (size,)


def test_a_delta_digest_listed_by_sqlite_is_the_digest_of_the_whole_namespace(st: Store) -> None:
    # A delta's digest comes from SQLite's path order; the client computes it from Python's
    # sorted strings. Names whose UTF-8 bytes and punctuation test that the two orders agree.
    names = ["a.md", "a/b.md", "a-b.md", "a b.md", "Z.md", "é.md", "ß.md", "日本/x.md", "z/~.md",
             "ab.md", "A.MD.md", "\u00e9t\u00e9.md", "\U0001f600.md", "a/é/c.md"]
    state = {name: f"text of {name}" for name in names}
    ingest(st, "m1", "notes", "markdown", files(dict(list(state.items())[::2])))
    base = st.namespace_digest("m1", "notes")
    sent = dict(list(state.items())[1::2]) | {"a.md": "changed"}
    report = ingest(st, "m1", "notes", "markdown", files(sent), removed=["Z.md"], base_digest=base)
    assert report.refused == []
    state |= sent
    del state["Z.md"]
    expected = digest_of((p, sha256_text(t)) for p, t in state.items())
    assert st.namespace_digest("m1", "notes") == expected
    assert report.accepted == len(state) == st.namespaces().machines[0].files
    assert st.namespaces().machines[0].bytes == sum(len(t.encode()) for t in state.values())


def test_a_delta_stored_as_listed_takes_its_manifests_digest_unlisted(st: Store) -> None:
    state = {f"{i}.md": f"text {i}" for i in range(20)}
    ingest(st, "m1", "notes", "markdown", files(state))
    base = st.namespace_digest("m1", "notes")
    changed = {"3.md": "three", "new.md": "new"}
    after = {p: t for p, t in (state | changed).items() if p != "7.md"}
    claimed = digest_of((p, sha256_text(t)) for p, t in after.items())
    statements: list[str] = []
    st.conn.set_trace_callback(statements.append)
    report = ingest(st, "m1", "notes", "markdown", files(changed), removed=["7.md"],
                    base_digest=base, digest=claimed)
    st.conn.set_trace_callback(None)
    assert report.refused == [] and report.stored == {}
    assert st.namespace_digest("m1", "notes") == claimed
    assert not [s for s in statements if "group_concat" in s]  # the namespace is not listed
    assert exported(st, "machines/m1/notes/") == {f"machines/m1/notes/{p}": t
                                                   for p, t in after.items()}


def test_a_whole_manifest_stored_as_listed_takes_the_digest_it_names(st: Store) -> None:
    named = "c" * 64  # not the files' digest: the client's word is taken, as documented
    ingest(st, "m1", "notes", "markdown", files({"a.md": "A", "b.md": "B"}), digest=named)
    assert st.namespace_digest("m1", "notes") == named
    report = ingest(st, "m1", "notes", "markdown", files({"a.md": "A", "../b.md": "B"}),
                    digest=named)
    assert report.refused
    assert st.namespace_digest("m1", "notes") == digest_of([("a.md", sha256_text("A"))])


@pytest.mark.parametrize("case", ["refused", "redacted"])
def test_a_delta_not_stored_as_listed_lists_its_digest(st: Store, case: str) -> None:
    # The manifest's digest names what the client sent: with a file refused, or stored as the
    # server's redaction left it, the namespace holds something else.
    ingest(st, "m1", "notes", "markdown", files({"a.md": "A", "b.md": "B"}))
    base = st.namespace_digest("m1", "notes")
    text = "../up" if case == "refused" else "token = 'Zq8vN2mL" + "p4Rt7Ws1Kd3'\n"
    sent = ([*files({"c.md": "C"}), *files({"../up.md": "U"})] if case == "refused"
            else [IncomingFile("c.md", sha256_text(text), len(text), 0, text, None)])
    claimed = digest_of([("a.md", sha256_text("A")), ("b.md", sha256_text("B")),
                         ("c.md", sha256_text("C" if case == "refused" else text))]
                        + ([("../up.md", sha256_text("U"))] if case == "refused" else []))
    report = ingest(st, "m1", "notes", "markdown", sent, base_digest=base, digest=claimed)
    assert report.refused if case == "refused" else report.stored
    held = {p: sha256_text(t) for p, t in exported(st, "machines/m1/notes/").items()}
    expected = digest_of((p.removeprefix("machines/m1/notes/"), sha) for p, sha in held.items())
    assert st.namespace_digest("m1", "notes") == expected != claimed


def test_a_delta_counts_the_kept_files_towards_the_quota(st: Store) -> None:
    limits = Limits(file_bytes=100, namespace_bytes=20, namespace_files=3)
    ingest(st, "m1", "notes", "markdown", files({"a.md": "a" * 5, "b.md": "b" * 5}), limits=limits)
    base = st.namespace_digest("m1", "notes")
    report = ingest(st, "m1", "notes", "markdown",
                       files({"a.md": "A" * 9, "c.md": "c" * 5, "d.md": "d"}),
                       base_digest=base, limits=limits)
    assert [(r["path"], r["reason"]) for r in report.refused] == [("d.md", "quota")]
    assert exported(st) == {"machines/m1/notes/a.md": "A" * 9, "machines/m1/notes/b.md": "b" * 5,
                            "machines/m1/notes/c.md": "c" * 5}
    base = st.namespace_digest("m1", "notes")
    report = ingest(st, "m1", "notes", "markdown", files({"e.md": "e" * 6}), base_digest=base,
                       limits=limits)
    assert [(r["path"], r["reason"]) for r in report.refused] == [("e.md", "quota")]
    report = ingest(st, "m1", "notes", "markdown", files({"e.md": "e" * 6}), removed=["c.md"],
                       base_digest=base, limits=limits)
    assert report.refused == [] and report.accepted == 3
    roomy = Limits(file_bytes=100, namespace_bytes=20, namespace_files=100)  # 20 bytes held
    report = ingest(st, "m1", "notes", "markdown", files({"f.md": "f"}),
                       base_digest=st.namespace_digest("m1", "notes"), limits=roomy)
    assert [(r["path"], r["reason"]) for r in report.refused] == [("f.md", "quota")]


def test_delta_refuses_a_new_name_that_clashes_with_a_kept_one(st: Store) -> None:
    ingest(st, "m1", "notes", "markdown", files({"Readme.md": "R", "b.md": "B", "straße.md": "S"}))
    base = st.namespace_digest("m1", "notes")
    report = ingest(st, "m1", "notes", "markdown",
                       files({"README.md": "new", "STRASSE.md": "new", "b.md": "B2",
                              "c.md": "C", "C.md": "C2"}), base_digest=base)
    assert {r["path"]: r["reason"] for r in report.refused} == {
        "README.md": "collision", "STRASSE.md": "collision", "c.md": "collision"}
    assert exported(st) == {"machines/m1/notes/Readme.md": "R", "machines/m1/notes/b.md": "B2",
                            "machines/m1/notes/straße.md": "S", "machines/m1/notes/C.md": "C2"}
    again = st.namespace_digest("m1", "notes")
    report = ingest(st, "m1", "notes", "markdown", files({"b.md": "B3"}), base_digest=again)
    assert report.refused == [] and exported(st)["machines/m1/notes/b.md"] == "B3"


def test_unchanged_reingest_keeps_the_generation(st: Store) -> None:
    first = ingest(st, "m1", "notes", "markdown", files({"a.md": "A", "b.md": "B"}))
    ingest(st, "m2", "notes", "markdown", files({"a.md": "A"}))
    again = ingest(st, "m1", "notes", "markdown", files({"b.md": "B", "a.md": "A"}))
    assert again.unchanged and again.generation == first.generation and again.accepted == 2
    delta = ingest(st, "m1", "notes", "markdown", [], base_digest=st.namespace_digest("m1", "notes"))
    assert delta.unchanged and delta.generation == first.generation
    assert st.touch("m1", "notes") == first.generation
    assert st.touch("m9", "notes") is None
    changed = ingest(st, "m1", "notes", "markdown", files({"a.md": "A"}))
    assert not changed.unchanged and changed.generation > first.generation


def test_a_body_stored_ahead_is_used_and_one_gone_since_is_refused(st: Store) -> None:
    kept, gone = "stored as it arrived: é, 日本", "stored, then dropped by another session"
    rows = [(sha256_text(t), len(t.encode()), t.encode()) for t in (kept, gone)]
    assert st.put_blobs(rows) == sorted([sha256_text(kept), sha256_text(gone)])
    assert {r[0] for r in st.conn.execute("SELECT typeof(body) FROM blobs")} == {"text"}
    assert st.put_blobs([(sha256_text(kept), len(kept.encode()), kept.encode())]) == []  # there already
    assert st.conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL again after it
    with st.transaction() as conn:  # another process took this session for dead, collected it
        conn.execute("DELETE FROM sessions")
        conn.execute("DELETE FROM blobs WHERE sha256=?", (sha256_text(gone),))
    report = ingest(st, "m1", "notes", "markdown", [
        IncomingFile("a.md", sha256_text(kept), len(kept.encode()), 0, None, {}),
        IncomingFile("b.md", sha256_text(gone), len(gone.encode()), 0, None, {})])
    assert report.accepted == 1
    assert [r["reason"] for r in report.refused] == ["missing-body"]
    assert exported(st) == {"machines/m1/notes/a.md": kept}
    st.collect(strays=True, now=2**40)  # used by a file: kept
    assert exported(st) == {"machines/m1/notes/a.md": kept} and st.verify() == []


def test_a_namespace_commit_is_not_fsynced_but_a_note_is(st: Store) -> None:
    # A namespace is a copy the client redoes; a note is deleted from the client's outbox once
    # stored. SQLite counts a commit's syncs in neither, so watch the setting each one ran with.
    seen: list[int] = []
    st.conn.set_trace_callback(
        lambda sql: seen.append(st.conn.execute("PRAGMA synchronous").fetchone()[0])
        if sql == "COMMIT" else None)
    ingest(st, "m1", "notes", "markdown", files({"a.md": "A"}))
    st.append_note("m1", "2026-11-30T09-00-00-x.md", "a note")
    st.conn.set_trace_callback(None)
    assert seen == [1, 2]  # NORMAL, then FULL
    assert st.conn.execute("PRAGMA synchronous").fetchone()[0] == 2


def test_the_file_limit_holds_for_a_body_the_store_already_has(st: Store) -> None:
    # An orphan of a killed session, or a body stored under a larger limit: a manifest naming
    # it by sha256 alone must not slip past the file limit.
    big, small = "b" * 2000, "small"
    st.put_blobs([(sha256_text(t), len(t), t.encode()) for t in (big, small)])
    report = ingest(st, "m1", "notes", "markdown", [
        IncomingFile("big.md", sha256_text(big), 10, 0), IncomingFile("ok.md", sha256_text(small))],
        limits=Limits(file_bytes=1000))
    assert [(r["path"], r["reason"]) for r in report.refused] == [("big.md", "too-large")]
    assert "is 2000 bytes, over the 1000-byte file limit" in report.refused[0]["message"]
    assert st.manifest() == {"machines/m1/notes/ok.md": sha256_text(small)}


def test_refusals_decided_as_the_bodies_came(st: Store) -> None:
    limits = Limits(file_bytes=10)
    report = ingest(st, "m1", "notes", "markdown", [
        IncomingFile("a.md", "a" * 64, 50, 0, refused="too-large"),
        IncomingFile("b.md", "b" * 64, 5, 0, refused="quota"),
        IncomingFile("../d.md", "d" * 64, 50, 0, refused="too-large"),  # the path rule first
        *files({"e.md": "kept"})], limits=limits)
    assert {r["path"]: (r["reason"], r["message"]) for r in report.refused} == {
        "a.md": ("too-large", "'a.md' is 50 bytes, over the 10-byte file limit"),
        "b.md": ("quota", f"'b.md' is past the namespace quota ({limits.namespace_files} files, "
                          f"{limits.namespace_bytes} bytes)"),
        "../d.md": ("bad-path", report.refused[0]["message"])}
    assert exported(st) == {"machines/m1/notes/e.md": "kept"}
    assert st.counts()["blobs"] == 1


def test_a_body_stored_redacted_as_it_arrived(st: Store) -> None:
    sent = f"key {GITHUB_TOKEN}"
    clean = "key [REDACTED:github-token]"
    st.put_blobs([(sha256_text(clean), len(clean), clean.encode())])
    report = ingest(st, "m1", "notes", "markdown", [
        IncomingFile("a.md", sha256_text(sent), len(clean), 0, None, {"github-token": 1},
                     sha256_text(clean))])
    assert report.accepted == 1 and report.redacted == {"github-token": 1}
    assert report.stored == {"a.md": sha256_text(clean)}
    assert exported(st) == {"machines/m1/notes/a.md": clean} and st.verify() == []


def test_a_machine_has_totals_over_all_its_namespaces(st: Store) -> None:
    limits = Limits(machine_files=3, machine_bytes=30, machine_namespaces=3)
    ingest(st, "m1", "a", "markdown", files({"1.md": "a" * 10, "2.md": "b" * 10}), limits=limits)
    ingest(st, "m2", "a", "markdown", files({"1.md": "x" * 25}), limits=limits)  # not m1's
    report = ingest(st, "m1", "b", "markdown", files({"1.md": "c" * 5, "2.md": "d"}),
                    limits=limits)
    assert [(r["path"], r["reason"]) for r in report.refused] == [("2.md", "machine-quota")]
    message = report.refused[0]["message"]
    assert ("would take machine 'm1' past its total over all its namespaces (3 files, 30 bytes; "
            "its other 1 namespaces hold 2 files, 20 bytes)") in message
    assert "forget --store STORE --machine m1 --source NAME" in message
    assert "serve --limit machine_bytes=N --limit machine_files=N" in message
    report = ingest(st, "m1", "b", "markdown", files({"1.md": "c" * 11}), limits=limits)
    assert [r["reason"] for r in report.refused] == ["machine-quota"]  # 31 bytes
    # A namespace re-published counts itself once: shrinking it makes room elsewhere.
    ingest(st, "m1", "a", "markdown", files({"1.md": "a"}), limits=limits)
    report = ingest(st, "m1", "b", "markdown", files({"1.md": "c" * 11, "2.md": "d"}),
                    limits=limits)
    assert report.refused == [] and report.accepted == 2
    base = st.namespace_digest("m1", "b")
    report = ingest(st, "m1", "b", "markdown", files({"3.md": "e"}), base_digest=base,
                    limits=limits)  # a delta: its kept files count too
    assert [r["reason"] for r in report.refused] == ["machine-quota"]
    ingest(st, "m1", "c", "markdown", [], limits=limits)
    report = ingest(st, "m1", "d", "markdown", files({"1.md": "x"}), limits=limits)
    assert report.accepted == 0 and report.generation == 0
    assert [r["reason"] for r in report.refused] == ["machine-quota"]
    assert "machine 'm1' already has 3 namespaces" in report.refused[0]["message"]
    assert "serve --limit machine_namespaces=N" in report.refused[0]["message"]
    assert st.namespace_digest("m1", "d") is None and st.verify() == []


def test_a_refusal_message_is_cut_however_long_the_path(st: Store) -> None:
    path = "\x01" * 5000 + ".md"
    report = ingest(st, "m1", "notes", "markdown", [IncomingFile(path, text="x")])
    refusal = report.refused[0]
    assert refusal["path"] == path and refusal["reason"] == "bad-path"
    assert len(refusal["message"]) == MAX_MESSAGE_CHARS and refusal["message"].endswith("…")
