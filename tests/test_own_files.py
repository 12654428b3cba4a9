"""What a sync takes from its own snapshot: the files and removals of the namespaces named."""

from __future__ import annotations

from sharedmem.client.own_files import OwnFiles
from sharedmem.sources.walk import Entry


def test_the_files_offered_are_those_of_the_namespaces_named() -> None:
    entries = {"machines/m/a": [Entry("x.md", "1" * 64, 2, 0, 2, {}, "x\n")],
               "machines/m/b": [Entry("y.md", "2" * 64, 2, 0, 2, {}, "y\n"),
                                Entry("z.md", "3" * 64, 2, 0, 2, {}, None)]}
    own = OwnFiles({}, {"machines/m/a": "d", "machines/m/b": "e"}, entries,
                   changed={"machines/m/b"}, gone={"machines/m/b": ["machines/m/b/old.md"]})
    assert own.files({"machines/m/b"}) == [("machines/m/b/y.md", "2" * 64, "y\n")]  # z unread
    assert own.files(set()) == [] and OwnFiles().files({"machines/m/a"}) == []
    assert own.whole({"machines/m/a", "machines/m/b", "machines/m/c"}) == {"machines/m/a"}
    assert own.removed({"machines/m/a"}) == []
    assert own.removed({"machines/m/b"}) == ["machines/m/b/old.md"]


def test_a_text_loaded_for_a_need_stands_for_the_one_the_server_leaves_out() -> None:
    own = OwnFiles()
    own.add_text("4" * 64, "loaded\n")
    assert own.texts == {"4" * 64: "loaded\n"}
