"""Reaching `serve`: remote quoting, the ssh command line, ssh's errors, and real child processes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import local_config, run_cli, write_config
from loopback_sshd import SERVE

from sharedmem.client import config as config_mod
from sharedmem.client.config import ClientConfig, Transport
from sharedmem.client.early_ssh import remote_words
from sharedmem.client.transport import (
    Connection,
    HelloChanged,
    explain_ssh,
    refused_before_authentication,
    ssh_command,
)
from sharedmem.core import ProtocolError, TransportError
from sharedmem.protocol import PeerError, encode_raw_texts
from sharedmem.server.store import Store

SSH = Transport("ssh", host="me@srv", port=2222, identity=Path("/keys/id ed25519"),
                options=("ConnectTimeout=5", "UserKnownHostsFile=/k/known"),
                remote_command=("python3", "~/.local/share/c m/shared_memory.py", "serve"))


def test_remote_words_quote_for_the_server_shell(tmp_path: Path) -> None:
    words = ["python3", "~/dir with space/shared_memory.py", "it's \"quoted\"", "$HOME/x",
             "`id`", "~/", "~notme", "a;b", "plain-word_1.0"]
    line = remote_words(words)
    assert line.startswith("python3 ~/'dir with space/shared_memory.py' ")
    assert "'$HOME/x'" in line and "'`id`'" in line
    home = tmp_path / "remote home"
    out = subprocess.run(["sh", "-c", f"printf '%s\\n' {line}"], capture_output=True, text=True,
                         env={"HOME": str(home), "PATH": os.environ["PATH"]}, check=True).stdout
    assert out.splitlines() == [
        "python3", f"{home}/dir with space/shared_memory.py", "it's \"quoted\"", "$HOME/x",
        "`id`", f"{home}/", "~notme", "a;b", "plain-word_1.0"]


def test_ssh_command_is_strict_and_passes_options_through() -> None:
    argv = ssh_command(SSH)
    assert argv[0] == "ssh"
    pairs = list(zip(argv, argv[1:], strict=False))
    for option in ("BatchMode=yes", "StrictHostKeyChecking=yes", "ConnectTimeout=5",
                   "UserKnownHostsFile=/k/known", "IdentitiesOnly=yes"):
        assert ("-o", option) in pairs, option
    assert ("-p", "2222") in pairs and ("-i", "/keys/id ed25519") in pairs
    end = argv.index("--")
    assert argv[end + 1:] == ["me@srv", "python3 ~/'.local/share/c m/shared_memory.py' serve"]
    assert all(argv.index(flag) < end for flag in ("-p", "-i"))
    assert argv.index("ConnectTimeout=5") < end


def test_ssh_command_without_port_or_identity() -> None:
    argv = ssh_command(Transport("ssh", host="-oProxyCommand=x", remote_command=("serve",)))
    assert "-p" not in argv and "-i" not in argv and "IdentitiesOnly=yes" not in argv
    assert argv[-3:] == ["--", "-oProxyCommand=x", "serve"]  # a hostile host is never an option


@pytest.mark.parametrize("stderr,needles", [
    ("Host key verification failed.\n",
     ["host key of me@srv is not known", "ssh -p 2222 me@srv true", "ssh-keyscan -p 2222 me@srv"]),
    ("No ED25519 host key is known for [127.0.0.1]:2222 and you have requested strict checking.\n"
     "Host key verification failed.\n", ["host key", "known_hosts"]),
    ("me@srv: Permission denied (publickey).\n",
     ["me@srv refused this client's key (me@srv: Permission denied (publickey).)",
      "install_server.py --authorize NAME --key", "--ssh-identity"]),
    ("ssh: connect to host srv port 2222: Connection refused\n",
     ["cannot reach me@srv -p 2222 (ssh: connect to host srv port 2222: Connection refused)",
      "sshd runs"]),
    ("ssh: Could not resolve hostname srv: Name or service not known\n", ["cannot reach me@srv"]),
    ("kex_exchange_identification: read: Connection reset by peer\n",
     ["the server refused the connection while busy (sshd MaxStartups): me@srv -p 2222 closed it "
      "before authentication (kex_exchange_identification: read: Connection reset by peer)",
      "raise MaxStartups", 'docs/OPERATIONS.md "Many machines on one server: ssh"']),
    ("kex_exchange_identification: Connection closed by remote host\n"
     "Connection closed by 10.0.0.1 port 2222\n", ["refused the connection while busy"]),
    ("Connection closed by 10.0.0.1 port 2222\n",  # closed later: reset, but not seen as busy
     ["ssh to me@srv failed: Connection closed by 10.0.0.1 port 2222"]),
    ("", ["ssh to me@srv failed: ssh exited with no message"]),
])
def test_explain_ssh(stderr: str, needles: list[str]) -> None:
    text = explain_ssh(stderr, SSH)
    for needle in needles:
        assert needle in text, (needle, text)


@pytest.mark.parametrize("max_version", [2, 1])
def test_local_connection_to_a_real_serve(tmp_path: Path, max_version: int) -> None:
    store = tmp_path / "server" / "store.sqlite3"
    with Connection(local_config(tmp_path, store), max_version) as conn:
        reply = conn.hello()
        assert conn.version == max_version == reply["version"]
        assert reply["machine"] == "laptop" and reply["pinned"] is False
        assert str(reply["server"]).startswith("sharedmem/")
        assert conn.channel.sent > 0 and conn.channel.received > 0
    assert conn.process.wait(timeout=30) == 0  # close() reaps in the background
    assert store.is_file()


def test_server_end_that_exits_at_once(tmp_path: Path) -> None:
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where the store's folder should be")
    conn = Connection(local_config(tmp_path, blocker / "sub" / "store.sqlite3"))
    try:
        with pytest.raises(PeerError) as exc:
            conn.hello()
    finally:
        conn.close()
    message = str(exc.value)
    assert exc.value.code == "store"
    assert f"store {blocker / 'sub' / 'store.sqlite3'} cannot be created" in message
    assert str(blocker) in message
    assert conn.process.wait(timeout=30) != 0  # close() reaps in the background
    assert blocker.read_text().startswith("a file")


def test_the_handshake_reads_the_answer_while_its_body_runs(tmp_path: Path) -> None:
    with Connection(local_config(tmp_path, tmp_path / "store.sqlite3")) as conn:
        with conn.handshake():
            assert conn.version == 0  # the answer is taken once the body is done
            deadline = time.monotonic() + 30
            while conn.early is None and time.monotonic() < deadline:
                time.sleep(0.01)
            assert conn.early is not None  # but read as soon as it came
        assert conn.version == 3 and conn.server is conn.early


def test_a_server_end_gone_during_the_handshake_is_explained(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"  # an ssh that takes the hello, then fails as OpenSSH does
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text(f"#!{sys.executable}\nimport sys\nsys.stdin.readline()\n"
                                 "sys.stderr.write('me@srv: Permission denied (publickey).\\n')\n"
                                 "sys.exit(255)\n")
    (bin_dir / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    conn = Connection(ssh_config(tmp_path))
    try:
        with pytest.raises(TransportError, match="refused this client's key"), \
                conn.handshake():
            raise ProtocolError("the server end went away")  # as a body sent ahead finds it
    finally:
        conn.close()


def fake_ssh(folder: Path, stderr: str, code: int) -> Path:
    """A stand-in `ssh` on PATH that fails the way OpenSSH does."""
    folder.mkdir()
    script = folder / "ssh"
    script.write_text(f"#!{sys.executable}\nimport sys\n"
                      f"sys.stderr.write({stderr!r})\nsys.exit({code})\n")
    script.chmod(0o755)
    return folder


def ssh_config(tmp_path: Path) -> ClientConfig:
    return ClientConfig(tmp_path / "client.json", "laptop", SSH, (), tmp_path / "c",
                        tmp_path / "s")


def test_ssh_failure_is_explained(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = fake_ssh(tmp_path / "bin", "me@srv: Permission denied (publickey).\n", 255)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    conn = Connection(ssh_config(tmp_path))
    try:
        with pytest.raises(TransportError, match="refused this client's key"):
            conn.hello()
    finally:
        conn.close()
    assert conn.process.returncode == 255


def test_missing_ssh_client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    with pytest.raises(TransportError, match="cannot start 'ssh' to reach ssh me@srv") as exc:
        Connection(ssh_config(tmp_path))
    assert "install OpenSSH" in str(exc.value)


def answering_ssh(folder: Path, code: str, message: str, *, read_first: bool) -> Path:
    """A stand-in `ssh` whose server end answers the hello, then an error, and exits.

    With `read_first` it reads one more message before it answers; without, it answers and
    exits at once, so what the client writes next finds the pipe closed.
    """
    folder.mkdir()
    script = folder / "ssh"
    script.write_text(
        f"#!{sys.executable}\nimport json, sys\nsys.stdin.readline()\n"
        "print(json.dumps({'type': 'hello', 'versions': [1, 2], 'version': 2}), flush=True)\n"
        + ("sys.stdin.readline()\n" if read_first else "")
        + f"print(json.dumps({{'type': 'error', 'code': {code!r}, 'message': {message!r}}}), "
        "flush=True)\nsys.stderr.write('serve: ' + " + repr(message) + " + '\\n')\nsys.exit(1)\n")
    script.chmod(0o755)
    return folder


FULL = ("store /srv/store.sqlite3: the disk holding /srv/store.sqlite3 is full (0 bytes free; "
        "database or disk is full), so nothing of this step was written and the store is as it "
        "was before it. Disk full: free space on the server's disk holding /srv/store.sqlite3, "
        "then try again")


@pytest.mark.parametrize(("code", "message"), [
    ("disk-full", FULL),
    ("store", "the store /srv/store.sqlite3 failed: database or disk is full"),  # older servers
])
def test_a_full_disk_on_the_server_is_said_with_the_server_and_the_fix(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: str, message: str) -> None:
    bin_dir = answering_ssh(tmp_path / "bin", code, message, read_first=True)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    with Connection(ssh_config(tmp_path)) as conn:
        conn.hello()
        conn.channel.send({"type": "note", "note_id": "n" * 8, "filename": "x.md", "text": "x"})
        with pytest.raises(PeerError) as exc:
            conn.channel.expect("note_result")
    said = str(exc.value)
    assert exc.value.code == code and "\n" not in said
    assert said.startswith("the server's disk is full (ssh me@srv), so the server stored nothing "
                           "more, and this machine's cache and the notes waiting to go are as "
                           "they were. The server says: ")
    assert said.endswith(message)


def test_an_error_a_server_end_left_before_it_stopped_reading_is_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A server whose disk fills while bodies come answers and ends; the client, still writing,
    # finds the pipe closed: the answer waiting behind it says why, not "closed the connection".
    bin_dir = answering_ssh(tmp_path / "bin", "disk-full", FULL, read_first=False)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    with Connection(ssh_config(tmp_path)) as conn:
        conn.hello()
        conn.process.wait(timeout=30)
        with pytest.raises(PeerError) as exc:
            for _ in range(64):  # past any pipe buffer
                conn.channel.send_line(b'{"type":"bodies","bodies":[["' + b"a" * 64 + b'","'
                                       + b"x" * (1 << 20) + b'"]]}\n')
    assert exc.value.code == "disk-full" and str(exc.value).endswith(FULL)
    assert "the server's disk is full (ssh me@srv)" in str(exc.value)


# --- compression and the optimistic hello (version 3) -------------------------------------------

def compressing_config(tmp_path: Path, store: Path, compress: str = "on") -> ClientConfig:
    return local_config(tmp_path, store)._replace(compress=compress)


def test_a_local_store_is_not_compressed_unless_asked(tmp_path: Path) -> None:
    store = tmp_path / "store.sqlite3"
    with Connection(local_config(tmp_path, store)) as conn:  # compress auto: off for local
        assert "compress" not in conn.hello() and not conn.channel.compressing
    with Connection(compressing_config(tmp_path, store)) as conn:
        assert conn.hello()["compress"] == "zlib" and conn.channel.compressing
        conn.channel.send({"type": "status"})
        assert conn.channel.expect("status")["schema"] >= 1  # both ways compressed from here
        assert conn.channel.received < conn.channel.received_plain
    assert conn.process.wait(timeout=30) == 0


@pytest.mark.parametrize("max_version", [2, 1])
def test_a_client_below_version_3_offers_no_compression(tmp_path: Path, max_version: int) -> None:
    with Connection(compressing_config(tmp_path, tmp_path / "store.sqlite3"), max_version) as conn:
        reply = conn.hello()
        assert reply["version"] == max_version and "compress" not in reply
        conn.channel.send({"type": "status"})
        assert conn.channel.expect("status")
        assert conn.channel.received == conn.channel.received_plain


def test_the_next_session_goes_on_before_the_hello_answer(tmp_path: Path) -> None:
    config = compressing_config(tmp_path, tmp_path / "store.sqlite3")
    record = config.state / "server.json"
    with Connection(config) as conn, conn.handshake():
        assert conn.assumed is None  # nothing remembered: the answer is waited for
    assert json.loads(record.read_text())["hello"]["compress"] == "zlib"
    with Connection(config) as conn:
        with conn.handshake():
            assert conn.assumed is not None and conn.version == 3  # the hello just sent
            assert conn.channel.compressing
            conn.channel.send({"type": "status"})
        assert conn.channel.expect("status")  # the real hello was read and checked first
        assert conn.assumed is None and conn.server["server"].startswith("sharedmem/")
    assert conn.process.wait(timeout=30) == 0


def test_a_sync_session_takes_the_servers_reports_while_it_sends_ahead(tmp_path: Path) -> None:
    """A real `serve`: its `received` reports are read on the hello's thread, never returned."""
    config = compressing_config(tmp_path, tmp_path / "store.sqlite3")
    with Connection(config) as conn:
        with conn.handshake():
            pass
        assert conn.server["reports"] is True
        for _ in range(4):  # about 330 kB each on the wire: reported
            conn.channel.send_line(encode_raw_texts([os.urandom(300_000).hex().encode()]))
        conn.channel.send({"type": "status"})
        assert conn.channel.expect("status")["schema"] >= 1
        reports = list(conn.channel._reports)
        assert len(reports) >= 2 and reports == sorted(reports)
        assert reports[-1][0] <= conn.channel.sent
    assert conn.process.wait(timeout=30) == 0


