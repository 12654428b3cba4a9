"""scripts/corpus.py: the generated corpus, and a folder of real Markdown copied as one."""

from __future__ import annotations

import gzip
import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

sys.path.insert(0, str(REPO / "scripts"))
import corpus  # noqa: E402


def test_the_same_seed_writes_the_same_bytes(tmp_path: Path) -> None:
    one = corpus.generate(tmp_path / "one", files=30)
    two = corpus.generate(tmp_path / "two", files=30)
    assert one == two and one["files"] == 30
    names = sorted(p.relative_to(tmp_path / "one") for p in (tmp_path / "one").rglob("*.md"))
    assert names == sorted(p.relative_to(tmp_path / "two") for p in (tmp_path / "two").rglob("*.md"))
    assert all((tmp_path / "one" / n).read_bytes() == (tmp_path / "two" / n).read_bytes()
               for n in names)


def test_the_prose_style_is_the_corpus_it_always_was(tmp_path: Path) -> None:
    # Every figure in docs/BENCHMARKS.md was measured on it: the notes style must not move it.
    stats = corpus.generate(tmp_path / "c", files=60, seed=3)
    digest = hashlib.sha256()
    for path in sorted((tmp_path / "c").rglob("*.md")):
        digest.update(path.relative_to(tmp_path / "c").as_posix().encode() + b"\0"
                      + path.read_bytes())
    assert stats == {"files": 60, "bytes": 163708, "lines": 2726, "folders": 5, "seed": 3}
    assert digest.hexdigest() == "d281527bdc24b67f6b13af8e6182ed569f156821a5ae7d6b2c9f950c7f3b5de4"


def test_the_notes_style_holds_what_notes_hold_besides_prose(tmp_path: Path) -> None:
    stats = corpus.generate(tmp_path / "n", files=200, seed=5, style="notes")
    again = corpus.generate(tmp_path / "m", files=200, seed=5, style="notes")
    assert stats == again and stats["style"] == "notes" and stats["files"] == 200
    text = "".join(p.read_text(encoding="utf-8") for p in sorted((tmp_path / "n").rglob("*.md")))
    assert text.count("\n---\nname: ") + text.startswith("---\nname: ") > 50  # front matter
    assert text.count("- see https://") > 100 and "@git.example.org/" in text
    assert " = " in text and "_" in text and "\ndescription: " in text
    assert any(f"- {k}_" in text for k in ("api", "access", "auth"))
    assert corpus.describe(stats).endswith(", notes style")
    with pytest.raises(SystemExit, match="--style 'poetry': use one of prose, notes"):
        corpus.generate(tmp_path / "x", files=1, style="poetry")


def test_the_man_style_turns_manual_pages_into_text_and_leaves_the_rest(tmp_path: Path) -> None:
    pages = tmp_path / "man"
    (pages / "man1").mkdir(parents=True)
    (pages / "fr" / "man1").mkdir(parents=True)
    body = "".join(f"Line {i} of the \\fBpage\\fR, with \\-\\-flags\\(em and more.\n"
                   for i in range(8))
    roff = f'.TH FOO 1\n.\\" a comment\n.SH NAME\nfoo \\- do things\n.B \\-\\-all\n.PP\n{body}.zz x\n'
    (pages / "man1" / "foo.1.gz").write_bytes(gzip.compress(roff.encode()))
    (pages / "fr" / "man1" / "bar.1").write_text(".SS Détails\n" + body.replace("page", "pagé"),
                                                 encoding="utf-8")
    (pages / "man1" / "tiny.1").write_text(".SH NAME\ntiny\n", encoding="utf-8")
    (pages / "man1" / "latin.1").write_bytes(("caf\xe9 " * 100).encode("latin-1"))
    (pages / "man1" / "broken.1.gz").write_bytes(b"not gzip" * 100)
    stats = corpus.manuals(tmp_path / "c", 10, top=str(pages))
    out = tmp_path / "c"
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*.md")) == [
        "fr/man1/bar-1.md", "man1/foo-1.md"]
    foo = (out / "man1" / "foo-1.md").read_text(encoding="utf-8")
    assert foo.startswith("FOO 1\n## NAME\nfoo - do things\n--all\n\nLine 0 of the page, with "
                          "--flags- and more.\n") and "comment" not in foo and "zz" not in foo
    assert (out / "fr" / "man1" / "bar-1.md").read_text(encoding="utf-8").startswith(
        "### Détails\nLine 0 of the pagé")
    assert stats == {"files": 2, "bytes": sum(p.stat().st_size for p in out.rglob("*.md")),
                     "lines": 22, "folders": 2, "style": "man"}
    assert corpus.manuals(tmp_path / "d", 1, top=str(pages))["files"] == 1
    with pytest.raises(SystemExit, match="--style man: no manual pages found under"):
        corpus.manuals(tmp_path / "e", 5, top=str(tmp_path / "none"))


