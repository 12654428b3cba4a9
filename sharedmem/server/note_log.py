"""The notes log: append-only entries, their hash chain and bounds, and the note files they render.

Only the server writes an entry's heading (`## <time> · <machine>`): each body is rendered in a
code fence that no line of it can close, so text that looks like a heading stays text
(docs/PROVENANCE.md). The chain hash covers the stored body, not its rendering, so the
rendering can change without touching the chain. `Store` holds the connection and the one
transaction helper; these functions work inside what it opens.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterable, Iterator

from sharedmem.clock import utc_now
from sharedmem.core import NoteError
from sharedmem.hashing import sha256_text
from sharedmem.rules import (
    NOTE_DAY_MAX_BYTES,
    NOTE_DAY_MAX_NOTES,
    NOTE_FILE_MAX_BYTES,
    NOTES_DIR,
    check_machine_name,
)

GENESIS = "0" * 64
# How note files are rendered: 1 put bodies under their headings as they were, 2 fences them.
# The notes namespace's generation is its base plus the newest note's sequence number. The base
# is RENDERING * GENERATION_STEP, plus meta's `notes_epoch` once a restore moved it past every
# generation a client may have seen (the restore rewinds the sequence numbers). A client whose
# generation is not one of this base's (an older rendering, another epoch, or one a restore
# took back) is sent every note file, whole (`since`).
RENDERING = 2
GENERATION_STEP = 10**12

_BACKTICKS = re.compile(r"`+")


def chain_hash(prev: str, note_id: str, filename: str, machine: str, created: str,
               body: str) -> str:
    """The hash that links a note entry to its predecessor, so a rewrite is detectable."""
    return sha256_text("\n".join((prev, note_id, filename, machine, created, body)))


def render_entry(created: str, machine: str, body: str) -> str:
    """One entry: the server's heading, then the body in a fence longer than any backtick run in it.

    A fenced line is never a heading, and only a backtick run at least as long as the fence can
    close it. Every line break becomes LF (a lone CR is one in Markdown, and a terminal shows
    the text after it over the line before).
    """
    text = body.replace("\r\n", "\n").replace("\r", "\n").rstrip()
    longest = max((len(run) for run in _BACKTICKS.findall(text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"## {created} · {machine}\n\n{fence}\n{text}\n{fence}\n"


def render_note(entries: Iterable[tuple[str, str, str]]) -> str:
    """A note file: every (created_at, machine, body) entry in order, at most NOTE_FILE_MAX_BYTES.

    A file stored before that bound (or by hand) is shown up to it: its first entries, then a
    marker naming how many entries and bytes are left out. The store keeps them all.
    """
    shown: list[tuple[str, int, int]] = []  # (rendered entry, its bytes + a separator, body bytes)
    size = 0
    rest = iter(entries)
    for created, machine, body in rest:
        part = render_entry(created, machine, body)
        shown.append((part, len(part.encode("utf-8")) + 1, len(body.encode("utf-8"))))
        size += shown[-1][1]
        if size - 1 > NOTE_FILE_MAX_BYTES:
            break
    else:
        return "\n".join(part for part, _, _ in shown)
    left = left_bytes = 0
    reserve = len(_marker(10**15, 10**15).encode("utf-8"))  # room for any counts
    while shown and size + reserve > NOTE_FILE_MAX_BYTES:
        _, cost, body_bytes = shown.pop()
        size -= cost
        left, left_bytes = left + 1, left_bytes + body_bytes
    for _, _, body in rest:
        left, left_bytes = left + 1, left_bytes + len(body.encode("utf-8"))
    return "\n".join([*(part for part, _, _ in shown), _marker(left, left_bytes)])


def _marker(left: int, left_bytes: int) -> str:
    """What a file cut at the bound says in place of the entries it leaves out."""
    return (f"> **Not shown: {left} later entries ({left_bytes} bytes of text).** This note file "
            f"is larger than a note file may be ({NOTE_FILE_MAX_BYTES} bytes), so only its first "
            "entries are shown; every entry is kept in the server's store. Add new entries to a "
            "new note file.\n")


def rendered_size(entries: Iterable[tuple[str, str, str]]) -> int:
    """The bytes of these entries rendered whole, with no bound."""
    sizes = [len(render_entry(*entry).encode("utf-8")) + 1 for entry in entries]
    return sum(sizes) - 1 if sizes else 0


def prepare(machine: str, filename: str, text: str, note_id: str | None) -> tuple[str, str]:
    """Check a note and redact it, before any transaction: (body to store, note id)."""
    check_machine_name(machine)
    from sharedmem.redact.redactor import redact_note
    body = redact_note(filename, text)[0]
    if note_id is None:
        import uuid
        note_id = uuid.uuid4().hex
    if not isinstance(note_id, str) or not 8 <= len(note_id) <= 128:
        raise NoteError(f"note id {note_id!r} must be a string of 8 to 128 characters")
    return body, note_id


def append(conn: sqlite3.Connection, machine: str, filename: str, body: str,
           note_id: str) -> tuple[str, bool]:
    """Append one prepared entry inside the caller's transaction: (published path, stored now).

    A note id already stored is a retry and stores nothing, whatever the bounds say now.
    """
    path = f"{NOTES_DIR}/{filename}"
    if conn.execute("SELECT 1 FROM notes WHERE note_id=?", (note_id,)).fetchone():
        return path, False
    created = utc_now()
    _check_day(conn, machine, created, body)
    _check_file(conn, filename, created, machine, body)
    last = conn.execute("SELECT sha256 FROM notes ORDER BY seq DESC LIMIT 1").fetchone()
    prev = last[0] if last else GENESIS
    conn.execute(
        "INSERT INTO notes(note_id, filename, machine, created_at, body, prev_sha256,"
        " sha256) VALUES (?,?,?,?,?,?,?)",
        (note_id, filename, machine, created, body, prev,
         chain_hash(prev, note_id, filename, machine, created, body)))
    return path, True


def _check_day(conn: sqlite3.Connection, machine: str, created: str, body: str) -> None:
    """Refuse an entry past what one machine may add in one UTC day."""
    day = created[:10]
    count, used = conn.execute(
        "SELECT count(*), coalesce(sum(length(CAST(body AS BLOB))), 0) FROM notes "
        "WHERE machine=? AND created_at >= ?", (machine, f"{day}T00:00:00Z")).fetchone()
    if count >= NOTE_DAY_MAX_NOTES:
        raise NoteError(f"note refused: machine {machine!r} has added {count} notes today "
                        f"({day}, UTC), the most one machine may add in a day "
                        f"({NOTE_DAY_MAX_NOTES}); send it again after 00:00 UTC")
    size = len(body.encode("utf-8"))
    if used + size > NOTE_DAY_MAX_BYTES:
        raise NoteError(f"note refused: machine {machine!r} has added {used} bytes of notes "
                        f"today ({day}, UTC), and this note's {size} bytes would pass the "
                        f"{NOTE_DAY_MAX_BYTES} one machine may add in a day; send it again "
                        "after 00:00 UTC, or shorten it")


def _check_file(conn: sqlite3.Connection, filename: str, created: str, machine: str,
                body: str) -> None:
    """Refuse an entry that would take its note file past the bound every client can pull."""
    entries = conn.execute("SELECT created_at, machine, body FROM notes WHERE filename=? "
                           "ORDER BY seq", (filename,))
    size = rendered_size([*entries, (created, machine, body)])
    if size > NOTE_FILE_MAX_BYTES:
        fresh = f"{created[:10]}T{created[11:19].replace(':', '-')}-{filename[20:]}"
        hint = f", e.g. {fresh}" if fresh != filename else ""
        raise NoteError(f"note file {filename} is full: with this note it would be {size} bytes, "
                        f"over the {NOTE_FILE_MAX_BYTES} a note file may hold; write this note "
                        f"to a new note file (a new filename{hint})")


def newest_seq(conn: sqlite3.Connection) -> int:
    """The sequence number of the newest note (0 for none): what backups compare."""
    return conn.execute("SELECT coalesce(max(seq), 0) FROM notes").fetchone()[0]


def base(epoch: int | None) -> int:
    """Where the notes generations of a store whose meta `notes_epoch` is `epoch` count from.

    The notes namespace's `created_generation`: no note has it, the first has one more.
    """
    return RENDERING * GENERATION_STEP + (epoch or 0)


def generation(seq: int, start: int) -> int:
    """The notes namespace's generation when the newest note is `seq` (0 while there is none)."""
    return start + seq if seq else 0


