"""Tests for sharedmem.sources.walk, through snapshot: links, FIFOs, content, names, quotas, reuse."""

from __future__ import annotations

import json
import os
import sys

import pytest
from conftest import published, reasons, run_with_timeout, spec, write

from sharedmem.core import SourceError
from sharedmem.hashing import sha256_text
from sharedmem.rules import KIND_MARKDOWN, MIB, SOURCE_CLAUDE, Limits
from sharedmem.sources.kinds import load_text, snapshot

GITHUB_TOKEN = "ghp_" + "a" * 36


# --- links, FIFOs, hidden names -----------------------------------------------------------------

def test_symlink_to_outside_file_is_reported_not_read(tmp_path):
    root = tmp_path / "docs"
    secret = write(tmp_path / "outside" / "secret.md", "TOP SECRET\n")
    write(root / "ok.md", "fine\n")
    (root / "link.md").symlink_to(secret)
    snap = snapshot(spec(KIND_MARKDOWN, root))
    assert published(snap) == ["ok.md"]
    assert reasons(snap) == {"link.md": "symlink"}
    assert "link.md" in snap.skipped[0].message
    assert snap.problems() == []


def test_symlinked_directory_is_not_descended(tmp_path):
    outside = tmp_path / "outside"
    write(outside / "x.md", "outside\n")
    root = tmp_path / "docs"
    root.mkdir()
    (root / "linked").symlink_to(outside, target_is_directory=True)
    snap = snapshot(spec(KIND_MARKDOWN, root))
    assert published(snap) == []
    assert reasons(snap) == {"linked": "symlink"}


def test_fifo_is_reported_and_never_blocks(tmp_path):
    root = tmp_path / "docs"
    write(root / "ok.md", "ok\n")
    os.mkfifo(root / "pipe.md")
    snap = run_with_timeout(lambda: snapshot(spec(KIND_MARKDOWN, root)))
    assert published(snap) == ["ok.md"]
    assert reasons(snap) == {"pipe.md": "not-regular"}


def test_hidden_files_and_folders_are_reported_not_descended(tmp_path):
    root = tmp_path / "docs"
    write(root / ".hidden" / "x.md", "hidden folder\n")
    write(root / ".secret.md", "hidden file\n")
    write(root / "sub" / ".also.md", "hidden file in sub\n")
    write(root / "visible.md", "visible\n")
    snap = snapshot(spec(KIND_MARKDOWN, root))
    assert published(snap) == ["visible.md"]
    assert reasons(snap) == {".hidden": "hidden", ".secret.md": "hidden", "sub/.also.md": "hidden"}
    assert snap.problems() == []



# --- content rules ------------------------------------------------------------------------------

def test_invalid_utf8_is_a_problem_and_the_walk_goes_on(tmp_path):
    root = tmp_path / "docs"
    write(root / "bad.md", b"caf\xe9 latin-1\n")
    write(root / "bom.md", b"\xef\xbb\xbfwith bom\n")
    write(root / "good.md", "good\n")
    snap = snapshot(spec(KIND_MARKDOWN, root))
    assert published(snap) == ["bom.md", "good.md"]
    assert reasons(snap) == {"bad.md": "invalid-utf8"}
    assert [p.path for p in snap.problems()] == ["bad.md"]
    assert "bad.md" in snap.problems()[0].message
    assert snap.files[0].text == "\ufeffwith bom\n"


def test_two_mib_file_is_too_large_and_fits_a_larger_limit(tmp_path):
    root = tmp_path / "docs"
    write(root / "big.md", "x" * (2 * MIB))
    write(root / "small.md", "small\n")
    snap = snapshot(spec(KIND_MARKDOWN, root))
    assert published(snap) == ["small.md"]
    assert reasons(snap) == {"big.md": "too-large"}
    assert "big.md" in snap.skipped[0].message
    roomy = snapshot(spec(KIND_MARKDOWN, root), Limits(file_bytes=3 * MIB))
    assert published(roomy) == ["big.md", "small.md"]
    assert roomy.files[0].size == 2 * MIB


def test_oversized_file_is_not_read(tmp_path):
    """A 1 TiB sparse file: reading it would take far longer than the timeout."""
    root = tmp_path / "docs"
    root.mkdir()
    try:
        with open(root / "huge.md", "wb") as handle:
            handle.truncate(1 << 40)
    except OSError as exc:
        pytest.skip(f"this filesystem cannot hold a sparse 1 TiB file: {exc}")
    snap = run_with_timeout(lambda: snapshot(spec(KIND_MARKDOWN, root)), 10)
    assert reasons(snap) == {"huge.md": "too-large"}


