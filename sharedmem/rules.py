"""What both ends agree on: source kinds, published folders, limits, and the name, path and note rules.

The server checks every rule again on ingest; a client is never trusted to have filtered.
"""

from __future__ import annotations

import re
import unicodedata
from collections import namedtuple
from collections.abc import Sequence

from sharedmem.core import LimitError, NameRuleError, NoteError, PathRuleError

KIB = 1024
MIB = 1024 * KIB

SOURCE_CODEX = "codex"
SOURCE_CLAUDE = "claude-code"
KIND_MARKDOWN = "markdown"
SOURCE_KINDS = (SOURCE_CODEX, SOURCE_CLAUDE, KIND_MARKDOWN)
RESERVED_SOURCE_NAMES = frozenset({SOURCE_CODEX, SOURCE_CLAUDE})

MACHINES_DIR = "machines"
NOTES_DIR = "extensions/ad_hoc/notes"
NOTE_MAX_BYTES = 64 * KIB
# A note file as the server renders it (each entry under its heading, in its fence) stays within
# this, the default per-file limit (Limits().file_bytes), so every client can pull it: an entry
# that would take it past is refused (start a new note file), and a file stored before this
# bound is shown up to it, with a marker saying how many entries are left out.
NOTE_FILE_MAX_BYTES = 1 * MIB
# What one machine may add in one UTC day, over all note files: entries, and bytes of text.
NOTE_DAY_MAX_NOTES = 200
NOTE_DAY_MAX_BYTES = 4 * MIB

MAX_COMPONENT_BYTES = 255
MAX_PATH_BYTES = 1024

_NAME_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")
# C1 controls (Cc), format characters such as bidi overrides and zero-width marks (Cf), and
# line/paragraph separators: they make a path display as something it is not.
_INVISIBLE = frozenset({"Cc", "Cf", "Zl", "Zp"})
_FORBIDDEN_CHARS = frozenset('\\<>:"|?*')
# The patterns of the path and note rules, compiled at their first use (`compile_rules`):
# `serve` loads this module before its hello and checks no path or note there. _SAFE_FILE and
# _SAFE_FOLDER are the fast path: plain ASCII names that obviously pass every rule below
# (checked against the full rule in the tests); anything else takes the full check.
_NOTE_FILENAME_RE = _SAFE_FILE = _SAFE_FOLDER = _RESERVED_RE = _PLAIN_CHARS = None
_compiled = False  # set last, once all of them are there
_RESERVED_WINDOWS = frozenset(
    {"CON", "PRN", "AUX", "NUL"}
    | {f"{port}{i}" for port in ("COM", "LPT") for i in (*"123456789", "\u00b9", "\u00b2", "\u00b3")}
)  # Windows also treats the superscript digits 1-3 as port numbers


class Limits(namedtuple("Limits", "file_bytes namespace_bytes namespace_files machine_bytes "
                         "machine_files machine_namespaces session_bytes session_messages "
                         "sessions",
                         defaults=(1 * MIB, 64 * MIB, 20_000, 256 * MIB, 100_000, 64,
                                   1024 * MIB, 100_000, 8))):
    """Size limits: a file; a namespace; a machine, over all its namespaces on the server.

    The defaults protect both ends. The machine totals hold only on the server, which alone
    sees every namespace of a machine (an operator sets them with `serve --limit`): without
    them one machine could fill the server's disk with namespaces each within its quota. So do
    the bounds of one session (the bytes it may send, decompressed, and its messages), which
    bound the server's work for one connection, and the sessions a store runs at once, which
    bound its memory under a burst of clients. A named tuple, not a dataclass: the dataclasses
    module would cost `serve` milliseconds before its hello.
    """

    __slots__ = ()

    def problems(self) -> list[str]:
        """Every reason these limits are unusable."""
        out = []
        for name in self._fields:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                out.append(f"limit {name} must be a positive integer, not {value!r}")
        return out

    @classmethod
    def parse(cls, settings: Sequence[str]) -> Limits:
        """Limits from `NAME=VALUE` settings (`serve --limit`), the rest at their defaults.

        Raises LimitError naming each bad setting and the names there are.
        """
        values: dict[str, int] = {}
        problems: list[str] = []
        for setting in settings:
            name, _, raw = setting.partition("=")
            name = name.strip().replace("-", "_")
            if name not in cls._fields:
                problems.append(f"unknown limit {setting!r}: use NAME=VALUE with NAME one of "
                                f"{', '.join(cls._fields)}")
            elif not (raw.strip().isascii() and raw.strip().isdigit()):
                problems.append(f"limit {name} must be a positive integer, not {raw!r}")
            else:
                values[name] = int(raw)
        limits = cls(**values)
        problems += limits.problems()
        if problems:
            raise LimitError("; ".join(problems))
        return limits


