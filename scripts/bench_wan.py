"""`bench.py wan`: our sync against `rsync -a` and `rsync -az` over a simulated slow link.

The same real sshd on loopback as `bench.py sync`, reached through `wan_relay.py` as ssh's
`ProxyCommand` by every tool, so each pays the same one-way delay and bandwidth cap in each
direction. Ours runs as the installer sets it up (pinned key, forced command, ssh connection
reuse, `--no-ssh-reuse` to time it without; its search index, `--no-index` to time it without:
see bench_index.py); rsync opens a connection per run, as it is used.
For each link and tool: the first sync, a no-change re-sync and a re-sync after appending to 1%
of the files, the tools taking turns going first; medians of the wall time, the bytes on the
link each way (ssh included) and the round trips the relay counted.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import bench_index  # noqa: E402
import bench_sync  # noqa: E402
import corpus  # noqa: E402
import wan_relay  # noqa: E402
from loopback_sshd import LAUNCHER, Sshd, start_sshd  # noqa: E402

from sharedmem.client import config as config_mod  # noqa: E402
from sharedmem.install import ssh_reuse  # noqa: E402

RELAY = HERE / "wan_relay.py"
PROFILES = {"40ms": (40.0, 20.0), "150ms": (150.0, 5.0)}  # RTT in ms, Mbit/s each way
TOOLS = ("sharedmem", "rsync -a", "rsync -az")
PHASES = bench_sync.PHASES
TARGETS = {"first": 1.0, "nochange": 0.3, "changed1pct": 0.3}  # ours / rsync -az, at most


def link(text: str) -> tuple[str, float, float]:
    """A `--link` value: a profile's name, or RTT_MS/MBIT (MBIT 0: no cap)."""
    if text in PROFILES:
        return (text, *PROFILES[text])
    try:
        rtt, mbit = (float(part) for part in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: use {' or '.join(PROFILES)}, or RTT_MS/MBIT "
                                         "such as 80/10") from None
    if rtt < 0 or mbit < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: the round trip and the rate are >= 0")
    return (text, rtt, mbit)


def proxy_command(rtt_ms: float, mbit: float, log: Path) -> str:
    """The ProxyCommand that puts the relay between ssh and sshd, logging into `log`."""
    for path in (sys.executable, RELAY, log):
        if any(c.isspace() or c in "'\"\\%" for c in str(path)):
            raise SystemExit(f"{path}: a path with spaces, quotes or % cannot go into a "
                             "ProxyCommand here; use --dir with a plain path")
    return (f"{sys.executable} -S {RELAY} --rtt-ms {rtt_ms:g} --mbit {mbit:g} --log {log} "
            "%h %p")


def _ours(work: Path, server: Sshd, source: Path, run: int, proxy: str, sockets: Path | None,
          log: Path, limits: dict[str, int], index: bool) -> dict[str, dict[str, float]]:
    """One run of our three phases; the connection the first opens is closed at the end.

    With `index`, as installed; after each sync the run waits (untimed) until the search index
    covers the cache: `ready` is that time from the sync's start.
    """
    cfg = work / f"client-{run}" / "client.json"
    cfg.parent.mkdir(parents=True)
    transport = server.transport()
    transport["options"] += [f"ProxyCommand={proxy}"]
    if sockets is not None:
        folder = sockets / str(run)
        ssh_reuse.prepare(folder)
        transport["options"] += ssh_reuse.options(folder)
    cfg.write_text(json.dumps({
        "machine": "laptop", "transport": transport,
        "sources": [{"name": "corpus", "kind": "markdown", "path": str(source)}],
        "cache": str(cfg.parent / "cache"), "state": str(cfg.parent / "state"),
        **({"limits": limits} if limits else {})}))
    out: dict[str, dict[str, float]] = {}
    try:
        for phase in PHASES:
            if phase == "changed1pct":
                bench_sync._change(source, 1.0, run)
            bench_sync.settle()
            wall, started = time.time(), time.monotonic()
            proc = subprocess.run([sys.executable, "-S", str(LAUNCHER), "sync", "--config",
                                   str(cfg), "--json", *bench_index.sync_args(phase, index)],
                                  capture_output=True, text=True)
            ended = time.monotonic()
            report = json.loads(proc.stdout or "{}")
            if proc.returncode != 0:
                raise SystemExit(f"sync failed in phase {phase}: {bench_sync._why(report)} "
                                 f"{proc.stderr[-400:]}")
            out[phase] = {"seconds": ended - started, "sent": report["bytes"]["sent"],
                          "received": report["bytes"]["received"],
                          **_wire(log, started, ended)}
            if index:
                out[phase]["ready"] = bench_index.ready(LAUNCHER, cfg.parent / "cache", wall)
    finally:
        if sockets is not None:
            ssh_reuse.stop(config_mod.load(cfg).transport)
    return out


