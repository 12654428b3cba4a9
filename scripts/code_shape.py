"""The code's shape in figures: what a newcomer has to read, counted the same way every time.

Issue 35 set these targets for `sharedmem/`; the script counts them so that a change can say
what it did to each (`python3 scripts/code_shape.py`, or `--json` for a script). It reads the
source only (`ast` and `tokenize`); it imports nothing of the package.
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import re
import sys
import tokenize
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SYNC = "client/sync.py"
LONG, VERY_LONG, BIG_MODULE = 50, 80, 800
# A comment that carries a measurement or a round of work: a duration, a ratio, "round N".
FIGURE = re.compile(r"\bround \d+|\b\d+(?:\.\d+)?\s?(?:ms|µs|us)\b|\b\d+(?:\.\d+)?x\b"
                    r"|\b\d+(?:\.\d+)?\s?(?:MB|GB|MiB|GiB)/s\b", re.IGNORECASE)
TARGETS = {  # figure -> (highest value that meets the target, what the target says)
    "sync_lines": (450, "client/sync.py <= 450 lines"),
    "functions_over_80": (0, "no function over 80 lines"),
    "functions_over_50": (8, "at most 8 functions over 50 lines"),
    "modules_over_800": (0, "no module over 800 lines"),
    "version_comparisons": (12, "at most 12 comparisons of a protocol version"),
    "figure_comments": (0, "no comment carrying a benchmark figure or round"),
    "benchmarks_lines": (600, "docs/BENCHMARKS.md <= 600 lines"),
}


def code_lines(text: str) -> int:
    """Lines that are neither blank nor only a comment (docstrings count: a reader reads them)."""
    return sum(1 for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#"))


def functions(tree: ast.AST) -> list[tuple[str, int]]:
    """(name, lines) of every function and method, nested ones included."""
    return [(node.name, node.end_lineno - node.lineno + 1) for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno]


def version_comparisons(tree: ast.AST) -> list[int]:
    """Lines comparing a protocol version with a number (a store's schema version is not one)."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        names = [ast.unparse(side) for side in sides if not isinstance(side, ast.Constant)]
        numbers = [side for side in sides
                   if isinstance(side, ast.Constant) and type(side.value) is int]
        if numbers and any("version" in name and "schema" not in name for name in names):
            found.append(node.lineno)
    return found


def figure_comments(text: str) -> list[int]:
    """Lines whose comment carries a benchmark figure or a round number."""
    tokens = tokenize.generate_tokens(io.StringIO(text).readline)
    return [tok.start[0] for tok in tokens
            if tok.type == tokenize.COMMENT and FIGURE.search(tok.string)]


def measure(package: Path, benchmarks: Path) -> dict[str, object]:
    """Every figure of the targets, with what makes it up, for `package`."""
    long, very_long, big, versions, figures = [], [], [], [], []
    total = 0
    for path in sorted(package.rglob("*.py")):
        name = path.relative_to(package).as_posix()
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
        total += code_lines(text)
        if len(text.splitlines()) > BIG_MODULE:
            big.append(f"{name} ({len(text.splitlines())})")
        for function, lines in functions(tree):
            if lines > VERY_LONG:
                very_long.append(f"{name}:{function} ({lines})")
            elif lines > LONG:
                long.append(f"{name}:{function} ({lines})")
        versions += [f"{name}:{line}" for line in version_comparisons(tree)]
        figures += [f"{name}:{line}" for line in figure_comments(text)]
    sync = package / SYNC
    return {
        "sync_lines": len(sync.read_text(encoding="utf-8").splitlines()) if sync.exists() else 0,
        "functions_over_80": len(very_long), "functions_over_80_list": very_long,
        "functions_over_50": len(long) + len(very_long), "functions_over_50_list": long,
        "modules_over_800": len(big), "modules_over_800_list": big,
        "version_comparisons": len(versions), "version_comparisons_list": versions,
        "figure_comments": len(figures), "figure_comments_list": figures,
        "benchmarks_lines": (len(benchmarks.read_text(encoding="utf-8").splitlines())
                             if benchmarks.exists() else 0),
        "code_lines": total,
    }


def report(figures: dict[str, object], baseline: int | None) -> str:
    """One line per target: the figure, the target, PASS or FAIL, and what makes it up."""
    out = []
    for key, (limit, says) in TARGETS.items():
        value = figures[key]
        verdict = "PASS" if isinstance(value, int) and value <= limit else "FAIL"
        out.append(f"{key:<20} {value:>6}  {says}: {verdict}")
        out += [f"    {item}" for item in figures.get(f"{key}_list", [])]  # type: ignore[union-attr]
    line = f"{'code_lines':<20} {figures['code_lines']:>6}  non-blank, non-comment lines"
    if baseline:
        change = (figures["code_lines"] - baseline) / baseline  # type: ignore[operator]
        goal = "PASS" if change <= -0.05 else "FAIL"
        line += f" ({change:+.1%} against {baseline}; target -5% or fewer: {goal})"
    out.append(line)
    return "\n".join(out)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, default=REPO,
                        help="the checkout to count (default: this one)")
    parser.add_argument("--baseline", type=Path,
                        help="another checkout whose code lines the change is measured against")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    package = args.repo / "sharedmem"
    if not package.is_dir():
        parser.error(f"{package} is not a directory: give --repo a checkout of this project")
    figures = measure(package, args.repo / "docs" / "BENCHMARKS.md")
    baseline = None
    if args.baseline:
        base = args.baseline / "sharedmem"
        if not base.is_dir():
            parser.error(f"{base} is not a directory: give --baseline a checkout of this project")
        baseline = sum(code_lines(p.read_text(encoding="utf-8")) for p in base.rglob("*.py"))
        figures["baseline_code_lines"] = baseline
    print(json.dumps(figures, indent=2) if args.json else report(figures, baseline))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
