"""`bench.py scale`: one store of several machines, a new client's first pull, and search at once.

Builds a store the way users do (each machine publishes a generated Markdown folder with a
local install), then a new client, over a real sshd on loopback, pulls the whole store as an
installed client does (its first sync builds the search index, `--no-index` for a client
without one: see bench_index.py); each figure is printed beside its anchor (`rsync -a` of the
same tree over the same sshd, `rg` over the same cache) and its target. Memory is each
process's peak RSS, taken from `getrusage` by a small wrapper around it, so nothing is sampled
and no peak is missed.
"""

from __future__ import annotations

import argparse
import compileall
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_index  # noqa: E402
import corpus  # noqa: E402
from bench_mcp import Session, pct  # noqa: E402
from bench_sync import settle  # noqa: E402
from loopback_sshd import LAUNCHER, Sshd, start_sshd  # noqa: E402

SEARCHES = [  # (label, arguments, rg flags): every query shape issue 15 names
    ("rare identifier", {"queries": ["RareIdent0007"]}, []),
    ("three common words", {"queries": ["rotate the signing"]}, []),
    ("phrase of words in every file", {"queries": ["the default value"]}, []),
    ("non-Latin word", {"queries": ["Привет"]}, []),
    ("accented, normalized", {"queries": ["décision"], "normalized": True}, ["-i"]),
    ("common word", {"queries": ["session"]}, []),
    ("case-insensitive", {"queries": ["Release"], "case_sensitive": False}, ["-i"]),
    ("all of three", {"queries": ["rotate", "signing", "key"], "match_mode": "all"}, []),
    ("any of three", {"queries": ["RareIdent0003", "Ελληνικά", "façade"],
                      "match_mode": "any"}, []),
    ("one character, ignoring case, 20", {"queries": ["a"], "case_sensitive": False,
                                          "max_results": 20}, ["-i"]),
    ("two characters", {"queries": ["zq"]}, []),
    ("accented one character, normalized", {"queries": ["é"], "normalized": True}, ["-i"]),
]

# Reports the peak RSS (KiB) of the command it runs, in a file, and exits with its code.
WRAPPER = """\
import resource, subprocess, sys
code = subprocess.call(sys.argv[2:])
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
open(sys.argv[1], "w").write(str(peak))
sys.exit(code)
"""


def _peak_mb(path: Path) -> float:
    return int(path.read_text()) / 1024


