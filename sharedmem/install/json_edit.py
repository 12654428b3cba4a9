"""JSON (and JSONC) files edited as text: one member of one object changes, every other byte stays.

The standard library reads JSON but writes it only whole, so a harness's file rewritten with
`json.dumps` would lose its layout (one-line arrays spread over many lines, tabs turned into
spaces, CRLF into LF). Here the text is scanned token by token into the spans of its objects
and their members; a member is inserted, replaced or removed by splicing those bytes alone,
written in the file's own indentation, and every result is parsed again to prove that nothing
else changed. JSONC (comments and trailing commas), which OpenCode reads, is scanned the same
way: its comments are kept where they are.
"""

from __future__ import annotations

import bisect
import copy
import json
import re
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

from sharedmem.core import InstallError

_TOKEN = re.compile(r"""
    [ \t\r\n]*
    (?:
        (?P<string>"[^"\\]*(?:\\.[^"\\]*)*")
      | (?P<punct>[{}\[\]:,])
      | (?P<literal>-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?|true|false|null)
      | (?P<comment>//[^\n]*|/\*.*?\*/)
      | (?P<end>\Z)
    )
""", re.VERBOSE | re.DOTALL)
_BOM = "\ufeff"
DEFAULT_INDENT = "  "


@dataclass
class Node:
    """A value's span in the text; an object also lists its members in order."""

    kind: str  # "object" | "array" | "scalar"
    start: int
    end: int = -1
    members: list[Member] = field(default_factory=list)
    items: list[Node] = field(default_factory=list)  # an array's values, in order


@dataclass
class Member:
    """One `"key": value` of an object; `comma` is the offset of the comma after it, if any."""

    key: str
    key_start: int
    key_end: int
    value: Node
    comma: int | None = None


def _position(text: str, offset: int) -> str:
    line = text.count("\n", 0, offset) + 1
    return f"line {line}, column {offset - text.rfind(chr(10), 0, offset)}"


