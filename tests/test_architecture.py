"""The package's shape against ARCHITECTURE.md: sides in layers, imports one way, no cycles.

Every import counts, at module level or inside a function (a lazy import is still a dependency),
so the rules hold for what the code can load, not only for what it loads first.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BASE = "base"


def module_imports(package: Path) -> dict[str, list[tuple[str, int]]]:
    """Module name -> (imported name, line) for every import in the package's files."""
    top = package.name
    found: dict[str, list[tuple[str, int]]] = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        targets = found.setdefault(name, [])
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets += [(alias.name, node.lineno) for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                # `from pkg.side import module` depends on that module; `from pkg.x import name`
                # on pkg.x
                inner = [f"{node.module}.{a.name}" for a in node.names
                         if node.module.split(".")[0] == top
                         and _is_module(package, f"{node.module}.{a.name}")]
                if len(inner) < len(node.names):
                    targets.append((node.module, node.lineno))
                targets += [(name, node.lineno) for name in inner]
    return found


def _is_module(package: Path, name: str) -> bool:
    path = package.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def side_of(package: Path, module: str) -> str:
    """The subpackage a module belongs to, or BASE for the package's own top-level modules."""
    parts = module.split(".")
    if len(parts) >= 2 and (package / parts[1]).is_dir():
        return parts[1]
    return BASE


def internal(package: Path, imports: dict[str, list[tuple[str, int]]]
             ) -> dict[str, list[tuple[str, int]]]:
    """Only the imports of the package's own modules (the package itself counts as base)."""
    return {m: [(t, line) for t, line in targets if _is_module(package, t)]
            for m, targets in imports.items()}


def cycles(graph: dict[str, list[tuple[str, int]]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan), and self-imports."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target, _ in graph.get(node, []):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1 or any(t == node for t, _ in graph.get(node, [])):
                out.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return out


def layers(architecture: str) -> dict[str, int]:
    """Side -> layer number (0 is the front) from ARCHITECTURE.md's import-direction block."""
    block = architecture.split("Imports go one way", 1)[1].split("```", 2)[1]
    block = re.sub(r"\([^)]*\)", "", block)
    return {name: number for number, part in enumerate(block.split("->"))
            for name in re.sub(r"\s+", "", part).split("/") if name}


def problems(package: Path, layer_of: dict[str, int]) -> list[str]:
    """Every way the package breaks the rules of its shape, one line each."""
    imports = module_imports(package)
    graph = internal(package, imports)
    out = []
    for group in cycles(graph):
        out.append("import cycle: " + " -> ".join(group))
    sides = sorted({side_of(package, m) for m in imports})
    out += [f"side {s} is in no layer of docs/ARCHITECTURE.md" for s in sides if s not in layer_of]
    for module, targets in sorted(graph.items()):
        here = side_of(package, module)
        for target, line in targets:
            there = side_of(package, target)
            if here == there or target == package.name:
                continue
            where = f"{module} imports {target} (line {line})"
            if {here, there} == {"server", "client"}:
                out.append(f"{where}: server and client never import each other")
            elif here == BASE:
                out.append(f"{where}: the base imports no subpackage")
            elif here in layer_of and there in layer_of and layer_of[there] < layer_of[here]:
                out.append(f"{where}: {there} is a layer above {here}")
    stdlib = sys.stdlib_module_names | {"__future__"}
    for module, targets in sorted(imports.items()):
        if side_of(package, module) == BASE:
            out += [f"{module} imports {t} (line {line}): the base uses only the standard library"
                    for t, line in targets
                    if t.split(".")[0] not in stdlib and t.split(".")[0] != package.name]
    return out


def test_the_package_keeps_its_shape() -> None:
    architecture = (REPO / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    layer_of = layers(architecture)
    assert layer_of["cli"] == 0 and layer_of[BASE] == max(layer_of.values())
    found = problems(REPO / "sharedmem", layer_of)
    assert not found, "\n".join(found)


def test_every_module_has_a_row_in_architecture() -> None:
    architecture = (REPO / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    package = REPO / "sharedmem"
    missing = [path.relative_to(package).as_posix() for path in sorted(package.rglob("*.py"))
               if path.name != "__init__.py"
               and f"`{path.relative_to(package).as_posix()}`" not in architecture]
    assert not missing, f"modules with no row in docs/ARCHITECTURE.md: {missing}"


def test_the_check_finds_each_kind_of_break(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    for side in ("front", "server", "client", "lower"):
        (package / side).mkdir(parents=True)
        (package / side / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    files = {
        "base.py": "import json\nimport yaml\nfrom pkg.lower import deep\n",
        "other.py": "def later():\n    from pkg import base\n",
        "front/cmd.py": "from pkg.server import a\nfrom pkg.client import b\n",
        "server/a.py": "from pkg.client.b import x\n",
        "client/b.py": "from pkg.lower import deep\n",
        "lower/deep.py": "def f():\n    from pkg.front import cmd\n",
        "lower/one.py": "from pkg.lower import two\n",
        "lower/two.py": "def g():\n    import pkg.lower.one\n",
        "stray/__init__.py": "",
    }
    for name, text in files.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(text)
    layer_of = layers("Imports go one way:\n\n```\nfront -> server / client\n"
                      "   -> lower -> base (only the stdlib)\n```\n")
    assert layer_of == {"front": 0, "server": 1, "client": 1, "lower": 2, "base": 3}
    assert problems(package, layer_of) == [
        "import cycle: pkg.client.b -> pkg.front.cmd -> pkg.lower.deep -> pkg.server.a",
        "import cycle: pkg.lower.one -> pkg.lower.two",
        "side stray is in no layer of docs/ARCHITECTURE.md",
        "pkg.base imports pkg.lower.deep (line 3): the base imports no subpackage",
        "pkg.lower.deep imports pkg.front.cmd (line 2): front is a layer above lower",
        "pkg.server.a imports pkg.client.b (line 1): server and client never import each other",
        "pkg.base imports yaml (line 2): the base uses only the standard library",
    ]


# --- the tests' shape: one file a module, helpers shared through conftest.py ---------------------

REPOSITORY_TESTS = {"architecture", "docs"}  # these test the repository itself, not one module


def mirror_problems(tests: Path, package: Path, scripts: Path) -> list[str]:
    """Every test file named after no module, or that imports another test file, one line each.

    tests/test_<module>.py mirrors one module of the package or of scripts/; where the module's
    name is also another module's or another subpackage's, the file is
    test_<subpackage>_<module>.py.
    """
    paths: dict[str, list[Path]] = {}
    for path in package.rglob("*.py"):
        if path.name != "__init__.py":
            paths.setdefault(path.stem, []).append(path.relative_to(package))
    subpackages = {p.name for p in package.iterdir() if (p / "__init__.py").is_file()}
    shared = {name for name, found in paths.items()
              if len(found) > 1 or name in subpackages - {found[0].parts[0]}}
    allowed = REPOSITORY_TESTS | {p.stem for p in scripts.glob("*.py")}
    allowed |= {name for name in paths if name not in shared}
    allowed |= {"_".join(p.parts[-2:])[:-3] for name in shared for p in paths[name]
                if len(p.parts) >= 2}
    test_files = {p.stem for p in tests.glob("test_*.py")}
    out = []
    for path in sorted(tests.glob("*.py")):
        if path.name.startswith("test_") and path.stem[5:] not in allowed:
            out.append(f"{path.name} is named after no module (tests/test_<module>.py, or "
                       f"test_<subpackage>_<module>.py where two share a name)")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            out += [f"{path.name} imports {name} (line {node.lineno}): shared helpers go in "
                    f"conftest.py" for name in names if name.split(".")[0] in test_files]
    return out


def test_test_files_mirror_modules_and_share_through_conftest() -> None:
    found = mirror_problems(REPO / "tests", REPO / "sharedmem", REPO / "scripts")
    assert not found, "\n".join(found)


def test_the_test_file_check_finds_each_kind_of_break(tmp_path: Path) -> None:
    package, scripts, tests = tmp_path / "pkg", tmp_path / "scripts", tmp_path / "tests"
    for folder in ("client", "server", "mcp"):
        (package / folder).mkdir(parents=True)
        (package / folder / "__init__.py").write_text("")
    for name in ("core.py", "client/tails.py", "server/tails.py", "mcp/server.py",
                 "client/sync.py", "client/client.py"):
        (package / name).write_text("")
    scripts.mkdir()
    (scripts / "bench.py").write_text("")
    tests.mkdir()
    for name, text in {"conftest.py": "", "test_core.py": "", "test_bench.py": "",
                       "test_client.py": "",
                       "test_client_tails.py": "", "test_mcp_server.py": "",
                       "test_tails.py": "", "test_server.py": "", "test_faults.py": "",
                       "test_sync.py": "from test_core import helper\n",
                       "test_architecture.py": "def f():\n    import test_sync.x\n"}.items():
        (tests / name).write_text(text)
    assert [line.split(" (")[0] for line in mirror_problems(tests, package, scripts)] == [
        "test_architecture.py imports test_sync.x",
        "test_faults.py is named after no module",
        "test_server.py is named after no module",
        "test_sync.py imports test_core",
        "test_tails.py is named after no module",
    ]