def compile_rules() -> None:
    """Compile the patterns of the path and note rules (a second thread may too: the same)."""
    global _NOTE_FILENAME_RE, _SAFE_FILE, _SAFE_FOLDER, _RESERVED_RE, _PLAIN_CHARS, _compiled
    part = r"[A-Za-z0-9_-](?:[A-Za-z0-9_.-]{0,253}[A-Za-z0-9_-])?"
    _NOTE_FILENAME_RE = re.compile(
        r"([0-9]{4})-([0-9]{2})-([0-9]{2})T([0-9]{2})-([0-9]{2})-([0-9]{2})-([a-z0-9][a-z0-9-]{0,79})"
        r"\.md")
    _SAFE_FILE = re.compile(rf"(?:{part}/)*[A-Za-z0-9_-][A-Za-z0-9_.-]{{0,249}}\.md")
    _SAFE_FOLDER = re.compile(rf"{part}(?:/{part})*")
    _RESERVED_RE = re.compile(r"(?:^|/)(?:con|prn|aux|nul|com[1-9]|lpt[1-9])(?:[./]|$)",
                              re.IGNORECASE)
    _PLAIN_CHARS = re.compile(r"[A-Za-z0-9_.\n/-]*")
    _compiled = True


def name_problem(name: object, what: str = "name") -> str | None:
    """Why `name` is not a valid machine or source name, or None.

    A name is a folder of every client's cache, so it obeys the path rule for a component
    too: a name the server took but a client could not write would stop that client's pull.
    """
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        return (
            f"{what} {name!r} is invalid: use 1-63 characters of lower-case letters, digits, "
            "'.', '_' or '-', starting with a letter or digit"
        )
    if name.endswith("."):
        return (f"{what} {name!r} is invalid: it ends in a dot, which Windows drops from a "
                "folder name; end it with a letter or digit")
    if name.split(".", 1)[0].upper() in _RESERVED_WINDOWS:
        return (f"{what} {name!r} is invalid: {name.split('.', 1)[0]!r} is a reserved device "
                "name on Windows (con, prn, aux, nul, com1-9, lpt1-9, also before a dot), so "
                "no client there can make its folder; pick another name")
    return None


def check_machine_name(name: object) -> str:
    """Return `name` if it is a valid machine name, else raise."""
    problem = name_problem(name, "machine name")
    if problem:
        raise NameRuleError(problem)
    return name  # type: ignore[return-value]


def check_markdown_source_name(name: object) -> str:
    """Return `name` if a `markdown` source may use it; codex and claude-code are reserved."""
    problem = name_problem(name, "source name")
    if problem:
        raise NameRuleError(problem)
    if name in RESERVED_SOURCE_NAMES:
        raise NameRuleError(
            f"source name {name!r} is reserved for the {name} source kind: pick another name "
            "for this markdown folder"
        )
    return name  # type: ignore[return-value]


def path_problems(path: object, *, folder: bool = False) -> list[str]:
    """Every way `path` breaks the published path rule (empty when it is valid).

    With `folder`, the path names a folder of published files and need not end in `.md`.
    """
    if not isinstance(path, str):
        return [f"path {path!r} is not a string"]
    if not _compiled:
        compile_rules()
    if (len(path) <= MAX_PATH_BYTES and (_SAFE_FOLDER if folder else _SAFE_FILE).fullmatch(path)
            and not _RESERVED_RE.search(path)):
        return []
    shown = repr(path)
    problems: list[str] = []
    if not path:
        return ["path is empty"]
    if "\x00" in path:
        problems.append(f"path {shown} contains a NUL character")
    if any(ord(c) < 32 or ord(c) == 127 for c in path.replace("\x00", "")):
        problems.append(f"path {shown} contains a control character")
    elif any(unicodedata.category(c) in _INVISIBLE for c in path):
        problems.append(f"path {shown} contains an invisible control, direction or separator "
                        "character (such as U+0085, U+202E or U+2028): rename the file")
    if unicodedata.normalize("NFC", path) != path:
        problems.append(f"path {shown} is not in Unicode NFC form")
    if path.startswith("/"):
        problems.append(f"path {shown} is absolute; published paths are relative")
    if re.match(r"^[A-Za-z]:", path):
        problems.append(f"path {shown} starts with a drive letter")
    try:
        encoded = path.encode("utf-8")
    except UnicodeEncodeError:
        return problems + [f"path {shown} is not valid Unicode (lone surrogate)"]
    if len(encoded) > MAX_PATH_BYTES:
        problems.append(f"path {shown} is longer than {MAX_PATH_BYTES} bytes")
    bad_chars = sorted({c for c in path if c in _FORBIDDEN_CHARS})
    if bad_chars:
        problems.append(f"path {shown} contains forbidden characters {''.join(bad_chars)!r}")
    for part in path.split("/"):
        problems.extend(_component_problems(part, shown))
    if not folder and not path.endswith(".md"):
        problems.append(f"path {shown} does not end in .md")
    return problems


