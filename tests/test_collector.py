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


def test_what_the_block_keeps_goes_to_the_oldest_generation_unwalked():
    def work() -> list[list]:
        with Paused():
            return [[] for _ in range(50_000)]  # far past the threshold of a young collection

    kept, ran = collections_in(work)
    assert ran == []
    assert gc.get_count()[0] < 700  # no young collection is due, to walk all of `kept`
    oldest = {id(o) for o in gc.get_objects(generation=2)}
    assert id(kept) in oldest and id(kept[-1]) in oldest
    assert collections_in(lambda: cycles(2_000))[1]  # young collections run again after