def test_an_error_read_in_place_of_a_report_reaches_the_sync(tmp_path: Path) -> None:
    config = compressing_config(tmp_path, tmp_path / "store.sqlite3")
    with Connection(config) as conn:
        with conn.handshake():
            pass
        conn.channel.send({"type": "bodies", "sizes": [-1]})  # refused: the session ends
        with pytest.raises(PeerError) as exc:
            conn.channel.expect("status")
        assert exc.value.code == "bad-field" and "bodies.sizes" in str(exc.value)


def test_commands_other_than_sync_ask_for_no_reports(tmp_path: Path) -> None:
    with Connection(compressing_config(tmp_path, tmp_path / "store.sqlite3")) as conn:
        assert "reports" not in conn.hello()
        conn.channel.send({"type": "status"})
        assert conn.channel.expect("status")["schema"] >= 1


FAKE_REPORTER = r'''
import json, sys, zlib
sys.stdin.buffer.readline()  # the client's hello
out = sys.stdout.buffer
out.write(json.dumps({"type": "hello", "versions": [3], "version": 3, "server": "fake",
                      "machine": "laptop", "pinned": False, "ahead_bytes": 1000,
                      "compress": "zlib", "reports": True}).encode() + b"\n")
deflate = zlib.compressobj()
after = json.dumps({"type": "error", "code": "store", "message": "read past the report"})
out.write(deflate.compress(sys.argv[1].encode() + b"\n" + after.encode() + b"\n")
          + deflate.flush(zlib.Z_SYNC_FLUSH))
out.flush()
sys.stdin.buffer.read()  # until the client goes
'''


