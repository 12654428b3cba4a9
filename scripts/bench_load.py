"""`bench.py load`: N machines on one store, as a team's server sees them.

For each number of machines and each transport (local stdio, and ssh through the loopback sshd
of scripts/loopback_sshd.py), a fresh store takes:

- a burst: every machine's first sync started at once (a team's morning, or schedules that
  all fire together);
- a steady schedule: each machine then syncs once a period at its own offset in it, one file
  of it changed each time, for a few periods.

The clients run on the same machine as the server, so they take its CPU from it. It prints,
for each: the sessions that succeeded and failed (with the failures' last lines counted), the
session time (the client's `sync`, start to exit) at the median, p95 and most, the CPU the
server's processes (`serve`) used in all, their peak RSS (the largest one, and all of them at
once), the largest size of the store's write-ahead log, and the store's size. The server's
processes are found and read in /proc every 10 ms (Linux), so a process's last 10 ms of CPU
may be missed. The machine's CPU is shared with whatever else runs on it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import corpus  # noqa: E402
from loopback_sshd import LAUNCHER, SERVE, SshdUnavailable, start_sshd  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `bench.py load`."""
    parser.add_argument("--machines", default="20,50,100",
                        help="numbers of machines, comma-separated (default 20,50,100)")
    parser.add_argument("--files", type=int, default=60,
                        help="Markdown files each machine publishes (default 60, about 170 kB)")
    parser.add_argument("--transports", default="local,ssh",
                        help="local (stdio), ssh (the loopback sshd), or both (default)")
    parser.add_argument("--period", type=float, default=120.0,
                        help="seconds of one period of the steady schedule (default 120, the "
                             "installed schedule's)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="periods of the steady schedule (default 1; 0 leaves it out)")
    parser.add_argument("--limit", action="append", default=[], metavar="NAME=VALUE",
                        help="a serve --limit setting for every session (repeatable)")
    parser.add_argument("--dir", help="where to put the stores, sources and caches "
                                      "(default: the system's temporary folder)")
    parser.add_argument("--json", action="store_true", help="also print the figures as JSON")


class ServerWatch:
    """The store's `serve` processes and its write-ahead log, read every 10 ms on a thread."""

    def __init__(self, store: Path) -> None:
        self.store = store
        self.wal = Path(f"{store}-wal")
        self.cpu: dict[int, float] = {}  # pid -> CPU seconds, as last read
        self.peak: dict[int, int] = {}  # pid -> its peak RSS (VmHWM), KiB
        self.together = 0  # the most RSS of all of them at one reading, KiB
        self.most = 0  # the most of them running at one reading
        self.wal_peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> ServerWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        needle = f"{self.store}".encode()
        while not self._stop.is_set():
            rss = running = 0
            for name in os.listdir("/proc"):
                if not name.isdigit():
                    continue
                try:
                    argv = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")
                    if b"serve" not in argv or not any(needle == a for a in argv):
                        continue
                    stat = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
                    status = Path(f"/proc/{name}/status").read_text()
                except OSError:
                    continue
                pid = int(name)
                self.cpu[pid] = (int(stat[11]) + int(stat[12])) / TICK
                fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
                now = int(fields.get("VmRSS", "0 kB").split()[0])
                self.peak[pid] = max(self.peak.get(pid, 0),
                                     int(fields.get("VmHWM", "0 kB").split()[0]), now)
                rss += now
                running += 1
            self.together = max(self.together, rss)
            self.most = max(self.most, running)
            try:
                self.wal_peak = max(self.wal_peak, self.wal.stat().st_size)
            except OSError:
                pass
            self._stop.wait(0.01)


class Machines:
    """N machines' sources, configurations and caches, all on one store."""

    def __init__(self, work: Path, store: Path, count: int, files: int,
                 transport: dict | None) -> None:
        self.configs: list[Path] = []
        self.sources: list[Path] = []
        for m in range(count):
            name = f"m{m:03d}"
            src = work / "sources" / name
            corpus.generate(src, files, seed=m + 1)
            config = work / "clients" / name / "client.json"
            config.parent.mkdir(parents=True)
            config.write_text(json.dumps({
                "machine": name,
                "transport": transport or {"kind": "local", "store": str(store)},
                "sources": [{"name": "notes", "kind": "markdown", "path": str(src)}],
                "cache": str(config.parent / "cache"), "state": str(config.parent / "state")}))
            self.configs.append(config)
            self.sources.append(src)

    def change_one(self, m: int, round_no: int) -> None:
        """Append a line to one file of machine `m`: a steady schedule's usual change."""
        target = sorted(self.sources[m].rglob("*.md"))[round_no % 7]
        with open(target, "a", encoding="utf-8") as handle:
            handle.write(f"\n- round {round_no}: one more line\n")


class Sessions:
    """Syncs started as scheduled: each one's time and outcome."""

    def __init__(self, env: dict[str, str], store: Path) -> None:
        self.env = env
        self.store = store
        self.times: list[float] = []
        self.failures: dict[str, int] = {}
        self.partial = 0
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def start(self, config: Path, delay: float = 0.0) -> None:
        """Start one sync after `delay` seconds, on a thread of its own."""
        thread = threading.Thread(target=self._run, args=(config, delay), daemon=True)
        thread.start()
        self._threads.append(thread)

    def wait(self) -> None:
        """Wait for every sync started."""
        for thread in self._threads:
            thread.join()
        self._threads = []

    def _run(self, config: Path, delay: float) -> None:
        time.sleep(delay)
        started = time.perf_counter()
        proc = subprocess.run([sys.executable, "-S", str(LAUNCHER), "sync", "--config",
                               str(config)], capture_output=True, text=True, env=self.env)
        seconds = time.perf_counter() - started
        with self._lock:
            self.times.append(seconds)
            if proc.returncode == 1:
                self.partial += 1
            elif proc.returncode != 0:
                said = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
                said = said.replace(str(config.parent), "CLIENT")
                said = said.replace(str(self.store), "STORE")[:200]
                self.failures[said] = self.failures.get(said, 0) + 1


def _pct(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))] if ordered else 0.0


