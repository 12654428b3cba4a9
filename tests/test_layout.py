"""The published layout: path checks, namespace keys, and folders confined to the cache."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sharedmem.cache.layout import Folders, namespace_key, published_path_problems
from sharedmem.core import ProtocolError
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
