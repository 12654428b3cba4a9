"""scripts/bench_sync.py's limits for a large corpus, and the sshd that carries them to `serve`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, write_config
from loopback_sshd import LAUNCHER, SshdUnavailable, pinned_line, start_sshd

sys.path.insert(0, str(REPO / "scripts"))
import bench_sync  # noqa: E402


def test_a_corpus_within_half_the_defaults_keeps_them() -> None:
    assert bench_sync.corpus_limits({"files": 10_000, "bytes": 28_000_000}) == ({}, ())


def test_a_large_corpus_raises_the_limits_of_both_ends_to_twice_its_size() -> None:
    client, serve_args = bench_sync.corpus_limits({"files": 100_000, "bytes": 280_000_000})
    assert client == {"namespace_files": 200_000, "namespace_bytes": 560_000_000}
    assert serve_args == ("--limit", "namespace_files=200000", "--limit",
                          "namespace_bytes=560000000", "--limit", "machine_files=200000",
                          "--limit", "machine_bytes=560000000")


def test_the_pinned_line_runs_serve_with_the_arguments_given() -> None:
    line = pinned_line(Path("/s/store.sqlite3"), "laptop", "ssh-ed25519 AAAA k",
                       ("--limit", "namespace_files=7"))
    assert ' --store /s/store.sqlite3 --limit namespace_files=7 --machine laptop" ' in line


@pytest.mark.parametrize("pinned", [True, False])
def test_serve_takes_the_limits_sshd_was_started_with(tmp_path: Path, pinned: bool) -> None:
    # Three files against a server that takes two a namespace: the sync says the server
    # refused the manifest, so the setting reached the `serve` sshd ran, by either key.
    store = tmp_path / "server" / "store.sqlite3"
    store.parent.mkdir()
    try:
        server = start_sshd(tmp_path / "sshd", store,
                            serve_args=("--limit", "namespace_files=2"))
    except SshdUnavailable as exc:
        pytest.skip(str(exc))
    try:
        notes = tmp_path / "notes"
        notes.mkdir()
        for name in ("a.md", "b.md", "c.md"):
            (notes / name).write_text(f"{name}\n", encoding="utf-8")
        cfg = write_config(tmp_path / "client" / "client.json", "laptop",
                           server.transport(pinned=pinned),
                           [{"name": "notes", "kind": "markdown", "path": str(notes)}],
                           tmp_path / "client" / "cache")
        proc = subprocess.run([sys.executable, "-S", str(LAUNCHER), "sync", "--config", str(cfg),
                               "--json"], capture_output=True, text=True, timeout=60)
        report = json.loads(proc.stdout)
        assert report["status"] == "failed"
        assert "more than 2 files for source 'notes'" in report["error"]
    finally:
        server.stop()