def since(known: int, newest: int, start: int) -> int | None:
    """The sequence number a client's notes generation `known` stands for; None if none.

    None when `known` is not a generation this store's notes have had since `start` (an older
    rendering's, another epoch's, one past the newest, or 0): the client is sent every note
    file, and drops any other.
    """
    return known - start if start < known <= newest else None


def restart(conn: sqlite3.Connection, floor: int) -> None:
    """Make every notes generation from now on larger than `floor` (inside a restore's commit)."""
    epoch = max(0, floor - RENDERING * GENERATION_STEP)
    conn.execute("INSERT OR REPLACE INTO meta VALUES ('notes_epoch', ?)", (str(epoch),))


def files_since(conn: sqlite3.Connection, seq: int = 0) -> Iterator[tuple[str, str, str]]:
    """(path, sha256, text) of each note file with an entry past `seq` (all for 0)."""
    names = [r[0] for r in conn.execute(
        "SELECT filename FROM notes GROUP BY filename HAVING max(seq) > ? ORDER BY filename",
        (seq,))]
    for name in names:
        text = render_note(conn.execute("SELECT created_at, machine, body FROM notes WHERE "
                                        "filename=? ORDER BY seq", (name,)))
        yield f"{NOTES_DIR}/{name}", sha256_text(text), text


def chain_problems(conn: sqlite3.Connection) -> list[str]:
    """Where the note chain is broken (empty when every entry links to the one before)."""
    prev = GENESIS
    for seq, note_id, filename, machine, created, body, prev_sha, sha in conn.execute(
            "SELECT seq, note_id, filename, machine, created_at, body, prev_sha256, sha256 "
            "FROM notes ORDER BY seq"):
        if prev_sha != prev or sha != chain_hash(prev, note_id, filename, machine, created, body):
            return [f"note chain broken at entry {seq} ({filename}): the history was rewritten; "
                    "restore from a verified backup"]
        prev = sha
    return []
