#!/usr/bin/env python3
"""Benchmark of the MCP server over a generated (or copied) cache, each figure beside its reference."""

from __future__ import annotations

import argparse
import compileall
import json
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SCRIPTS = Path(__file__).resolve().parent
REPO = SCRIPTS.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(SCRIPTS))

import corpus  # noqa: E402

from sharedmem.cache.cache import Cache, NamespaceInfo  # noqa: E402
from sharedmem.hashing import sha256_text  # noqa: E402

NAMESPACE = "machines/bench/notes"
LATER = NamespaceInfo(NAMESPACE, "bench", "notes", "markdown", 2, "2026-01-02T00:00:00Z")  # later syncs
QUERIES = [  # (label, arguments, rg flags)
    ("common word", {"queries": ["session"]}, []),
    ("rare identifier", {"queries": ["RareIdent0007"]}, []),
    ("non-ASCII word", {"queries": ["Привет"]}, []),
    ("three-word phrase", {"queries": ["rotate the signing"]}, []),
    ("phrase of common words", {"queries": ["stale lock file"]}, []),
    ("phrase of words in every file", {"queries": ["the default value"]}, []),
    ("phrase of common words, real text", {"queries": ["see also the"]}, []),
    ("phrase ending in a short common word", {"queries": ["see the"]}, []),
    ("all of three", {"queries": ["rotate", "signing", "key"], "match_mode": "all"}, []),
    ("accented, normalized", {"queries": ["décision"], "normalized": True}, ["-i"]),
    ("one character, ignoring case, 20", {"queries": ["a"], "case_sensitive": False,
                                          "max_results": 20}, ["-i"]),
    ("two characters", {"queries": ["zq"]}, []),
]


def build(work: Path, files: int, seed: int, style: str = "prose",
          copy_of: str | None = None) -> tuple[Path, dict[str, Any]]:
    """Corpus (generated, or a copy of `copy_of`) -> cache (via Cache.apply) -> client.json.

    Returns the config path and the corpus's counts.
    """
    src, root = work / "src", work / "cache"
    stats = corpus.copy(Path(copy_of), src) if copy_of else corpus.generate(src, files, seed,
                                                                            style)
    upserts = []
    for path in sorted(src.rglob("*.md")):
        text = path.read_text(encoding="utf-8")
        upserts.append((f"{NAMESPACE}/{path.relative_to(src).as_posix()}", sha256_text(text), text))
    info = NamespaceInfo(NAMESPACE, "bench", "notes", "markdown", 1, "2026-01-01T00:00:00Z")
    Cache(root).apply(upserts, [], {NAMESPACE: info})
    shutil.rmtree(src)
    config = work / "client.json"
    config.write_text(json.dumps({
        "machine": "bench", "transport": {"kind": "local", "store": str(work / "store.sqlite3")},
        "sources": [], "cache": str(root), "state": str(work / "state")}), encoding="utf-8")
    return config, stats


