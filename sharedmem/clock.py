"""Time as the program writes and shows it: UTC stamps, ages, durations."""

from __future__ import annotations

import time

# How often the installed schedule runs `sync` (install/scheduler.py); what makes a cache stale.
SYNC_INTERVAL_SECONDS = 120
_STAMP = "%Y-%m-%dT%H:%M:%SZ"


def utc_now() -> str:
    """Current UTC time as ISO 8601 with a Z suffix, second precision."""
    return time.strftime(_STAMP, time.gmtime())


def parse_utc(stamp: str) -> float:
    """Seconds since the epoch for a timestamp written by `utc_now`; ValueError for other text.

    Computed, then checked by writing it back, so the MCP server's start loads neither
    `datetime` nor `_strptime` (which brings `re`) to say how old its cache is.
    """
    try:
        if len(stamp) != 20 or not stamp.isascii():
            raise ValueError
        year, month, day = int(stamp[0:4]), int(stamp[5:7]), int(stamp[8:10])
        seconds = int(stamp[11:13]) * 3600 + int(stamp[14:16]) * 60 + int(stamp[17:19])
        year -= month <= 2  # days from the civil date (March-based years), then the epoch
        days = (year * 365 + year // 4 - year // 100 + year // 400
                + (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 719469)
        value = days * 86400 + seconds
        if time.strftime(_STAMP, time.gmtime(value)) != stamp:
            raise ValueError
    except (ValueError, TypeError, OverflowError, OSError):
        raise ValueError(f"{stamp!r} is not a UTC time such as 2026-01-31T09:30:00Z") from None
    return float(value)


def age_text(seconds: float) -> str:
    """A short human age such as '3m 12s' or '2d 4h'."""
    seconds = max(0, int(seconds))
    for unit, size, sub, subsize in (("d", 86400, "h", 3600), ("h", 3600, "m", 60),
                                     ("m", 60, "s", 1)):
        if seconds >= size:
            return f"{seconds // size}{unit} {(seconds % size) // subsize}{sub}"
    return f"{seconds}s"


def monotonic() -> float:
    """Monotonic clock, for durations."""
    return time.monotonic()