@pytest.mark.parametrize("report", [{"bytes": "12", "seconds": 1.5},
                                    {"bytes": 12, "seconds": "soon"},
                                    {"bytes": -1, "seconds": 1.5},
                                    {"bytes": 12, "seconds": 1.5, "last": False}])
def test_a_malformed_report_ends_the_sync_naming_it(tmp_path: Path, sshd: Any,
                                                    report: dict) -> None:
    fake = tmp_path / "fake_server.py"
    fake.write_text(FAKE_REPORTER)
    line = json.dumps({"type": "received", **report})
    transport = sshd.transport(pinned=False, remote_command=[sys.executable, str(fake), line])
    path = write_config(tmp_path / "c" / "client.json", "laptop", transport, [],
                        tmp_path / "cache")
    config = config_mod.load(path, {"HOME": str(tmp_path)})._replace(compress="on")
    with Connection(config) as conn:
        with conn.handshake():
            pass
        with pytest.raises(ProtocolError, match="sent a malformed received message"):
            conn.channel.receive()


def test_a_hello_that_changed_forgets_the_record(tmp_path: Path) -> None:
    """The server now offers less room ahead than remembered: this try ends, and the next waits."""
    config = compressing_config(tmp_path, tmp_path / "store.sqlite3")
    with Connection(config) as conn, conn.handshake():
        pass
    record = config.state / "server.json"
    saved = json.loads(record.read_text())
    saved["hello"]["ahead_bytes"] += 1
    record.write_text(json.dumps(saved))
    with Connection(config) as conn:
        with conn.handshake():
            assert conn.assumed is not None
            conn.channel.send({"type": "status"})
        with pytest.raises(HelloChanged, match="runs again"):
            conn.channel.receive()
    assert not record.exists()
    with Connection(config) as conn, conn.handshake():
        assert conn.assumed is None


