"""Tests for sharedmem.sources.safe_open: links refused, FIFOs never block, the size cap bounds every read."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import run_with_timeout

from sharedmem.core import SourceError
from sharedmem.sources import safe_open

needs_symlinks = pytest.mark.skipif(not hasattr(os, "symlink") or os.name == "nt",
                                    reason="needs POSIX symlinks")


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """root/real/note.md, root/top.md, and (where possible) links to both."""
    root = tmp_path / "root"
    (root / "real").mkdir(parents=True)
    (root / "real" / "note.md").write_text("hello\n", encoding="utf-8")
    (root / "top.md").write_text("top\n", encoding="utf-8")
    if hasattr(os, "symlink") and os.name != "nt":
        os.symlink(root / "real", root / "linked")
        os.symlink(root / "top.md", root / "linked.md")
    return root


@pytest.fixture(params=["fd", "path"])
def root_handle(request, tree: Path):
    """The root opened normally (fd where supported) and as a path (the Windows fallback branch)."""
    handle = safe_open.open_root(tree) if request.param == "fd" else str(tree)
    yield handle
    safe_open.close(handle)


def test_open_root_refuses_a_file(tree):
    with pytest.raises(NotADirectoryError):
        safe_open.open_root(tree / "top.md")


@needs_symlinks
def test_symlinked_folder_is_refused_but_real_one_opens(root_handle):
    real = safe_open.open_child_dir(root_handle, "real")
    try:
        assert [e.name for e in safe_open.list_dir(real)] == ["note.md"]
    finally:
        safe_open.close(real)
    with pytest.raises(OSError) as info:
        safe_open.open_child_dir(root_handle, "linked")
    assert safe_open.refusal(info.value, "linked").reason in {"symlink", "vanished"}


@needs_symlinks
def test_symlinked_file_is_refused_as_a_link(root_handle):
    with pytest.raises(safe_open.Refused) as info:
        safe_open.read_text(root_handle, "linked.md", "linked.md", 1000)
    assert info.value.reason == "symlink"
    assert isinstance(info.value, SourceError)
    text, st = safe_open.read_text(root_handle, "top.md", "top.md", 1000)
    assert text == "top\n" and st.st_size == 4


@needs_symlinks
def test_list_dir_is_sorted_and_is_link_spots_links(root_handle):
    entries = safe_open.list_dir(root_handle)
    assert [e.name for e in entries] == ["linked", "linked.md", "real", "top.md"]
    assert {e.name for e in entries if safe_open.is_link(e)} == {"linked", "linked.md"}


@needs_symlinks
def test_read_below_refuses_a_linked_folder_on_the_way(tree):
    assert safe_open.read_below(tree, "real/note.md", "note", 100)[0] == "hello\n"
    with pytest.raises(OSError):
        safe_open.read_below(tree, "linked/note.md", "note", 100)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs mkfifo")
def test_fifo_is_not_opened_for_reading_and_does_not_hang(tree, root_handle):
    os.mkfifo(tree / "pipe.md")  # no writer: a blocking open or read would hang forever
    with pytest.raises(safe_open.Refused) as info:
        run_with_timeout(lambda: safe_open.read_text(root_handle, "pipe.md", "pipe.md", 1000))
    assert info.value.reason == "not-regular"


def test_file_over_the_cap_is_refused(tree, root_handle):
    (tree / "big.md").write_bytes(b"x" * 50)
    with pytest.raises(safe_open.Refused) as info:
        safe_open.read_text(root_handle, "big.md", "big.md", 49)
    assert info.value.reason == "too-large"
    assert "is 50 bytes" in info.value.detail and "limit of 49 bytes" in info.value.detail
    assert safe_open.read_text(root_handle, "big.md", "big.md", 50)[0] == "x" * 50


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="needs Linux /proc")
def test_file_that_lies_about_its_size_is_read_only_to_the_cap():
    # /proc files report st_size 0 but hold more: the loop must stop at cap + 1 bytes.
    handle = safe_open.open_root("/proc/self")
    try:
        with pytest.raises(safe_open.Refused) as info:
            safe_open.read_text(handle, "status", "status", 10)
    finally:
        safe_open.close(handle)
    assert info.value.reason == "too-large"
    assert "is 11 bytes" in info.value.detail


def test_invalid_utf8_and_missing_files_are_named(tree, root_handle):
    (tree / "bad.md").write_bytes(b"ok\xff")
    with pytest.raises(safe_open.Refused) as info:
        safe_open.read_text(root_handle, "bad.md", "bad.md", 100)
    assert info.value.reason == "invalid-utf8" and "offset 2" in info.value.detail
    with pytest.raises(safe_open.Refused) as info:
        safe_open.read_text(root_handle, "gone.md", "gone.md", 100)
    assert info.value.reason == "vanished"


@needs_symlinks
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs mkfifo")
def test_open_file_then_read_open(tree: Path, root_handle: int | str) -> None:
    from sharedmem.sources.safe_open import Refused, open_file, read_open, refusal
    with pytest.raises(OSError) as info:
        open_file(root_handle, "linked.md")
    assert refusal(info.value, "linked.md").reason == "symlink"
    fd = open_file(root_handle, "top.md")
    try:
        data, st = read_open(fd, "top.md", 2**62)  # no cap worth the name: one read
    finally:
        os.close(fd)
    assert data == b"top\n" and st.st_size == 4
    os.mkfifo(tree / "pipe.md")
    fd = run_with_timeout(lambda: open_file(root_handle, "pipe.md"))
    try:
        with pytest.raises(Refused, match="not a regular file"):
            read_open(fd, "pipe.md", 100)
    finally:
        os.close(fd)
