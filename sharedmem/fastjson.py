"""JSON read and written by the C module `_json`, without importing `json`.

`json.loads` and `json.dumps` run this same C scanner and encoder, so the values and the text
are theirs; what importing `json` adds is `re` (milliseconds), which `mcp` would pay before its
`initialize` answer and `sync` before starting ssh. Text the scanner does not take whole goes
to `json` itself, so the error is json's: Python 3.11's scanner cannot even report one before
`json` is loaded (it fails with a SystemError instead).
"""

from __future__ import annotations

from sharedmem.core import JSONError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

_WHITESPACE = " \t\n\r"  # what json skips around a value
NESTED_TOO_DEEPLY = "JSON nested too deeply"


class _Decoding:
    """What the C scanner reads from its decoder: the settings of `json.loads` with no hooks."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = {"-Infinity": float("-inf"), "Infinity": float("inf"),
                      "NaN": float("nan")}.__getitem__


try:
    from _json import encode_basestring, encode_basestring_ascii, make_encoder, make_scanner
    _scan: Callable[[str, int], tuple[Any, int]] | None = make_scanner(_Decoding)
except ImportError:  # a Python without the C accelerator: `json` does all the work
    _scan = make_encoder = None


def loads(text: str, *, unicode_only: bool = False) -> Any:
    r"""The value of one JSON text, as `json.loads` gives it; JSONError if it is not JSON.

    With `unicode_only`, a text whose strings hold a lone surrogate (a `\ud800` escape, which
    has no UTF-8 form) is refused as not JSON too: checked here, where the text enters, so no
    reader of the value needs to. Only a text with such an escape is walked.
    """
    value = _loads(text)
    if unicode_only and ("\\ud" in text or "\\uD" in text):
        lone = lone_surrogate(value)
        if lone is not None:
            raise JSONError(f"a string holds a lone surrogate ({lone}), which is not Unicode "
                            "text: it has no UTF-8 form")
    return value


def _loads(text: str) -> Any:
    if _scan is not None:
        try:
            value, end = _scan(text, len(text) - len(text.lstrip(_WHITESPACE)))
            if not text[end:].lstrip(_WHITESPACE):
                return value
        except RecursionError:
            raise JSONError(NESTED_TOO_DEEPLY) from None
        except (StopIteration, ValueError, SystemError):
            pass  # json says why, below
    import json
    try:
        return json.loads(text)
    except RecursionError:
        raise JSONError(NESTED_TOO_DEEPLY) from None
    except ValueError as exc:
        raise JSONError(str(exc)) from None


def lone_surrogate(value: Any) -> str | None:
    """The first lone surrogate a decoded value's strings (keys too) hold, written out, or None."""
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is str:
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as exc:
                return f"U+{ord(item[exc.start]):04X}"
        elif kind is list:
            stack.extend(item)
        elif kind is dict:
            stack.extend(item)
            stack.extend(item.values())
    return None


def dumps(value: Any, *, ascii_only: bool = False) -> str:
    """`json.dumps(value, ensure_ascii=ascii_only, separators=(",", ":"))`: one compact line.

    A value JSON has no form for (a set, a circular list, nesting past the recursion limit)
    is a JSONError, where json raises TypeError, ValueError or RecursionError.
    """
    try:
        if make_encoder is None:
            import json
            return json.dumps(value, ensure_ascii=ascii_only, separators=(",", ":"),
                              default=_not_serializable)
        encode_string = encode_basestring_ascii if ascii_only else encode_basestring
        if isinstance(value, str):
            return encode_string(value)
        encoder = make_encoder({}, _not_serializable, encode_string, None, ":", ",", False,
                               False, True)
        return "".join(encoder(value, 0))
    except RecursionError:
        raise JSONError(NESTED_TOO_DEEPLY) from None
    except ValueError as exc:
        raise JSONError(str(exc)) from None


def _not_serializable(value: object) -> Any:
    """Refuse a value JSON has no form for, in json's words."""
    raise JSONError(f"Object of type {value.__class__.__name__} is not JSON serializable")
