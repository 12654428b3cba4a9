"""One source's publication: the delta against what the server acknowledged, the texts a need names."""

from __future__ import annotations

import random

from sharedmem.client.publication import _changes
from sharedmem.client.source_state import SourceState
from sharedmem.sources.walk import Entry


def naive_changes(record: dict, files: list[Entry]) -> tuple[list, list]:
    """Every file compared with the acknowledged map: what `_changes` must find."""
    acked = {path: rec[2] for path, rec in record.items()}
    listed = {e.path for e in files}
    return ([[e.path, e.sha256, e.size, 0] for e in files if acked.get(e.path) != e.sha256],
            sorted(p for p in acked if p not in listed))


def test_a_deltas_changes_from_the_files_read_match_those_from_every_file() -> None:
    # `_changes` looks up only the files read: a file reused unread is as acknowledged.
    rng = random.Random(7)
    for case in range(300):
        record = {f"f{i}.md": [i, i, f"{i:064x}", i, {}] for i in range(rng.randrange(0, 30))}
        files = []
        for path, rec in record.items():
            fate = rng.choice(["reused", "read same", "read changed", "removed"])
            if fate == "removed":
                continue
            sha = rec[2] if fate != "read changed" else "e" * 64
            files.append(Entry(path, sha, 1, 1, 1, {}, None if fate == "reused" else "text"))
        files += [Entry(f"new{i}.md", "d" * 64, 1, 1, 1, {}, "text")
                  for i in range(rng.randrange(0, 3))]
        rng.shuffle(files)
        state = SourceState(["r"], "a" * 64, record)
        assert _changes(state, files) == naive_changes(record, files), case


def test_a_delta_names_changed_and_new_files_and_the_paths_removed() -> None:
    record = {"a.md": [1, 1, "1" * 64, 1, {}], "b.md": [1, 1, "2" * 64, 1, {}],
              "c.md": [1, 1, "3" * 64, 1, {}]}
    files = [Entry("a.md", "1" * 64, 1, 1, 1, {}, None), Entry("b.md", "9" * 64, 1, 1, 1, {}, "x"),
             Entry("d.md", "4" * 64, 1, 1, 1, {}, "y")]
    assert _changes(SourceState(["r"], "a" * 64, record), files) == (
        [["b.md", "9" * 64, 1, 0], ["d.md", "4" * 64, 1, 0]], ["c.md"])  # no mtime_ns: 0
