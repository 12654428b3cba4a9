"""JSON with one large mapping written an entry a line: a rewrite reuses unchanged entries' text.

The cache manifest and each source's snapshot record hold one entry per file (10,000 for a big
memory folder) and are rewritten by every sync that changes a file; encoding them whole cost a
sync more than anything else it did for a one-percent change. The files stay plain JSON:
`{"version": 1, "files": {` on the first line, then one `"key": value` a line, then `}}`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    Old = Mapping[str, tuple[Any, str]]  # key -> (value, its line as last read or written)


def rewrite(head: Mapping[str, Any], key: str, items: Iterable[tuple[str, Any, bool]],
            old: Old, value: Callable[[Any], Any] | None = None) -> str:
    """`head` plus `key` mapping to `items`, for a writer that knows which items are unchanged.

    Each item is (name, item, kept): a kept one takes its line from `old` as it is, nothing
    compared; the others, and a kept one `old` has no line for, are encoded, as `value(item)`
    when `value` is given (so a kept one's is never made). A sync that changed 100 of 10,000
    files encodes 100 lines, and compares none of the rest.
    """
    lines: list[str] = []
    fresh: list[tuple[int, str, Any]] = []
    if isinstance(old, _Lines):
        line_of = old.lines().get
    else:
        def line_of(name: str) -> str | None:
            known = old.get(name)
            return None if known is None else known[1]
    append = lines.append
    for name, item, kept in items:
        line = line_of(name) if kept else None
        if line is None:
            fresh.append((len(lines), name, item if value is None else value(item)))
            line = ""
        append(line)
    for (at, _, _), line in zip(fresh, _lines([(n, v) for _, n, v in fresh]), strict=True):
        lines[at] = line
    return _text(head, key, lines)


def _text(head: Mapping[str, Any], key: str, lines: list[str]) -> str:
    """The file: `head` with `key` last, then its entries' lines, one a line."""
    first = json.dumps({**head, key: {}}, ensure_ascii=False)[:-2]  # ends in `"key": {`
    body = ",\n".join(lines)
    return f"{first}\n{body}\n}}}}"


_ENCODE = json.JSONEncoder(ensure_ascii=False).encode


def _lines(items: list[tuple[str, Any]]) -> list[str]:
    """`"name": value` for each item, as `json.dumps` writes them.

    Many items whose values are arrays are encoded in two calls and split where one element
    ends and the next begins. An encoded string never holds `", "` (its quotes are escaped);
    an array holds `], [` only where it nests arrays or strings hold it, and then the count
    is off and each item is encoded by itself.
    """
    if len(items) > 64 and all(type(value) in (list, tuple) for _, value in items):
        names = _ENCODE([name for name, _ in items])[2:-2].split('", "')
        values = _ENCODE([value for _, value in items])[1:-1].split("], [")
        if len(values) == len(items):
            last = len(values) - 1
            return [f'"{name}": {"[" if i else ""}{value}{"]" if i < last else ""}'
                    for i, (name, value) in enumerate(zip(names, values, strict=True))]
    return [f"{_ENCODE(name)}: {_ENCODE(value)}" for name, value in items]


def decode(text: str, key: str) -> tuple[dict[str, Any], Old]:
    """The object, and the lines of its `key` mapping when the text is in this module's form.

    The lines are empty otherwise: a file from an older version, or edited by hand, is read all
    the same, and its next rewrite encodes every entry.
    """
    value = json.loads(text)
    entries = value.get(key) if isinstance(value, dict) else None
    if not isinstance(entries, dict) or not entries:
        return value, {}
    return value, _Lines(text, entries)


class _Lines(Mapping):  # of str -> (value, line): Old
    """The lines of a mapping as read, split off the text only when first asked for.

    A sync that rewrites nothing (no change) never asks, and splitting thousands of lines would
    cost it milliseconds. One that does (`rewrite`) asks for lines by name, and pairs no value with its line.
    """

    def __init__(self, text: str, entries: dict[str, Any]) -> None:
        self._text, self._entries = text, entries
        self._split: dict[str, str] | None = None  # see `lines`
        self._lines: dict[str, tuple[Any, str]] | None = None  # see `_made`

    def lines(self) -> dict[str, str]:
        """Each name's line as read, without its comma; none when the text is not one a line.

        Split off the text once, at the first call.
        """
        if self._split is None:
            lines = self._text.split("\n")
            self._split = ({name: line[:-1] if line[-1:] == "," else line
                            for name, line in zip(self._entries, lines[1:-1], strict=True)}
                           if len(lines) == len(self._entries) + 2 else {})
            self._text = ""
        return self._split

    def _made(self) -> dict[str, tuple[Any, str]]:
        if self._lines is None:
            lines = self.lines()
            self._lines = {name: (item, lines[name]) for name, item in self._entries.items()
                           } if lines else {}
        return self._lines

    def __getitem__(self, name: str) -> tuple[Any, str]:
        return self._made()[name]

    def get(self, name: str, default: Any = None) -> Any:  # noqa: D102 - Mapping's, one lookup
        return self._made().get(name, default)

    def __contains__(self, name: object) -> bool:
        return name in self._made()

    def __iter__(self) -> Iterator[str]:
        return iter(self._made())

    def __len__(self) -> int:
        return len(self._made())
