"""The documentation against the code: every command and option documented, no broken links.

The command tree is walked from the real argparse parsers (`sharedmem.cli.main.parser()` and the two
installers'), so a new option without a mention in README.md or docs/*.md fails here by name.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from sharedmem.cli import main as cli
from sharedmem.install.client_install import parser as client_parser
from sharedmem.install.server_install import server_parser

REPO = Path(__file__).resolve().parent.parent
LAUNCHER = "shared_memory.py"
IGNORED_OPTIONS = frozenset({"--help"})

_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.MULTILINE | re.DOTALL)
_CODE = re.compile(r"`+[^`\n]*`+")
_LINK = re.compile(r"!?\[(?:[^\]\n]|\][^(\n])*\]\(\s*<?([^)\s>]+)>?(?:\s+[\"'][^\n]*?[\"'])?\s*\)")


def doc_paths(root: Path = REPO) -> list[Path]:
    """README.md and every Markdown file directly in docs/."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def doc_text(root: Path = REPO) -> str:
    """Everything the user can read, as one text."""
    return "\n".join(p.read_text(encoding="utf-8") for p in doc_paths(root) if p.is_file())


def walk(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
         ) -> Iterator[tuple[tuple[str, ...], list[str]]]:
    """(command path, long options) for a parser and each of its subcommands, depth first."""
    options = [s for action in parser._actions for s in action.option_strings
               if s.startswith("--") and s not in IGNORED_OPTIONS]
    yield path, options
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from walk(sub, (*path, name))


def _word(word: str) -> str:
    return rf"(?<![\w-]){re.escape(word)}(?![\w-])"


def command_mentioned(path: tuple[str, ...], text: str, program: str) -> bool:
    """A top-level command is named on a line with the program; a nested one beside its parent."""
    if not path:
        return True
    if len(path) == 1:
        pattern = _word(program) + r".*" + _word(path[0])
    else:
        pattern = _word(path[-2]) + r".*" + _word(path[-1])
    return re.search(pattern, text) is not None


def undocumented(parser: argparse.ArgumentParser, text: str, program: str) -> list[str]:
    """Every command and long option of `parser` that `text` never mentions, as readable lines."""
    missing = []
    for path, options in walk(parser):
        shown = " ".join((program, *path))
        if not command_mentioned(path, text, program):
            missing.append(f"command `{shown}` is not documented (mention `{shown}` in README.md "
                           "or docs/*.md)")
        for option in options:
            if re.search(_word(option), text) is None:
                missing.append(f"option `{shown} {option}` is not documented (mention {option} "
                               "in README.md or docs/*.md)")
    return missing


def broken_links(paths: list[Path]) -> list[str]:
    """Relative Markdown links (outside code) whose target file does not exist."""
    out = []
    for path in paths:
        text = path.read_text(encoding="utf-8")
        prose = _CODE.sub("", _FENCE.sub("", text))
        for match in _LINK.finditer(prose):
            target = match.group(1)
            if re.match(r"(?i)(?:[a-z][a-z0-9+.-]*:|#)", target):
                continue  # http(s), mailto and other schemes; anchors within the page
            file_part = target.split("#", 1)[0].split("?", 1)[0]
            if not (path.parent / file_part).exists():
                out.append(f"{path.name}: link [{target}] does not resolve "
                           f"({(path.parent / file_part).resolve()} is missing)")
    return out


PARSERS = [
    pytest.param(cli.parser, LAUNCHER, id="shared_memory.py"),
    pytest.param(server_parser, "install_server.py", id="install_server.py"),
    pytest.param(client_parser, "install_client.py", id="install_client.py"),
]


@pytest.mark.parametrize(("make", "program"), PARSERS)
def test_every_command_and_option_is_documented(make: object, program: str) -> None:
    parser = make()  # type: ignore[operator]
    assert list(walk(parser))[0][1], f"{program}: the walk found no options at all"
    missing = undocumented(parser, doc_text(), program)
    assert not missing, "\n".join(["undocumented:"] + missing)


def test_the_walk_reaches_nested_commands_and_their_options() -> None:
    commands = {path: options for path, options in walk(cli.parser())}
    assert ("sync",) in commands and "--config" in commands[("sync",)]
    assert "--version" in commands[()]
    assert "--help" not in commands[("sync",)]
    nested = [path for path in commands if len(path) > 1]
    if ("backup",) in commands:
        assert nested, "backup has subcommands, but the walk did not reach them"


def _toy() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="tool")
    top.add_argument("--verbose", action="store_true")
    sub = top.add_subparsers(dest="command")
    box = sub.add_parser("box")
    inner = box.add_subparsers(dest="action")
    make = inner.add_parser("make")
    make.add_argument("--label")
    make.add_argument("-q", "--quiet-mode", action="store_true")
    sub.add_parser("boxed")
    return top


def test_the_checker_names_each_missing_command_and_option() -> None:
    text = "Run `tool box make --label X`, or `tool boxed`; add --verbose for more."
    assert undocumented(_toy(), text, "tool") == [
        "option `tool box make --quiet-mode` is not documented (mention --quiet-mode in "
        "README.md or docs/*.md)"]
    missing = undocumented(_toy(), "tool boxed --verbose --labels --quiet-mode-x", "tool")
    assert "command `tool box` is not documented (mention `tool box` in README.md or " \
           "docs/*.md)" in missing
    assert any("`tool box make`" in m and "command" in m for m in missing)
    assert any("--label is" not in m and "`tool box make --label`" in m for m in missing)
    assert any("`tool box make --quiet-mode`" in m for m in missing)


def test_the_real_docs_have_no_broken_relative_links() -> None:
    problems = broken_links([p for p in doc_paths() if p.is_file()])
    assert not problems, "\n".join(["broken links:"] + problems)


def test_the_link_checker_finds_a_broken_link(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "B.md").write_text("# B\n")
    (tmp_path / "README.md").write_text(
        "[ok](docs/B.md) [ok too](docs/B.md#b) [web](https://example.com/x.md) "
        "[mail](mailto:me@example.com) [anchor](#top) [gone](docs/MISSING.md#part)\n"
        "```\n[in code](docs/ALSO-MISSING.md)\n```\n`[inline](docs/NOPE.md)`\n"
        "![image](docs/pic.png)\n")
    (tmp_path / "docs" / "A.md").write_text("[up](../README.md) [sibling](B.md) [bad](C.md)\n")
    problems = broken_links(doc_paths(tmp_path))
    assert len(problems) == 3, problems
    assert any("[docs/MISSING.md#part]" in p for p in problems)
    assert any("[docs/pic.png]" in p for p in problems)
    assert any(p.startswith("A.md: link [C.md]") for p in problems)