def _rsync(work: Path, server: Sshd, source: Path, run: int, compress: bool, proxy: str,
           log: Path) -> dict[str, dict[str, float]]:
    dest = work / f"rsync-{'az' if compress else 'a'}-dest-{run}"
    ssh = f'{bench_sync._ssh_e(server)} -o "ProxyCommand={proxy}"'
    out: dict[str, dict[str, float]] = {}
    for phase in PHASES:
        if phase == "changed1pct":
            bench_sync._change(source, 1.0, run + (2000 if compress else 1000))
        bench_sync.settle()
        started = time.monotonic()
        proc = subprocess.run(["rsync", "-az" if compress else "-a", "--stats", "-e", ssh,
                               f"{source}/", f"{server.user}@127.0.0.1:{dest}/"],
                              capture_output=True, text=True)
        ended = time.monotonic()
        if proc.returncode != 0:
            raise SystemExit(f"rsync failed: {proc.stderr[-800:]}")
        sent, received = bench_sync._rsync_stats(proc.stdout)
        out[phase] = {"seconds": ended - started, "sent": sent, "received": received,
                      **_wire(log, started, ended)}
    return out


def _wire(log: Path, started: float, ended: float) -> dict[str, float]:
    """What the relay saw between two instants: bytes up and down, round trips, connections."""
    seen = wan_relay.summarize(log, started, ended)
    return {"up": seen["up"], "down": seen["down"], "round_trips": seen["round_trips"],
            "connects": seen["connects"]}


def _rows(results: dict[str, list[dict[str, dict[str, float]]]]) -> list[dict[str, Any]]:
    rows = []
    for phase in PHASES:
        row: dict[str, Any] = {"phase": phase}
        for tool in TOOLS:
            runs = results[tool]
            row[tool] = {key: round(statistics.median(r[phase][key] for r in runs), 3)
                         for key in ("seconds", "up", "down", "round_trips", "connects",
                                     "sent", "received")}
        ratio = row["sharedmem"]["seconds"] / row["rsync -az"]["seconds"]
        row["ratio"] = round(ratio, 2)
        row["target"] = TARGETS[phase]
        row["pass"] = ratio <= TARGETS[phase]
        if "ready" in results["sharedmem"][0][phase]:
            row["index_ready"] = round(statistics.median(
                r[phase]["ready"] for r in results["sharedmem"]), 3)
        rows.append(row)
    return rows


def _megabytes(n: float) -> str:
    return f"{n / 1e6:.2f} MB" if n >= 100_000 else f"{n / 1e3:.1f} kB"


def _print(name: str, rtt: float, mbit: float, rows: list[dict[str, Any]], stats: dict,
           runs: int, reuse: bool) -> None:
    cap = f"{mbit:g} Mbit/s" if mbit else "no cap"
    print(f"\nlink {name}: {rtt:g} ms RTT, {cap} each way ({stats['files']} files, "
          f"{stats['bytes'] / 1e6:.1f} MB; median of {runs}; ours with"
          f"{'' if reuse else 'out'} ssh connection reuse)")
    print(bench_index.NOTE if "index_ready" in rows[0] else bench_index.PLAIN)
    print(f"{'phase':<12}" + "".join(f"{t:>12}" for t in TOOLS) + f"{'ours/-az':>10}  target")
    for r in rows:
        print(f"{r['phase']:<12}" + "".join(f"{r[t]['seconds']:>10.2f} s" for t in TOOLS)
              + f"{r['ratio']:>9.2f}x  <= {r['target']}x -az: {'PASS' if r['pass'] else 'FAIL'}"
              + (f"  (index ready {r['index_ready']:.2f} s)" if "index_ready" in r else ""))
    print("bytes up / down on the link, ssh included (round trips)")
    print(f"{'phase':<12}" + "".join(f"{t:>30}" for t in TOOLS))
    for r in rows:
        cells = [f"{_megabytes(r[t]['up'])} / {_megabytes(r[t]['down'])} "
                 f"({r[t]['round_trips']:g})" for t in TOOLS]
        print(f"{r['phase']:<12}" + "".join(f"{c:>30}" for c in cells))


