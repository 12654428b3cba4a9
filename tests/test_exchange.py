"""The exchange that ends every session: notes delivered, the pull checked and applied.

Through the real client code against a real `serve` and store, a real sshd on loopback, and
stand-in servers that answer wrongly on purpose.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import cache_files, config_for, local_config, make_memories, sync_json

from sharedmem.client.exchange import Exchange
from sharedmem.client.outbox import Outbox
from sharedmem.client.transport import Connection
from sharedmem.server.store import Store

NOTE = "2026-11-30T09-00-00-decision.md"


def test_notes_are_delivered_and_a_refused_one_is_kept_aside(tmp_path: Path) -> None:
    config = local_config(tmp_path, tmp_path / "store.sqlite3")
    outbox = Outbox(config.state / "outbox")
    outbox.put(NOTE, "we chose SQLite")
    # An empty note queued by hand (put refuses it): the server refuses it too.
    queued = outbox.put("2026-11-30T09-00-01-empty.md", "to be emptied")
    [(path, _)] = [(p, n) for p, n in outbox.pending() if n.note_id == queued.note_id]
    path.write_text(path.read_text().replace('"to be emptied"', '""'))
    exchange = Exchange(config)
    with Connection(config) as conn:
        conn.hello()
        exchange.deliver_now(conn)
    assert exchange.notes["delivered"] == 1
    assert [r["filename"] for r in exchange.notes["refused"]] == ["2026-11-30T09-00-01-empty.md"]
    assert outbox.pending() == []
    kept = sorted(p.name for p in (config.state / "refused-notes").iterdir())
    assert len(kept) == 2 and kept[1] == kept[0].removesuffix(".json") + ".reason"
    reason = json.loads((config.state / "refused-notes" / kept[1]).read_text())
    assert reason["filename"] == "2026-11-30T09-00-01-empty.md"
    assert reason["note_id"] == queued.note_id and reason["message"] and reason["refused_at"]
    assert reason["message"] == exchange.notes["refused"][0]["message"]
    assert "we chose SQLite" in (config.cache / "extensions/ad_hoc/notes" / NOTE).read_text()


HOSTILE_SERVER = r'''
import json, sys
def send(m):
    sys.stdout.write(json.dumps(m) + "\n"); sys.stdout.flush()
evil = sys.argv[1]
for line in sys.stdin:
    m = json.loads(line)
    t = m["type"]
    if t == "hello":
        send({"type": "hello", "version": 2, "versions": [2]})
    elif t == "manifest":
        send({"type": "result", "source": m["source"], "unchanged": True, "digest": m["digest"],
              "generation": 1, "refused": [], "redacted": {}})
    elif t == "pull" and evil == "no-text":
        send({"type": "namespaces", "namespaces": [], "full": [], "removed": []})
        send({"type": "files", "files": [["machines/evil/notes/x.md", "ab" * 32, None]]})
        send({"type": "end"})
    elif t == "pull":
        send({"type": "namespaces", "namespaces": [{"key": "machines/evil/notes", "machine": "evil",
              "source": "notes", "kind": "markdown", "generation": 1}], "full": [],
              "removed": [evil]})
        import hashlib
        body = "pwned"
        sha = hashlib.sha256(body.encode()).hexdigest()
        send({"type": "files", "files": [["machines/evil/notes/fine.md", sha, body], [evil, sha, body]]})
        send({"type": "end"})
    elif t == "bye":
        break
'''


@pytest.mark.parametrize("evil", [
    "../../outside.md", "/tmp/absolute-evil.md", "machines/evil/notes/../../../../outside.md",
    "machines/evil/notes/.hidden.md", "extensions/ad_hoc/notes/../../x.md", "machines/evil/x\\..\\y.md",
    "machines/con/notes/x.md", "machines/evil/x./y.md",
])
def test_hostile_server_paths_are_skipped_and_the_rest_written(tmp_path, sshd, evil):
    script = tmp_path / "hostile.py"
    script.write_text(HOSTILE_SERVER)
    home = tmp_path / "h"
    make_memories(home, files=1)
    cfg = config_for(tmp_path, home, "laptop", sshd.transport(
        pinned=False, remote_command=[sys.executable, str(script), evil]))
    victim = tmp_path / "laptop" / "keep.md"
    victim.write_text("mine")
    code, report = sync_json(cfg)
    assert code == 1, report
    assert report["status"] == "partial"
    skipped = report["pull"]["skipped"]
    assert [s["path"] for s in skipped] == [evil, evil]  # the removal and the file
    assert {s["reason"] for s in skipped} == {"bad-path"}
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")
                     if p.is_file() and ("outside" in p.name or "evil" in str(p) or "pwned" in
                                         (p.read_text(errors="ignore") if p.suffix == ".md" else "")))
    assert written == ["laptop/cache/machines/evil/notes/fine.md"]  # only the good file
    assert victim.read_text() == "mine"


def test_a_server_that_leaves_out_a_body_the_client_lacks_is_refused(tmp_path, sshd):
    script = tmp_path / "hostile.py"
    script.write_text(HOSTILE_SERVER)
    home = tmp_path / "h"
    make_memories(home, files=1)
    cfg = config_for(tmp_path, home, "laptop", sshd.transport(
        pinned=False, remote_command=[sys.executable, str(script), "no-text"]))
    code, report = sync_json(cfg)
    assert code == 2
    assert "sent a malformed files message" in report["error"]
    assert "no text for 'machines/evil/notes/x.md'" in report["error"]
    assert not (tmp_path / "laptop" / "cache" / "machines").exists()


def test_a_cache_file_changed_by_hand_is_restored_by_the_next_sync(tmp_path):
    home = tmp_path / "h"
    make_memories(home, files=3)
    cfg = config_for(tmp_path, home, "laptop",
                     {"kind": "local", "store": str(tmp_path / "store.sqlite3")})
    assert sync_json(cfg)[0] == 0
    cache = tmp_path / "laptop" / "cache"
    before = cache_files(cache)
    edited = cache / "machines/laptop/notes/d1/note-001.md"
    edited.write_text("edited by hand, and longer than it was\n", encoding="utf-8")
    (cache / "machines/laptop/codex/MEMORY.md").unlink()
    code, report = sync_json(cfg)
    assert code == 0 and report["pull"]["written"] == 2
    assert cache_files(cache) == before


def test_a_first_sync_keeps_its_own_files_and_takes_what_the_server_refused_from_it(tmp_path):
    home = tmp_path / "h"
    notes = make_memories(home, files=6)
    store = tmp_path / "store.sqlite3"
    cfg = config_for(tmp_path, home, "laptop", {"kind": "local", "store": str(store)})
    code, report = sync_json(cfg)
    assert code == 0
    cache = tmp_path / "laptop" / "cache"
    with Store.open(store) as s:
        assert cache_files(cache) == {p: t for p, _, t in s.export()}
    # A client whose limit is above the server's: the server refuses the big file, so the
    # namespace it holds is not the snapshot sent, and the cache must show the server's.
    home2 = tmp_path / "h2"
    make_memories(home2, files=2)
    (home2 / "notes" / "big.md").write_text("x" * (1024 * 1024 + 10), encoding="utf-8")
    cfg2 = config_for(tmp_path, home2, "desktop", {"kind": "local", "store": str(store)})
    raw = json.loads(cfg2.read_text())
    raw["limits"] = {"file_bytes": 2 * 1024 * 1024}
    cfg2.write_text(json.dumps(raw))
    code, report = sync_json(cfg2)
    assert code == 1 and report["sources"][1]["refused"][0]["reason"] == "too-large"
    cache2 = tmp_path / "desktop" / "cache"
    assert "machines/desktop/notes/big.md" not in cache_files(cache2)
    with Store.open(store) as s:
        assert cache_files(cache2) == {p: t for p, _, t in s.export()}
    assert notes.is_dir()
