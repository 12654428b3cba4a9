"""Tests for sharedmem.rules: the path rule, collisions, name rules, note names, limits."""

from __future__ import annotations

import unicodedata
from pathlib import Path

import pytest

from sharedmem.core import NameRuleError, NoteError, PathRuleError
from sharedmem.rules import (
    MAX_COMPONENT_BYTES,
    MAX_PATH_BYTES,
    NOTE_MAX_BYTES,
    Limits,
    check_machine_name,
    check_markdown_source_name,
    check_note,
    check_path,
    collision_key,
    name_problem,
    note_filename_problem,
    path_problems,
)

NFD_E = "e\u0301"  # 'é' decomposed
NFC_E = "\u00e9"  # 'é' composed


def path_of_bytes(total: int) -> str:
    """A valid-looking path of exactly `total` UTF-8 bytes, every component within the limit."""
    folders = (total - 10) // 201
    name = "x" * (total - folders * 201 - 3) + ".md"
    path = "/".join(["d" * 200] * folders + [name])
    assert len(path.encode("utf-8")) == total
    return path


# (id, path) that the path rule must refuse; each says what it attacks.
HOSTILE = [
    ("traversal", "../x.md"),
    ("traversal-deep", "a/../../x.md"),
    ("traversal-middle", "a/b/../x.md"),
    ("traversal-only", ".."),
    ("dot-component", "./x.md"),
    ("dot-middle", "a/./x.md"),
    ("absolute", "/etc/x.md"),
    ("absolute-root", "/x.md"),
    ("drive-slash", "C:/x.md"),
    ("drive-relative", "C:x.md"),
    ("drive-lower", "c:/x.md"),
    ("unc-slash", "//server/share/x.md"),
    ("unc-backslash", "\\\\server\\share\\x.md"),
    ("backslash", "a\\x.md"),
    ("backslash-traversal", "..\\x.md"),
    ("nul", "a\x00.md"),
    ("nul-suffix", "x.md\x00.txt"),
    ("tab", "a\tb.md"),
    ("newline", "a\nb.md"),
    ("carriage-return", "a\rb.md"),
    ("escape", "a\x1b[31m.md"),
    ("unit-separator", "a\x1f.md"),
    ("delete", "a\x7f.md"),
    ("lt", "a<b.md"),
    ("gt", "a>b.md"),
    ("colon", "a:b.md"),
    ("stream", "x.md:evil"),
    ("quote", 'a"b.md'),
    ("pipe", "a|b.md"),
    ("question", "a?b.md"),
    ("star", "a*.md"),
    ("con", "CON.md"),
    ("con-lower", "con.md"),
    ("aux-double-ext", "aux.txt.md"),
    ("com1", "COM1.md"),
    ("lpt9", "LPT9.md"),
    ("prn-folder", "a/PRN/b.md"),
    ("nul-folder", "nul/x.md"),
    ("con-space-ext", "CON .md"),
    ("com-superscript", "COM\u00b9.md"),
    ("trailing-dot-folder", "a./b.md"),
    ("trailing-space-folder", "a /b.md"),
    ("trailing-dot-file", "x.md."),
    ("trailing-space-file", "x.md "),
    ("hidden-folder", ".git/x.md"),
    ("hidden-file", "a/.x.md"),
    ("hidden-nested", "a/b/.ssh/x.md"),
    ("empty-component", "a//b.md"),
    ("trailing-slash", "a/x.md/"),
    ("empty", ""),
    ("nfd", f"caf{NFD_E}.md"),
    ("nfd-folder", f"{NFD_E}/x.md"),
    ("lone-surrogate", "a\ud800.md"),
    ("long-component", "a" * (MAX_COMPONENT_BYTES + 1 - 3) + ".md"),
    ("long-component-multibyte", NFC_E * 127 + ".md"),
    ("long-folder", "d" * (MAX_COMPONENT_BYTES + 1) + "/x.md"),
    ("long-path", path_of_bytes(MAX_PATH_BYTES + 1)),
    ("not-md", "x.txt"),
    ("md-upper", "x.MD"),
    ("no-extension", "notes"),
    ("md-only-folder", "a.md/b"),
]