def main(args: argparse.Namespace) -> int:
    """Run every link's comparison; print the tables (and JSON with --json)."""
    links = args.link or [link(n) for n in PROFILES]
    reuse = not args.no_ssh_reuse
    if shutil.which("rsync") is None:
        raise SystemExit("rsync is not installed: apt-get install -y rsync")
    bench_sync.compiled(LAUNCHER)
    work = Path(tempfile.mkdtemp(prefix="sharedmem-bench-wan-", dir=args.dir))
    sockets = Path(tempfile.mkdtemp(prefix="smw-", dir="/tmp")) if reuse else None
    report: dict[str, Any] = {"runs": args.runs, "ssh_reuse": reuse, "links": []}
    passed = True
    try:
        source = work / "corpus"
        stats = corpus.make(source, args.files, args.corpus, args.style)
        report["corpus"] = stats
        print(corpus.describe(stats), file=sys.stderr)
        limits, serve_args = bench_sync.corpus_limits(stats)
        server = start_sshd(work / "sshd", work / "server" / "store.sqlite3",
                            serve_args=serve_args)
        try:
            for name, rtt, mbit in links:
                slug = name.replace("/", "-")
                (work / slug).mkdir()
                results: dict[str, list[dict[str, dict[str, float]]]] = {t: [] for t in TOOLS}
                for run in range(args.runs):
                    bench_sync._set_aside(work / "server", work / "old-stores" / f"{slug}-{run}")
                    order = TOOLS[run % len(TOOLS):] + TOOLS[:run % len(TOOLS)]
                    for tool in order if run % 2 == 0 else order[::-1]:
                        print(f"link {name}, run {run + 1}/{args.runs}: {tool}", file=sys.stderr)
                        log = work / "relay" / f"{slug}-{run}-{tool.replace(' ', '')}.log"
                        log.parent.mkdir(exist_ok=True)
                        proxy = proxy_command(rtt, mbit, log)
                        if tool == "sharedmem":
                            data = _ours(work / slug, server, source, run, proxy,
                                         None if sockets is None else sockets / slug, log,
                                         limits, not args.no_index)
                        else:
                            data = _rsync(work / slug, server, source, run, tool == "rsync -az",
                                          proxy, log)
                        results[tool].append(data)
                rows = _rows(results)
                passed = passed and all(r["pass"] for r in rows)
                _print(name, rtt, mbit, rows, stats, args.runs, reuse)
                report["links"].append({"link": name, "rtt_ms": rtt, "mbit": mbit, "rows": rows})
        finally:
            server.stop()
        if args.json:
            print(json.dumps(report, indent=2))
        return 0 if passed else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if sockets is not None:
            shutil.rmtree(sockets, ignore_errors=True)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `bench.py wan`."""
    parser.add_argument("--files", type=int, default=10_000, help="corpus size (default 10000)")
    parser.add_argument("--corpus", metavar="FOLDER", help=corpus.COPY_HELP)
    parser.add_argument("--style", choices=corpus.STYLES, default="prose", help=corpus.STYLE_HELP)
    parser.add_argument("--runs", type=int, default=3, help="repetitions (default 3)")
    parser.add_argument("--link", type=link, action="append",
                        help="40ms (40 ms RTT, 20 Mbit/s), 150ms (150 ms RTT, 5 Mbit/s), or "
                             "RTT_MS/MBIT; repeatable (default: 40ms and 150ms)")
    parser.add_argument("--no-ssh-reuse", action="store_true",
                        help="time our sync without ssh connection reuse (each sync "
                             "connects anew, as rsync does)")
    parser.add_argument("--no-index", action="store_true",
                        help="our client with no search index (by default as installed: its "
                             "first sync builds it, later ones keep it)")
    parser.add_argument("--dir", help="where to put the corpus, the store, the cache and "
                                      "rsync's copies (default: the system's temporary folder)")
    parser.add_argument("--json", action="store_true", help="also print the figures as JSON")


if __name__ == "__main__":
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(cli)
    sys.exit(main(cli.parse_args()))
