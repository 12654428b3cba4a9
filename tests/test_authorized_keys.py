"""authorized_keys, directly: fingerprints, forced commands, and `authorize` on real files.

tests/test_server_install.py covers the installer around it (pinning, --repin); these are the
module's own rules: keys it refuses, the lines it reads and writes.
"""

from __future__ import annotations

import base64
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import mode

from sharedmem.core import InstallError
from sharedmem.install import authorized_keys as authkeys

BLOB = base64.b64encode(b"\0\0\0\x0bssh-ed25519\0\0\0\x20" + bytes(range(32))).decode()
OTHER = base64.b64encode(b"\0\0\0\x0bssh-ed25519\0\0\0\x20" + bytes(32)).decode()
KEY = authkeys.PublicKey("ssh-ed25519", BLOB, "me@laptop")
COMMAND = "/usr/bin/python3 /srv/shared_memory.py serve --store /srv/store.sqlite3 --machine laptop"


@pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="ssh-keygen not installed")
def test_fingerprint_matches_ssh_keygen_and_tilde_uses_env_home(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    private = home / ".ssh" / "id_test"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "t@x", "-f",
                    str(private)], check=True, capture_output=True)
    key = authkeys.parse_key("~/.ssh/id_test.pub", {"HOME": str(home)})
    listed = subprocess.run(["ssh-keygen", "-l", "-E", "sha256", "-f", str(private) + ".pub"],
                            check=True, capture_output=True, text=True).stdout.split()
    assert key.fingerprint == listed[1]
    assert key.comment == "t@x" and key.text == private.with_suffix(".pub").read_text().strip()
    with pytest.raises(InstallError, match="PRIVATE key"):
        authkeys.parse_key(str(private), {"HOME": str(home)})


def test_forced_command_quotes_and_refuses_what_sshd_cannot_carry() -> None:
    command = authkeys.forced_command("python3", Path("/opt/my apps/shared_memory.py"),
                                      Path("/srv/store $1.sqlite3"), "laptop")
    assert shlex.split(command) == ["python3", "-S", "/opt/my apps/shared_memory.py", "serve",
                                    "--store", "/srv/store $1.sqlite3", "--machine", "laptop"]
    for bad in ('/opt/say "hi"', "/opt/back\\slash", "/opt/new\nline"):
        with pytest.raises(InstallError, match="quote, backslash or line break"):
            authkeys.forced_command("python3", Path(bad), Path("/s"), "laptop")


def test_pinned_line_round_trips_through_split_line() -> None:
    command = authkeys.forced_command("python3", Path("/a b/shared_memory.py"), Path("/s"), "pc-2")
    line = authkeys.pinned_line(command, KEY)
    assert line.startswith('restrict,command="') and line.endswith(f" ssh-ed25519 {BLOB} me@laptop")
    options, blob = authkeys.split_line(line)
    assert blob == BLOB and authkeys.pinned_machine(options) == "pc-2"
    assert authkeys.split_line("   ") is None and authkeys.split_line("ssh-ed25519") is None


def test_dry_run_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "home" / ".ssh" / "authorized_keys"
    (tmp_path / "home").mkdir()
    outcome = authkeys.authorize(path, KEY, "laptop", COMMAND, dry_run=True)
    assert outcome.action == "added" and outcome.backup is None
    assert outcome.line == f'restrict,command="{COMMAND}" {KEY.text}'
    assert not path.parent.exists()


def test_add_then_unchanged_repairs_the_mode(tmp_path: Path) -> None:
    path = tmp_path / "home" / ".ssh" / "authorized_keys"
    (tmp_path / "home").mkdir()
    first = authkeys.authorize(path, KEY, "laptop", COMMAND)
    assert first.action == "added" and first.backup is None
    assert mode(path.parent) == 0o700 and mode(path) == 0o600
    data = path.read_bytes()
    path.chmod(0o644)
    again = authkeys.authorize(path, KEY, "laptop", COMMAND)
    assert again.action == "unchanged" and again.backup is None
    assert path.read_bytes() == data and mode(path) == 0o600
    assert list(path.parent.glob("*.bak-*")) == []


