"""scripts/code_shape.py: each figure of the code's shape is counted, on a package made here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import REPO

sys.path.insert(0, str(REPO / "scripts"))
import code_shape  # noqa: E402


def _package(root: Path) -> Path:
    package = root / "sharedmem"
    (package / "client").mkdir(parents=True)
    body = "\n".join(f"    x{i} = {i}" for i in range(85))
    (package / "client" / "sync.py").write_text(
        '"""Doc."""\n\n\ndef long_one() -> None:\n' + body + "\n", encoding="utf-8")
    (package / "client" / "talk.py").write_text(
        "# a comment that took 40 ms in round 12\n"
        "def pick(conn, schema_version):\n"
        "    if conn.version >= 3:  # a protocol version\n"
        "        return schema_version > 2\n"
        "    return 3 == conn.versions[0]\n", encoding="utf-8")
    (package / "big.py").write_text("\n".join(["x = 1"] * 801) + "\n", encoding="utf-8")
    (root / "docs").mkdir()
    (root / "docs" / "BENCHMARKS.md").write_text("# B\n" * 601, encoding="utf-8")
    return package


def test_each_figure_is_counted_on_a_package_made_here(tmp_path: Path) -> None:
    package = _package(tmp_path)
    figures = code_shape.measure(package, tmp_path / "docs" / "BENCHMARKS.md")
    assert figures["sync_lines"] == 89
    assert figures["functions_over_80_list"] == ["client/sync.py:long_one (86)"]
    assert figures["functions_over_50"] == 1
    assert figures["modules_over_800_list"] == ["big.py (801)"]
    assert figures["version_comparisons_list"] == ["client/talk.py:3", "client/talk.py:5"]
    assert figures["figure_comments_list"] == ["client/talk.py:1"]
    assert figures["benchmarks_lines"] == 601
    assert figures["code_lines"] == 87 + 4 + 801


def test_the_report_says_pass_or_fail_and_the_change_against_a_baseline(tmp_path: Path) -> None:
    _package(tmp_path / "new")
    _package(tmp_path / "old")
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "code_shape.py"),
                           "--repo", str(tmp_path / "new"), "--baseline", str(tmp_path / "old")],
                          capture_output=True, text=True, check=True)
    assert "client/sync.py <= 450 lines: PASS" in done.stdout
    assert "no function over 80 lines: FAIL" in done.stdout
    assert "(+0.0% against 892; target -5% or fewer: FAIL)" in done.stdout
    as_json = subprocess.run([sys.executable, str(REPO / "scripts" / "code_shape.py"),
                              "--repo", str(tmp_path / "new"), "--json"],
                             capture_output=True, text=True, check=True)
    assert json.loads(as_json.stdout)["modules_over_800"] == 1
    wrong = subprocess.run([sys.executable, str(REPO / "scripts" / "code_shape.py"),
                            "--repo", str(tmp_path / "nothing")], capture_output=True, text=True)
    assert wrong.returncode == 2 and "give --repo a checkout" in wrong.stderr