def _phase(label: str, machines: Machines, store: Path, env: dict[str, str],
           schedule: list[tuple[int, float]]) -> dict:
    """Run the syncs of `schedule` ((machine, delay)), watching the server; their figures."""
    sessions = Sessions(env, store)
    with ServerWatch(store) as watch:
        started = time.perf_counter()
        for m, delay in schedule:
            sessions.start(machines.configs[m], delay)
        sessions.wait()
        took = time.perf_counter() - started
    times = sessions.times
    return {"phase": label, "sessions": len(times), "ok": len(times) - sum(
        sessions.failures.values()) - sessions.partial, "partial": sessions.partial,
        "failed": sum(sessions.failures.values()), "failures": sessions.failures,
        "session_p50_s": statistics.median(times), "session_p95_s": _pct(times, 0.95),
        "session_max_s": max(times), "wall_s": took,
        "server_cpu_s": sum(watch.cpu.values()),
        "serve_peak_mib": max(watch.peak.values(), default=0) / 1024,
        "serve_together_mib": watch.together / 1024, "serve_most": watch.most,
        "wal_peak_mib": watch.wal_peak / 2**20,
        "store_mib": store.stat().st_size / 2**20 if store.exists() else 0.0}


def _one(work: Path, count: int, kind: str, args: argparse.Namespace) -> list[dict]:
    """A fresh store and `count` machines over `kind`: the burst, then the steady schedule."""
    store = work / "server" / "store.sqlite3"
    store.parent.mkdir(parents=True)
    limits = [arg for setting in args.limit for arg in ("--limit", setting)]
    sshd = None
    transport = None
    if kind == "ssh":
        sshd = start_sshd(work / "sshd", store)
        transport = sshd.transport(pinned=False, remote_command=[
            *SERVE, "--store", str(store), *limits])
    elif limits:
        raise SystemExit("--limit needs the ssh transport (a local client starts serve itself)")
    env = {**os.environ, "HOME": str(work / "home")}
    try:
        machines = Machines(work, store, count, args.files, transport)
        rows = [_phase("burst", machines, store, env, [(m, 0.0) for m in range(count)])]
        rng = random.Random(count)
        offsets = [rng.uniform(0, args.period) for _ in range(count)]
        schedule = []
        for round_no in range(args.rounds):
            for m in range(count):
                machines.change_one(m, round_no)
            schedule += [(m, round_no * args.period + offsets[m]) for m in range(count)]
        if schedule:
            rows.append(_phase(f"steady ({args.rounds} x {args.period:.0f} s)", machines, store,
                               env, schedule))
    finally:
        if sshd is not None:
            sshd.stop()
    for row in rows:
        row.update(machines=count, transport=kind)
    return rows


def _print(rows: list[dict]) -> None:
    print("| machines | transport | phase | ok / partial / failed | session p50 / p95 / max "
          "| server CPU | serve peak RSS: one / all at once (most running) | WAL peak | store |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['machines']} | {r['transport']} | {r['phase']} | {r['ok']} / {r['partial']}"
              f" / {r['failed']} | {r['session_p50_s']:.2f} / {r['session_p95_s']:.2f} / "
              f"{r['session_max_s']:.2f} s | {r['server_cpu_s']:.1f} s | "
              f"{r['serve_peak_mib']:.0f} / {r['serve_together_mib']:.0f} MiB "
              f"({r['serve_most']}) | {r['wal_peak_mib']:.1f} MiB | {r['store_mib']:.1f} MiB |")
    for r in rows:
        for said, times in sorted(r["failures"].items(), key=lambda item: -item[1]):
            print(f"  {r['machines']} {r['transport']} {r['phase']}: {times} x {said}")


def run(args: argparse.Namespace) -> int:
    """Every number of machines over every transport; the table, and JSON with --json."""
    if not Path("/proc/self/stat").exists():
        raise SystemExit("bench.py load reads the server's processes in /proc: Linux only")
    counts = [int(n) for n in args.machines.split(",") if n.strip()]
    kinds = [k.strip() for k in args.transports.split(",") if k.strip()]
    rows: list[dict] = []
    for count in counts:
        for kind in kinds:
            work = Path(tempfile.mkdtemp(prefix=f"sharedmem-bench-load-{count}-{kind}-",
                                         dir=args.dir))
            try:
                print(f"{count} machines over {kind} ...", file=sys.stderr)
                rows += _one(work, count, kind, args)
            except SshdUnavailable as exc:
                print(f"  skipped: {exc}", file=sys.stderr)
            finally:
                shutil.rmtree(work, ignore_errors=True)
    _print(rows)
    if args.json:
        print(json.dumps(rows, indent=2))
    return 0
