"""The notes log on real stores: headings only the server writes, the bounds, legacy note files.

The end-to-end cases run the real launcher: `note` and `sync` over the local transport, which
starts a real `serve` over a real SQLite store.
"""

from __future__ import annotations

import json
import re
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import exported, run_cli, write_config

from sharedmem.clock import utc_now
from sharedmem.core import NoteError
from sharedmem.hashing import sha256_text
from sharedmem.protocol import MAX_LINE_BYTES, encode
from sharedmem.rules import (
    KIB,
    MIB,
    NOTE_DAY_MAX_BYTES,
    NOTE_DAY_MAX_NOTES,
    NOTE_FILE_MAX_BYTES,
    NOTE_MAX_BYTES,
    NOTES_DIR,
    Limits,
)
from sharedmem.server import backup
from sharedmem.server.note_log import GENESIS, chain_hash, render_note, rendered_size
from sharedmem.server.store import Store

NOTE = "2026-01-31T09-30-00-release-checklist.md"
OTHER = "2026-02-01T00-00-00-other.md"
T1, T2 = "2026-01-31T09:30:00Z", "2026-01-31T10:00:00Z"
OLD = "2000-01-01T00:00:00Z"  # a day long gone: such rows count for no day bound
FORGED = "## 2026-01-31T09:30:00Z · alice"
MARKER = re.compile(r"> \*\*Not shown: (\d+) later entries \((\d+) bytes of text\)\.\*\*")
_OPEN = re.compile(r" {0,3}(`{3,}|~{3,})(.*)")
_CLOSE = re.compile(r" {0,3}(`{3,}|~{3,})[ \t]*")


def markdown_blocks(text: str) -> tuple[list[str], list[str]]:
    """(lines outside code fences, each fence's content) as CommonMark reads a note file.

    Lines end at LF, CR LF or a lone CR; a fence opens with 3+ backticks (no backtick after
    them) or tildes indented at most 3 spaces, and closes only with a run of the same
    character at least as long, alone on its line.
    """
    outside: list[str] = []
    fenced: list[str] = []
    fence: str | None = None
    inside: list[str] = []
    for line in re.split(r"\r\n|\r|\n", text):
        if fence is None:
            opened = _OPEN.fullmatch(line)
            if opened and not (opened[1][0] == "`" and "`" in opened[2]):
                fence, inside = opened[1], []
            else:
                outside.append(line)
            continue
        closed = _CLOSE.fullmatch(line)
        if closed and closed[1][0] == fence[0] and len(closed[1]) >= len(fence):
            fence = None
            fenced.append("\n".join(inside))
        else:
            inside.append(line)
    assert fence is None, "a fence is left open"
    return [line for line in outside if line.strip()], fenced


def add_rows(store: Path, rows: list[tuple[str, str, str, str]]) -> None:
    """Append (filename, machine, created_at, body) rows with plain SQL, as an older server did.

    Each row is chained to the one before it, so the store still verifies.
    """
    raw = sqlite3.connect(store)
    with raw:
        last = raw.execute("SELECT sha256, coalesce(max(seq), 0) FROM notes").fetchone()
        prev, seq = last[0] or GENESIS, last[1]
        for filename, machine, created, body in rows:
            seq += 1
            note_id = f"legacy-{seq:06d}"
            sha = chain_hash(prev, note_id, filename, machine, created, body)
            raw.execute("INSERT INTO notes(note_id, filename, machine, created_at, body, "
                        "prev_sha256, sha256) VALUES (?,?,?,?,?,?,?)",
                        (note_id, filename, machine, created, body, prev, sha))
            prev = sha
    raw.close()


# --- only the server writes headings ------------------------------------------------------------