def _build(work: Path, files: int, machines: int) -> tuple[Path, dict[str, int]]:
    """Each machine publishes its own generated folder into one store, as a local install."""
    store = work / "server" / "store.sqlite3"
    totals = {"files": 0, "bytes": 0}
    for m in range(machines):
        name = f"machine{m}"
        src = work / "sources" / name
        stats = corpus.generate(src, files // machines + (m < files % machines), seed=m + 1)
        totals["files"] += stats["files"]
        totals["bytes"] += stats["bytes"]
        config = work / "publishers" / name / "client.json"
        config.parent.mkdir(parents=True)
        config.write_text(json.dumps({
            "machine": name, "transport": {"kind": "local", "store": str(store)},
            "sources": [{"name": "notes", "kind": "markdown", "path": str(src)}],
            "cache": str(config.parent / "cache"), "state": str(config.parent / "state")}))
        proc = subprocess.run([sys.executable, str(LAUNCHER), "sync", "--config", str(config)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"publishing {name} failed: {proc.stderr[-800:]}")
        print(f"published {name}: {stats['files']} files", file=sys.stderr)
    return store, totals


def _drop_publishers(work: Path) -> None:
    """Delete the publishers' caches (each holds what the store held when it synced).

    Only once everything is timed, for a folder kept: a file system that discards the blocks
    it frees (ext4 `discard`) created files up to ten times slower just after deleting as
    many, so a first pull would pay for the deletion, and `rsync -a` after it would not.
    """
    for cache in (work / "publishers").glob("*/cache"):
        shutil.rmtree(cache)


def _reader(work: Path, server: Sshd, store: Path, run: int) -> Path:
    """A new client with no sources; its serve runs under the wrapper to report its RSS."""
    config = work / f"reader-{run}" / "client.json"
    config.parent.mkdir(parents=True)
    transport = server.transport(pinned=False, remote_command=[
        sys.executable, str(work / "rss.py"), str(config.parent / "serve.rss"),
        sys.executable, "-S", str(LAUNCHER), "serve", "--store", str(store)])
    config.write_text(json.dumps({
        "machine": f"reader{run}", "transport": transport, "sources": [],
        "cache": str(config.parent / "cache"), "state": str(config.parent / "state")}))
    return config


def _sync(work: Path, config: Path, *extra: str) -> dict[str, float]:
    """One timed sync with the peak RSS of the client and of its serve."""
    settle()
    wall, started = time.time(), time.perf_counter()
    proc = subprocess.run([sys.executable, str(work / "rss.py"), str(config.parent / "client.rss"),
                           sys.executable, "-S", str(LAUNCHER), "sync", "--config",
                           str(config), "--json", *extra], capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"sync failed: {proc.stdout[-400:]} {proc.stderr[-800:]}")
    deadline = time.monotonic() + 10  # serve reports after the client has gone
    while not (config.parent / "serve.rss").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    out = {"seconds": seconds, "client_mb": _peak_mb(config.parent / "client.rss"),
           "serve_mb": _peak_mb(config.parent / "serve.rss")}
    (config.parent / "serve.rss").unlink()
    if extra or (config.parent / "cache" / ".sharedmem" / "index").is_dir():
        out["ready"] = bench_index.ready(LAUNCHER, config.parent / "cache", wall)
    return out


def _later(work: Path, config: Path, count: int) -> int:
    """A later sync: `count` new files the first machine publishes, which the reader pulls.

    They are spread through that machine's folders; the reader's index is kept current by
    its sync, as an installed client's is: each takes the rows the build left free beside its
    neighbour's, where they are enough, else rows past all others, out of path order.
    """
    src = work / "sources" / "machine0"
    files = sorted(src.rglob("*.md"))
    picked = sorted({files[i * len(files) // count] for i in range(min(count, len(files)))})
    for path in picked:  # beside a file, with its text: the searches find there what it has
        shutil.copyfile(path, path.with_name(path.stem + "-later.md"))
    publisher = work / "publishers" / "machine0" / "client.json"
    proc = subprocess.run([sys.executable, str(LAUNCHER), "sync", "--config", str(publisher)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"publishing the later files failed: {proc.stderr[-800:]}")
    _sync(work, config)
    return len(picked)


def _rsync(server: Sshd, tree: Path, dest: Path) -> float:
    ssh = (f"ssh -p {server.port} -i {server.free_key} -o IdentitiesOnly=yes -o BatchMode=yes "
           f"-o StrictHostKeyChecking=yes -o UserKnownHostsFile={server.known_hosts} "
           "-o GlobalKnownHostsFile=/dev/null -o LogLevel=ERROR")
    settle()
    started = time.perf_counter()
    proc = subprocess.run(["rsync", "-a", "--exclude", ".sharedmem", "-e", ssh, f"{tree}/",
                           f"{server.user}@127.0.0.1:{dest}/"], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"rsync failed: {proc.stderr[-800:]}")
    return time.perf_counter() - started


def _rg(flags: list[str], query: str, root: Path) -> float:
    started = time.perf_counter()
    subprocess.run(["rg", "-l", "-F", *flags, "--", query, str(root)],
                   stdout=subprocess.DEVNULL, check=False)
    return time.perf_counter() - started


def _mcp_command(config: Path) -> list[str]:
    return [sys.executable, "-S", str(LAUNCHER), "mcp", "--config", str(config)]


CPU_NOTE = ("cpu: a fixed loop of Python timed after each search of a shape (median): how "
            "fast the machine ran meanwhile; compare runs by it")


def _cpu() -> float:
    """Seconds of a fixed loop of Python: how fast this machine runs at the moment.

    A virtual machine's speed moves in phases of seconds to minutes (by 1.5x here); timed
    between a shape's searches, it tells a slow search from a slow machine.
    """
    started, total = time.perf_counter(), 0
    for i in range(100_000):
        total += i % 7
    return time.perf_counter() - started


def _search(config: Path, runs: int) -> tuple[
        list[tuple[str, float, float, float, float, float]], dict]:
    """Search at once after the sync, then each shape; and RSS after 1,000 searches."""
    cache = config.parent / "cache"
    session = Session(_mcp_command(config))
    first = session.timed_call("search", SEARCHES[0][1])
    rows = []
    for label, arguments, flags in SEARCHES:
        times, cpu = [], []
        for _ in range(runs):
            times.append(session.timed_call("search", arguments))
            cpu.append(_cpu())
        rg = statistics.median(_rg(flags, arguments["queries"][0], cache) for _ in range(3))
        rows.append((label, pct(times, 0.5), pct(times, 0.95), rg, times[0],
                     statistics.median(cpu)))
    for i in range(1000):
        session.timed_call("search", SEARCHES[i % len(SEARCHES)][1])
    rss, _ = session.rss_kib()
    session.close()
    restarted = Session(_mcp_command(config))
    cold = restarted.timed_call("search", SEARCHES[1][1])
    restarted.close()
    index = sum(p.stat().st_size for p in (cache / ".sharedmem" / "index").glob("search*")) \
        if (cache / ".sharedmem" / "index").is_dir() else 0
    return rows, {"first_search_after_sync_s": first, "first_search_after_start_s": cold,
                  "rss_after_1000_mb": rss / 1024, "index_bytes": index}


def _search_only(work: Path, args: argparse.Namespace) -> int:
    """The search phase alone, on the first reader of a folder an earlier `--keep` run left."""
    config = work / "reader-0" / "client.json"
    if not config.is_file():
        raise SystemExit(f"{config} is missing: pass a folder an earlier `scale --keep` kept")
    rows, mcp = _search(config, args.searches)
    files = sum(1 for _ in (config.parent / "cache").rglob("*.md"))
    limit = 0.010 if files <= 10_000 else 0.025
    print(f"search only, on the cache of {config.parent} ({files} files)")
    for label, p50, p95, rg, once, cpu in rows:
        print(f"search {label} p50/p95 (first) | {p50 * 1e3:.1f} / {p95 * 1e3:.1f} "
              f"({once * 1e3:.1f}) ms | rg -l {rg * 1e3:.0f} ms; cpu {cpu * 1e3:.1f} ms | "
              f"{'pass' if p50 <= limit else 'FAIL'}")
    print(CPU_NOTE)
    print(f"first search right after the sync | {mcp['first_search_after_sync_s'] * 1e3:.0f} ms")
    print(f"first search after the server starts | "
          f"{mcp['first_search_after_start_s'] * 1e3:.0f} ms")
    print(f"MCP RSS after 1,000 searches | {mcp['rss_after_1000_mb']:.0f} MB")
    if args.json:
        print(json.dumps({"mcp": mcp, "search": [
            {"shape": r[0], "p50_s": r[1], "p95_s": r[2], "rg_s": r[3], "first_s": r[4],
             "cpu_s": r[5]} for r in rows]}, indent=2))
    return 0


def run(args: argparse.Namespace) -> int:
    """Build, measure, print the table; exit 1 if a target is missed."""
    for tool in ("rsync", "rg"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is not installed: apt-get install -y "
                             f"{'ripgrep' if tool == 'rg' else tool}")
    # An install has its bytecode compiled (install/prefix.py); PYTHONDONTWRITEBYTECODE would
    # otherwise make every process here compile the package again.
    compileall.compile_dir(str(HERE.parent / "sharedmem"), quiet=1)
    if args.reuse:
        return _search_only(Path(args.reuse), args)
    work = Path(tempfile.mkdtemp(prefix="sharedmem-bench-scale-", dir=args.dir))
    try:
        (work / "rss.py").write_text(WRAPPER)
        started = time.perf_counter()
        store, totals = _build(work, args.files, args.machines)
        print(f"store: {args.machines} machines, {totals['files']} files, "
              f"{totals['bytes'] / 1e6:.0f} MB, built in {time.perf_counter() - started:.0f} s",
              file=sys.stderr)
        server = start_sshd(work / "sshd", store)
        firsts, nochanges, rsyncs, rsync_nochanges = [], [], [], []
        first_sync = [] if args.no_index else ["--index"]  # as the installer runs it
        try:
            for run_no in range(args.runs):
                config = _reader(work, server, store, run_no)
                dest = work / f"rsync-{run_no}"
                if run_no % 2:
                    rsyncs.append(_rsync(server, work / "sources", dest))
                firsts.append(_sync(work, config, *first_sync))
                if not run_no % 2:
                    rsyncs.append(_rsync(server, work / "sources", dest))
                for _ in range(3):
                    nochanges.append(_sync(work, config))
                    rsync_nochanges.append(_rsync(server, work / "sources", dest))
            if args.later and not args.no_index:
                added = _later(work, config, args.later)
                print(f"searches after a later sync adding {added} files, kept in the index "
                      "by the sync, as on an installed client", file=sys.stderr)
            rows, mcp = _search(config, args.searches)
        finally:
            server.stop()
        text_bytes = sum(p.stat().st_size for p in (config.parent / "cache").rglob("*.md"))
        first = statistics.median(r["seconds"] for r in firsts)
        nochange = statistics.median(r["seconds"] for r in nochanges)
        figures: list[tuple[str, str, str, bool]] = [
            ("first pull", f"{first:.2f} s",
             f"rsync -a {statistics.median(rsyncs):.2f} s; <= 2x",
             first <= 2 * statistics.median(rsyncs)),
            ("first pull: client / serve peak RSS",
             f"{max(r['client_mb'] for r in firsts):.0f} / "
             f"{max(r['serve_mb'] for r in firsts):.0f} MB", "<= 100 MB each",
             max(max(r["client_mb"], r["serve_mb"]) for r in firsts) <= 100),
            ("no-change sync", f"{nochange:.2f} s",
             f"rsync -a {statistics.median(rsync_nochanges):.2f} s; <= 1x",
             nochange <= statistics.median(rsync_nochanges)),
            ("no-change sync: client / serve peak RSS",
             f"{max(r['client_mb'] for r in nochanges):.0f} / "
             f"{max(r['serve_mb'] for r in nochanges):.0f} MB", "<= 100 MB each",
             max(max(r["client_mb"], r["serve_mb"]) for r in nochanges) <= 100),
        ]
        limit = 0.010 if totals["files"] <= 10_000 else 0.025
        for label, p50, p95, rg, once, cpu in rows:  # first of the runs: nothing remembered
            figures.append((f"search {label} p50/p95 (first)",
                            f"{p50 * 1e3:.1f} / {p95 * 1e3:.1f} ({once * 1e3:.1f}) ms",
                            f"rg -l {rg * 1e3:.0f} ms; cpu {cpu * 1e3:.1f} ms; "
                            f"p50 <= {limit * 1e3:.0f} ms",
                            p50 <= limit))
        if not args.no_index:
            figures.append(("search index covering the cache, from the first pull's start",
                            f"{statistics.median(r['ready'] for r in firsts):.2f} s",
                            "untimed above: the pull reports first", True))
        figures += [
            ("first search right after the sync", f"{mcp['first_search_after_sync_s'] * 1e3:.0f}"
             " ms", "", True),
            ("first search after the server starts",
             f"{mcp['first_search_after_start_s'] * 1e3:.0f} ms", "<= 150 ms",
             mcp["first_search_after_start_s"] <= 0.150),
            ("MCP RSS after 1,000 searches", f"{mcp['rss_after_1000_mb']:.0f} MB",
             f"<= {64 if totals['files'] <= 10_000 else 96} MB",
             mcp["rss_after_1000_mb"] <= (64 if totals["files"] <= 10_000 else 96)),
            ("search index size", f"{mcp['index_bytes'] / 1e6:.0f} MB",
             f"text {text_bytes / 1e6:.0f} MB; <= 1.0x", mcp["index_bytes"] <= text_bytes),
        ]
        width = [max(len(f[i]) for f in figures) for i in range(3)]
        print(f"{totals['files']} files from {args.machines} machines, "
              f"{totals['bytes'] / 1e6:.0f} MB; median of {args.runs} first pulls, "
              f"{3 * args.runs} no-change syncs")
        print(bench_index.PLAIN if args.no_index else bench_index.NOTE)
        for f in figures:
            print(" | ".join(c.ljust(w) for c, w in zip(f[:3], width, strict=True))
                  + (" | pass" if f[3] else " | FAIL"))
        print(CPU_NOTE)
        if args.json:
            print(json.dumps({"files": totals["files"], "bytes": totals["bytes"],
                              "machines": args.machines, "first": firsts,
                              "nochange": nochanges, "rsync_first": rsyncs,
                              "rsync_nochange": rsync_nochanges, "mcp": mcp,
                              "search": [{"shape": r[0], "p50_s": r[1], "p95_s": r[2],
                                          "rg_s": r[3], "first_s": r[4], "cpu_s": r[5]}
                                         for r in rows]},
                             indent=2))
        return 0 if all(f[3] for f in figures) else 1
    finally:
        if args.keep:
            _drop_publishers(work)
            print(f"kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `bench.py scale`."""
    parser.add_argument("--files", type=int, default=100_000,
                        help="files in the store, over all machines (default 100000)")
    parser.add_argument("--machines", type=int, default=8, help="publishing machines (default 8)")
    parser.add_argument("--runs", type=int, default=1,
                        help="first pulls by new clients, each followed by 3 no-change syncs")
    parser.add_argument("--searches", type=int, default=21, help="timed searches per shape")
    parser.add_argument("--dir", help="where to build (default: the system's temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the folder it built")
    parser.add_argument("--json", action="store_true", help="also print the figures as JSON")
    parser.add_argument("--reuse", metavar="DIR",
                        help="only the search phase, on the cache a `--keep` run left in DIR "
                        "(its first reader's; builds and syncs nothing)")
    parser.add_argument("--no-index", action="store_true",
                        help="a client with no search index (a plain first `sync`; by default "
                        "as installed: the first pull is `sync --index`, later syncs keep it)")
    parser.add_argument("--later", type=int, default=100, metavar="N",
                        help="before the searches, a later sync brings N new files spread "
                        "through the first machine's folders, as an installed client's index "
                        "has them (default 100; 0: search the index as the first pull built it)")
