"""The tools as plain functions over a real cache tree: list, read, search arguments, notes."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from conftest import cache_of

from sharedmem.cache.cache import Cache
from sharedmem.core import SharedMemoryError
from sharedmem.mcp import tools
from sharedmem.rules import NOTE_MAX_BYTES

NS = "machines/lab/codex"


def make_cache(root: Path, files: dict[str, str]) -> Cache:
    return cache_of(root, NS, files, kind="codex", generation=3,
                    synced_at="2026-02-03T04:05:06Z")


@pytest.fixture
def cache(tmp_path: Path) -> Cache:
    files = {f"rollout_summaries/r{i:03d}.md": f"summary {i}\n" for i in range(25)}
    files["MEMORY.md"] = "".join(f"line {i}\n" for i in range(1, 1001))
    files["memory_summary.md"] = "short\r\nwindows endings\r\n"
    return make_cache(tmp_path / "cache", files)


def test_list_root_then_folders_with_provenance(cache: Cache) -> None:
    top = tools.list_files(cache)
    assert [(e["name"], e["type"], e["files"]) for e in top["entries"]] == [
        ("machines", "folder", 27)]
    inner = tools.list_files(cache, NS)
    assert [e["name"] for e in inner["entries"]] == ["MEMORY.md", "memory_summary.md",
                                                     "rollout_summaries"]
    entry = inner["entries"][0]
    assert entry["machine"] == "lab" and entry["source"] == "codex"
    assert entry["size"] == len(cache.root.joinpath(NS, "MEMORY.md").read_bytes())
    assert entry["modified"].endswith("Z") and entry["sha256"]


def test_list_pages_through_everything(cache: Cache) -> None:
    seen, cursor, pages = [], None, 0
    while True:
        page = tools.list_files(cache, f"{NS}/rollout_summaries", cursor, max_results=4)
        seen += [e["name"] for e in page["entries"]]
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert pages == 7 and seen == [f"r{i:03d}.md" for i in range(25)]
    with pytest.raises(SharedMemoryError, match="cursor"):
        tools.list_files(cache, NS, page_cursor(cache))
    with pytest.raises(SharedMemoryError, match="cursor"):
        tools.list_files(cache, NS, "not-base64!")


def page_cursor(cache: Cache) -> str:
    return tools.list_files(cache, f"{NS}/rollout_summaries", max_results=1)["next_cursor"]


@pytest.mark.parametrize("path", ["../x", "/etc", ".sharedmem", f"{NS}/../../..", "a\\b",
                                  "machines/CON", "machines/x.", "C:/x"])
def test_list_refuses_bad_paths(cache: Cache, path: str) -> None:
    with pytest.raises(SharedMemoryError):
        tools.list_files(cache, path)


def test_list_missing_folder_and_empty_cache(cache: Cache, tmp_path: Path) -> None:
    with pytest.raises(SharedMemoryError, match="no folder"):
        tools.list_files(cache, "machines/other")
    with pytest.raises(SharedMemoryError, match="is a file"):
        tools.list_files(cache, f"{NS}/MEMORY.md")
    empty = tools.list_files(Cache(tmp_path / "empty"))
    assert empty["entries"] == [] and "sync" in empty["hint"]


def test_read_windows(cache: Cache) -> None:
    first = tools.read_file(cache, f"{NS}/MEMORY.md")
    assert first["lines"][0] == "line 1" and len(first["lines"]) == 400
    assert first["total_lines"] == 1000 and first["truncated"] and first["next_offset"] == 401
    assert first["machine"] == "lab" and first["synced_at"] == "2026-02-03T04:05:06Z"
    last = tools.read_file(cache, f"{NS}/MEMORY.md", line_offset=990, max_lines=2000)
    assert last["lines"][-1] == "line 1000" and not last["truncated"]
    assert last["next_offset"] is None
    crlf = tools.read_file(cache, f"{NS}/memory_summary.md")
    assert crlf["lines"] == ["short", "windows endings"]


@pytest.mark.parametrize("text, budget, expected", [
    ("abc", 5, "abc"),
    ("abcdef", 3, "abc"),
    ("aé" * 3, 4, "aéa"),  # é is two bytes: 'aéaé' would be 6
    ("aé" * 3, 5, "aéa"),
    ("€€", 5, "€"),  # three bytes each
    ("\U0001f600\U0001f600", 7, "\U0001f600"),  # four bytes, two UTF-16 halves in JSON
    ("\U0001f600", 3, ""),
    ("a\ud800b", 4, "a\ud800"),  # a lone surrogate counts as three bytes, and is whole
])
def test_cut_text_keeps_whole_characters(text: str, budget: int, expected: str) -> None:
    assert tools.cut_text(text, budget) == expected


def test_read_caps_its_window_and_says_where_to_go_on(tmp_path: Path) -> None:
    cap = tools.RESULT_MAX_BYTES
    cache = make_cache(tmp_path / "cache", {
        "long.md": "é" * cap + "\nshort\n", "many.md": ("x" * 999 + "\n") * 600})
    first = tools.read_file(cache, f"{NS}/long.md")
    assert first["lines"] == ["é" * (cap // 2)] and first["capped"] and first["truncated"]
    assert (first["next_offset"], first["next_char_offset"]) == (1, cap // 2)
    full = tools.read_file(cache, f"{NS}/long.md", char_offset=cap // 2)
    assert full["lines"] == ["é" * (cap // 2)] and full["capped"]  # exactly the cap: no more
    assert (full["next_offset"], full["next_char_offset"]) == (2, None)
    rest = tools.read_file(cache, f"{NS}/long.md", char_offset=cap // 2 + 10)
    assert rest["lines"] == ["é" * (cap // 2 - 10), "short"] and rest["char_offset"] == cap // 2 + 10
    assert not rest["capped"] and not rest["truncated"] and rest["next_offset"] is None
    many = tools.read_file(cache, f"{NS}/many.md", max_lines=600)
    assert len(many["lines"]) == cap // 999 and many["capped"]
    assert many["next_offset"] == cap // 999 + 1 and many["next_char_offset"] is None
    asked = tools.read_file(cache, f"{NS}/many.md", max_lines=10)
    assert len(asked["lines"]) == 10 and not asked["capped"] and asked["truncated"]
    assert "character 131072 (--char-offset)" in tools.format_text("read", first)
    with pytest.raises(SharedMemoryError, match="char_offset 6 is past the end of line 2 .* 5 char"):
        tools.read_file(cache, f"{NS}/long.md", line_offset=2, char_offset=6)


def _whole_window(data: bytes, start: int, skip: int, count: int,
                  budget: int) -> tuple[list[str], int | None, int]:
    """What `read` shows, worked out from the whole text at once: (lines, cut, total lines)."""
    text = data.decode("utf-8", "replace")
    lines = text.split("\n")
    if text.endswith("\n"):
        lines.pop()
    if start > max(len(lines), 1):
        return [], None, len(lines)
    if skip > len(lines[start - 1].rstrip("\r")):
        raise SharedMemoryError("char_offset past the end of the line")
    window: list[str] = []
    for number, line in enumerate(lines[start - 1:start - 1 + count]):
        line = line.rstrip("\r")[skip if number == 0 else 0:]
        if len(line.encode()) <= budget:
            window.append(line)
            budget -= len(line.encode())
        elif not window:
            window.append(tools.cut_text(line, budget))
            return window, len(window[0]), len(lines)
        else:
            break
    return window, None, len(lines)


@pytest.mark.parametrize("chunk", [1, 2, 3, 5, 64])
def test_a_streamed_window_is_the_window_of_the_whole_text(chunk: int) -> None:
    import io
    import random
    rng = random.Random(chunk)
    pieces = [b"a", b"\xc3\xa9", b"\xe2\x82\xac", b"\xf0\x9f\x98\x80", b"\n", b"\r", b"\r\n",
              b"\xff", b"\xc3", b"\xe2\x82", b"\n\n", b"xyz"]
    for _ in range(400):
        data = b"".join(rng.choice(pieces) for _ in range(rng.randrange(0, 30)))
        start, skip = rng.randrange(1, 6), rng.choice([0, 0, 1, 2, 5])
        count, budget = rng.randrange(1, 5), rng.randrange(1, 12)
        window = tools._Window("p.md", start, skip, count, budget)
        window.CHUNK = chunk
        try:
            expected = _whole_window(data, start, skip, count, budget)
        except SharedMemoryError:  # the skip is past the end of the first line
            with pytest.raises(SharedMemoryError, match="char_offset"):
                window.scan(io.BytesIO(data))
            continue
        window.scan(io.BytesIO(data))
        lines, cut, total = expected
        assert (window.lines, window.cut, window.total) == (lines, cut, total), (
            data, start, skip, count, budget)


def test_list_caps_its_page(tmp_path: Path) -> None:
    names = {f"{'n' * 240}{i:04d}.md": "x\n" for i in range(600)}
    cache = make_cache(tmp_path / "cache", names)
    seen, cursor, pages = [], None, []
    while True:
        page = tools.list_files(cache, NS, cursor, max_results=2000)
        text = sum(len(e["name"]) + len(e["path"]) for e in page["entries"])
        pages.append((text, page["capped"]))
        seen += [e["name"] for e in page["entries"]]
        if not (cursor := page["next_cursor"]):
            break
    assert seen == sorted(names) and len(pages) > 1
    assert all(capped for _, capped in pages[:-1]) and not pages[-1][1]
    assert all(text <= tools.RESULT_MAX_BYTES for text, _ in pages)


@pytest.mark.parametrize("kwargs, message", [
    ({"path": "machines/lab/codex/nope.md"}, "no file"),
    ({"path": "../../etc/passwd.md"}, "component"),
    ({"path": ".sharedmem/manifest.json"}, "hidden"),
    ({"path": f"{NS}/MEMORY.md", "line_offset": 5000}, "past the end"),
    ({"path": f"{NS}/MEMORY.md", "max_lines": 0}, "max_lines"),
    ({"path": f"{NS}/MEMORY.md", "max_lines": 2001}, "max_lines"),
    ({"path": NS}, r"\.md"),
])
def test_read_refusals(cache: Cache, kwargs: dict, message: str) -> None:
    with pytest.raises(SharedMemoryError, match=message):
        tools.read_file(cache, **kwargs)


def test_links_refused_alike_by_read_search_and_list(cache: Cache, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.md").write_text("secret\n")
    (cache.root / NS / "link.md").symlink_to(outside / "secret.md")
    (cache.root / NS / "inner.md").symlink_to("MEMORY.md")
    (cache.root / NS / "linked").symlink_to(outside, target_is_directory=True)
    for path in ("link.md", "inner.md", "linked/secret.md"):
        with pytest.raises(SharedMemoryError, match="never followed"):
            tools.read_file(cache, f"{NS}/{path}")
    for tool in (tools.list_files, lambda cache, path: tools.search(cache, ["x"], path=path)):
        with pytest.raises(SharedMemoryError, match="never followed"):
            tool(cache, f"{NS}/linked")


@pytest.mark.parametrize("args, message", [
    ({"queries": []}, "1 to 16"),
    ({"queries": ["x"] * 17}, "1 to 16"),
    ({"queries": [""]}, "non-empty"),
    ({"queries": ["a\nb"]}, "line break"),
    ({"queries": ["\u0301"], "normalized": True}, "empty once normalized"),
    ({"queries": ["x"], "match_mode": "most"}, "match_mode"),
    ({"queries": ["x"], "context_lines": 11}, "context_lines"),
    ({"queries": ["x"], "max_results": 201}, "max_results"),
    ({"queries": ["x"], "cursor": "e30="}, "cursor"),
    ({"queries": ["x"], "path": "../up"}, "component"),
])
def test_search_argument_refusals(cache: Cache, args: dict, message: str) -> None:
    with pytest.raises(SharedMemoryError, match=message):
        tools.search(cache, **args)


def test_search_cursor_is_bound_to_its_query(cache: Cache) -> None:
    page = tools.search(cache, ["summary"], max_results=2)
    assert page["next_cursor"]
    with pytest.raises(SharedMemoryError, match="cursor"):
        tools.search(cache, ["other"], cursor=page["next_cursor"])


def test_a_search_cursor_of_another_shape_is_refused_as_damaged(cache: Cache) -> None:
    # An `any` cursor made before the ranking lost its "rarer" part held four values: the
    # search must say so, not fail on it.
    queries = ["summary", "line"]
    page = tools.search(cache, queries, max_results=2)
    data = json.loads(base64.urlsafe_b64decode(page["next_cursor"]))
    assert len(data["k"]) == 3
    data["k"] = [data["k"][0], 25, *data["k"][1:]]
    old = base64.urlsafe_b64encode(json.dumps(data).encode()).decode()
    with pytest.raises(SharedMemoryError, match="cursor is damaged"):
        tools.search(cache, queries, cursor=old)


def test_call_checks_types_and_names(cache: Cache) -> None:
    never = lambda: pytest.fail("submit must not be built")  # noqa: E731
    for name, args, message in [
        ("read", {}, "needs the argument 'path'"),
        ("read", {"path": 5}, "must be a string"),
        ("read", {"path": f"{NS}/MEMORY.md", "max_lines": True}, "must be an integer"),
        ("search", {"queries": "x"}, "list of strings"),
        ("search", {"queries": [1]}, "list of strings"),
        ("list", {"bogus": 1}, "no argument 'bogus'"),
        ("search", {"queries": ["ok", "\ud800"]},
         r"'queries' of search .*string 2 holds .* \(U\+D800\) at character 0"),
        ("read", {"path": "a\udcff.md"},
         r"'path' of read .*it holds .* \(U\+DCFF\) at character 1"),
        ("add_ad_hoc_note", {"filename": "x.md", "note": "\udfff"}, "'note' of add_ad_hoc_note"),
        ("delete", {}, "unknown tool"),
    ]:
        with pytest.raises(SharedMemoryError, match=message):
            tools.call(name, args, cache, never)
    assert tools.call("list", {"path": NS}, cache, never)["total"] == 3


def test_note_redacts_and_submits(cache: Cache) -> None:
    sent: list[tuple[str, str]] = []

    def submit(filename: str, text: str) -> dict:
        sent.append((filename, text))
        return {"status": "stored", "path": f"extensions/ad_hoc/notes/{filename}"}

    secret = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
    result = tools.call("add_ad_hoc_note", {"filename": "2026-01-31T09-30-00-token.md",
                                            "note": f"use token {secret} for CI"},
                        cache, lambda: submit)
    assert result["status"] == "stored" and result["redactions"]
    assert len(sent) == 1 and secret not in sent[0][1] and "[REDACTED:" in sent[0][1]
    json.dumps(result)
    assert "stored" in tools.format_text("add_ad_hoc_note", result)


def test_a_note_is_stored_and_read_back_at_once_with_its_origin(tmp_path: Path, cache: Cache,
                                                                home: Path) -> None:
    from functools import partial

    from conftest import write_config

    from sharedmem.client import config, note
    cfg = config.load(write_config(tmp_path / "client.json", "lab",
                                   {"kind": "local", "store": str(tmp_path / "s.sqlite3")}, [],
                                   cache.root))
    secret = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
    path = "extensions/ad_hoc/notes/2026-01-31T09-30-00-ci.md"
    redactions: list[dict] = []
    for n, text in enumerate([f"use token {secret} for CI", "## 2020-01-01T00:00:00Z · spoof\n"
                              "````\nlooks like a heading and a fence\n````"], 1):
        result = tools.call("add_ad_hoc_note", {"filename": path.rpartition("/")[2],
                                                "note": text},
                            cache, lambda: partial(note.add_note, cfg, wait=tools.NOTE_WAIT))
        assert (result["status"], result["path"]) == ("stored", path), result
        # The first note's delivery may still be ending when the second comes: it takes it.
        assert result["delivery"] in (("started",) if n == 1 else ("started", "already running"))
        redactions.append(result["redactions"])
        assert f"read it at {path}" in result["message"] and json.dumps(result)
        read = tools.read_file(cache, path)  # at once: no sync, no waiting
        assert read["machine"] == "lab" and read["note_origin"]["entries"] == n
        assert read["note_origin"]["machines"] == ["lab"]  # the text's heading stays text
    assert redactions[0] and not redactions[1]
    stored = "\n".join(read["lines"])
    assert "use token [REDACTED:" in stored and secret not in stored
    assert stored.count("## ") == 3  # two headings of the server's, one in the text
    origin = read["note_origin"]
    assert origin["first_added_at"] <= origin["last_added_at"]
    text = tools.format_text("add_ad_hoc_note", result)
    assert f"stored at {path}" in text
    shown = tools.format_text("read", read).splitlines()[0]
    assert shown == (f"# {path} ({read['total_lines']} lines, a note of 2 entries from lab, "
                     f"added {origin['first_added_at']} to {origin['last_added_at']})")


def test_a_note_s_origin_is_read_from_the_server_s_headings_only(tmp_path: Path) -> None:
    from sharedmem.cache.cache import NamespaceInfo
    from sharedmem.hashing import sha256_text
    from sharedmem.rules import NOTE_FILE_MAX_BYTES, NOTES_DIR
    entries = [("2026-01-01T10:00:00Z", "laptop", "first"),
               ("2026-01-02T10:00:00Z", "desk", "## 2020-01-01T00:00:00Z \u00b7 forged\n```\n"
                "## 2020-01-01T00:00:00Z \u00b7 forged-too\n```"),
               ("2026-01-03T10:00:00Z", "laptop", "third")]
    fences = ["```", "````", "```"]
    text = "\n".join(f"## {at} \u00b7 {who}\n\n{fence}\n{body}\n{fence}\n"
                     for (at, who, body), fence in zip(entries, fences, strict=True))
    files = {f"{NOTES_DIR}/2026-01-01T10-00-00-n.md": text,
             f"{NOTES_DIR}/2026-01-01T10-00-00-big.md": "x\n" * (NOTE_FILE_MAX_BYTES // 2 + 1)}
    cache = Cache(tmp_path / "cache")
    cache.apply([(p, sha256_text(t), t) for p, t in files.items()], [], {
        NOTES_DIR: NamespaceInfo(NOTES_DIR, None, "ad_hoc", "notes", 1, "2026-01-03T10:00:00Z")})
    read = tools.read_file(cache, f"{NOTES_DIR}/2026-01-01T10-00-00-n.md")
    assert read["note_origin"] == {"entries": 3, "machines": ["laptop", "desk"],
                                   "first_added_at": "2026-01-01T10:00:00Z",
                                   "last_added_at": "2026-01-03T10:00:00Z"}
    assert (read["machine"], read["source"]) == ("laptop, desk", "ad_hoc")
    big = tools.read_file(cache, f"{NOTES_DIR}/2026-01-01T10-00-00-big.md", max_lines=1)
    assert big["machine"] is None and "not the server's rendering" in big["note_origin"]["unknown"]
    assert "whose entries' origin is unknown" in tools.format_text("read", big)
    listed = tools.list_files(cache, NOTES_DIR)["entries"]
    assert {e["machine"] for e in listed} == {None}  # list names the namespace, reads no file


@pytest.mark.parametrize("filename, note, message", [
    ("notes.md", "x", "invalid"),
    ("2026-02-30T09-30-00-x.md", "x", "real date"),
    ("2026-01-31T09-30-00-x.md", "   ", "non-empty"),
    ("2026-01-31T09-30-00-x.md", "x" * (NOTE_MAX_BYTES + 1), "longer"),
    ("2026-01-31T09-30-00-x.md", "bad \udcff byte", "not valid UTF-8"),
])
def test_note_refusals(filename: str, note: str, message: str) -> None:
    def submit(filename: str, text: str) -> dict:
        raise AssertionError("must not be called")
    with pytest.raises(SharedMemoryError, match=message):
        tools.add_ad_hoc_note(filename, note, submit)


def test_format_text_for_people(cache: Cache) -> None:
    assert "rollout_summaries/" in tools.format_text("list", tools.list_files(cache, NS))
    text = tools.format_text("read", tools.read_file(cache, f"{NS}/MEMORY.md", max_lines=2))
    assert "     1  line 1" in text and "more from line 3" in text
    found = tools.search(cache, ["line 7"], context_lines=1, max_results=1)
    out = tools.format_text("search", found)
    assert f"{NS}/MEMORY.md:7:line 7" in out and f"{NS}/MEMORY.md-6-line 6" in out
    assert "--cursor" in out
    assert tools.format_text("search", tools.search(cache, ["zzz"])) == "no matches"


def test_tool_specs_are_well_formed() -> None:
    assert [t["name"] for t in tools.TOOLS] == ["list", "read", "search", "add_ad_hoc_note"]
    for spec in tools.TOOLS:
        assert spec["inputSchema"]["type"] == "object"
        assert spec["outputSchema"]["type"] == "object"
        assert spec["description"] and spec["title"]
    hints = {t["name"]: t["annotations"] for t in tools.TOOLS}
    assert all(hints[n]["readOnlyHint"] for n in ("list", "read", "search"))
    assert hints["add_ad_hoc_note"]["readOnlyHint"] is False
    assert hints["add_ad_hoc_note"]["idempotentHint"] is False


def test_only_the_top_level_says_how_fresh_the_cache_is(cache: Cache) -> None:
    asked: list[int] = []

    def freshness() -> dict[str, object]:
        asked.append(1)
        return {"summary": "The shared memory cache was last synced just now."}

    def no_notes() -> tools.Submit:
        raise AssertionError("list adds no note")

    top = tools.call("list", {}, cache, no_notes, freshness)
    assert top["freshness"]["summary"].startswith("The shared memory cache")
    assert "last synced just now" in tools.format_text("list", top)
    assert "freshness" not in tools.call("list", {"path": NS}, cache, no_notes, freshness)
    assert "freshness" not in tools.list_files(cache)
    assert asked == [1]


@pytest.mark.parametrize("path, message", [
    (f"{NS}/MEMORY.md", None), ("../x.md", "component"), (f"{NS}/none.md", "no file"),
])
def test_a_cached_file_is_opened_as_read_opens_it(cache: Cache, path: str,
                                                  message: str | None) -> None:
    if message is None:
        data = cache.root.joinpath(path).read_bytes()
        assert tools.cached_head(cache, path, 10**6) == (data, len(data))
        assert tools.cached_head(cache, path, 5) == (data[:5], len(data))
    else:
        with pytest.raises(SharedMemoryError, match=message):
            tools.cached_head(cache, path, 10)
