"""The published layout: path checks, namespace keys, and folders confined to the cache."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from sharedmem.cache.layout import CacheFiles, Folders, namespace_key, published_path_problems
from sharedmem.core import PathRuleError, ProtocolError
from sharedmem.rules import NOTES_DIR

NOTE = "extensions/ad_hoc/notes/2026-01-31T09-30-00-release-checklist.md"


@pytest.mark.parametrize("path", [
    "machines/laptop/codex/MEMORY.md",
    "machines/laptop/claude-code/my-project/notes.md",
    "machines/a.b_c-1/notes/x/y/z.md",
    NOTE,
])
def test_published_path_accepts_the_layout(path: str) -> None:
    assert published_path_problems(path) == []


@pytest.mark.parametrize("path,needle", [
    ("machines/laptop/MEMORY.md", "outside the published layout"),
    ("machines/laptop", "does not end in .md"),
    ("other/laptop/codex/a.md", "outside the published layout"),
    ("machines/Laptop/codex/a.md", "machine 'Laptop' is invalid"),
    ("machines/laptop/My_Notes/a.md", "source 'My_Notes' is invalid"),
    ("extensions/ad_hoc/notes/sub/2026-01-31T09-30-00-x.md", "outside the published layout"),
    ("extensions/ad_hoc/notes/hello.md", "note filename 'hello.md' is invalid"),
    ("extensions/ad_hoc/notes/2026-02-30T09-30-00-x.md", "real date"),
    ("extensions/ad_hoc/notes/2026-01-31T09-30-00-Upper.md", "is invalid"),
    ("../machines/laptop/codex/a.md", "'..'"),
    ("/machines/laptop/codex/a.md", "absolute"),
    ("machines/laptop/codex/a.txt", "does not end in .md"),
    (5, "not a string"),
])
def test_published_path_refuses(path: object, needle: str) -> None:
    problems = published_path_problems(path)
    assert problems and any(needle in p for p in problems), problems


def test_namespace_key() -> None:
    assert namespace_key("machines/m/s/x/y.md") == "machines/m/s"
    assert namespace_key(NOTE) == NOTES_DIR
    with pytest.raises(ProtocolError, match="outside the published layout"):
        namespace_key("machines/m/x.md")


def test_folders_make_what_is_missing_only_when_asked(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    folders = Folders(root)
    assert folders.target("machines/m/s/deep/a.md", create=False) is None
    assert not root.exists()
    target = folders.target("machines/m/s/deep/a.md", create=True)
    assert target == str((root / "machines/m/s/deep/a.md").resolve())
    assert (root / "machines/m/s/deep").is_dir()
    assert Folders(root).target("machines/m/s/deep/b.md", create=False) == str(
        (root / "machines/m/s/deep/b.md").resolve())


def test_folders_refuse_a_planted_link_before_making_anything(tmp_path: Path) -> None:
    root, outside = tmp_path / "cache", tmp_path / "outside"
    (root / "machines").mkdir(parents=True)
    outside.mkdir()
    os.symlink(outside, root / "machines" / "m")
    for create in (True, False):
        with pytest.raises(ProtocolError, match="is a link or not a folder"):
            Folders(root).target("machines/m/s/a.md", create=create)
    assert list(outside.iterdir()) == []


def test_a_file_in_the_way_is_refused_only_when_writing(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    (root / "machines").mkdir(parents=True)
    (root / "machines" / "m").write_text("in the way")
    assert Folders(root).target("machines/m/s/a.md", create=False) is None
    for kwargs in ({"create": True}, {"create": False, "strict": True}):
        with pytest.raises(ProtocolError, match="remove it, then sync again"):
            Folders(root).target("machines/m/s/a.md", **kwargs)


def test_cache_files_read_stat_and_missing(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "x.md").write_bytes(b"text\n")
    (tmp_path / "a" / "file.md").write_bytes(b"")
    with CacheFiles(tmp_path) as disk:
        assert disk.read("a/b/x.md") == b"text\n"
        assert disk.stat("a/b/x.md").st_size == 5
        assert disk.read("a/b/none.md") is None and disk.stat("a/b/none.md") is None
        assert disk.read("a/none/x.md") is None and disk.folder("a/none") is None
        assert disk.read("a/file.md/x.md") is None and disk.folder("a/file.md") is None
        assert disk.folder("a/b") is not None
    assert CacheFiles(tmp_path / "absent").read("x.md") is None


def test_cache_files_follow_no_link(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "real").mkdir(parents=True)
    outside.mkdir()
    (outside / "secret.md").write_bytes(b"secret\n")
    (root / "real" / "x.md").write_bytes(b"x\n")
    os.symlink(outside / "secret.md", root / "real" / "out.md")
    os.symlink("x.md", root / "real" / "in.md")
    os.symlink(outside, root / "linked", target_is_directory=True)
    os.mkfifo(root / "real" / "pipe.md")
    with CacheFiles(root) as disk:
        for path in ("real/out.md", "real/in.md", "linked/secret.md"):
            with pytest.raises(PathRuleError, match="links in the cache are never followed"):
                disk.read(path)
        with pytest.raises(PathRuleError, match="never followed"):
            disk.folder("linked")
        with pytest.raises(PathRuleError, match="not a regular file"):
            disk.read("real/pipe.md")
        assert stat.S_ISLNK(disk.stat("real/out.md").st_mode)
    os.symlink(root, tmp_path / "alias", target_is_directory=True)
    assert CacheFiles(tmp_path / "alias").read("real/x.md") == b"x\n"
