"""`bench.py sync`: our sync against `rsync -a`, over the same real sshd on loopback, same corpus.

For each tool it measures the first sync, a no-change re-sync and a re-sync after changing 1% of
the files: the median wall time of several runs and the bytes each tool's protocol sent and
received (our channel's counters; rsync's --stats totals). Our client runs as installed, with
its search index (bench_index.py), unless `--no-index`; `--plain` times a client with no index
in the same runs too, so the index's share of each sync shows.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import re
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

import bench_index  # noqa: E402
import corpus  # noqa: E402
from loopback_sshd import LAUNCHER, Sshd, start_sshd  # noqa: E402

PHASES = ("first", "nochange", "changed1pct")


def _ssh_e(server: Sshd) -> str:
    return (f"ssh -p {server.port} -i {server.free_key} -o IdentitiesOnly=yes -o BatchMode=yes "
            f"-o StrictHostKeyChecking=yes -o UserKnownHostsFile={server.known_hosts} "
            "-o GlobalKnownHostsFile=/dev/null -o LogLevel=ERROR")


def _why(report: dict) -> str:
    """The error of a failed sync, or what made it partial (a quota: raise the limits)."""
    if report.get("error"):
        return str(report["error"])
    reasons: dict[str, int] = {}
    for source in report.get("sources", []):
        for item in source.get("skipped", []) + source.get("refused", []):
            reasons[item.get("reason", "?")] = reasons.get(item.get("reason", "?"), 0) + 1
    shown = ", ".join(f"{n} {r}" for r, n in sorted(reasons.items()))
    return f"{report.get('status')} ({shown or 'see its report'})"


# The limits a sync keeps by default (rules.Limits): a corpus past them is benchmarked with
# limits raised to fit it, on both ends (`corpus_limits`), as docs/CONFIGURATION.md says to.
DEFAULT_FILES, DEFAULT_BYTES = 20_000, 64 << 20


def corpus_limits(stats: dict[str, int]) -> tuple[dict[str, int], tuple[str, ...]]:
    """The client's `limits` and `serve`'s `--limit` settings for a corpus of `stats`.

    None of either for a corpus within half the defaults (the 10,000 files of the tables here);
    past them, room for the corpus and the appends of the 1% phases, twice over.
    """
    files, size = stats["files"], stats["bytes"]
    if files <= DEFAULT_FILES // 2 and size <= DEFAULT_BYTES // 2:
        return {}, ()
    client = {"namespace_files": max(DEFAULT_FILES, 2 * files),
              "namespace_bytes": max(DEFAULT_BYTES, 2 * size)}
    server = {**client, "machine_files": max(100_000, 2 * files),
              "machine_bytes": max(256 << 20, 2 * size)}
    return client, tuple(arg for name, value in server.items()
                         for arg in ("--limit", f"{name}={value}"))


def settle() -> None:
    """Let the disk write out what earlier phases left, so each timed phase starts alike.

    Whichever tool ran before would otherwise leave its writes to slow the next one.
    """
    if hasattr(os, "sync"):
        os.sync()


def _set_aside(server: Path, kept: Path) -> None:
    """Move the last run's store out of the way, once its server has closed it.

    A server ends after the client that ran it: it checkpoints and then removes its WAL.
    """
    deadline = time.monotonic() + 30
    while (server / "store.sqlite3-wal").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    kept.mkdir(parents=True)
    for path in server.glob("store.sqlite3*"):
        try:
            path.rename(kept / path.name)
        except FileNotFoundError:
            pass


def _change(root: Path, percent: float, round_no: int) -> int:
    files = sorted(root.rglob("*.md"))
    step = max(1, int(100 / percent))
    changed = 0
    for path in files[round_no % step::step]:
        with path.open("a", encoding="utf-8") as handle:
            handle.write(f"\nchanged in round {round_no}\n")
        changed += 1
    return changed


def _ours(work: Path, server: Sshd, source: Path, run: int,
          launcher: Path | None = None, index: bool = True,
          limits: dict[str, int] | None = None) -> dict[str, dict[str, float]]:
    """One run of our three phases; with `launcher`, that checkout's client and server.

    A comparison of two checkouts runs both with the unpinned key and an explicit remote
    command, each with a store of its own, so the only difference is the code. With `index`,
    as installed: the first sync builds the search index and the later ones keep it, and after
    each sync the run waits (untimed) until it covers the cache: `ready` is that time from the
    sync's start.
    """
    tag = "" if launcher is None else ("-b" if launcher != LAUNCHER else "-a")
    tag += "" if index else "-plain"
    cfg = work / f"client-{run}{tag}" / "client.json"
    cfg.parent.mkdir(parents=True)
    if launcher is None:
        transport = server.transport()
    else:
        store = work / f"server{tag}" / "store.sqlite3"
        transport = server.transport(pinned=False, remote_command=[
            sys.executable, "-S", str(launcher), "serve", "--store", str(store),
            *server.serve_args])
    cfg.write_text(json.dumps({
        "machine": "laptop", "transport": transport,
        "sources": [{"name": "corpus", "kind": "markdown", "path": str(source)}],
        "cache": str(cfg.parent / "cache"), "state": str(cfg.parent / "state"),
        **({"limits": limits} if limits else {})}))
    out: dict[str, dict[str, float]] = {}
    for phase in PHASES:
        if phase == "changed1pct":
            _change(source, 1.0, run)
        settle()
        wall, started = time.time(), time.perf_counter()
        proc = subprocess.run([sys.executable, "-S", str(launcher or LAUNCHER), "sync",
                               "--config", str(cfg), "--json",
                               *bench_index.sync_args(phase, index)],
                              capture_output=True, text=True)
        seconds = time.perf_counter() - started
        report = json.loads(proc.stdout)
        if proc.returncode != 0:
            raise SystemExit(f"sync failed in phase {phase}: {_why(report)}")
        out[phase] = {"seconds": seconds, "sent": report["bytes"]["sent"],
                      "received": report["bytes"]["received"]}
        if index:
            out[phase]["ready"] = bench_index.ready(launcher or LAUNCHER, cfg.parent / "cache",
                                                    wall)
    return out


def _rsync_stats(text: str) -> tuple[int, int]:
    sent = re.search(r"Total bytes sent: ([\d,]+)", text)
    received = re.search(r"Total bytes received: ([\d,]+)", text)
    if not sent or not received:
        raise SystemExit(f"cannot read rsync --stats output:\n{text[-800:]}")
    return int(sent.group(1).replace(",", "")), int(received.group(1).replace(",", ""))


def _rsync(work: Path, server: Sshd, source: Path, run: int) -> dict[str, dict[str, float]]:
    dest = work / f"rsync-dest-{run}"
    out: dict[str, dict[str, float]] = {}
    for phase in PHASES:
        if phase == "changed1pct":
            _change(source, 1.0, run + 1000)
        settle()
        started = time.perf_counter()
        proc = subprocess.run(["rsync", "-a", "--stats", "-e", _ssh_e(server), f"{source}/",
                               f"{server.user}@127.0.0.1:{dest}/"], capture_output=True, text=True)
        seconds = time.perf_counter() - started
        if proc.returncode != 0:
            raise SystemExit(f"rsync failed: {proc.stderr[-800:]}")
        sent, received = _rsync_stats(proc.stdout)
        out[phase] = {"seconds": seconds, "sent": sent, "received": received}
    return out


def _median(runs: list[dict[str, dict[str, float]]], phase: str, key: str) -> float:
    return statistics.median(r[phase][key] for r in runs)


def compiled(launcher: Path) -> None:
    """Compile the package beside `launcher` as an install does (install/prefix.py).

    With PYTHONDONTWRITEBYTECODE set (as on many CI machines) every process timed here would
    otherwise compile each module again: 100 ms or more a process on a clean checkout.
    """
    compileall.compile_dir(str(launcher.parent / "sharedmem"), quiet=1)


def main(args: argparse.Namespace | None = None) -> int:
    """Run the comparison and print a table (and JSON with --json)."""
    files = getattr(args, "files", None) or 10_000
    runs = getattr(args, "runs", None) or 3
    as_json = bool(getattr(args, "json", False))
    index = not getattr(args, "no_index", False)
    plain = bool(getattr(args, "plain", False)) and index
    baseline = getattr(args, "baseline", None)
    baseline = Path(baseline).resolve() / "shared_memory.py" if baseline else None
    if baseline is not None and not baseline.is_file():
        raise SystemExit(f"--baseline: {baseline} does not exist: name a checkout of this project")
    if shutil.which("rsync") is None:
        raise SystemExit("rsync is not installed: apt-get install -y rsync")
    for launcher in (LAUNCHER, baseline):
        if launcher is not None:
            compiled(launcher)
    work = Path(tempfile.mkdtemp(prefix="sharedmem-bench-sync-", dir=getattr(args, "dir", None)))
    try:
        source = work / "corpus"
        stats = corpus.make(source, files, getattr(args, "corpus", None),
                            getattr(args, "style", None) or "prose")
        print(corpus.describe(stats), file=sys.stderr)
        limits, serve_args = corpus_limits(stats)
        server = start_sshd(work / "sshd", work / "server" / "store.sqlite3",
                            serve_args=serve_args)
        ours: list[dict[str, dict[str, float]]] = []
        theirs: list[dict[str, dict[str, float]]] = []
        base: list[dict[str, dict[str, float]]] = []
        bare: list[dict[str, dict[str, float]]] = []  # --plain: the same client, no index
        tools = ("sharedmem", "rsync") + (("baseline",) if baseline is not None else ()) + (
            ("plain",) if plain else ())
        # Two clients of ours compared run each with a store of its own (see `_ours`).
        explicit = baseline if baseline is not None else (LAUNCHER if plain else None)
        try:
            for run in range(runs):
                # Moved aside, not deleted: freeing 60 MB just before a timed first sync would
                # slow it (this disk discards freed blocks), and rsync's copies stay too.
                for folder in ("server", "server-a", "server-b", "server-a-plain"):
                    _set_aside(work / folder, work / "old-stores" / f"{run}{folder}")
                # The tools take turns going first, so none always runs after another.
                order = tools[run % len(tools):] + tools[:run % len(tools)]
                for name in order if run % 2 == 0 else order[::-1]:
                    print(f"run {run + 1}/{runs}: {name}", file=sys.stderr)
                    if name == "sharedmem":
                        ours.append(_ours(work, server, source, run,
                                          None if explicit is None else LAUNCHER, index, limits))
                    elif name == "baseline":
                        base.append(_ours(work, server, source, run, baseline, index, limits))
                    elif name == "plain":
                        bare.append(_ours(work, server, source, run, LAUNCHER, False, limits))
                    else:
                        theirs.append(_rsync(work, server, source, run))
        finally:
            server.stop()
        rows = []
        for phase in PHASES:
            row: dict[str, Any] = {"phase": phase}
            for name, data in (("sharedmem", ours), ("rsync", theirs), ("baseline", base),
                               ("plain", bare)):
                if not data:
                    continue
                row[name] = {"seconds": round(_median(data, phase, "seconds"), 3),
                             "bytes": int(_median(data, phase, "sent")
                                          + _median(data, phase, "received"))}
                if "ready" in data[0][phase]:
                    row[name]["index_ready"] = round(_median(data, phase, "ready"), 3)
            limit = 1.5 if phase == "first" else 1.0
            row["time_ratio"] = round(row["sharedmem"]["seconds"] / row["rsync"]["seconds"], 2)
            row["bytes_ratio"] = round(row["sharedmem"]["bytes"] / max(1, row["rsync"]["bytes"]), 3)
            row["target"] = f"time <= {limit}x rsync" + ("" if phase == "first" else
                                                          ", bytes <= rsync")
            row["pass"] = row["time_ratio"] <= limit and (phase == "first"
                                                           or row["bytes_ratio"] <= 1.0)
            if base:
                row["vs_baseline"] = round(row["sharedmem"]["seconds"]
                                           / row["baseline"]["seconds"], 3)
            if bare:  # the index's share of the sync: what it adds to a plain client's time
                row["index_share"] = round(1 - row["plain"]["seconds"]
                                           / row["sharedmem"]["seconds"], 3)
            rows.append(row)
        print(bench_index.NOTE if index else bench_index.PLAIN)
        print(f"{'phase':<12} {'sharedmem s':>12} {'rsync s':>9} {'ratio':>6} "
              f"{'sharedmem B':>13} {'rsync B':>11} {'ratio':>6}  target")
        for r in rows:
            print(f"{r['phase']:<12} {r['sharedmem']['seconds']:>12.3f} "
                  f"{r['rsync']['seconds']:>9.3f} {r['time_ratio']:>6.2f} "
                  f"{r['sharedmem']['bytes']:>13,} {r['rsync']['bytes']:>11,} "
                  f"{r['bytes_ratio']:>6.3f}  {r['target']}: {'PASS' if r['pass'] else 'FAIL'}")
        if index:
            print("\nsearch index covering the cache, from the sync's start (untimed above):")
            for r in rows:
                print(f"{r['phase']:<12} {r['sharedmem']['index_ready']:>12.3f}"
                      + (f"   plain client {r['plain']['seconds']:.3f} s: the index's share "
                         f"of the sync {100 * r['index_share']:.0f}% (target <= 33%)"
                         if bare else ""))
        if baseline is not None:
            print(f"\nagainst the baseline {baseline.parent} (same runs, interleaved):")
            for r in rows:
                print(f"{r['phase']:<12} {r['sharedmem']['seconds']:>12.3f} "
                      f"{r['baseline']['seconds']:>9.3f} {r['vs_baseline']:>6.3f}")
        if as_json:
            print(json.dumps({"corpus": stats, "runs": runs, "rows": rows}, indent=2))
        return 0 if all(r["pass"] for r in rows) else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--corpus", help=corpus.COPY_HELP)
    parser.add_argument("--style", choices=corpus.STYLES, default="prose", help=corpus.STYLE_HELP)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--dir", help="where to put the corpus, the store and the copies")
    parser.add_argument("--baseline", help="another checkout to time beside this one")
    parser.add_argument("--no-index", action="store_true", help="a plain client with no search "
                        "index (by default as installed: the first sync builds it)")
    parser.add_argument("--plain", action="store_true", help="also time a plain client (no "
                        "index) in the same runs, for the index's share of each sync")
    sys.exit(main(parser.parse_args()))