class Document:
    """The parsed text of one JSON file, its values (`data`) and the spans of its objects."""

    def __init__(self, path: Path, text: str, *, jsonc: bool = False) -> None:
        self.path, self.text, self.jsonc = path, text, jsonc
        self.comments: list[int] = []  # where each comment starts
        tokens, clean = self._scan()
        try:
            self.data = json.loads(clean)
        except json.JSONDecodeError as exc:
            self._refuse(f"{exc.msg} at {_position(text, exc.pos)}")
        except RecursionError:
            self._refuse("it is nested too deeply to read")
        if not isinstance(self.data, dict):
            raise InstallError(f"{path} does not hold a JSON object; fix it or move it aside, "
                               "then re-run -- it was left untouched")
        self.root = _tree(text, tokens)
        self.newline = "\r\n" if "\r\n" in text else "\n"
        self.indent, self.colon, self.comma = self._style()
        self.one_line = bool(self.root.members) and "\n" not in text[self.root.start:self.root.end]

    # --- reading ------------------------------------------------------------------------------

    def _refuse(self, why: str) -> NoReturn:
        kind = "JSONC" if self.jsonc else "JSON"
        raise InstallError(f"{self.path} is not valid {kind} ({why}); fix it or move it aside, "
                           "then re-run -- it was left untouched")

    def _scan(self) -> tuple[list[tuple[str, int, int]], str]:
        """The significant tokens (kind, start, end), and the text json.loads can read.

        The cleaned text keeps every offset: a comment or a trailing comma becomes spaces.
        """
        text = self.text
        pos = 1 if text.startswith(_BOM) else 0
        tokens: list[tuple[str, int, int]] = []
        blanks: list[tuple[int, int]] = [(0, 1)] if pos else []
        match = _TOKEN.match
        while True:
            found = match(text, pos)
            if found is None:
                while text[pos] in " \t\r\n":
                    pos += 1
                what = ("an unterminated string" if text[pos] == '"' else
                        "an unterminated comment" if text.startswith("/*", pos) else
                        f"the unexpected character {text[pos]!r}")
                self._refuse(f"{what} at {_position(text, pos)}")
            kind = found.lastgroup or ""
            if kind == "end":
                break
            start, end = found.span(kind)
            if kind == "comment":
                if not self.jsonc:
                    self._refuse(f"a comment at {_position(text, start)}: comments are not "
                                 "allowed in this file")
                blanks.append((start, end))
                self.comments.append(start)
            elif kind == "punct":
                char = text[start]
                if (char in "}]" and self.jsonc and len(tokens) > 1 and tokens[-1][0] == ","
                        and tokens[-2][0] not in "{[,:"):  # a trailing comma after a value
                    blanks.append((tokens[-1][1], tokens[-1][2]))
                tokens.append((char, start, end))
            else:
                tokens.append((kind, start, end))
            pos = end
        if not blanks:
            return tokens, text
        parts, last = [], 0
        for start, end in sorted(blanks):
            parts += [text[last:start], re.sub(r"[^\n]", " ", text[start:end])]
            last = end
        return tokens, "".join(parts) + text[last:]

    def _style(self) -> tuple[str, str, str]:
        """The indentation unit, the key-value separator and the compact item separator."""
        indent = colon = comma = None
        queue = deque([self.root])
        while queue and None in (indent, colon, comma):
            node = queue.popleft()
            members = node.members
            if members and indent is None and "\n" in self.text[node.start:members[0].key_start]:
                outer, inner = self.line_indent(node.start), self.line_indent(members[0].key_start)
                if inner.startswith(outer) and len(inner) > len(outer):
                    indent = inner[len(outer):]
            for one, two in zip(members, members[1:], strict=False):
                gap = self.text[one.value.end:two.key_start]
                if comma is None and "\n" not in gap and not self.commented(one.value.end, two.key_start):
                    comma = gap
            for member in members:
                gap = self.text[member.key_end:member.value.start]
                if colon is None and gap.strip() == ":" and "\n" not in gap:
                    colon = gap
                queue.append(member.value)
        colon = ": " if colon is None else colon
        return (indent or DEFAULT_INDENT, colon,
                comma if comma is not None else ("," if colon == ":" else ", "))

    def commented(self, start: int, end: int) -> bool:
        """Whether a comment starts between offsets `start` and `end`."""
        index = bisect.bisect_left(self.comments, start)
        return index < len(self.comments) and self.comments[index] < end

    def line_indent(self, offset: int) -> str:
        """The blanks that start the line holding `offset`."""
        start = self.text.rfind("\n", 0, offset) + 1
        line = self.text[start:offset]
        return line[:len(line) - len(line.lstrip(" \t"))]

    def get(self, keys: tuple[str, ...]) -> object:
        """The value at `keys` (None when a key is missing or a value on the way is no object)."""
        node: object = self.data
        for key in keys:
            if not isinstance(node, dict) or key not in node:
                return None
            node = node[key]
        return node

    def _member(self, node: Node, key: str, keys: tuple[str, ...]) -> Member | None:
        found = [m for m in node.members if m.key == key]
        if len(found) > 1:
            raise InstallError(f"{self.path} has {'.'.join(keys)} {len(found)} times; keep one "
                               "by hand, then re-run -- the file was left untouched")
        return found[0] if found else None

    def _object(self, keys: tuple[str, ...]) -> tuple[Node, int]:
        """The deepest object along `keys` and how many of the keys lead to it."""
        node = self.root
        for depth, key in enumerate(keys):
            member = self._member(node, key, keys[:depth + 1])
            if member is None:
                return node, depth
            if member.value.kind != "object":
                raise InstallError(f"{self.path}: {'.'.join(keys[:depth + 1])} is not a JSON "
                                   "object; fix it by hand, then re-run")
            node = member.value
        return node, len(keys)

    # --- writing ------------------------------------------------------------------------------

    def render(self, value: object, indent: str, compact: bool) -> str:
        """`value` as JSON in this file's style, its later lines indented by `indent`."""
        if compact:
            return json.dumps(value, ensure_ascii=False, separators=(self.comma, self.colon))
        text = json.dumps(value, ensure_ascii=False, indent=self.indent,
                          separators=(",", self.colon))
        return text.replace("\n", self.newline + indent)

    def _blanks_before(self, offset: int) -> int:
        while offset and self.text[offset - 1] in " \t\r\n":
            offset -= 1
        return offset

    def _insert(self, node: Node, key: str, value: object) -> list[tuple[int, int, str]]:
        """The splice that adds `"key": value` as the last member of `node`."""
        text, nl = self.text, self.newline
        name = json.dumps(key, ensure_ascii=False) + self.colon
        if node.members:
            last = node.members[-1]
            before = node.members[-2] if len(node.members) > 1 else None
            gap = text[before.value.end:last.key_start] if before else ""
            if not before or self.commented(before.value.end, last.key_start):
                # no separator to copy: a comma, then the blanks that start the last line
                blanks = text[self._blanks_before(last.key_start):last.key_start]
                gap = ("," + nl + blanks[blanks.rfind("\n") + 1:] if "\n" in blanks
                       else self.comma)
            indent = self.line_indent(last.key_start)
            member = name + self.render(value, indent, "\n" not in gap)
            return [(last.value.end, last.value.end, gap + member)]
        inside = node.start + 1, node.end - 1
        if self.one_line:
            member = name + self.render(value, "", True)
            if self.commented(*inside):
                return [(inside[0], inside[0], member)]
            return [(inside[0], inside[1], member)]
        outer = self.line_indent(node.start)
        indent = outer + self.indent
        member = nl + indent + name + self.render(value, indent, False)
        if self.commented(*inside):
            return [(inside[0], inside[0], member)]
        return [(inside[0], inside[1], member + nl + outer)]

    def _delete(self, node: Node, member: Member) -> list[tuple[int, int, str]]:
        """The splices that take `member` out of `node`, its comma with it, comments kept.

        Taking out the last member removes the comma before it and the blanks between, so
        it undoes `_insert` byte for byte.
        """
        text, members = self.text, node.members
        index = members.index(member)
        end = member.value.end
        after_comma = member.comma + 1 if member.comma is not None else end
        if len(members) == 1:
            if not self.commented(node.start + 1, node.end - 1):
                return [(node.start + 1, node.end - 1, "")]
            return [(self._blanks_before(member.key_start), after_comma, "")]
        if index:
            before = members[index - 1]
            if not self.commented(before.value.end, member.key_start):
                return [(before.value.end, end, "")]
            assert before.comma is not None
            return [(before.comma, before.comma + 1, ""),
                    (self._blanks_before(member.key_start), end, "")]
        following = members[1]
        if not self.commented(end, following.key_start):
            return [(member.key_start, following.key_start, "")]
        stop = after_comma
        while stop < len(text) and text[stop] in " \t\r\n":
            stop += 1
        return [(member.key_start, stop, "")]

    def _apply(self, splices: list[tuple[int, int, str]], expected: dict, what: str) -> str:
        """The text with `splices` made, re-read to prove it holds `expected` and nothing else."""
        text = self.text
        for start, end, new in sorted(splices, reverse=True):
            text = text[:start] + new + text[end:]
        try:
            result = Document(self.path, text, jsonc=self.jsonc)
        except InstallError as exc:
            raise InstallError(f"editing {self.path} safely is not possible ({exc}); nothing "
                               f"was written: {what} by hand") from exc
        if result.data != expected:
            raise InstallError(f"editing {self.path} safely is not possible (the result would "
                               f"change more than one entry); nothing was written: {what} by "
                               "hand")
        return text

    def set(self, keys: tuple[str, ...], value: object) -> str:
        """The text with the member at `keys` set to `value`; missing objects on the way added."""
        node, depth = self._object(keys[:-1])
        expected = copy.deepcopy(self.data)
        target = expected
        for key in keys[:-1]:
            target = target.setdefault(key, {})
        target[keys[-1]] = value
        what = f"set {'.'.join(keys)} to {json.dumps(value, ensure_ascii=False)}"
        if depth < len(keys) - 1:
            nested: object = value
            for key in reversed(keys[depth + 1:]):
                nested = {key: nested}
            return self._apply(self._insert(node, keys[depth], nested), expected, what)
        member = self._member(node, keys[-1], keys)
        if member is None:
            return self._apply(self._insert(node, keys[-1], value), expected, what)
        old = member.value
        compact = ("\n" not in self.text[old.start:old.end] if old.kind == "object"
                   and old.members else self.one_line)
        new = self.render(value, self.line_indent(member.key_start), compact)
        return self._apply([(old.start, old.end, new)], expected, what)

    def remove(self, keys: tuple[str, ...]) -> str:
        """The text without the member at `keys` (unchanged when there is none)."""
        node, depth = self._object(keys[:-1])
        member = self._member(node, keys[-1], keys) if depth == len(keys) - 1 else None
        if member is None:
            return self.text
        expected = copy.deepcopy(self.data)
        target = expected
        for key in keys[:-1]:
            target = target[key]
        del target[keys[-1]]
        return self._apply(self._delete(node, member), expected,
                           f"remove {'.'.join(keys)}")

    def _array(self, keys: tuple[str, ...]) -> Node:
        """The array that is the member at `keys` (it must be one)."""
        node, depth = self._object(keys[:-1])
        member = self._member(node, keys[-1], keys) if depth == len(keys) - 1 else None
        if member is None or member.value.kind != "array":
            raise InstallError(f"{self.path}: {'.'.join(keys)} is not a JSON array; fix it by "
                               "hand, then re-run")
        return member.value

    def append(self, keys: tuple[str, ...], value: object) -> str:
        """The text with `value` added as the last item of the array at `keys`.

        The item goes right after the last one, after a copy of the separator between the last
        two (or the file's compact one), so `remove_item` gives the bytes back.
        """
        array = self._array(keys)
        expected = copy.deepcopy(self.data)
        target = expected
        for key in keys:
            target = target[key]
        target.append(value)
        what = f"add {json.dumps(value, ensure_ascii=False)} to {'.'.join(keys)}"
        items = array.items
        if not items:
            return self._apply([(array.start + 1, array.start + 1, self.render(value, "", True))],
                               expected, what)
        last = items[-1]
        gap = self.comma
        if len(items) > 1 and not self.commented(items[-2].end, last.start):
            gap = self.text[items[-2].end:last.start]
        elif "\n" in self.text[array.start:last.start]:
            gap = "," + self.text[self._blanks_before(last.start):last.start]
        indent = self.line_indent(last.start)
        return self._apply([(last.end, last.end, gap + self.render(value, indent, True))],
                           expected, what)

    def remove_item(self, keys: tuple[str, ...], value: object) -> str:
        """The text without the items equal to `value` in the array at `keys`.

        Each goes with the separator before it, as `append` put it in.
        """
        array = self._array(keys)
        values = self.get(keys)
        assert isinstance(values, list)
        doomed = [i for i, item in enumerate(values) if item == value]
        if not doomed:
            return self.text
        expected = copy.deepcopy(self.data)
        target = expected
        for key in keys[:-1]:
            target = target[key]
        target[keys[-1]] = [item for item in values if item != value]
        splices = []
        items = array.items
        for index in doomed:
            item = items[index]
            if index and not self.commented(items[index - 1].end, item.start):
                splices.append((items[index - 1].end, item.end, ""))
            elif index + 1 < len(items) and not self.commented(item.end, items[index + 1].start):
                splices.append((item.start, items[index + 1].start, ""))
            elif len(items) == 1:
                splices.append((item.start, item.end, ""))
            else:
                raise InstallError(f"{self.path}: a comment sits next to "
                                   f"{json.dumps(value, ensure_ascii=False)} in "
                                   f"{'.'.join(keys)}; remove that item by hand")
        return self._apply(splices, expected, f"remove {json.dumps(value, ensure_ascii=False)} "
                           f"from {'.'.join(keys)}")


