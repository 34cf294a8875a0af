#!/usr/bin/env python3
"""The applications in actions/ end to end on a real scad-server, each with its intermediate state
in memory elements and, through the same code, in Redis (Debian's redis-server started here, the
redis client from the package registry), at two data sizes each; and the width of a fan-out.

For every application, size and storage: the invocation's wall time (client side, a blocking
invoke) and the time its stages spent moving state (the sum over stages and instances of the
seconds inside scad.state's put/get, which the applications return). Medians of --runs runs after
one warm-up run, the two storages taking turns; each run's state is gone before the next starts
(the memory elements end with their activation; Redis is flushed after its run, untimed).
Ratios: Redis' time over ours (above 1: memory elements are faster). Targets: data movement >= 5x
faster, and >= 2x end to end for the data-heavy applications (sort, query).

Width: a fan-out of 8, 128 and 512 trivial Python instances (a platform with --quotas
instances=1024), 9 runs each after a warm-up (or --runs, if more); the per-instance cost is the
invocation's wall time over the width; and
scad-server's peak threads and resident memory meanwhile.

Charts (matplotlib): docs/img/apps-breakdown.png (movement and the rest, per application, size and
storage) and docs/img/apps-width.png (per-instance cost against width).

    bench/apps.py [--runs 5] [--quick] [--no-width] [--no-charts] [--largest] [--apps sort,query,...]
"""
import argparse
import json
import pathlib
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "build" / "python"), str(ROOT / "bindings" / "python")]
from scadtest import Platform  # noqa: E402

# (application, parameters of the small and the large size)
SIZES = {
    "sort": ({"n": 4_000_000}, {"n": 32_000_000}),             # 32 MiB and 256 MiB of keys
    "query": ({"scale": 1}, {"scale": 8}),                     # 0.5M and 4M sales rows (16 and 128 MB)
    "logreg": ({"rows": 100_000, "epochs": 3}, {"rows": 400_000, "epochs": 3}),
    "elastic": ({"chunks": 32, "chunk_kib": 1024}, {"chunks": 256, "chunk_kib": 1024}),
}
QUICK = {"sort": ({"n": 1_000_000},), "query": ({"scale": 0.5},), "logreg": ({"rows": 20_000, "epochs": 2},),
         "elastic": ({"chunks": 16, "chunk_kib": 256},)}