def test_duplicate_lines_of_one_key_collapse(tmp_path: Path) -> None:
    path = tmp_path / "home" / ".ssh" / "authorized_keys"
    path.parent.mkdir(parents=True, mode=0o700)
    old = f'restrict,command="old serve --machine laptop" ssh-ed25519 {BLOB} me@laptop'
    keep = f"ssh-ed25519 {OTHER} someone@else"
    original = f"# my keys\n{old}\n{keep}\n{old}\n"
    path.write_text(original)
    outcome = authkeys.authorize(path, KEY, "laptop", COMMAND)
    assert outcome.action == "updated"
    assert path.read_text() == f"# my keys\n{outcome.line}\n{keep}\n"
    assert outcome.backup is not None and outcome.backup.read_text() == original
    assert mode(outcome.backup) == 0o600


def test_an_unpinned_line_of_the_same_key_is_not_taken_over(tmp_path: Path) -> None:
    path = tmp_path / "home" / ".ssh" / "authorized_keys"
    path.parent.mkdir(parents=True, mode=0o700)
    original = f"ssh-ed25519 {BLOB} me@laptop\n"
    path.write_text(original)
    with pytest.raises(InstallError, match="with no machine pin") as exc:
        authkeys.authorize(path, KEY, "laptop", COMMAND)
    assert KEY.fingerprint in str(exc.value) and "line 1" in str(exc.value)
    assert path.read_text() == original
    assert authkeys.authorize(path, KEY, "laptop", COMMAND, repin=True).action == "updated"
    assert path.read_text() == f'restrict,command="{COMMAND}" {KEY.text}\n'


def test_pinned_python_names_the_interpreter_of_this_very_command(tmp_path: Path) -> None:
    launcher, store = Path("/srv/cm/shared_memory.py"), Path("/srv/cm/store.sqlite3")
    keys = tmp_path / "authorized_keys"
    assert authkeys.pinned_python(keys, KEY, "laptop", launcher, store) is None  # no file
    mine = authkeys.forced_command("/opt/py 3/bin/python3", launcher, store, "laptop")
    other = authkeys.forced_command("/usr/bin/python3", Path("/old/shared_memory.py"), store,
                                    "laptop")
    keys.write_text("\n".join([
        "# comment", authkeys.pinned_line(other, authkeys.PublicKey("ssh-ed25519", OTHER, "")),
        authkeys.pinned_line(mine, KEY), ""]))
    assert authkeys.pinned_python(keys, KEY, "laptop", launcher, store) == "/opt/py 3/bin/python3"
    assert authkeys.pinned_python(keys, KEY, "desktop", launcher, store) is None
    assert authkeys.pinned_python(keys, KEY, "laptop", Path("/new/shared_memory.py"),
                                  store) is None  # a moved prefix rewrites the whole line
    unflagged = mine.replace(" -S ", " ")
    keys.write_text(authkeys.pinned_line(unflagged, KEY) + "\n")
    assert authkeys.pinned_python(keys, KEY, "laptop", launcher, store) is None


@pytest.mark.parametrize("text,needle", [
    ("ssh-ed25519 not*base64", "damaged"),
    ("ssh-rsa " + OTHER, "does not match its type"),
    ("ssh-ed25519 " + OTHER[:-8], "damaged"),
    ("hello world", "no such file"),
    ("ssh-ed25519 AAAA\nssh-ed25519 AAAA", "exactly one"),
])
def test_parse_key_refuses_bad_keys(text, needle, tmp_path):
    good = authkeys.parse_key(f"ssh-ed25519 {OTHER} me@pc", {"HOME": str(tmp_path)})
    assert good.text == f"ssh-ed25519 {OTHER} me@pc"
    with pytest.raises(InstallError, match=needle):
        authkeys.parse_key(text if "world" not in text else "/no/such.pub",
                           {"HOME": str(tmp_path)})


def test_split_line_reads_options_with_quoted_spaces():
    line = 'restrict,command="py /a b/shared_memory.py serve --machine pc" ssh-ed25519 AAAB c'
    options, blob = authkeys.split_line(line)
    assert blob == "AAAB" and authkeys.pinned_machine(options) == "pc"
    assert authkeys.split_line("# comment") is None
    assert authkeys.pinned_machine(authkeys.split_line("ssh-rsa AAAA x")[0]) is None