VALID = [
    "x.md",
    "MEMORY.md",
    "rollout_summaries/2026-01-01.md",
    f"caf{NFC_E}/r{NFC_E}sum{NFC_E}.md",
    "日本語/メモ.md",
    "a/b/c/d/e/f/g/h/i/j.md",
    "-home-u-app/x.md",
    "my-notes/some-file.md",
    "a b/c d.md",
    "v1.2/x.y.md",
    "CONSOLE.md",
    "com10.md",
    "auxiliary/x.md",
    "a" * (MAX_COMPONENT_BYTES - 3) + ".md",
    NFC_E * 126 + ".md",
    path_of_bytes(MAX_PATH_BYTES),
]


@pytest.mark.parametrize(("label", "path"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_path_rule_refuses_hostile_paths(label: str, path: str) -> None:
    assert path_problems(path), label
    with pytest.raises(PathRuleError):
        check_path(path)


def test_hostile_list_is_long_enough() -> None:
    assert len(HOSTILE) >= 40
    assert len({p for _, p in HOSTILE}) == len(HOSTILE)


@pytest.mark.parametrize("path", VALID)
def test_path_rule_accepts_valid_paths(path: str) -> None:
    assert path_problems(path) == []
    assert check_path(path) == path


@pytest.mark.parametrize("value", [None, 5, b"x.md", Path("x.md"), ["x.md"]])
def test_path_rule_refuses_non_strings(value: object) -> None:
    assert path_problems(value) == [f"path {value!r} is not a string"]
    with pytest.raises(PathRuleError, match="not a string"):
        check_path(value)


def test_exact_length_boundaries() -> None:
    ok_component = "a" * (MAX_COMPONENT_BYTES - 3) + ".md"
    assert len(ok_component.encode()) == 255
    assert path_problems(ok_component) == []
    too_long = "a" + ok_component
    assert len(too_long.encode()) == 256
    assert any("longer than 255 bytes" in p for p in path_problems(too_long))
    ok_path, long_path = path_of_bytes(1024), path_of_bytes(1025)
    assert path_problems(ok_path) == []
    assert any("longer than 1024 bytes" in p for p in path_problems(long_path))
    # Bytes, not characters: 126 two-byte letters plus '.md' is 255 bytes, 127 is 257.
    assert path_problems(NFC_E * 126 + ".md") == []
    assert any("longer than 255" in p for p in path_problems(NFC_E * 127 + ".md"))


def test_problems_name_each_fault() -> None:
    problems = path_problems("/a//CON.md")
    text = " ".join(problems)
    assert "absolute" in text and "empty" in text and "reserved name" in text
    assert "NFC" in " ".join(path_problems(f"{NFD_E}.md"))
    assert "NUL" in " ".join(path_problems("a\x00.md"))
    assert "control" in " ".join(path_problems("a\x01.md"))
    assert "hidden" in " ".join(path_problems(".x.md"))
    assert "drive letter" in " ".join(path_problems("C:x.md"))
    assert "forbidden" in " ".join(path_problems("a?.md"))
    assert "does not end in .md" in " ".join(path_problems("a.txt"))
    with pytest.raises(PathRuleError, match="absolute.*empty|empty.*absolute"):
        check_path("/a//x.md")


def test_folder_variant() -> None:
    for folder in ("a", "a/b", "-home-u-app", "rollout_summaries", f"caf{NFC_E}", "x.md"):
        assert path_problems(folder, folder=True) == [], folder
        assert check_path(folder, folder=True) == folder
    for folder in ("..", "a/..", "/a", "C:", "a//b", ".hidden", "nul", "a/PRN", "a.", "a ",
                   f"{NFD_E}", "a\\b", "a/", ""):
        assert path_problems(folder, folder=True), folder
        with pytest.raises(PathRuleError):
            check_path(folder, folder=True)
    assert path_problems("a") and not path_problems("a", folder=True)


def test_nfd_is_refused_but_nfc_of_it_is_accepted() -> None:
    nfd = unicodedata.normalize("NFD", f"r{NFC_E}sum{NFC_E}.md")
    assert nfd != unicodedata.normalize("NFC", nfd)
    assert path_problems(nfd)
    assert path_problems(unicodedata.normalize("NFC", nfd)) == []


def test_collision_key() -> None:
    assert collision_key("A.md") == collision_key("a.md")
    assert collision_key("Dir/Notes.md") == collision_key("dir/NOTES.md")
    assert collision_key(f"{NFD_E}.md") == collision_key(f"{NFC_E}.md")
    assert collision_key("STRASSE.md") == collision_key("straße.md")
    assert collision_key(f"Caf{NFC_E}.md") == collision_key(f"CAF{NFD_E.upper()}.md")
    assert collision_key("a.md") != collision_key("b.md")
    assert collision_key("a/b.md") != collision_key("a-b.md")
    key = collision_key(f"X{NFD_E}.md")
    assert key == unicodedata.normalize("NFC", key)


@pytest.mark.parametrize("name", ["a", "0", "laptop", "my-laptop.local_1", "0abc", "a" * 63,
                                  "codex", "claude-code", "a..b", "a-", "console", "com",
                                  "com10", "lpt0", "nullable", "x.y", "auxiliary"])
def test_name_rule_accepts(name: str) -> None:
    assert name_problem(name) is None
    assert check_machine_name(name) == name


@pytest.mark.parametrize("name", ["", "a" * 64, "A", "Laptop", "-a", ".a", "_a", "a b", "a/b",
                                  "a\\b", f"caf{NFC_E}", "a\n", "\na", "a:b", None, 5, b"ab"])
def test_name_rule_refuses(name: object) -> None:
    assert name_problem(name, "machine name")
    with pytest.raises(NameRuleError, match="machine name"):
        check_machine_name(name)
    with pytest.raises(NameRuleError, match="source name"):
        check_markdown_source_name(name)


# Names the server once took that no client could make a folder of (issue 14): each is a
# machine or source folder in every client's cache, so the name rule refuses what the path
# rule refuses for a component.
WINDOWS_UNSAFE_NAMES = ["con", "nul", "prn", "aux", "com1", "com9", "lpt1", "lpt9", "aux.x",
                        "con.local", "nul.tar.gz", "x.", "a.b.", "laptop.", "com1.x"]


@pytest.mark.parametrize("name", WINDOWS_UNSAFE_NAMES)
def test_name_rule_refuses_what_no_cache_could_hold(name: str) -> None:
    problem = name_problem(name, "source")
    assert problem and f"source {name!r} is invalid" in problem
    assert path_problems(f"machines/{name}/x.md")  # the path rule refuses it too
    with pytest.raises(NameRuleError, match="machine name"):
        check_machine_name(name)
    with pytest.raises(NameRuleError, match="source name"):
        check_markdown_source_name(name)


def test_a_name_is_valid_exactly_when_it_makes_a_valid_folder() -> None:
    import random
    import re
    rng = random.Random(14)
    pieces = ["a", "0", "9", "-", "_", ".", "con", "nul", "aux", "prn", "com", "lpt", "1", "x"]
    checked = 0
    for _ in range(5000):
        name = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 5)))
        if not re.fullmatch(r"[a-z0-9][a-z0-9._-]{0,62}", name):
            continue
        checked += 1
        assert (name_problem(name) is None) == (path_problems(f"machines/{name}/x.md") == []), name
    assert checked > 1000


