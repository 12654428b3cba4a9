"""The installed copy of the code: what an upgrade writes, removes, and in which order."""

from __future__ import annotations

import io
from pathlib import Path

from conftest import tree

from sharedmem.install.console import Console
from sharedmem.install.prefix import LAUNCHER_NAME, install_code, release_files


def install(prefix: Path, *, dry_run: bool = False) -> list[str]:
    return install_code(prefix, Console(io.StringIO(), io.StringIO()), dry_run=dry_run)


def test_removed_package_and_orphan_compiled_files_leave_nothing_behind(tmp_path):
    prefix = tmp_path / "prefix"
    install(prefix)
    package = prefix / "sharedmem"
    retired = package / "retired"
    (retired / "inner" / "__pycache__").mkdir(parents=True)
    for rel in ("__init__.py", "old.py", "inner/__init__.py"):
        (retired / rel).write_text("x = 1\n")
    (retired / "inner" / "__pycache__" / "__init__.cpython-311.pyc").write_bytes(b"old")
    (package / "__pycache__" / "gone.cpython-39.opt-1.pyc").write_bytes(b"old")  # .py gone before
    (package / "cli" / "__pycache__" / "retired.cpython-311.pyc").write_bytes(b"old")
    kept = package / "mine" / "notes.txt"  # not ours: it and its folder stay
    kept.parent.mkdir()
    kept.write_text("mine\n")
    (kept.parent / "old.py").write_text("x = 1\n")
    before = tree(prefix)

    dry = install(prefix, dry_run=True)
    assert tree(prefix) == before
    assert set(dry) == {f"sharedmem/{rel} (removed)" for rel in (
        "__pycache__/gone.cpython-39.opt-1.pyc", "cli/__pycache__/retired.cpython-311.pyc",
        "mine/old.py", "retired/__init__.py", "retired/old.py", "retired/inner/__init__.py",
        "retired/inner/__pycache__/__init__.cpython-311.pyc", "retired/inner/__pycache__/",
        "retired/inner/", "retired/")}
    assert dry.index("sharedmem/retired/inner/ (removed)") < dry.index(
        "sharedmem/retired/ (removed)")

    assert install(prefix) == dry
    assert tree(prefix) == {k: v for k, v in before.items() if f"{k}/ (removed)" not in dry
                            and f"{k} (removed)" not in dry}
    assert kept.read_text() == "mine\n" and not retired.exists()
    assert install(prefix) == []


def test_new_modules_come_before_their_package_and_the_launcher_last(tmp_path):
    prefix = tmp_path / "prefix"
    (prefix / "sharedmem").mkdir(parents=True)
    (prefix / "sharedmem" / "cli.py").write_text("def main(argv): return 0\n")  # the flat layout
    order = install(prefix, dry_run=True)
    assert order[-1] == LAUNCHER_NAME
    assert order[-2] == "sharedmem/cli.py (removed)"
    assert set(order[:-2]) == set(release_files()) - {LAUNCHER_NAME}
    for rel in order[:-2]:
        package = rel.rpartition("/")[0]
        if rel.startswith("sharedmem/") and not rel.endswith("/__init__.py"):
            assert order.index(rel) < order.index(f"{package}/__init__.py"), rel
    assert order.index("sharedmem/cli/__init__.py") < order.index("sharedmem/__init__.py")
    assert install(prefix) == order
    assert not (prefix / "sharedmem" / "cli.py").exists()