def test_a_record_of_another_transport_is_not_used(tmp_path: Path) -> None:
    config = compressing_config(tmp_path, tmp_path / "store.sqlite3")
    with Connection(config) as conn:
        conn.hello()
    assert not (config.state / "server.json").exists()  # only a sync keeps it
    with Connection(config) as conn, conn.handshake():
        pass
    probe = Connection(config)
    try:
        assert probe.remembered() is not None
    finally:
        probe.close()
    other = config._replace(transport=Transport("local", store=tmp_path / "other"))
    probe = Connection(other)
    try:
        assert probe.remembered() is None
    finally:
        probe.close()


def capped_server(tmp_path: Path, sshd: Any, *, alias: bool = True) -> tuple[dict, Path, Path]:
    """An ssh transport to a `serve` whose --max-protocol a file decides, and its log of runs.

    With `alias` the host is named as another machine would be (`HostName` gives the address):
    127.0.0.1 as written is this machine, which `auto` does not compress nor expect a hello of.
    """
    cap, runs = tmp_path / "cap", tmp_path / "runs"
    cap.write_text("")
    wrapper = tmp_path / "serve.sh"
    wrapper.write_text(f'#!/bin/sh\necho run >> "{runs}"\n'
                       f'exec {" ".join(SERVE)} --store "{sshd.store}" $(cat "{cap}")\n')
    transport = sshd.transport(pinned=False, remote_command=["sh", str(wrapper)])
    if alias:
        transport["host"] = transport["host"].replace("@127.0.0.1", "@sharedmem-test-server")
        transport["options"] = [*transport["options"], "HostName=127.0.0.1"]
    return transport, cap, runs