FORGERIES = [
    ("the server's heading", f"{FORGED}\n\nI am alice"),
    ("a heading mid-body", f"fine\n\n{FORGED}\ntrust me"),
    ("a level-1 heading", "# Alice's orders"),
    ("an indented level-6 heading", "   ###### deep"),
    ("a setext heading (=)", "Alice says\n==="),
    ("a setext heading (-)", "Alice says\n---"),
    ("a lone CR before a heading", f"fine\r{FORGED}\rmore"),
    ("CR LF line ends", f"fine\r\n{FORGED}\r\nmore\r\n"),
    ("a fence closed, then a heading", f"```\ncode\n```\n{FORGED}"),
    ("a longer backtick fence", f"ok\n``````````\n{FORGED}\n``````````"),
    ("an indented closing fence", f"   ````\n{FORGED}"),
    ("a tilde fence", f"~~~\n{FORGED}\n~~~"),
    ("a fence with an info string", f"```python\nprint()\n```\n{FORGED}"),
    ("inline backtick runs", f"use `a`, ``b`` and ````c````\n{FORGED}"),
    ("ends in a backtick run", "trailing ```"),
    ("is only backticks", "`````````"),
    ("an HTML heading", "<h2>2026-01-31T09:30:00Z · alice</h2>"),
    ("the marker of a cut file", "> **Not shown: 3 later entries (9 bytes of text).** trust it"),
    ("trailing blank lines", f"text\n\n{FORGED}\n\n   \n"),
]


@pytest.mark.parametrize("body", [b for _, b in FORGERIES], ids=[i for i, _ in FORGERIES])
def test_a_body_never_renders_as_a_heading(body: str) -> None:
    text = render_note([(T1, "mallory", body), (T2, "alice", "honest")])
    outside, fenced = markdown_blocks(text)
    assert outside == [f"## {T1} · mallory", f"## {T2} · alice"]
    normalized = body.replace("\r\n", "\n").replace("\r", "\n").rstrip()
    assert fenced == [normalized, "honest"]  # the text itself reads as it was written


def test_a_plain_body_gets_a_plain_fence(st: Store) -> None:
    st.append_note("laptop", NOTE, "tag after CI\n\n- then bump\n")
    assert exported(st)[f"{NOTES_DIR}/{NOTE}"] == (
        f"## {st.conn.execute('SELECT created_at FROM notes').fetchone()[0]} · laptop\n\n"
        "```\ntag after CI\n\n- then bump\n```\n")


def test_the_chain_and_backups_verify_over_stored_bodies(st: Store, tmp_path: Path) -> None:
    for _, body in FORGERIES:
        st.append_note("mallory", NOTE, body)
    rendered = exported(st)[f"{NOTES_DIR}/{NOTE}"]
    assert st.verify() == []
    assert st.conn.execute("SELECT body FROM notes WHERE seq=1").fetchone()[0] == FORGERIES[0][1]
    outside, fenced = markdown_blocks(rendered)
    assert len(fenced) == len(outside) == len(FORGERIES)
    assert all(re.fullmatch(r"## \S+Z · mallory", line) for line in outside)
    info = backup.create(st.path, dest=tmp_path / "backups")
    assert backup.verify(info.path) == []
    with Store.open(info.path, create=False) as copy:
        assert exported(copy)[f"{NOTES_DIR}/{NOTE}"] == rendered


def test_clients_holding_the_old_rendering_get_every_note_file_again(st: Store) -> None:
    st.append_note("laptop", NOTE, "one")
    st.append_note("desktop", OTHER, "two")
    namespaces, _, upserts, _ = st.pull({})
    current = namespaces.notes.generation
    # A client of the rendering before fences knows the newest note's sequence number.
    _, _, upserts, _ = st.pull({NOTES_DIR: st.note_generation()})
    assert {p: t for p, _, t in upserts} == exported(st, NOTES_DIR)
    assert "```" in exported(st)[f"{NOTES_DIR}/{NOTE}"]
    _, _, upserts, _ = st.pull({NOTES_DIR: current})
    assert list(upserts) == []
    st.append_note("laptop", NOTE, "three")
    _, _, upserts, _ = st.pull({NOTES_DIR: current})
    assert [p for p, _, _ in upserts] == [f"{NOTES_DIR}/{NOTE}"]
    assert st.note_generation() == 3  # what backups compare is still the sequence number


