"""The backups catalog on real archives: the manifest under concurrent runs, list states, prune."""

from __future__ import annotations

import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import pytest
from conftest import backup_manifest, flip, make_store

from sharedmem.core import BackupError
from sharedmem.server import backup, catalog


def test_concurrent_creates_all_reach_the_manifest(tmp_path: Path) -> None:
    path = make_store(tmp_path / "store.sqlite3")
    with ThreadPoolExecutor(4) as pool:
        infos = list(pool.map(lambda _: backup.create(path), range(8)))
    assert len({i.path for i in infos}) == 8
    assert sorted(backup_manifest(tmp_path / "backups")) == sorted(i.path.name for i in infos)
    assert not (tmp_path / "backups" / ".manifest.lock").exists()
    assert all(i.state == "ok" for i in catalog.list_backups(tmp_path / "backups"))


def test_list_states(tmp_path: Path) -> None:
    path = make_store(tmp_path / "store.sqlite3")
    good, damaged, gone = (backup.create(path, label=label) for label in ("good", "bad", "gone"))
    flip(damaged.path, damaged.size // 2)
    gone.path.unlink()
    stray = good.path.with_name("store-20200101T000000Z.sqlite3")
    shutil.copyfile(good.path, stray)
    states = {i.path.name: i.state for i in catalog.list_backups(tmp_path / "backups")}
    assert states == {good.path.name: "ok", damaged.path.name: "mismatch",
                      gone.path.name: "missing", stray.name: "unlisted"}
    listed = catalog.list_backups(tmp_path / "backups")
    assert listed[0].path == stray and listed[0].created == "2020-01-01T00:00:00Z"
    assert json.dumps([i.to_json() for i in listed])
    assert catalog.list_backups(tmp_path / "no-such-folder") == []
    (tmp_path / "backups" / "manifest.json").write_text("{not json")
    with pytest.raises(BackupError, match="move it aside"):
        catalog.list_backups(tmp_path / "backups")


def series(folder: Path, source: Path, stamps: dict[str, str], protected: set[str]) -> None:
    """Real archives whose creation times the test controls, listed in the manifest."""
    template = backup.create(source, dest=folder / "tmpl")
    entry = backup_manifest(folder / "tmpl")[template.path.name]
    entries = {}
    for key, stamp in stamps.items():
        name = f"store-{stamp.replace('-', '').replace(':', '')}-{key}.sqlite3"
        shutil.copyfile(template.path, folder / name)
        entries[name] = dict(entry, created=stamp, label=key, protected=key in protected)
    (folder / "manifest.json").write_text(json.dumps({"format": 1, "backups": entries}))


STAMPS = {  # now is Sunday 2026-03-15 12:00Z, ISO week 11
    "a": "2026-03-15T11:00:00Z",  # newest
    "b": "2026-03-15T10:00:00Z",  # same day as a
    "c": "2026-03-14T23:00:00Z",  # newest of the 14th
    "d": "2026-03-14T01:00:00Z",
    "e": "2026-03-09T05:00:00Z",  # seventh day back
    "f": "2026-03-08T05:00:00Z",  # newest of week 10
    "g": "2026-03-03T05:00:00Z",
    "h": "2026-02-25T00:00:00Z",  # week 9
    "i": "2026-02-18T00:00:00Z",  # week 8
    "j": "2026-02-10T00:00:00Z",  # week 7: outside four weeks
    "k": "2026-01-01T00:00:00Z",  # protected
}
NOW = datetime(2026, 3, 15, 12, 0, tzinfo=UTC)


def test_prune_policy_and_dry_run(tmp_path: Path) -> None:
    folder = tmp_path / "backups"
    folder.mkdir()
    series(folder, make_store(tmp_path / "store.sqlite3"), STAMPS, {"k"})
    expected = sorted(folder / f"store-{STAMPS[k].replace('-', '').replace(':', '')}-{k}.sqlite3"
                      for k in "bdgj")
    before = sorted(folder.iterdir())
    assert catalog.prune(folder, dry_run=True, now=NOW) == expected
    assert sorted(folder.iterdir()) == before
    assert catalog.prune(folder, now=NOW) == expected
    assert not any(p.exists() for p in expected)
    left = catalog.list_backups(folder)
    assert sorted(i.label for i in left) == list("acefhik")
    assert all(i.state == "ok" for i in left)
    assert catalog.prune(folder, now=NOW) == []


def test_prune_is_configurable_and_never_removes_protected(tmp_path: Path) -> None:
    folder = tmp_path / "backups"
    folder.mkdir()
    series(folder, make_store(tmp_path / "store.sqlite3"), STAMPS, {"k", "j"})
    removed = catalog.prune(folder, keep_last=3, daily=0, weekly=0, now=NOW)
    assert sorted(p.name.split("-")[-1][0] for p in removed) == list("defghi")
    assert sorted(i.label for i in catalog.list_backups(folder)) == list("abcjk")
    with pytest.raises(BackupError, match="keep-last"):
        catalog.prune(folder, keep_last=0)
    with pytest.raises(BackupError, match="daily"):
        catalog.prune(folder, daily=-1)