def capped_sync(tmp_path: Path, sshd: Any, *,
                alias: bool = True) -> tuple[Callable[..., dict], Path, Path]:
    """A client of 30 notes and the `capped_server` it syncs with: its sync, the cap, the runs."""
    notes = tmp_path / "home" / "notes"
    notes.mkdir(parents=True)
    for i in range(30):
        (notes / f"n{i}.md").write_text(f"# note {i}\n" + "words and words\n" * 200)
    transport, cap, runs = capped_server(tmp_path, sshd, alias=alias)
    cfg = write_config(tmp_path / "c" / "client.json", "laptop", transport,
                       [{"name": "notes", "kind": "markdown", "path": str(notes)}],
                       tmp_path / "cache")

    def sync(*extra: str) -> dict:
        proc = run_cli("sync", "--config", str(cfg), "--json", *extra)
        report = json.loads(proc.stdout)
        assert proc.returncode == 0, (report, proc.stderr)
        return report

    return sync, cap, runs


def test_an_older_server_after_a_v3_session_fails_over_once(tmp_path: Path, sshd: Any) -> None:
    """The record says v3 and zlib; the server is now capped at 2: the sync runs again, right."""
    sync, cap, runs = capped_sync(tmp_path, sshd)
    record = tmp_path / "c" / "state" / "server.json"

    first = sync()  # over ssh to another machine, compress auto: on
    assert first["protocol"] == 3
    assert first["bytes"]["sent"] < 30 * 3200 / 4  # the bodies went compressed
    assert json.loads(record.read_text())["hello"]["compress"] == "zlib"
    assert runs.read_text().count("run") == 1

    cap.write_text("--max-protocol 2")
    (tmp_path / "home" / "notes" / "n1.md").write_text("changed while the server was downgraded\n")
    second = sync()
    assert second["protocol"] == 2 and runs.read_text().count("run") == 3  # tried, then again
    assert [s["status"] for s in second["sources"]] == ["published"]
    assert (tmp_path / "cache" / "machines" / "laptop" / "notes" / "n1.md").read_text() == \
        "changed while the server was downgraded\n"
    hello = json.loads(record.read_text())["hello"]
    assert hello["version"] == 2 and "compress" not in hello

    cap.write_text("")
    third = sync()  # the record says 2, the server answers 3: again, once
    assert third["protocol"] == 3 and runs.read_text().count("run") == 5
    assert all(s["status"] == "unchanged" for s in third["sources"])
    fourth = sync()  # remembered and right: one run, no round trip waited for
    assert fourth["protocol"] == 3 and runs.read_text().count("run") == 6

    off = sync("--compress", "off")
    assert off["protocol"] == 3 and "compress" not in json.loads(record.read_text())["hello"]
    with Store.open(sshd.store, create=False) as store:
        assert store.verify() == []