def _tree(text: str, tokens: list[tuple[str, int, int]]) -> Node:
    """The spans of a token list json.loads already accepted (so its grammar is valid).

    Inside an object a string is a key exactly when no key waits for its value: the grammar
    puts a comma or the closing brace after each value.
    """
    root: Node | None = None
    stack: list[Node] = []
    waiting: list[tuple[str, int, int] | None] = []  # per open container: a key and its span

    def attach(node: Node) -> None:
        nonlocal root
        if not stack:
            root = node
        elif stack[-1].kind == "object":
            key = waiting[-1]
            assert key is not None
            stack[-1].members.append(Member(key[0], key[1], key[2], node))
            waiting[-1] = None
        else:
            stack[-1].items.append(node)

    for kind, start, end in tokens:
        if kind in "{[":
            node = Node("object" if kind == "{" else "array", start)
            attach(node)
            stack.append(node)
            waiting.append(None)
        elif kind in "}]":
            stack.pop().end = end
            waiting.pop()
        elif kind == ",":
            if stack[-1].kind == "object":
                stack[-1].members[-1].comma = start
        elif kind == ":":
            continue
        elif stack and stack[-1].kind == "object" and waiting[-1] is None:
            key = text[start + 1:end - 1]
            waiting[-1] = (json.loads(text[start:end]) if "\\" in key else key, start, end)
        else:
            attach(Node("scalar", start, end))
    assert root is not None
    return root
