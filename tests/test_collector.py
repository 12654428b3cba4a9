"""Tests for sharedmem.collector: the cycle collector paused for a block, and restored."""

from __future__ import annotations

import gc

import pytest
from conftest import collections_in

from sharedmem.collector import Paused


def cycles(count: int) -> None:
    """Make `count` reference cycles and drop them: garbage only the collector frees."""
    for _ in range(count):
        node: list = []
        node.append(node)


def paused_cycles() -> None:
    with Paused():
        assert not gc.isenabled()
        cycles(50_000)  # far past the threshold of a young collection


def test_no_collection_runs_in_the_block_and_the_collector_is_on_again_after():
    assert collections_in(paused_cycles) == (None, [])
    assert collections_in(lambda: cycles(50_000))[1]  # without the pause, collections run


def test_a_collector_that_was_off_stays_off_and_an_error_still_restores_it():
    gc.disable()
    try:
        with Paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
    with pytest.raises(ValueError), Paused():
        raise ValueError("inside the block")
    assert gc.isenabled()