@pytest.mark.parametrize("cap,answered", [("--max-protocol 2", (2, 64 * 1024 * 1024)),
                                          ("--limit namespace_bytes=200000", (3, 200000))])
def test_a_first_sync_expects_a_server_like_itself_and_runs_again_if_not(
        tmp_path: Path, sshd: Any, cap: str, answered: tuple[int, int]) -> None:
    """No record: over ssh the first sync goes on as if the server answered as ours does by
    default; an older server, or one with a smaller quota, costs it one more run, no more."""
    sync, capped, runs = capped_sync(tmp_path, sshd)
    state = tmp_path / "c" / "state"
    capped.write_text(cap)
    first = sync()
    assert runs.read_text().count("run") == 2  # went on as if v3, then again, waiting
    # The smaller quota still took the first try's files (the check is the client's): the
    # second finds them stored. The older server refused the first try's compressed bytes.
    assert [s["status"] for s in first["sources"]] in (["published"], ["unchanged"])
    assert len(list((tmp_path / "cache" / "machines" / "laptop" / "notes").iterdir())) == 30
    hello = json.loads((state / "server.json").read_text())["hello"]
    assert (hello["version"], hello["ahead_bytes"]) == answered
    shutil.rmtree(state)
    capped.write_text("")
    again = sync()  # a server like itself: one run
    assert again["protocol"] == 3 and runs.read_text().count("run") == 3


def test_ssh_to_this_machine_waits_for_the_hello_and_sends_plainly(tmp_path: Path,
                                                                  sshd: Any) -> None:
    """127.0.0.1 as written is this machine: its hello comes at once, so a first sync waits for
    it (one run, even against an older server), and `auto` does not compress."""
    sync, capped, runs = capped_sync(tmp_path, sshd, alias=False)
    capped.write_text("--max-protocol 2")
    first = sync()
    assert first["protocol"] == 2 and runs.read_text().count("run") == 1  # not run again
    shutil.rmtree(tmp_path / "c" / "state")
    shutil.rmtree(tmp_path / "cache")
    capped.write_text("")
    again = sync()
    assert again["protocol"] == 3 and runs.read_text().count("run") == 2
    assert again["bytes"]["sent"] > 30 * 3200  # the texts went as they are
    assert "compress" not in json.loads((tmp_path / "c" / "state" / "server.json").read_text())[
        "hello"]


# --- the remembered hello ---------------------------------------------------------------------

def test_a_sync_remembers_the_hello_and_expects_the_default_one_over_ssh(tmp_path: Path) -> None:
    config = local_config(tmp_path, tmp_path / "store.sqlite3")
    with Connection(config) as conn, conn.handshake():
        pass
    hello = json.loads((config.state / "server.json").read_text())["hello"]
    assert hello["version"] == 3 and hello["ahead_bytes"] == config.limits.namespace_bytes
    assert "raw_bodies" not in hello  # every version 3 body is raw: nothing to announce
    ssh = config._replace(transport=Transport("ssh", host="memory.example.net"))
    probe = Connection.__new__(Connection)  # no process: only what `expected` reads
    probe.config, probe.versions, probe.compress = ssh, [1, 2, 3], False
    assert probe.expected() == {"version": 3, "ahead_bytes": config.limits.namespace_bytes}


# --- a busy sshd: connections reset before authentication (MaxStartups) -------------------------

