#!/usr/bin/env python3
"""Maintainer benchmarks: `bench.py mcp` (the MCP server), `sync` (the sync exchange), `wan`
(the sync over a slow link), `scale`, `load` (many machines on one store)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    import bench_mcp
    bench_mcp.add_arguments(sub.add_parser("mcp", help="cold start, read and search latency, "
                                                       "memory of the MCP server"))
    import corpus
    sync = sub.add_parser("sync", help="the sync benchmark (scripts/bench_sync.py)")
    sync.add_argument("--files", type=int, default=10_000, help="corpus size (default 10000)")
    sync.add_argument("--corpus", metavar="FOLDER", help=corpus.COPY_HELP)
    sync.add_argument("--style", choices=corpus.STYLES, default="prose", help=corpus.STYLE_HELP)
    sync.add_argument("--runs", type=int, default=3, help="repetitions (default 3)")
    sync.add_argument("--json", action="store_true", help="also print the figures as JSON")
    sync.add_argument("--dir", help="where to put the corpus, the store, the cache and rsync's "
                                    "copy (default: the system's temporary folder); /dev/shm "
                                    "takes the disk out of the comparison")
    sync.add_argument("--baseline", metavar="CHECKOUT",
                      help="another checkout of this project (say, one without a speed trick) "
                           "timed in the same runs, interleaved, with the same key and corpus")
    sync.add_argument("--no-index", action="store_true",
                      help="a plain client with no search index (by default the client runs as "
                           "installed: its first sync builds the index, later ones keep it)")
    sync.add_argument("--plain", action="store_true",
                      help="also time a plain client (no index) in the same runs, to show the "
                           "index's share of each sync")
    import bench_wan
    bench_wan.add_arguments(sub.add_parser(
        "wan", help="our sync against rsync -a and rsync -az over a simulated slow link "
                    "(scripts/bench_wan.py, scripts/wan_relay.py)"))
    import bench_scale
    bench_scale.add_arguments(sub.add_parser(
        "scale", help="a store of several machines: a new client's first pull, no-change "
                      "syncs, search and memory (scripts/bench_scale.py)"))
    import bench_load
    bench_load.add_arguments(sub.add_parser(
        "load", help="N machines on one store: a burst of first syncs, then a steady schedule, "
                     "over local stdio and ssh (scripts/bench_load.py)"))
    args = parser.parse_args(argv)
    if args.command == "mcp":
        return bench_mcp.main(args)
    if args.command == "scale":
        return bench_scale.run(args)
    if args.command == "wan":
        return bench_wan.main(args)
    if args.command == "load":
        return bench_load.run(args)
    import bench_sync
    return bench_sync.main(args)


if __name__ == "__main__":
    sys.exit(main())