def add_later(cache: Cache, count: int) -> int:
    """Add `count` files spread through path order, as a sync after the index's build does.

    Each is a copy of a file, beside it, so the searches find in them what they find there.
    """
    files = sorted(cache.load().files)
    picked = {files[i * len(files) // count] for i in range(min(count, len(files)))}
    upserts = []
    for relpath in sorted(picked):
        text = (cache.root / relpath).read_text(encoding="utf-8")
        upserts.append((relpath.removesuffix(".md") + "-later.md", sha256_text(text), text))
    cache.apply(upserts, [], {NAMESPACE: LATER})
    return len(upserts)


def change_some(cache: Cache, round_: int) -> int:
    """Change 1% of the files (at least one), spread through path order, as a later sync does.

    Each keeps its text and gains a line, so searches find in it what they found; each round
    picks other files, as a client's memory changes here and there over weeks.
    """
    files = sorted(cache.load().files)
    count = max(1, len(files) // 100)
    picked = sorted({files[(i * len(files) // count + 37 * round_) % len(files)]
                     for i in range(count)})
    upserts = []
    for relpath in picked:
        text = (cache.root / relpath).read_text(encoding="utf-8") + f"\nChanged by sync {round_}.\n"
        upserts.append((relpath, sha256_text(text), text))
    cache.apply(upserts, [], {NAMESPACE: LATER})
    return len(upserts)


def segments(cache: Cache) -> list[int]:
    """How many FTS5 segments each table of the index is in (grams, words, pairs)."""
    from sharedmem.cache.search_index import index_path
    conn = sqlite3.connect(index_path(cache))
    try:
        return [conn.execute(f"SELECT count(DISTINCT segid) FROM {table}_idx").fetchone()[0]
                for table in ("grams", "words", "pairs")]
    finally:
        conn.close()


def strays(cache: Cache) -> int:
    """Parts the index holds out of path order, as its last refresh counted them."""
    from sharedmem.cache.search_index import index_path
    conn = sqlite3.connect(index_path(cache))
    try:
        row = conn.execute("SELECT value FROM meta WHERE key='strays'").fetchone()
    finally:
        conn.close()
    return int(row[0]) if row else 0


def server_command(config: Path) -> list[str]:
    """The launcher when cli.py wires `mcp`, else the module entry point."""
    cli = REPO / "sharedmem" / "cli.py"
    if cli.is_file() and '"mcp"' in cli.read_text(encoding="utf-8"):
        return [sys.executable, "-S", str(REPO / "shared_memory.py"), "mcp", "--config",
                str(config)]
    return [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(REPO)!r}); "
            "from sharedmem.mcp.server import main; sys.exit(main(sys.argv[1]))", str(config)]


def first_output(cmd: list[str], line: bytes = b"") -> float:
    """Seconds from spawn to the first line of output."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    assert proc.stdin and proc.stdout
    proc.stdin.write(line)
    proc.stdin.flush()
    proc.stdout.readline()
    elapsed = time.perf_counter() - start
    proc.stdin.close()
    proc.wait()
    return elapsed


class Session:
    """A running server and a request/response helper."""

    def __init__(self, cmd: list[str]) -> None:
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL)
        self.next_id = 0
        self.ask("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                "clientInfo": {"name": "bench", "version": "0"}})

    def ask(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        self.next_id += 1
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(json.dumps({"jsonrpc": "2.0", "id": self.next_id, "method": method,
                                          "params": params}).encode() + b"\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def timed_call(self, name: str, arguments: dict[str, Any]) -> float:
        start = time.perf_counter()
        reply = self.ask("tools/call", {"name": name, "arguments": arguments})
        elapsed = time.perf_counter() - start
        assert not reply["result"]["isError"], reply
        return elapsed

    def rss_kib(self) -> tuple[int, int]:
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])

    def close(self) -> None:
        assert self.proc.stdin
        self.proc.stdin.close()
        self.proc.wait()


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(args: argparse.Namespace) -> int:
    """Build, measure, print the table; exit 1 if any target is missed."""
    from sharedmem.cache.search_index import refresh_index
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="bench-mcp-"))
    work.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    config, stats = build(work, args.files, args.seed, args.style, args.corpus)
    built = time.perf_counter() - start
    compileall.compile_dir(str(REPO / "sharedmem"), quiet=1)
    start = time.perf_counter()
    refresh_index(Cache(work / "cache"))
    indexed = time.perf_counter() - start
    print(f"corpus: {stats['files']} files, {stats['bytes'] / 1e6:.1f} MB; cache built in "
          f"{built:.1f}s, index built in {indexed:.1f}s")
    if args.later:
        added = add_later(Cache(work / "cache"), args.later)
        refresh_index(Cache(work / "cache"))
        out = strays(Cache(work / "cache"))
        print(f"then {added} files added by a later sync, as an installed client's index has "
              f"them: {out} part{'' if out == 1 else 's'} out of path order, the rest in rows "
              "the build left free (--later 0: the index as built whole)")
    if args.syncs:
        for round_ in range(1, args.syncs + 1):
            change_some(Cache(work / "cache"), round_)
            refresh_index(Cache(work / "cache"))
        print(f"then {args.syncs} syncs each changing 1% of the files, as a client's index has "
              f"them after weeks: its tables in {segments(Cache(work / 'cache'))} segments "
              "(--syncs 0: none)")
    rows: list[tuple[str, str, str, str, bool]] = []
    cmd = server_command(config)
    init = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                       "params": {"protocolVersion": "2025-06-18"}}).encode() + b"\n"
    pairs = [(first_output(cmd, init), first_output([sys.executable, "-c", "print(1)"]))
             for _ in range(args.runs)]  # interleaved, so background load hits both alike
    cold = statistics.median(p[0] for p in pairs)
    ref = statistics.median(p[1] for p in pairs)
    rows.append(("cold start (spawn to initialize reply)", f"{cold * 1e3:.1f} ms", "<= 2x ref",
                 f"{ref * 1e3:.1f} ms (python -c print(1))", cold <= 2 * ref))
    session = Session(cmd)
    files = sorted(Cache(work / "cache").load().files)
    reads = [session.timed_call("read", {"path": files[i * 37 % len(files)]})
             for i in range(args.runs * 20)]
    rows.append(("read round trip p50", f"{pct(reads, 0.5) * 1e3:.2f} ms", "< 1 ms", "",
                 pct(reads, 0.5) < 0.001))
    for label, arguments, flags in QUERIES + searches(args.search):
        times = [session.timed_call("search", arguments) for _ in range(args.runs * 4)]
        rg = statistics.median(_rg(flags, arguments["queries"][0], work / "cache")
                               for _ in range(args.runs))
        p50, p95 = pct(times, 0.5), pct(times, 0.95)
        rows.append((f"search {label} p50/p95", f"{p50 * 1e3:.2f} / {p95 * 1e3:.2f} ms",
                     "p50 <= 10 ms, >= 4x rg", f"rg {rg * 1e3:.1f} ms ({rg / p50:.0f}x)",
                     p50 <= 0.010 and rg >= 4 * p50))
    for i in range(1000):
        label, arguments, _ = QUERIES[i % len(QUERIES)]
        session.timed_call("search", {**arguments, "max_results": 50})
    rss, hwm = session.rss_kib()
    rows.append(("server memory after 1,000 searches (VmRSS)", f"{rss / 1024:.1f} MB",
                 "<= 64 MB", f"peak {hwm / 1024:.1f} MB", rss <= 64 * 1024))
    session.close()
    width = [max(len(str(r[i])) for r in rows) for i in range(4)]
    print(" | ".join(h.ljust(w) for h, w in zip(("figure", "value", "target", "reference"), width,
                                               strict=True)) + " | result")
    for row in rows:
        print(" | ".join(str(c).ljust(w) for c, w in zip(row[:4], width, strict=True))
              + (" | pass" if row[4] else " | FAIL"))
    if not args.work and not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if all(r[4] for r in rows) else 1


def searches(texts: list[str]) -> list[tuple[str, dict[str, Any], list[str]]]:
    """`--search` shapes: each a JSON object of `search` arguments, labelled by itself.

    `rg` is asked for the first query, ignoring case unless the search keeps it.
    """
    shapes = []
    for text in texts:
        try:
            arguments = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SystemExit(f"--search {text!r}: not JSON ({exc}); give an object such as "
                             '\'{"queries": ["stale lock"]}\'') from None
        if not isinstance(arguments, dict) or not isinstance(arguments.get("queries"), list) \
                or not arguments["queries"] or not isinstance(arguments["queries"][0], str):
            raise SystemExit(f"--search {text!r}: give a JSON object with a non-empty "
                             '"queries" list of strings, as the search tool takes')
        keeps_case = arguments.get("case_sensitive", True) and not arguments.get("normalized")
        shapes.append((text, arguments, [] if keeps_case else ["-i"]))
    return shapes


def _rg(flags: list[str], query: str, root: Path) -> float:
    start = time.perf_counter()
    subprocess.run(["rg", "-F", "-n", *flags, "--", query, str(root)], stdout=subprocess.DEVNULL,
                   check=False)
    return time.perf_counter() - start


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--files", type=int, default=10000, help="corpus size (default 10000)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--style", choices=corpus.STYLES, default="prose", help=corpus.STYLE_HELP)
    parser.add_argument("--corpus", metavar="FOLDER", help="a folder of Markdown to copy as the "
                        "corpus, paths kept, instead of generating one (--files is then ignored)")
    parser.add_argument("--search", metavar="JSON", action="append", default=[],
                        help="one more search shape to time, as the search tool's arguments "
                        "(repeatable), e.g. '{\"queries\": [\"stale lock\"], "
                        "\"case_sensitive\": false}'")
    parser.add_argument("--later", type=int, default=50, metavar="N",
                        help="files a later sync adds once the index is built, spread through "
                        "the cache, as on an installed client (default 50; 0: the index as "
                        "built whole)")
    parser.add_argument("--syncs", type=int, default=0, metavar="N",
                        help="syncs that then each change 1%% of the files, spread through the "
                        "cache, each followed by its index refresh: a client's index after "
                        "weeks of use (default 0)")
    parser.add_argument("--runs", type=int, default=11, help="repetitions per figure")
    parser.add_argument("--work", help="folder to build in (kept); default a temporary one")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")


def main(args: argparse.Namespace | None = None) -> int:
    if args is None:
        parser = argparse.ArgumentParser(description=__doc__)
        add_arguments(parser)
        args = parser.parse_args()
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