def test_redaction_is_applied_and_counted(tmp_path):
    root = tmp_path / "docs"
    write(root / "creds.md", f"token: {GITHUB_TOKEN}\n")
    snap = snapshot(spec(KIND_MARKDOWN, root))
    entry = snap.files[0]
    assert GITHUB_TOKEN not in entry.text
    assert sum(entry.redactions.values()) >= 1
    assert entry.sha256 == sha256_text(entry.text)
    assert entry.size == len(entry.text.encode("utf-8"))
    assert entry.disk_size == len(f"token: {GITHUB_TOKEN}\n")
    again = snapshot(snap.spec, previous=json.loads(json.dumps(snap.record())))
    assert again.files[0].text is None
    assert again.files[0].redactions == entry.redactions
    assert load_text(again.spec, again.files[0]) == entry.text



# --- names --------------------------------------------------------------------------------------

@pytest.mark.skipif(sys.platform == "darwin", reason="macOS normalises names itself")
def test_nfd_names_are_published_as_nfc(tmp_path):
    root = tmp_path / "docs"
    write(root / "cafe\u0301" / "re\u0301sume\u0301.md", "nfd\n")
    snap = snapshot(spec(KIND_MARKDOWN, root))
    assert published(snap) == ["caf\u00e9/r\u00e9sum\u00e9.md"]
    again = snapshot(snap.spec, previous=snap.record())
    assert again.files[0].text is None
    assert load_text(again.spec, again.files[0]) == "nfd\n"


@pytest.mark.skipif(sys.platform in ("darwin", "win32"), reason="needs a case-sensitive filesystem")
def test_case_and_unicode_collisions(tmp_path):
    root = tmp_path / "docs"
    write(root / "A.md", "upper\n")
    write(root / "a.md", "lower\n")
    write(root / "\u00e9.md", "nfc\n")
    write(root / "e\u0301.md", "nfd\n")
    snap = snapshot(spec(KIND_MARKDOWN, root))
    # Sorted by on-disk name: "e\u0301" sorts before "\u00e9", so the NFD file wins.
    assert published(snap) == ["A.md", "\u00e9.md"]
    assert [e.text for e in snap.files] == ["upper\n", "nfd\n"]
    assert reasons(snap) == {"a.md": "collision", "\u00e9.md": "collision"}
    assert {p.reason for p in snap.problems()} == {"collision"}


def test_names_breaking_the_path_rule_are_bad_paths(tmp_path):
    root = tmp_path / "docs"
    write(root / "a:b.md", "colon\n")
    write(root / "nul.md", "reserved\n")
    write(root / "trailing " / "x.md", "space\n")
    write(root / "fine.md", "fine\n")
    snap = snapshot(spec(KIND_MARKDOWN, root))
    assert published(snap) == ["fine.md"]
    assert reasons(snap) == {"a:b.md": "bad-path", "nul.md": "bad-path",
                             "trailing /x.md": "bad-path"}



# --- quota --------------------------------------------------------------------------------------

def test_quota_by_count(tmp_path):
    root = tmp_path / "docs"
    for i in range(5):
        write(root / f"{i}.md", f"file {i}\n")
    snap = snapshot(spec(KIND_MARKDOWN, root), Limits(namespace_files=3))
    assert published(snap) == ["0.md", "1.md", "2.md"]
    assert reasons(snap) == {"3.md": "quota", "4.md": "quota"}
    assert len(snap.problems()) == 2


def test_quota_by_bytes(tmp_path):
    root = tmp_path / "docs"
    for i in range(4):
        write(root / f"{i}.md", "123456789\n")  # 10 bytes each
    snap = snapshot(spec(KIND_MARKDOWN, root), Limits(namespace_bytes=25))
    assert published(snap) == ["0.md", "1.md"]
    assert reasons(snap) == {"2.md": "quota", "3.md": "quota"}
    exact = snapshot(spec(KIND_MARKDOWN, root), Limits(namespace_bytes=40))
    assert len(exact.files) == 4 and exact.problems() == []



# --- unreadable folders -------------------------------------------------------------------------

def test_unreadable_folder_is_reported(tmp_path):
    root = tmp_path / "docs"
    write(root / "locked" / "x.md", "x\n")
    write(root / "open.md", "open\n")
    (root / "locked").chmod(0)
    try:
        snap = snapshot(spec(KIND_MARKDOWN, root))
    finally:
        (root / "locked").chmod(0o755)
    assert snap.status == "ok"
    assert "open.md" in published(snap)
    if os.geteuid() == 0:
        pytest.skip("running as root: chmod 000 does not deny root, so 'locked' was readable")
    assert reasons(snap) == {"locked": "unreadable"}



# --- saved records, unchanged files -------------------------------------------------------------

def test_unchanged_files_are_not_read_again(tmp_path):
    root = tmp_path / "docs"
    path = write(root / "x.md", "original\n")
    first = snapshot(spec(KIND_MARKDOWN, root))
    record = json.loads(json.dumps(first.record()))
    old_sha = first.files[0].sha256
    st = path.stat()
    path.write_bytes(b"replaced\n")  # same size
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    again = snapshot(first.spec, previous=record)
    entry = again.files[0]
    assert entry.text is None
    assert entry.sha256 == old_sha  # the old sha: the file was not read
    assert entry.size == first.files[0].size
    with pytest.raises(SourceError, match="changed"):
        load_text(again.spec, entry)
    fresh = snapshot(first.spec)
    assert fresh.files[0].sha256 == sha256_text("replaced\n")