def test_reserved_source_names() -> None:
    for reserved in ("codex", "claude-code"):
        with pytest.raises(NameRuleError, match="reserved"):
            check_markdown_source_name(reserved)
        assert check_machine_name(reserved) == reserved
    assert check_markdown_source_name("notes") == "notes"
    assert check_markdown_source_name("codex-notes") == "codex-notes"
    assert check_markdown_source_name("claude") == "claude"


@pytest.mark.parametrize("filename", [
    "2026-01-31T09-30-00-release-checklist.md",
    "2024-02-29T23-59-59-leap.md",
    "2000-01-01T00-00-00-a.md",
    "2026-12-31T00-00-00-0.md",
    "2026-01-01T00-00-00-" + "a" * 80 + ".md",
    "2026-01-01T00-00-00-a-b-c-1.md",
])
def test_note_filename_accepts(filename: str) -> None:
    assert note_filename_problem(filename) is None
    assert check_note(filename, "text") == "text"


@pytest.mark.parametrize(("filename", "why"), [
    ("2026-01-31T09-30-00-Release.md", "invalid"),
    ("2026-01-31T09-30-00--x.md", "invalid"),
    ("2026-01-31T09-30-00-a_b.md", "invalid"),
    ("2026-01-31T09-30-00-a.b.md", "invalid"),
    ("2026-01-31T09-30-00-" + "a" * 81 + ".md", "invalid"),
    ("2026-01-31T09-30-00-.md", "invalid"),
    ("2026-01-31T09-30-00.md", "invalid"),
    ("2026-01-31T09:30:00-x.md", "invalid"),
    ("2026-01-31 09-30-00-x.md", "invalid"),
    ("26-01-31T09-30-00-x.md", "invalid"),
    ("2026-01-31T09-30-00-x.txt", "invalid"),
    ("2026-01-31T09-30-00-x.md\n", "invalid"),
    ("a/2026-01-31T09-30-00-x.md", "invalid"),
    ("../2026-01-31T09-30-00-x.md", "invalid"),
    ("2026-01-31T09-30-00-x", "invalid"),
    (None, "invalid"),
    (20260131, "invalid"),
    ("2026-02-30T09-30-00-x.md", "real date"),
    ("2023-02-29T09-30-00-x.md", "real date"),
    ("2026-13-01T09-30-00-x.md", "real date"),
    ("2026-00-01T09-30-00-x.md", "real date"),
    ("2026-01-00T09-30-00-x.md", "real date"),
    ("2026-01-31T24-00-00-x.md", "real date"),
    ("2026-01-31T09-60-00-x.md", "real date"),
    ("2026-01-31T09-30-60-x.md", "real date"),
    # Digits of other scripts are digits to Python's int() and to a regex's \d: a note named
    # with them would be stored as another note's name would read.
    ("\uff12\uff10\uff12\uff16-01-01T00-00-00-x.md", "ASCII digits"),  # full-width
    ("2026-01-01T00-00-0\u0661-x.md", "ASCII digits"),  # Arabic-Indic
    ("2026-\u0967\u0968-01T00-00-00-x.md", "ASCII digits"),  # Devanagari
    ("2026-01-01T00-00-00-\uff11.md", "ASCII digits"),  # in the slug
])
def test_note_filename_refuses(filename: object, why: str) -> None:
    problem = note_filename_problem(filename)
    assert problem and why in problem
    with pytest.raises(NoteError, match=why):
        check_note(filename, "text")


