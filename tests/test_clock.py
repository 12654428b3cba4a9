"""Tests for sharedmem.clock: stamps and ages."""

from __future__ import annotations

import time

from sharedmem import clock


def test_stamps_round_trip_and_ages_read_well() -> None:
    stamp = clock.utc_now()
    assert stamp.endswith("Z") and len(stamp) == 20
    assert abs(clock.parse_utc(stamp) - time.time()) < 5
    assert clock.age_text(0) == "0s"
    assert clock.age_text(192) == "3m 12s"
    assert clock.age_text(2 * 86400 + 4 * 3600) == "2d 4h"
    assert clock.age_text(-5) == "0s"
