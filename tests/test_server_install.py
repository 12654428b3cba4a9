"""install_server.py end to end (sharedmem.install.server_install): real files in a temporary HOME."""

from __future__ import annotations

import io
import json
import os
import sys

from conftest import PREFIX, REPO, keygen, mode, run_installer, tree

from sharedmem.install import authorized_keys as authkeys
from sharedmem.install import interpreter
from sharedmem.install.server_install import server_main
from sharedmem.server.store import Store


def test_server_install_pins_key_once_and_refuses_another_machine(tmp_path):
    home = tmp_path / "server-home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh").chmod(0o755)
    keys = home / ".ssh" / "authorized_keys"
    keys.write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBBBB old@box\n")
    keys.chmod(0o644)
    pub = keygen(tmp_path / "laptop_key")
    prefix = home / PREFIX
    proc = run_installer("install_server.py", "--authorize", "laptop", "--key",
                         str(tmp_path / "laptop_key.pub"), home=home, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    store = prefix / "store.sqlite3"
    python = interpreter.choose().path  # as the client installer chooses: a stable one
    line = (f'restrict,command="{python} -S {prefix}/shared_memory.py serve --store '
            f'{store} --machine laptop" {pub}')
    assert keys.read_text() == "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBBBB old@box\n" + line + "\n"
    assert mode(home / ".ssh") == 0o700 and mode(keys) == 0o600
    assert keys.stat().st_uid == os.getuid()
    backups = sorted((home / ".ssh").glob("authorized_keys.bak-*"))
    assert [b.read_text() for b in backups] == ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBBBB old@box\n"]
    assert "install_client.py --machine laptop --ssh-host USER@HOST" in proc.stdout
    assert "--remote-prefix" not in proc.stdout
    assert list((prefix / "sharedmem" / "__pycache__").glob("core.cpython-*.pyc"))
    assert (prefix / "docs" / "AGENT-GUIDANCE.md").is_file()
    with Store.open(store, create=False) as opened:
        assert opened.verify() == []

    before = tree(home)
    again = run_installer("install_server.py", "--authorize", "laptop", "--key", pub, home=home,
                          cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert tree(home, skip=(str(PREFIX / "store.sqlite3"),)) == {
        k: v for k, v in before.items() if k != str(PREFIX / "store.sqlite3")}
    assert keys.read_text().count(pub.split()[1]) == 1

    refused = run_installer("install_server.py", "--authorize", "desktop", "--key", pub, home=home,
                            cwd=tmp_path)
    assert refused.returncode == 2
    assert "pinned to machine 'laptop'" in refused.stderr
    assert "--authorize desktop --key ... --repin" in refused.stderr
    assert keys.read_text().count(pub.split()[1]) == 1 and "--machine laptop" in keys.read_text()

    moved = run_installer("install_server.py", "--authorize", "desktop", "--key", pub, "--repin",
                          home=home, cwd=tmp_path)
    assert moved.returncode == 0, moved.stderr
    text = keys.read_text()
    assert text.count(pub.split()[1]) == 1 and "--machine desktop" in text
    assert "old@box" in text


def test_server_pins_a_stable_interpreter_keeps_a_working_one_and_takes_python(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    mine = bin_dir / "python3"
    mine.symlink_to(sys.executable)
    pub = keygen(tmp_path / "laptop_key")
    prefix, keys = home / PREFIX, home / ".ssh" / "authorized_keys"
    key = authkeys.parse_key(pub, {"HOME": str(home)})

    def pinned(python: str) -> str:
        command = authkeys.forced_command(python, prefix / "shared_memory.py",
                                          prefix / "store.sqlite3", "laptop")
        return authkeys.pinned_line(command, key) + "\n"

    def install(*extra: str) -> tuple[int, dict, str]:
        out, err = io.StringIO(), io.StringIO()
        code = server_main(["--authorize", "laptop", "--key", pub, "--json", *extra],
                           {"HOME": str(home)}, out=out, err=err)
        return code, json.loads(out.getvalue() or "{}"), err.getvalue()

    (home / ".ssh").mkdir(mode=0o700)
    keys.write_text(pinned(str(mine)))  # an older install pinned a Python that still runs
    code, summary, err = install()
    assert code == 0, err
    assert summary["authorized_keys"]["action"] == "unchanged" and summary["python"] == str(mine)
    assert keys.read_text() == pinned(str(mine))

    mine.unlink()  # a version manager took it away: the stable choice replaces it
    code, summary, err = install()
    assert code == 0, err
    assert summary["authorized_keys"]["action"] == "updated"
    assert keys.read_text() == pinned(interpreter.choose().path)

    mine.symlink_to(sys.executable)
    code, summary, err = install("--python", str(mine))  # named: it wins over a working line
    assert code == 0, err
    assert keys.read_text() == pinned(str(mine)) and summary["python"] == str(mine)
    code, _, err = install("--python", str(bin_dir / "python9"))
    assert code == 2 and f"--python {bin_dir / 'python9'}: no Python runs there" in err
    assert keys.read_text() == pinned(str(mine))


def test_server_upgrade_removes_stale_files_and_custom_prefix_hint(tmp_path):
    home = tmp_path / "h"
    home.mkdir()
    prefix = tmp_path / "srv"
    first = run_installer("install_server.py", "--prefix", str(prefix), home=home, cwd=tmp_path)
    assert first.returncode == 0
    stale = prefix / "sharedmem" / "retired.py"
    stale.write_text("x = 1\n")
    (prefix / "sharedmem" / "__pycache__" / "retired.cpython-311.pyc").write_bytes(b"old")
    (prefix / "sharedmem" / "core.py").write_text("# damaged\n")
    proc = run_installer("install_server.py", "--prefix", str(prefix), home=home, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert not stale.exists()
    assert not list((prefix / "sharedmem" / "__pycache__").glob("retired.*"))
    assert (prefix / "sharedmem" / "core.py").read_bytes() == (REPO / "sharedmem" / "core.py").read_bytes()
    assert f"--remote-prefix {prefix}" in proc.stdout
    assert not (home / ".ssh").exists()


def test_server_argument_and_key_problems(tmp_path):
    home = tmp_path / "h"
    home.mkdir()
    private = tmp_path / "k"
    keygen(private)
    proc = run_installer("install_server.py", "--authorize", "Bad Name", "--key", str(private),
                         "--repin", home=home, cwd=tmp_path)
    assert proc.returncode == 2
    assert "2 problem(s)" in proc.stderr
    assert "--authorize 'Bad Name' is invalid" in proc.stderr
    assert "PRIVATE key" in proc.stderr
    assert not (home / PREFIX).exists()
    lone = run_installer("install_server.py", "--key", str(private) + ".pub", home=home, cwd=tmp_path)
    assert lone.returncode == 2 and "go together" in lone.stderr
    assert run_installer("install_server.py", "--help", home=home, cwd=tmp_path).stdout.count("--authorize")


def test_server_warns_when_home_is_writable_by_others(tmp_path):
    home = tmp_path / "shared-home"
    home.mkdir()
    home.chmod(0o777)
    keygen(tmp_path / "k")
    proc = run_installer("install_server.py", "--authorize", "pc", "--key", str(tmp_path / "k.pub"),
                         home=home, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert f"chmod go-w {home}" in proc.stderr
    assert "--machine pc" in (home / ".ssh" / "authorized_keys").read_text()
