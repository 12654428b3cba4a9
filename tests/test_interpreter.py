"""Which Python the harnesses and the schedule run: candidates are real programs run once each.

Stand-ins for other Python versions are small shell scripts that answer the version probe the
way an interpreter would; the same version is a link to this very interpreter.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from sharedmem.core import ConfigError
from sharedmem.install import interpreter as it

HERE = (sys.version_info[0], sys.version_info[1])
pytestmark = pytest.mark.skipif(os.name == "nt", reason="shell-script stand-ins need a POSIX sh")


def fake_python(folder: Path, name: str, answer: str, status: int = 0) -> str:
    """A program that prints `answer` to the version probe, as another Python would."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(f"#!/bin/sh\necho '{answer}'\nexit {status}\n")
    path.chmod(0o755)
    return str(path)


def same_python(folder: Path, name: str) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.symlink_to(sys.executable)
    return str(path)


@pytest.mark.parametrize(("path", "in_venv", "why"), [
    ("/usr/bin/python3.12", False, None),
    ("/usr/local/bin/python3", False, None),
    ("/opt/homebrew/bin/python3.13", False, None),
    ("/home/secondary/bin/python3", False, None),  # "conda" inside a word is no conda
    ("/usr/bin/python3.12", True, "a virtual environment"),
    ("/home/me/.pyenv/versions/3.12.1/bin/python3.12", False, "a pyenv install"),
    ("/home/me/.asdf/installs/python/3.12.1/bin/python3", False, "an asdf install"),
    ("/home/me/.local/share/uv/python/cpython-3.12.1-linux/bin/python3", False,
     "a uv-managed Python"),
    ("/home/me/.local/share/mise/installs/python/3.12/bin/python3", False, "a mise install"),
    ("/nix/store/abc-python3-3.12.1/bin/python3", False, "a Nix store path"),
    ("/opt/homebrew/Cellar/python@3.12/3.12.1/bin/python3.12", False,
     "a Homebrew Cellar path"),
    ("/home/me/miniconda3/bin/python3", False, "a conda install"),
    ("C:\\Users\\me\\.pyenv\\pyenv-win\\versions\\3.12.1\\python.exe", False, "a pyenv install"),
])
def test_what_may_vanish(path: str, in_venv: bool, why: str | None) -> None:
    assert it.volatile(path, in_venv) == why


def test_a_stable_interpreter_is_kept_without_a_word() -> None:
    assert it.choose("/usr/bin/python3.12", in_venv=False, version=(3, 12), tried=[]) == \
        it.Choice("/usr/bin/python3.12")


def test_the_same_version_wins_over_an_earlier_newer_one(tmp_path: Path) -> None:
    tried = [str(tmp_path / "missing" / "python3"),
             fake_python(tmp_path / "old", "python3", "3 9"),
             fake_python(tmp_path / "broken", "python3", "3 12", status=1),
             fake_python(tmp_path / "garbage", "python3", "Python 3.12"),
             fake_python(tmp_path / "other", "python3", f"{HERE[0]} {HERE[1] + 1}"),
             same_python(tmp_path / "same", f"python{HERE[0]}.{HERE[1]}")]
    current = "/home/me/.pyenv/versions/x/bin/python3"
    choice = it.choose(current, in_venv=False, version=HERE, tried=tried)
    assert choice.path == tried[-1] and not choice.volatile
    assert f"will run {tried[-1]} (Python {HERE[0]}.{HERE[1]}), not {current}" in choice.note
    assert "a pyenv install" in choice.note


def test_any_system_python_3_11_or_later_comes_next(tmp_path: Path) -> None:
    tried = [fake_python(tmp_path / "old", "python3", "3 10"),
             fake_python(tmp_path / "newer", "python3", "3 14"),
             fake_python(tmp_path / "newest", "python3", "3 15")]
    choice = it.choose("/venv/bin/python", in_venv=True, version=(3, 12), tried=tried)
    assert choice.path == tried[1] and "(Python 3.14)" in choice.note
    assert "a virtual environment" in choice.note


def test_without_one_the_current_is_kept_with_a_warning(tmp_path: Path) -> None:
    tried = [fake_python(tmp_path / "old", "python3", "3 10")]
    current = "/home/me/.local/share/uv/python/cpython-3.12/bin/python3"
    choice = it.choose(current, in_venv=False, version=(3, 12), tried=tried)
    assert choice.path == current and choice.volatile
    assert "--python PATH" in choice.note and "re-run install_client.py" in choice.note


def test_the_default_candidates_are_system_paths_same_version_first() -> None:
    found = it.candidates((3, 12))
    assert found[0] == "/usr/bin/python3.12" and "/usr/bin/python3" in found
    assert found.index("/usr/local/bin/python3.12") < found.index("/usr/bin/python3")


def test_probe_runs_the_program(tmp_path: Path) -> None:
    assert it.probe(sys.executable) == HERE
    plain = tmp_path / "not-executable"
    plain.write_text("#!/bin/sh\necho 3 12\n")
    assert it.probe(str(plain)) is None
    assert it.probe(str(tmp_path)) is None


def test_given_checks_by_running(tmp_path: Path) -> None:
    assert it.given(sys.executable) == it.Choice(str(Path(sys.executable).absolute()))
    with pytest.raises(ConfigError, match="runs Python 3.9; this program needs 3.11"):
        it.given(fake_python(tmp_path, "python3.9", "3 9"))
    with pytest.raises(ConfigError, match="no Python runs there"):
        it.given(str(tmp_path / "nothing"))
    with pytest.raises(ConfigError, match="give the full path"):
        it.given("python3")