@pytest.mark.parametrize(("stderr", "reset"), [
    ("kex_exchange_identification: read: Connection reset by peer\n", True),
    ("kex_exchange_identification: Connection closed by remote host\n", True),
    ("ssh_exchange_identification: read: Connection reset by peer\n", True),  # older OpenSSH
    ("Connection closed by 10.0.0.1 port 22\n", True),
    ("Connection reset by 10.0.0.1 port 22\n", True),
    ("me@srv: Permission denied (publickey).\n", False),
    ("Host key verification failed.\n", False),
    ("ssh: connect to host srv port 22: Connection refused\n", False),
    ("ssh: connect to host srv port 22: Connection timed out\n", False),
    ("Received disconnect from 10.0.0.1 port 22:2: Too many authentication failures\n"
     "Connection closed by 10.0.0.1 port 22\n", False),
])
def test_which_ssh_failures_are_resets_before_authentication(stderr: str, reset: bool) -> None:
    assert refused_before_authentication(stderr) is reset


def busy_config(tmp_path: Path, busy: Any, retries: int, **transport: Any) -> ClientConfig:
    path = write_config(tmp_path / "c" / "client.json", "laptop",
                        {**busy.transport(), **transport}, [], tmp_path / "cache")
    raw = json.loads(path.read_text())
    path.write_text(json.dumps({**raw, "timeouts": {"busy_retries": retries}}))
    return config_mod.load(path, {"HOME": str(tmp_path)})


def release_later(held: Any, seconds: float) -> threading.Timer:
    """Close the connection that keeps sshd busy after `seconds`, from a thread."""
    timer = threading.Timer(seconds, held.close)
    timer.start()
    return timer


def test_a_connection_a_busy_sshd_resets_is_started_again(tmp_path: Path, busy_sshd: Any) -> None:
    config = busy_config(tmp_path, busy_sshd, retries=6)
    held = busy_sshd.hold_startup()
    before = busy_sshd.dropped()
    timer = release_later(held, 1.0)
    try:
        conn = Connection(config)
        first = conn.process
        with conn:
            assert conn.hello()["version"] == 3  # over the connection started again
            conn.channel.send({"type": "status"})
            assert conn.channel.expect("status")["schema"] >= 1
        assert conn.process is not first and first.poll() == 255
    finally:
        timer.join()
    assert busy_sshd.dropped() > before


@pytest.mark.parametrize("retries", [0, 2])
def test_a_server_busy_past_every_retry_is_said_to_be_busy(tmp_path: Path, busy_sshd: Any,
                                                           retries: int) -> None:
    config = busy_config(tmp_path, busy_sshd, retries=retries)
    held = busy_sshd.hold_startup()
    before = busy_sshd.dropped()
    try:
        conn = Connection(config)
        try:
            with pytest.raises(TransportError) as exc:
                conn.hello()
        finally:
            conn.close()
    finally:
        held.close()
    said = str(exc.value)
    assert said.startswith("the server refused the connection while busy (sshd MaxStartups): "
                           f"{busy_sshd.user}@127.0.0.1 -p {busy_sshd.port} closed it before "
                           "authentication"), said
    assert (f"({retries + 1} tries)" in said) is bool(retries)
    assert "raise MaxStartups" in said and "Many machines on one server: ssh" in said
    assert busy_sshd.dropped() - before == retries + 1


def test_a_sync_through_a_busy_sshd_connects_once_it_is_free(tmp_path: Path,
                                                             busy_sshd: Any) -> None:
    """The real command line: ssh started before the program loads, reset, started again."""
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "a.md").write_text("# a note\n")
    path = write_config(tmp_path / "c" / "client.json", "laptop", busy_sshd.transport(),
                        [{"name": "notes", "kind": "markdown", "path": str(notes)}],
                        tmp_path / "cache")
    held = busy_sshd.hold_startup()
    before = busy_sshd.dropped()
    timer = release_later(held, 1.0)
    try:
        run = run_cli("sync", "--config", str(path), "--json",
                      env={**os.environ, "HOME": str(tmp_path)})
    finally:
        timer.join()
    assert run.returncode == 0, run.stdout + run.stderr
    assert json.loads(run.stdout)["sources"][0]["status"] == "published"
    assert (tmp_path / "cache" / "machines" / "laptop" / "notes" / "a.md").read_text() == \
        "# a note\n"
    assert busy_sshd.dropped() > before
