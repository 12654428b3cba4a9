"""Hostile sessions against the real `serve`: one table row a case.

A row is (session, arguments, check): the raw lines a hostile client sends (made when the row
runs, since some are large), the `serve` options, and what must hold afterwards: the replies,
the SQLite store it leaves (queried directly) and, for the memory rows, serve's peak RSS. Every
row also requires a session that ends cleanly (no traceback on stderr) and a sound store. The
last row is legitimate traffic the bounds must let through (it passed before them too).

serve runs as the child of a small Python that reports its peak RSS (`ru_maxrss` from wait4): a
child forked straight from pytest would inherit pytest's high-water mark across exec.
"""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from conftest import LAUNCHER

from sharedmem.hashing import digest_of, sha256_text
from sharedmem.rules import MIB, Limits
from sharedmem.server.store import Store

HELLO = {"type": "hello", "versions": [1, 2], "machine": "laptop"}
HELLO_V1 = {**HELLO, "versions": [1]}
LIMITS = Limits()
PEAK_MIB = 90  # serve starts at about 20 MiB; these rows took 115-230 MiB before the bounds
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


def enc(message: object) -> bytes:
    return json.dumps(message).encode() + b"\n"


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


def manifest(source: str, files: list[tuple[str, str]], **extra: Any) -> bytes:
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
    yield manifest(source, files)
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
        lambda: then_status(enc(HELLO), manifest("notes", [("big.md", texts(
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
        lambda: [enc(HELLO), manifest("notes", [(f"{i}.md", "x") for i in range(
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
                            manifest("many", LEGIT_FILES),
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