@pytest.mark.parametrize(("text", "redacted", "why"), [
    ("", False, "note must be non-empty text"),
    (" \n\t", False, "note must be non-empty text"),
    (None, False, "note must be non-empty text"),
    (b"bytes", False, "note must be non-empty text"),
    ("lone \ud800 surrogate", False, "not valid UTF-8 text"),
    ("x" * (NOTE_MAX_BYTES + 1), False, f"longer than {NOTE_MAX_BYTES} bytes of UTF-8"),
    ("\u00e9" * (NOTE_MAX_BYTES // 2 + 1), False, f"longer than {NOTE_MAX_BYTES} bytes of UTF-8"),
    ("x" * (NOTE_MAX_BYTES + 1), True, f"longer than {NOTE_MAX_BYTES} bytes once redacted"),
])
def test_note_text_refuses(text: object, redacted: bool, why: str) -> None:
    with pytest.raises(NoteError, match=why):
        check_note("2026-01-31T09-30-00-x.md", text, redacted=redacted)


def test_note_text_accepts_up_to_the_limit() -> None:
    for text in ("x", "x" * NOTE_MAX_BYTES, "\u00e9" * (NOTE_MAX_BYTES // 2), "caf\u00e9\n"):
        assert check_note("2026-01-31T09-30-00-x.md", text) == text


def test_limits_problems() -> None:
    assert Limits().problems() == []
    assert Limits(1, 1, 1).problems() == []
    for bad in (0, -1, True, False, 1.5, "10", None):
        problems = Limits(file_bytes=bad).problems()  # type: ignore[arg-type]
        assert len(problems) == 1 and "file_bytes" in problems[0], bad
    problems = Limits(0, 0, 0).problems()
    assert [p.split()[1] for p in problems] == ["file_bytes", "namespace_bytes", "namespace_files"]
    assert Limits().file_bytes < Limits().namespace_bytes


def test_fast_path_never_accepts_what_the_full_rule_refuses(monkeypatch):
    import random
    import re

    from sharedmem import rules
    rng = random.Random(5)
    alphabet = "aZ09_-. /.:\\CONcon1é"
    samples = []
    for _ in range(20000):
        path = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 20)))
        samples.append(path + (".md" if rng.random() < 0.5 else ""))
    fast = {(p, f): rules.path_problems(p, folder=f) for p in samples for f in (False, True)}
    monkeypatch.setattr(rules, "_SAFE_FILE", re.compile(r"(?!)"))
    monkeypatch.setattr(rules, "_SAFE_FOLDER", re.compile(r"(?!)"))
    for (path, folder), problems in fast.items():
        assert bool(problems) == bool(rules.path_problems(path, folder=folder)), (path, folder)


@pytest.mark.parametrize("path", ["a\u0085b.md", "invoice\u202egpj.md", "x\u2028y.md",
                                  "a/\u200bzero.md", "x\u2066y.md", "\u009fz.md"])
def test_invisible_characters_are_refused(path):
    problems = path_problems(path)
    assert problems and "invisible" in " ".join(problems)


def test_plain_paths_are_valid_paths() -> None:
    # The batch check stands in for path_problems: whatever it passes must pass the rule.
    import random

    from sharedmem.rules import path_problems, plain_paths
    rng = random.Random(9)
    pieces = ["a", "Z", "9", "_", "-", ".", "/", ".md", "md", "con", "COM1", "lpt9", "nul", "aux",
              "prn", "com", "x" * 120, " ", "é", "\n", ":", "..", "~", "A.md", "con.md", "/"]
    passed = 0
    for _ in range(20000):
        paths = ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 7)))
                 for _ in range(rng.randint(1, 3))]
        if plain_paths(paths):
            passed += 1
            assert all(path_problems(p) == [] for p in paths), paths
    assert passed > 200  # the pieces do make plain paths


@pytest.mark.parametrize("paths", [["a.md"], ["notes/2026/x-y_z.v2.md", "Readme.md"],
                                   ["console.md", "a/comet/auxiliary.md", "nullable/x.md"],
                                   ["com.md", "a/lpt/com10.md", "CON-tents.md"], []])
def test_plain_paths_pass_everyday_names(paths: list[str]) -> None:
    from sharedmem.rules import plain_paths
    assert plain_paths(paths)


@pytest.mark.parametrize("path", ["con.md", "a/COM1.md", "lpt3/x.md", "a/.hidden.md", ".a.md",
                                  "a./b.md", "a//b.md", "/a.md", "a.txt", "é.md", "a b.md",
                                  "x" * 251 + ".md", "a\n.md", ""])
def test_plain_paths_leave_the_rest_to_the_full_check(path: str) -> None:
    from sharedmem.rules import plain_paths
    assert not plain_paths(["fine.md", path])


def test_the_collision_key_of_ascii_is_its_lower_case() -> None:
    # Plain paths (ASCII) take str.lower as their key on the walk and on ingest.
    from sharedmem.rules import collision_key
    ascii_text = "".join(chr(c) for c in range(128))
    assert collision_key(ascii_text) == ascii_text.lower()