DATA_HEAVY = ("sort", "query")
# --largest: the sort at the largest size its manifest takes, 1 GiB of keys; 2 runs (30 s each here).
LARGEST = {"n": 134_217_728}
LARGEST_RUNS = 2
WIDTHS = (8, 128, 512)
WIDTH_RUNS = 9  # runs of each width (after a warm-up one)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Redis:
    def __init__(self, folder):
        self.port = free_port()
        self.proc = subprocess.Popen([shutil.which("redis-server") or "redis-server", "--port", str(self.port),
                                      "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                                      "--proto-max-bulk-len", "1gb", "--dir", str(folder)],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in self.proc.stdout:
            if "Ready to accept connections" in line:
                break
        else:
            raise RuntimeError("redis-server did not start")
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def flush(self):
        subprocess.run(["redis-cli", "-p", str(self.port), "FLUSHALL"], check=True, capture_output=True)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(30)


def invoke(p, name, params):
    t0 = time.perf_counter()
    status, rec = p.invoke(name, params)
    wall = time.perf_counter() - t0
    if status != 200 or rec["response"]["status"] != "success":
        raise RuntimeError(f"{name} {params}: {rec['response']}")
    return wall, rec["response"]["result"]


def measure_app(p, redis, name, params, runs):
    """{storage: {"wall": [...], "moving": [...], "result": last result}}"""
    out = {storage: {"wall": [], "moving": [], "result": None} for storage in ("memory", "redis")}
    # The two storages take turns, so that whatever else the machine does meanwhile falls on both.
    for r in range(runs + 1):  # the first warms the processes
        for storage, got in out.items():
            extra = {} if storage == "memory" else {"storage": "redis", "redis": redis.url}
            wall, got["result"] = invoke(p, name, dict(params, **extra, run=f"{name}-{r}"))
            if storage == "redis":
                # Its state goes when its run ends (so every run starts with Redis empty), as the
                # memory elements go with theirs: a gigabyte left in Redis' heap during the next
                # run changes what that run is given.
                redis.flush()
            if r:
                got["wall"].append(wall)
                got["moving"].append(got["result"]["state"]["seconds"])
    strip = lambda res: {k: v for k, v in res.items() if k not in ("storage", "state")}  # noqa: E731
    if strip(out["memory"]["result"]) != strip(out["redis"]["result"]):
        raise RuntimeError(f"{name} {params}: the two storages gave different answers")
    return out


def width_app(n):
    manifest = {"name": f"w{n}", "elements": {"e": {"kind": "compute", "code": "noop.py", "parallelism": n, "cpu": 0.01}}}
    return {"manifest": json.dumps(manifest), "files": {"noop.py": "def main(args, action):\n    return {}\n"}}


class ServerWatch:
    """The peak threads and resident memory of scad-server while a block runs (sampled from /proc
    every 5 ms by a thread of its own)."""

    def __init__(self, pid):
        self.pid, self.threads, self.rss_mib = pid, 0, 0.0
        self._stop = threading.Event()

    def _sample(self):
        while not self._stop.is_set():
            try:
                status = pathlib.Path(f"/proc/{self.pid}/status").read_text()
            except OSError:
                return
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            self.threads = max(self.threads, int(fields["Threads"]))
            self.rss_mib = max(self.rss_mib, int(fields["VmRSS"].split()[0]) / 1024)
            self._stop.wait(0.005)

    def __enter__(self):
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def measure_width(home, runs):
    """{width: ms per instance of each run}, {width: (peak threads, peak RSS MiB) of scad-server}."""
    p = Platform(home, extra=["--quotas", "instances=1024,activations=64"])
    try:
        out, server = {}, {}
        for n in WIDTHS:
            assert p.call("PUT", f"/api/v1/namespaces/_/apps/w{n}", width_app(n))[0] == 200
            per = []
            with ServerWatch(p.proc.pid) as watch:
                for r in range(runs + 1):
                    wall, _ = invoke(p, f"w{n}", {})
                    if r:
                        per.append(wall / n * 1000)
            out[n] = per
            server[n] = (watch.threads, watch.rss_mib)
        return out, server
    finally:
        p.stop()


def human(params):
    return ",".join(f"{k}={v}" for k, v in params.items())


def charts(rows, width):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    img = ROOT / "docs" / "img"
    img.mkdir(parents=True, exist_ok=True)
    labels, moving, rest = [], [], []
    for name, params, storage, wall, mov in rows:
        labels.append(f"{name}\n{human(params)}\n{storage}")
        moving.append(mov)
        rest.append(max(0.0, wall - mov))
    fig, ax = plt.subplots(figsize=(max(8, len(rows) * 0.9), 5))
    xs = range(len(rows))
    ax.bar(xs, moving, label="moving state (sum over instances)", color="#c44e52")
    ax.bar(xs, rest, bottom=moving, label="the rest of the wall time", color="#4c72b0")
    ax.set_xticks(list(xs), labels, fontsize=7)
    ax.set_ylabel("seconds (median)")
    ax.set_yscale("symlog", linthresh=0.1)
    ax.set_title("Applications end to end: state in memory elements or in Redis")
    ax.legend()
    fig.tight_layout()
    fig.savefig(img / "apps-breakdown.png", dpi=110)
    if width:
        fig, ax = plt.subplots(figsize=(6, 4))
        ns = sorted(width)
        ax.plot(ns, [statistics.median(width[n]) for n in ns], marker="o")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("instances in the fan-out")
        ax.set_ylabel("ms per instance (median)")
        ax.set_title("Width: per-instance cost of a fan-out")
        ax.set_ylim(bottom=0)
        fig.tight_layout()
        fig.savefig(img / "apps-width.png", dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="one small size each (a smoke run)")
    ap.add_argument("--no-width", action="store_true")
    ap.add_argument("--no-charts", action="store_true")
    ap.add_argument("--largest", action="store_true", help="also the sort of 1 GiB of keys (2 runs, minutes more)")
    ap.add_argument("--apps", default=",".join(SIZES), help="which applications (comma-separated)")
    args = ap.parse_args()
    wanted = args.apps.split(",")
    unknown = [a for a in wanted if a not in SIZES]
    if unknown:
        ap.error(f"unknown application(s) {', '.join(unknown)}: choose from {', '.join(SIZES)}")
    sizes = {name: variants for name, variants in (QUICK if args.quick else SIZES).items() if name in wanted}
    if args.largest and "sort" in sizes:
        sizes["sort"] = (*sizes["sort"], LARGEST)
    t_start = time.time()
    rows, checks = [], []
    with tempfile.TemporaryDirectory(prefix="scad-apps-") as tmp:
        tmp = pathlib.Path(tmp)
        redis = Redis(tmp)
        p = Platform(tmp / "home", extra=["--pool", "8GiB"])
        try:
            for name in sizes:
                assert p.deploy(ROOT / "actions" / name)[0] == 200
            print(f"{'application':10} {'size':24} | {'wall s':>8} {'moving s':>9} | {'Redis wall':>10} {'moving':>8} | "
                  f"{'x wall':>6} {'x moving':>8}")
            for name, variants in sizes.items():
                for params in variants:
                    m = measure_app(p, redis, name, params, LARGEST_RUNS if params is LARGEST else args.runs)
                    med = {s: (statistics.median(m[s]["wall"]), statistics.median(m[s]["moving"])) for s in m}
                    xw = med["redis"][0] / med["memory"][0]
                    xm = med["redis"][1] / med["memory"][1] if med["memory"][1] else float("inf")
                    print(f"{name:10} {human(params):24} | {med['memory'][0]:8.3f} {med['memory'][1]:9.4f} | "
                          f"{med['redis'][0]:10.3f} {med['redis'][1]:8.4f} | {xw:6.2f} {xm:8.1f}", flush=True)
                    for storage in ("memory", "redis"):
                        rows.append((name, params, storage, *med[storage]))
                    checks.append((f"{name} {human(params)} data movement", xm, 5.0))
                    if name in DATA_HEAVY:
                        checks.append((f"{name} {human(params)} end to end", xw, 2.0))
        finally:
            p.stop()
            redis.stop()
        # A fan-out of 8 takes a few milliseconds: more runs than the applications get, so that
        # the base of the ratios is not one scheduling hiccup.
        width, server = ({}, {}) if args.no_width else measure_width(tmp / "width", max(args.runs, WIDTH_RUNS))
    if width:
        base = statistics.median(width[WIDTHS[0]])
        print("\nwidth: ms per instance (median), and over the width of 8; scad-server's peak threads and RSS")
        for n in WIDTHS:
            per = statistics.median(width[n])
            print(f"  {n:4} instances: {per:8.2f} ms  x{per / base:.2f}   threads {server[n][0]:4}  "
                  f"RSS {server[n][1]:6.1f} MiB")
            if n != WIDTHS[0]:
                checks.append((f"width {n} per instance within 2x of width {WIDTHS[0]} (x = 2 / ratio)", 2 * base / per, 1.0))
    met = [c for c in checks if c[1] >= c[2]]
    print(f"\ntargets: {len(met)} of {len(checks)} met")
    for label, x, need in checks:
        print(f"  {'met   ' if x >= need else 'MISSED'} {label}: {x:.2f} (need {need})")
    if not args.no_charts:
        charts(rows, width)
        print("charts: docs/img/apps-breakdown.png, docs/img/apps-width.png")
    print(f"took {time.time() - t_start:.0f} s")


if __name__ == "__main__":
    main()