def plain_paths(paths: Sequence[str]) -> bool:
    """True when every one of `paths` is a plain file path, which obeys the rule for sure.

    Plain: ASCII letters, digits, `_`, `-` and `.`, components that neither start nor (but for
    the `.md` of the file) end with a dot, and no Windows reserved name. A few scans of all the
    paths at once stand for a regex match per path, a tenth of the cost for 10,000 files. False
    says nothing: check each path (`path_problems`).
    """
    if not paths:
        return True
    if not _compiled:
        compile_rules()
    joined = "\n".join(paths) + "\n"
    if (not _PLAIN_CHARS.fullmatch(joined) or joined.count("\n") != len(paths)
            or joined.count(".md\n") != len(paths)
            or max(map(len, paths)) > _PLAIN_MAX or joined[0] in "./\n"
            or "\n." in joined or "/." in joined or "./" in joined or "//" in joined
            or "\n/" in joined):
        return False
    lowered = "\n" + joined.lower()
    for needle, numbered in _RESERVED_NEEDLES:  # Windows reserved names
        at = lowered.find(needle)
        while at != -1:
            end = at + 4
            if numbered and lowered[end] in "123456789":  # only com1-9 and lpt1-9 are reserved
                end += 1
            # A reserved name ends its component ("." or "/"; a line ends in .md, not in it).
            if (not numbered or end > at + 4) and lowered[end] in "./":
                return False
            at = lowered.find(needle, at + 1)
    return True


# Each reserved name where a component starts, and whether it is reserved only numbered.
_RESERVED_NEEDLES = tuple((f"{start}{name}", name in ("com", "lpt"))
                          for name in ("con", "prn", "aux", "nul", "com", "lpt")
                          for start in ("\n", "/"))


_PLAIN_MAX = 253  # the longest file name _SAFE_FILE takes; shorter than every other limit


def _component_problems(part: str, shown: str) -> list[str]:
    if part in ("", ".", ".."):
        return [f"path {shown} has an empty, '.' or '..' component"]
    out = []
    if part.startswith("."):
        out.append(f"path {shown} has a hidden component {part!r}")
    if part.endswith((".", " ")):
        out.append(f"path {shown} has a component ending in a dot or space: {part!r}")
    if part.split(".", 1)[0].rstrip(" ").upper() in _RESERVED_WINDOWS:
        out.append(f"path {shown} uses the Windows reserved name {part!r}")
    if len(part.encode("utf-8", "surrogatepass")) > MAX_COMPONENT_BYTES:
        out.append(f"path {shown} has a component longer than {MAX_COMPONENT_BYTES} bytes")
    return out


def check_path(path: object, *, folder: bool = False) -> str:
    """Return `path` if it obeys the path rule, else raise naming every problem."""
    problems = path_problems(path, folder=folder)
    if problems:
        raise PathRuleError("; ".join(problems))
    return path  # type: ignore[return-value]


def collision_key(path: str) -> str:
    """Key under which two paths would land on one file on macOS or Windows."""
    return unicodedata.normalize("NFC", unicodedata.normalize("NFC", path).casefold())


def note_filename_problem(filename: object) -> str | None:
    """Why `filename` is not a valid ad-hoc note filename, or None."""
    if not _compiled:
        compile_rules()
    if not isinstance(filename, str) or not _NOTE_FILENAME_RE.fullmatch(filename):
        return (
            f"note filename {filename!r} is invalid: use YYYY-MM-DDTHH-MM-SS-<slug>.md in ASCII "
            "digits, with a slug of lower-case ASCII letters, digits and '-' (1-80 characters), e.g. "
            "2026-01-31T09-30-00-release-checklist.md"
        )
    year, month, day, hour, minute, second = (int(g) for g in _NOTE_FILENAME_RE.fullmatch(
        filename).groups()[:6])
    from datetime import datetime
    try:
        datetime(year, month, day, hour, minute, second)
    except ValueError:
        return f"note filename {filename!r} does not start with a real date and time"
    return None


def check_note(filename: object, text: object, *, redacted: bool = False) -> str:
    """Return a note's text if the note rule takes the note, else raise NoteError.

    The one note check: the tool and `note` call it before and after redacting, the outbox
    before queuing, and the server again before storing, since it trusts no client. `redacted`
    (the text is the redactor's output) changes only what a note too long is told.
    """
    problem = note_filename_problem(filename)
    if problem:
        raise NoteError(problem)
    if not isinstance(text, str) or not text.strip():
        raise NoteError("note must be non-empty text: write what should be remembered")
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise NoteError("note is not valid UTF-8 text (it holds a lone surrogate): write it "
                        "again as UTF-8") from None
    if size > NOTE_MAX_BYTES:
        raise NoteError(f"note is longer than {NOTE_MAX_BYTES} bytes once redacted: shorten it"
                        if redacted else f"note is longer than {NOTE_MAX_BYTES} bytes of UTF-8: "
                        "shorten it or split it into several notes")
    return text