def test_a_copy_keeps_the_markdown_and_its_paths_and_leaves_the_rest(tmp_path: Path) -> None:
    notes = tmp_path / "notes"
    (notes / "team" / "deep").mkdir(parents=True)
    (notes / "a.md").write_text("title: abc\n", encoding="utf-8")
    (notes / "team" / "b.md").write_text("x = 1\nsecond line\n", encoding="utf-8")
    (notes / "team" / "deep" / "c.md").write_bytes("naïve_note\n".encode())
    (notes / "team" / "notes.txt").write_text("not markdown\n", encoding="utf-8")
    (notes / ".hidden.md").write_text("hidden\n", encoding="utf-8")
    (notes / ".git").mkdir()
    (notes / ".git" / "d.md").write_text("in a hidden folder\n", encoding="utf-8")
    (notes / "link.md").symlink_to(notes / "a.md")
    (notes / "linked").symlink_to(notes / "team")
    stats = corpus.copy(notes, tmp_path / "bench" / "corpus")
    out = tmp_path / "bench" / "corpus"
    copied = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert copied == ["a.md", "team/b.md", "team/deep/c.md"]
    assert (out / "team" / "deep" / "c.md").read_bytes() == "naïve_note\n".encode()
    assert stats == {"files": 3, "bytes": 11 + 18 + len("naïve_note\n".encode()), "lines": 4,
                     "folders": 3, "source": str(notes.resolve())}
    assert corpus.describe(stats) == f"corpus: 3 files, 0.0 MB, copied from {notes.resolve()}"
    assert not any(p.is_symlink() for p in out.rglob("*"))


def test_make_copies_when_told_a_folder_and_generates_otherwise(tmp_path: Path) -> None:
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "only.md").write_text("one\n", encoding="utf-8")
    assert corpus.make(tmp_path / "c1", 5, str(notes))["files"] == 1
    made = corpus.make(tmp_path / "c2", 5)
    assert made["files"] == 5 and "source" not in made
    assert corpus.describe(made) == f"corpus: 5 files, {made['bytes'] / 1e6:.1f} MB"


@pytest.mark.parametrize("case", ["missing", "a file", "no markdown", "inside it"])
def test_a_folder_that_cannot_be_a_corpus_is_refused_by_name(tmp_path: Path, case: str) -> None:
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "readme.txt").write_text("text\n", encoding="utf-8")
    source, root = notes, tmp_path / "bench"
    if case == "missing":
        source = tmp_path / "absent"
    elif case == "a file":
        source = notes / "readme.txt"
    elif case == "inside it":
        (notes / "a.md").write_text("a\n", encoding="utf-8")
        root = notes / "bench"
    with pytest.raises(SystemExit) as raised:
        corpus.copy(source, root)
    message = str(raised.value)
    assert message.startswith(f"--corpus {source.resolve()}: ")
    assert {"missing": "not a folder", "a file": "not a folder", "no markdown": "holds no .md",
            "inside it": "give --dir a folder outside"}[case] in message
    assert not (root / "a.md").exists()


@pytest.mark.skipif(shutil.which("rsync") is None, reason="the sync benchmark needs rsync")
def test_bench_sync_names_the_folder_it_cannot_copy(tmp_path: Path) -> None:
    # The option reaches the benchmark: a missing folder stops it before any sshd starts.
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "bench.py"), "sync",
                           "--corpus", str(tmp_path / "absent"), "--dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert f"--corpus {(tmp_path / 'absent').resolve()}: not a folder" in proc.stderr