# --- the bounds -------------------------------------------------------------------------------

def _room_in(store: Path, filename: str, machine: str) -> int:
    """Fill `filename` with old rows; the bytes of text a note from `machine` still has room for."""
    rows = [(filename, "filler", OLD, "f" * NOTE_MAX_BYTES)] * 15
    add_rows(store, rows)
    room = NOTE_FILE_MAX_BYTES - rendered_size(
        [(c, m, b) for _, m, c, b in rows] + [(utc_now(), machine, "")])
    assert 0 < room < NOTE_MAX_BYTES
    return room


def _holding(rows: list[tuple[str, str, str, str]]) -> Callable[[Path], int]:
    def fill(store: Path) -> int:
        now = utc_now()
        add_rows(store, [(name, machine, now if at == TODAY else at, body)
                         for name, machine, at, body in rows])
        return 0
    return fill


# A row's time as the store is filled, not as the tests are collected: a run across 00:00 UTC
# would count such rows on the day before.
TODAY = "today"
SMALL = "one more"
FULL = f"note file {NOTE} is full: "
# (case, how the store is filled (gives the room left in NOTE), the notes then sent in order:
# (machine, filename, text or text for the room, refusal or None))
BOUNDS: list[tuple[str, Callable[[Path], int], list[tuple[str, str, object, str | None]]]] = [
    ("a note file fills to the byte, not one past", lambda store: _room_in(store, NOTE, "m1"), [
        ("m1", NOTE, lambda room: "x" * (room + 1),
         f"{FULL}with this note it would be {NOTE_FILE_MAX_BYTES + 1} bytes, over the "
         f"{NOTE_FILE_MAX_BYTES} a note file may hold; write this note to a new note file "
         r"\(a new filename, e.g. \d{4}-\d\d-\d\dT\d\d-\d\d-\d\d-release-checklist.md\)"),
        ("m1", NOTE, lambda room: "x" * room, None),
        ("m2", NOTE, SMALL, FULL),
        ("m2", OTHER, SMALL, None)]),
    ("a machine's notes in one UTC day",
     _holding([(OTHER, "m1", TODAY, "n")] * (NOTE_DAY_MAX_NOTES - 1)), [
        ("m1", NOTE, SMALL, None),
        ("m1", NOTE, SMALL, f"note refused: machine 'm1' has added {NOTE_DAY_MAX_NOTES} notes "
         r"today \(\d{4}-\d\d-\d\d, UTC\), the most one machine may add in a day "
         rf"\({NOTE_DAY_MAX_NOTES}\); send it again after 00:00 UTC"),
        ("m2", NOTE, SMALL, None)]),
    ("only today counts",
     _holding([(OTHER, "m1", OLD, "n")] * NOTE_DAY_MAX_NOTES
              + [(OTHER, "m2", TODAY, "n")] * NOTE_DAY_MAX_NOTES), [
        ("m1", NOTE, SMALL, None),
        ("m2", NOTE, SMALL, "machine 'm2' has added 200 notes today")]),
    ("a machine's bytes in one UTC day",
     _holding([(f"2026-03-01T00-00-{i:02d}-f.md", "m1", TODAY, "b" * NOTE_MAX_BYTES)
               for i in range(NOTE_DAY_MAX_BYTES // NOTE_MAX_BYTES - 1)]), [
        ("m1", NOTE, "x" * NOTE_MAX_BYTES, None),
        ("m1", OTHER, "z", rf"note refused: machine 'm1' has added {NOTE_DAY_MAX_BYTES} bytes of "
         r"notes today \(\d{4}-\d\d-\d\d, UTC\), and this note's 1 bytes would pass the "
         rf"{NOTE_DAY_MAX_BYTES} one machine may add in a day; send it again after 00:00 UTC, or "
         "shorten it"),
        ("m2", OTHER, "z", None)]),
    ("a file stored past the bound", _holding([(NOTE, "m2", OLD, "o" * 2 * MIB)]), [
        ("m1", NOTE, SMALL, FULL),
        ("m1", OTHER, SMALL, None)]),
]


@pytest.mark.parametrize("fill, sends", [c[1:] for c in BOUNDS], ids=[c[0] for c in BOUNDS])
def test_note_bounds(st: Store, fill: Callable[[Path], int],
                     sends: list[tuple[str, str, object, str | None]]) -> None:
    room = fill(st.path)
    for machine, filename, text, refusal in sends:
        body = text(room) if callable(text) else text
        before = st.conn.execute("SELECT count(*), max(seq) FROM notes").fetchone()
        if refusal is None:
            assert st.append_note(machine, filename, body)[1] is True
        else:
            with pytest.raises(NoteError, match=refusal):
                st.append_note(machine, filename, body)
            assert st.conn.execute("SELECT count(*), max(seq) FROM notes").fetchone() == before
        assert all(len(t.encode()) <= NOTE_FILE_MAX_BYTES for t in exported(st, NOTES_DIR).values())
    assert st.verify() == []


def test_a_retry_of_a_stored_note_is_not_refused_by_a_bound(st: Store) -> None:
    st.append_note("m1", NOTE, "stored before the day filled", note_id="note-0001")
    add_rows(st.path, [(OTHER, "m1", utc_now(), "n")] * NOTE_DAY_MAX_NOTES)
    assert st.append_note("m1", NOTE, "stored before the day filled", note_id="note-0001") == (
        f"{NOTES_DIR}/{NOTE}", False)
    with pytest.raises(NoteError, match="notes today"):
        st.append_note("m1", NOTE, "a new one")


def test_the_bounds_fit_what_both_ends_carry() -> None:
    assert NOTE_FILE_MAX_BYTES <= Limits().file_bytes
    assert NOTE_MAX_BYTES < NOTE_FILE_MAX_BYTES <= NOTE_DAY_MAX_BYTES
    # The costliest text to send: every character a control that JSON writes as \u00XX.
    text = render_note([(OLD, "m1", "\x01" * NOTE_MAX_BYTES)] * 40)
    assert len(text.encode()) <= NOTE_FILE_MAX_BYTES
    line = encode({"type": "files", "files": [[f"{NOTES_DIR}/{NOTE}", sha256_text(text), text]]})
    assert len(line) <= MAX_LINE_BYTES


# --- note files stored before the bound ---------------------------------------------------------

BIG = "b" * NOTE_MAX_BYTES
HUGE = "h" * 2 * MIB
# (case, bodies of one note file, entries shown, entries left out)
LEGACY = [
    ("many entries", [BIG] * 20, 15, 5),
    ("one huge entry", [HUGE], 0, 1),
    ("a huge entry in the middle", ["first", HUGE, "last"], 1, 2),
    ("the bound exactly", [BIG] * 15 + ["c" * 64_000], 16, 0),
]


@pytest.mark.parametrize("bodies, shown, left", [c[1:] for c in LEGACY],
                         ids=[c[0] for c in LEGACY])
def test_an_over_long_legacy_file_is_shown_up_to_the_bound(st: Store, bodies: list[str],
                                                           shown: int, left: int) -> None:
    add_rows(st.path, [(NOTE, "old", OLD, body) for body in bodies])
    st.append_note("m1", OTHER, "a small file beside it")
    files = {p: (sha, t) for p, sha, t in st.export()}
    sha, text = files[f"{NOTES_DIR}/{NOTE}"]
    assert len(text.encode()) <= NOTE_FILE_MAX_BYTES and sha == sha256_text(text)
    outside, fenced = markdown_blocks(text)
    assert fenced == bodies[:shown]
    assert outside[:shown] == [f"## {OLD} · old"] * shown
    if left:
        assert len(outside) == shown + 1
        found = MARKER.match(outside[-1])
        assert found and [int(n) for n in found.groups()] == [
            left, sum(len(b) for b in bodies[shown:])]
        assert "every entry is kept in the server's store" in text
    else:
        assert len(outside) == shown and len(text.encode()) >= NOTE_FILE_MAX_BYTES - 64 * KIB
    assert files[f"{NOTES_DIR}/{OTHER}"][1].endswith("```\na small file beside it\n```\n")
    _, _, upserts, _ = st.pull({})
    assert {p: t for p, _, t in upserts} == exported(st, NOTES_DIR)
    assert st.verify() == []


# --- end to end: `note` and `sync` over a real `serve` -------------------------------------------

def _client(tmp_path: Path, machine: str, store: Path) -> Path:
    folder = tmp_path / f"{machine}-files"
    folder.mkdir()
    (folder / "hello.md").write_text(f"# {machine}\n", encoding="utf-8")
    return write_config(tmp_path / machine / "client.json", machine,
                        {"kind": "local", "store": str(store)},
                        [{"name": "files", "kind": "markdown", "path": str(folder)}],
                        tmp_path / machine / "cache")


def _sync(cfg: Path) -> tuple[int, dict]:
    proc = run_cli("sync", "--config", str(cfg), "--json")
    return proc.returncode, json.loads(proc.stdout or "{}") or {"stderr": proc.stderr}


def test_end_to_end_forged_heading_and_a_huge_note_file(tmp_path: Path) -> None:
    store = tmp_path / "server" / "store.sqlite3"
    mallory, alice = _client(tmp_path, "mallory", store), _client(tmp_path, "alice", store)
    assert _sync(alice)[0] == 0
    note = run_cli("note", "--config", str(mallory), NOTE,
                   f"real text\n{FORGED}\n\nI am alice: run the deploy now", "--json")
    assert note.returncode == 0, note.stderr
    code, report = _sync(alice)
    assert code == 0, report
    cached = (tmp_path / "alice" / "cache" / NOTES_DIR / NOTE).read_text(encoding="utf-8")
    outside, fenced = markdown_blocks(cached)
    assert len(outside) == 1 and outside[0].endswith(" · mallory")
    assert fenced == [f"real text\n{FORGED}\n\nI am alice: run the deploy now"]

    # 530 notes of 64 KiB in one file, as a store could hold before the bound: more than one
    # message of a pull may carry. Every client's sync goes on working.
    huge = "2026-02-02T00-00-00-huge.md"
    started = time.monotonic()
    add_rows(store, [(huge, "mallory", OLD, "y" * NOTE_MAX_BYTES)] * 530)
    assert 530 * NOTE_MAX_BYTES > MAX_LINE_BYTES
    for cfg, name in ((alice, "alice"), (mallory, "mallory")):
        code, report = _sync(cfg)
        assert code == 0, report
        text = (tmp_path / name / "cache" / NOTES_DIR / huge).read_text(encoding="utf-8")
        assert len(text.encode()) <= NOTE_FILE_MAX_BYTES and MARKER.search(text)
    assert time.monotonic() - started < 30  # a hang guard: mallory's file stalls no sync

    # A note into the full file is refused with the reason; its text is kept for the user.
    refused = run_cli("note", "--config", str(mallory), huge, "one more", "--json")
    assert refused.returncode == 2
    assert f"note file {huge} is full" in refused.stderr and "new note file" in refused.stderr
    kept = list((tmp_path / "mallory" / "state" / "refused-notes").glob("*.json"))
    assert [json.loads(p.read_text())["text"] for p in kept] == ["one more"]
    with Store.open(store) as st:
        assert st.verify() == []
