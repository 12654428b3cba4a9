"""Time as the program writes and shows it: UTC stamps, ages, durations."""

from __future__ import annotations

import time


def utc_now() -> str:
    """Current UTC time as ISO 8601 with a Z suffix, second precision."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def parse_utc(stamp: str) -> float:
    """Seconds since the epoch for a timestamp written by `utc_now`."""
    from datetime import UTC, datetime
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


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