def test_changed_mtime_is_read_again(tmp_path):
    root = tmp_path / "docs"
    path = write(root / "x.md", "original\n")
    first = snapshot(spec(KIND_MARKDOWN, root))
    path.write_bytes(b"replaced\n")
    os.utime(path, ns=(1, first.files[0].mtime_ns + 1_000_000_000))
    again = snapshot(first.spec, previous=first.record())
    assert again.files[0].text == "replaced\n"


def three_files(tmp_path):
    """A folder of a.md, b.md and c.md, its first snapshot, and that snapshot's record as saved."""
    root = tmp_path / "docs"
    for name in ("a.md", "b.md", "c.md"):
        write(root / name, f"{name}\n")
    first = snapshot(spec(KIND_MARKDOWN, root))
    return root, first, json.loads(json.dumps(first.record()))


def test_reused_files_keep_the_collision_and_quota_rules(tmp_path):
    root, first, record = three_files(tmp_path)
    again = snapshot(first.spec, Limits(namespace_files=2), previous=record)
    assert [e.path for e in again.files] == ["a.md", "b.md"]
    assert all(e.text is None for e in again.files) and reasons(again) == {"c.md": "quota"}
    small = snapshot(first.spec, Limits(namespace_bytes=10), previous=record)
    assert [e.path for e in small.files] == ["a.md", "b.md"] and reasons(small) == {"c.md": "quota"}
    write(root / "A.md", "upper\n")  # sorts first, and takes the name a.md collides with
    clash = snapshot(first.spec, previous=record)
    assert [e.path for e in clash.files] == ["A.md", "b.md", "c.md"]
    assert reasons(clash) == {"a.md": "collision"}


def test_a_walk_with_a_record_publishes_and_skips_as_one_without(tmp_path):
    # Unchanged files of a plain folder are taken in few steps (Walker.reuse_plain); whatever
    # else a folder holds must come out as the walk without a record finds it, in walk order.
    root = tmp_path / "docs"
    for i in range(12):
        write(root / f"f{i:02}.md", f"file {i}\n")
    write(root / "sub" / "inner.md", "inner\n")
    write(root / "g.md", "token" + " = '" + "hunter2" * 2 + "'\n")  # redacted, and unchanged
    first = snapshot(spec(KIND_MARKDOWN, root))
    record = json.loads(json.dumps(first.record()))
    write(root / "f03.md", "file 3, changed and longer\n")  # read: files after it wait for it
    write(root / "f00.md", "secret" + " = '" + "hunter2" * 2 + "'\n")  # read, and redacted
    (root / "f05.md").unlink()
    (root / "f05.md").symlink_to(root / "f06.md")  # a link where a file was
    write(root / "other" / ".hidden.md", "hidden\n")  # a name that is not plain: its own folder
    (root / "f07.md").unlink()
    (root / "f07.md").mkdir()  # a folder named like a file
    write(root / "f07.md" / "deep.md", "deep\n")
    write(root / "F08.md", "collides with f08.md\n")
    with_record = snapshot(first.spec, previous=record)
    without = snapshot(first.spec)
    assert [(e.path, e.sha256, e.size, e.redactions) for e in with_record.files] == \
        [(e.path, e.sha256, e.size, e.redactions) for e in without.files]
    assert [(s.path, s.reason) for s in with_record.skipped] == \
        [(s.path, s.reason) for s in without.skipped]
    assert next(e for e in with_record.files if e.path == "f00.md").redactions
    reused = {e.path for e in with_record.files if e.text is None}
    assert reused == {f"f{i:02}.md" for i in (1, 2, 4, 6, 9, 10, 11)} | {"sub/inner.md", "g.md"}
    assert next(e for e in with_record.files if e.path == "g.md").redactions
    assert reasons(with_record) == {"other/.hidden.md": "hidden", "f05.md": "symlink",
                                    "f08.md": "collision"}


def test_a_claude_record_is_reused_from_the_memory_folders(tmp_path):
    # Published as <project>/<name>, found at <project>/memory/<name>: a reused entry keeps both.
    root = tmp_path / "projects"
    write(root / "proj" / "memory" / "note.md", "remembered\n")
    first = snapshot(spec(SOURCE_CLAUDE, root))
    again = snapshot(first.spec, previous=json.loads(json.dumps(first.record())))
    [entry] = again.files
    assert (entry.path, entry.disk_path, entry.text) == ("proj/note.md", "proj/memory/note.md", None)
    assert entry.sha256 == first.files[0].sha256
    assert load_text(again.spec, entry) == "remembered\n"
