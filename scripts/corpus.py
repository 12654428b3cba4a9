#!/usr/bin/env python3
"""Deterministic Markdown corpus for benchmarks and tests: same seed, same bytes, every time.

Files are 200 B to 20 KB in folders up to four deep, mostly English-like prose with some
accented words (NFC, and a few NFD), some non-Latin text, and rare identifiers
(`RareIdent0000`...) that each appear in only a few files. Its text has no `:`, `=` or `_`,
which real notes hold and the redactor's screens stop at. The `notes` style adds what real
notes hold besides prose (front matter, links, `key: value` lines, code); the `docs` style
gathers the documentation this machine has (Markdown, reStructuredText and text files under
/usr/share/doc, global npm packages, Python's library), real text the project has not seen,
each written as a `.md` file; the `man` style takes this machine's manual pages (roff turned
to text: many of their lines hold a word or two, and many are in other languages); `copy` takes
a folder of real Markdown as the corpus instead.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import re
import sys
import sysconfig
import unicodedata
from pathlib import Path

WORDS = (
    "the memory session agent build release deploy config cache server client sync note "
    "search index file folder machine source project team review test error fix change "
    "update plan decision context summary rollout branch commit merge docs script install "
    "policy token backup store query result page cursor limit path rule module function "
    "value default option command output input stream format schema version network"
).split()
ACCENTED = ("décision", "café", "résumé", "naïve", "façade", "Zürich", "jalapeño", "coöperate",
            "élève", "Ångström", "crème", "déjà")
FOREIGN = ("日本語のメモ", "Привет мир", "Ελληνικά", "مرحبا", "한국어 메모", "ไทย")
PHRASE = "rotate the signing key"
COMMON = "session"
STYLES = ("prose", "notes", "docs", "man")
DOCS = ("/usr/share/doc", "/usr/local/lib/node_modules", "/usr/lib/node_modules",
        sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"])
DOC_SUFFIXES = (".md", ".rst", ".txt")
MANUALS = "/usr/share/man"
# roff: font, character and spacing escapes (`_unescaped`); macros whose arguments are text, and
# those that only break the text
_ROFF_ESCAPE = re.compile(r"\\(f(\[[^]]*\]|\(..|.)|\(..|\[[^]]*\]|\*(\(..|\[[^]]*\]|.)"
                          r"|s[-+]?\d+|[hv]'[^']*'|[&e|^ c-])")
_ROFF_TEXT = {"B", "I", "BR", "IR", "RB", "BI", "IB", "RI", "SM", "TP", "IP", "TH", "Nm", "Nd",
              "Fl", "Ar", "It", "Dt"}
_ROFF_BREAK = {"PP", "LP", "P", "br", "sp", "Pp"}


def _line(rng: random.Random, rare: list[str]) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(4, 14))]
    roll = rng.random()
    if roll < 0.08:
        word = rng.choice(ACCENTED)
        words.insert(rng.randrange(len(words)), unicodedata.normalize(
            "NFD" if rng.random() < 0.3 else "NFC", word))
    elif roll < 0.11:
        words.insert(rng.randrange(len(words)), rng.choice(FOREIGN))
    elif roll < 0.112:
        words.insert(rng.randrange(len(words)), rng.choice(rare))
    elif roll < 0.115:
        words.append(PHRASE)
    if rng.random() < 0.2:
        words[0] = words[0].capitalize()
    prefix = rng.choice(("", "", "", "- ", "* ", "  - ", "## "))
    return prefix + " ".join(words)


def _noted(extra: random.Random, line: str, n: int) -> str:
    """A prose line, now and then made into one of what notes hold besides prose.

    Links (a tenth of the lines; one in ten of those with a user before an '@'), `key: value`
    lines, code, and now and then a name the redactor's keyword screen stops at.
    """
    roll = extra.random()
    word, other = extra.choice(WORDS), extra.choice(WORDS)
    if roll < 0.09:
        return f"- see https://{word}.example.org/{other}/{n}"
    if roll < 0.10:
        return f"- clone https://{word}@git.example.org/{other}.git"
    if roll < 0.16:
        return f"{word}: {line.lstrip('-*# ')}"
    if roll < 0.19:
        return f"    {word}_{other} = {other}({n})"
    if roll < 0.20:
        return f"- {extra.choice(('api', 'access', 'auth'))}_{word}: {other} {n}"
    return line


def generate(root: Path, files: int = 10000, seed: int = 1,
             style: str = "prose") -> dict[str, int]:
    """Write `files` Markdown files under `root`; return counts (files, bytes, lines, folders).

    The `notes` style draws its additions from a second generator, so `prose` stays the bytes
    it always was.
    """
    if style not in STYLES:
        raise SystemExit(f"--style {style!r}: use one of {', '.join(STYLES)}")
    if style == "docs":
        return docs(Path(root), files)
    if style == "man":
        return manuals(Path(root), files)
    rng = random.Random(seed)
    extra = random.Random(seed + 1_000_003) if style == "notes" else None
    root = Path(root)
    rare = [f"RareIdent{i:04d}" for i in range(max(1, files // 50))]
    folders = [""]
    for depth in range(1, 5):
        for i in range(max(1, files // (40 * depth))):
            parent = rng.choice([f for f in folders if f.count("/") == depth - 2] or [""])
            name = f"{rng.choice(WORDS)}-{i:03d}"
            folders.append(f"{parent}/{name}".lstrip("/") if parent else name)
    total_bytes = total_lines = 0
    for n in range(files):
        folder = rng.choice(folders)
        target = root / folder / f"{rng.choice(WORDS)}-{n:05d}.md"
        size = int(min(20_000, max(200, rng.lognormvariate(7.6, 0.8))))
        lines = [f"# {rng.choice(WORDS).capitalize()} {n}", ""]
        if extra is not None and extra.random() < 0.5:  # front matter, as agents' memories have
            lines[:0] = ["---", f"name: {extra.choice(WORDS)} {extra.choice(WORDS)}",
                         f"description: {_line(extra, rare).lstrip('-*# ')}",
                         f"type: {extra.choice(WORDS)}", "---"]
        length = sum(len(x.encode("utf-8")) + 1 for x in lines)
        while length < size:
            line = _line(rng, rare)
            if extra is not None:
                line = _noted(extra, line, n)
            lines.append(line)
            length += len(line.encode("utf-8")) + 1
        text = "\n".join(lines) + "\n"
        target.parent.mkdir(parents=True, exist_ok=True)
        data = text.encode("utf-8")
        target.write_bytes(data)
        total_bytes += len(data)
        total_lines += len(lines)
    return {"files": files, "bytes": total_bytes, "lines": total_lines,
            "folders": len(folders), "seed": seed, **({"style": style} if extra is not None else {})}


def docs(root: Path, files: int) -> dict[str, int]:
    """Up to `files` documentation files of this machine (`DOCS`) written under `root` as `.md`.

    In the order of a sorted walk of each folder, so the same machine gives the same corpus;
    files that are not UTF-8, empty, hidden, links or over 1 MiB are left out.
    """
    tally = _Tally()
    for top in dict.fromkeys(DOCS):
        for folder, subfolders, names in os.walk(top):
            subfolders[:] = sorted(d for d in subfolders if not d.startswith("."))
            for name in sorted(names):
                path = Path(folder, name)
                if tally.files >= files or not name.endswith(DOC_SUFFIXES) or name.startswith(".") \
                        or path.is_symlink() or not path.is_file() or path.stat().st_size > 1 << 20:
                    continue
                data = path.read_bytes()
                try:
                    data.decode("utf-8")
                except UnicodeDecodeError:
                    continue
                if not data:
                    continue
                relative = Path(top.strip("/").replace("/", "-").lstrip(".")) / path.relative_to(top)
                tally.write(root / relative.parent / f"{relative.stem.lstrip('.')}-"
                            f"{relative.suffix[1:]}.md", relative.parent, data)
    if not tally.files:
        raise SystemExit(f"--style docs: no documentation found under {', '.join(DOCS)}")
    return {**tally.counts(), "style": "docs"}


def manuals(root: Path, files: int, top: str = MANUALS) -> dict[str, int]:
    """Up to `files` of this machine's manual pages under `top`, each as Markdown under `root`.

    Evenly spread over the sorted list of all of them (each language's folder among the
    English ones), so the same machine gives the same corpus. roff turned to text (`_page`); pages
    that are not UTF-8 (gzipped or not), over 1 MiB, or under 200 bytes once turned are left out.
    """
    pages = sorted(p for p in Path(top).rglob("*") if p.is_file() and not p.is_symlink())
    tally = _Tally()
    for path in pages[::max(1, len(pages) // files)] if files else []:
        if tally.files >= files or path.stat().st_size > 1 << 20:
            continue
        try:
            data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
            text = _page(data.decode("utf-8"))
        except (OSError, EOFError, UnicodeDecodeError):
            continue
        if len(text) < 200:
            continue
        relative = path.relative_to(top)
        name = relative.name.removesuffix(".gz").replace(".", "-")
        tally.write(root / relative.parent / f"{name}.md", relative.parent, text.encode())
    if not tally.files:
        raise SystemExit(f"--style man: no manual pages found under {top}")
    return {**tally.counts(), "style": "man"}


def _page(roff: str) -> str:
    """A manual page's roff as Markdown-like text: headings kept, other macros' words kept alone.

    Comments and unknown macros are dropped, as are roff's escapes (fonts, special characters).
    """
    lines = []
    for line in roff.splitlines():
        if line.startswith((".\\\"", "'\\\"")):
            continue
        if line.startswith((".", "'")):
            macro, _, words = line[1:].partition(" ")
            words = words.strip().replace('"', "")
            if macro in ("SH", "Sh"):
                line = "## " + words
            elif macro in ("SS", "Ss"):
                line = "### " + words
            elif macro in _ROFF_BREAK:
                line = ""
            elif macro in _ROFF_TEXT:
                line = words
            else:
                continue
        lines.append(_ROFF_ESCAPE.sub(_unescaped, line))
    return "\n".join(lines).strip() + "\n"


def _unescaped(escape: re.Match[str]) -> str:
    """What a roff escape prints as text: a hyphen, a backslash, a space, a dash; else nothing."""
    return {"\\-": "-", "\\e": "\\", "\\ ": " ", "\\(em": "-", "\\(en": "-"}.get(
        escape.group(), "")


class _Tally:
    """The files a corpus was made of, written as they are taken, and their counts."""

    def __init__(self) -> None:
        self.files = self.bytes = self.lines = 0
        self.folders: set[str] = set()

    def write(self, target: Path, folder: Path, data: bytes) -> None:
        """Write one file of the corpus (`folder` its folder within it) and count it."""
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        self.files += 1
        self.bytes += len(data)
        self.lines += data.count(b"\n")
        self.folders.add(folder.as_posix())

    def counts(self) -> dict[str, int]:
        """What `generate` returns of a corpus: files, bytes, lines, folders."""
        return {"files": self.files, "bytes": self.bytes, "lines": self.lines,
                "folders": len(self.folders)}


STYLE_HELP = ("prose (default: 60 words, no ':', '=' or '_'), notes (front matter, links, "
              "key: value lines and code as well, which the redactor's screens stop at) or docs "
              "(this machine's documentation, up to --files files: real text never seen here) "
              "or man (this machine's manual pages, roff as text: short lines, many languages)")
COPY_HELP = ("a folder of Markdown to copy as the corpus, paths kept, instead of generating "
             "one (--files is then ignored); the 1%% phase appends to the copy")


def copy(source: Path, root: Path) -> dict[str, int | str]:
    """Copy the `.md` files below `source` to `root`, paths kept; return counts as `generate`.

    Hidden names and links are left out, as a sync leaves them. The benchmarks append to the
    copy, never to `source`.
    """
    source, root = Path(source).resolve(), Path(root).resolve()
    if not source.is_dir():
        raise SystemExit(f"--corpus {source}: not a folder; name a folder of Markdown files")
    if root == source or source in root.parents:
        raise SystemExit(f"--corpus {source}: the benchmark's folder {root} is inside it; "
                         "give --dir a folder outside the corpus")
    tally = _Tally()
    for folder, subfolders, names in os.walk(source):
        subfolders[:] = sorted(d for d in subfolders if not d.startswith(".")
                               and not os.path.islink(os.path.join(folder, d)))
        for name in sorted(names):
            path = Path(folder, name)
            if name.startswith(".") or not name.endswith(".md") or path.is_symlink() \
                    or not path.is_file():
                continue
            relative = path.relative_to(source)
            tally.write(root / relative, relative.parent, path.read_bytes())
    if not tally.files:
        raise SystemExit(f"--corpus {source}: holds no .md file (hidden names and links are "
                         "left out); name a folder of Markdown files")
    return {**tally.counts(), "source": str(source)}


def make(root: Path, files: int = 10000, copy_of: str | None = None,
         style: str = "prose") -> dict[str, int | str]:
    """The benchmarks' corpus: a copy of the folder `copy_of`, or else `files` generated."""
    return copy(Path(copy_of), root) if copy_of else generate(root, files, style=style)


def describe(stats: dict[str, int | str]) -> str:
    """One line for people: how many files, how large, and from where when copied."""
    where = f", copied from {stats['source']}" if "source" in stats else ""
    style = f", {stats['style']} style" if "style" in stats else ""
    return f"corpus: {stats['files']} files, {int(stats['bytes']) / 1e6:.1f} MB{where}{style}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path, help="folder to fill (created if absent)")
    parser.add_argument("--files", type=int, default=10000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--style", choices=STYLES, default="prose", help=STYLE_HELP)
    args = parser.parse_args(argv)
    print(json.dumps(generate(args.root, args.files, args.seed, args.style)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
