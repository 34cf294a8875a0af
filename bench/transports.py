#!/usr/bin/env python3
"""Runs libd's transports beside their peers on this machine, in one run, and prints ratios.

    bench/run [--quick] [--no-setup] [--skip-peers]      (or bench/transports.py)

Peers: memcpy of the same access pattern and a raw loopback TCP ping-pong (libd-bench), iperf3
(one stream), Redis GET/SET of the same value sizes, UCX ucx_perftest put/get over tcp and over
shared memory. Every figure is a median. Raw results go to bench/out/results-*.json.
"""
import argparse
import json
import os
import pathlib
import select
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import peers  # noqa: E402

SIZES = [64, 4096, 65536, 1 << 20, 16 << 20, 64 << 20]
# Polling mode for the small-read latency: how long the client polls its answer and the server
# its sockets after each request before sleeping (libd's busy_poll_us on each side).
CLIENT_POLL_US = 200
SERVER_POLL_US = 100
MiB = 1 << 20


def human(n):
    for unit, f in (("MiB", MiB), ("KiB", 1024)):
        if n >= f:
            return f"{n // f} {unit}"
    return f"{n} B"


def config_on_stdin(args):
    """libd-bench's arguments with a transport's configuration (it holds the grant's secret) taken
    off the command line, and the standard input that carries it instead: (args, stdin text)."""
    args = [str(a) for a in args]
    if len(args) > 2 and args[0] == "transport":
        return args[:2] + ["-"] + args[3:], args[2] + "\n"
    return args, ""


def libd_bench(*args):
    """libd-bench's result lines."""
    args, config = config_on_stdin(args)
    out = subprocess.run([str(ROOT / "build/bench/libd-bench"), *args], input=config, capture_output=True, text=True,
                         timeout=600, env=dict(os.environ, LIBD_ACTION_ID="bench"))
    if out.returncode != 0:
        raise RuntimeError(f"libd-bench {' '.join(map(str, args))} failed: {out.stderr}")
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


class MemoryElement:
    """libd-memd with one element and a grant for the benchmark's client id; busy_poll_us: how
    long its thread polls after each request before it sleeps (libd-memd --busy-poll-us)."""

    def __init__(self, busy_poll_us=0):
        self.busy_poll_us = busy_poll_us

    def cpu_us(self):
        """CPU time the server's threads have used so far, in microseconds (schedstat: ns on CPU)."""
        total = 0
        for task in pathlib.Path(f"/proc/{self.proc.pid}/task").iterdir():
            total += int((task / "schedstat").read_text().split()[0])
        return total / 1e3

    def __enter__(self):
        self.dir = tempfile.TemporaryDirectory(prefix="scad-bench-")
        d = pathlib.Path(self.dir.name)
        self.proc = subprocess.Popen(
            [str(ROOT / "build/libd/libd-memd"), "--element", "mem1=320MiB", "--tcp", "127.0.0.1:0",
             "--unix", str(d / "mem1.sock"), "--grant", "mem1:bench:rw", "--grants", str(d / "grants.jsonl"),
             "--busy-poll-us", str(self.busy_poll_us)],
            stdout=subprocess.PIPE, text=True)
        ready, _, _ = select.select([self.proc.stdout], [], [], 20)
        if not ready:
            raise RuntimeError("libd-memd did not start")
        self.proc.stdout.readline()
        self.config = json.loads((d / "grants.jsonl").read_text().splitlines()[0])["config"]
        return self

    def __exit__(self, *exc):
        self.proc.terminate()
        self.proc.wait(10)
        self.dir.cleanup()


def find(results, peer, op, size, inflight=1):
    for r in results:
        if r["peer"] == peer and r["op"] == op and r["size"] == size and r["inflight"] == inflight:
            return r
    return None


def best(results, peer, op, size):
    """The best bandwidth over in-flight depths (each is already a median)."""
    rows = [r for r in results if r["peer"] == peer and r["op"] == op and r["size"] == size and r.get("gbps")]
    return max(rows, key=lambda r: r["gbps"]) if rows else None


def ratio(a, b):
    return a / b if a and b else None


def fmt(x, digits=2):
    return "   -  " if x is None else f"{x:6.{digits}f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer sizes, shorter runs")
    ap.add_argument("--no-setup", action="store_true", help="do not run scripts/setup first")
    ap.add_argument("--skip-peers", action="store_true", help="only libd and the local baselines")
    args = ap.parse_args()
    if not args.no_setup:
        subprocess.run([str(ROOT / "scripts/setup")], check=True)
    sizes = [64, 65536, 1 << 20, 16 << 20] if args.quick else SIZES
    size_arg = ",".join(map(str, sizes))
    t0 = time.time()
    results = []

    with MemoryElement() as mem:
        for impl in ("shm", "tcp"):
            print(f"measuring scad-{impl} ...", flush=True)
            results += libd_bench("transport", impl, mem.config, "--sizes", size_arg, "--inflight", "1,16")
        print("measuring memcpy ...", flush=True)
        results += libd_bench("memcpy", "--sizes", size_arg)
        # Small-read latency against the raw round trip, interleaved so drift hits both alike.
        print("measuring 64-byte latency against raw TCP ...", flush=True)
        ours, raw, raw_busy = [], [], []
        for _ in range(5):
            raw += [r["median_us"] for r in libd_bench("pingpong", "--budget-ms", "200")]
            ours += [r["median_us"] for r in libd_bench("transport", "tcp", mem.config, "--sizes", "64",
                                                         "--inflight", "1", "--budget-ms", "200")
                     if r["op"] == "read"]
        raw_busy += [r["median_us"] for r in libd_bench("pingpong", "--busy-poll", "--budget-ms", "200")]

    # The same read with every side polling (the client's busy_poll_us, the server's), beside the
    # busy-polling raw ping-pong, with the CPU each spends per operation.
    print("measuring 64-byte latency with polling ...", flush=True)
    polled = {"ours": [], "raw": [], "ours_client_cpu": [], "ours_server_cpu": [], "raw_cpu": []}
    with MemoryElement(busy_poll_us=SERVER_POLL_US) as mem:
        config = f"{mem.config};busy_poll_us,{CLIENT_POLL_US}"
        for _ in range(5):
            raw_run = libd_bench("pingpong", "--busy-poll", "--budget-ms", "200")[0]
            polled["raw"].append(raw_run["median_us"])
            polled["raw_cpu"].append((raw_run["user_us_per_op"] + raw_run["sys_us_per_op"]))
            server0 = mem.cpu_us()
            run = next(r for r in libd_bench("transport", "tcp", config, "--sizes", "64", "--inflight", "1",
                                             "--budget-ms", "200", "--ops", "read") if r["op"] == "read")
            server1 = mem.cpu_us()
            polled["ours"].append(run["median_us"])
            polled["ours_client_cpu"].append(run["user_us_per_op"] + run["sys_us_per_op"])
            # The server's CPU over the whole client run (warm-up included) per timed operation:
            # an upper bound.
            polled["ours_server_cpu"].append((server1 - server0) / run["ops"])

    if not args.skip_peers:
        print("measuring iperf3 ...", flush=True)
        results.append(peers.iperf3(seconds=3))
        print("measuring redis ...", flush=True)
        results += peers.redis(sizes, inflight_values=(1, 16))
        for tl in ("tcp", "shm"):
            print(f"measuring ucx over {tl} ...", flush=True)
            results += peers.ucx(sizes, tl)

    iperf = next((r["gbps"] for r in results if r["peer"] == "iperf3"), None)
    lat_ours, lat_raw = statistics.median(ours), statistics.median(raw)

    print()
    print("Bandwidth in GB/s (best over 1 and 16 in flight), and our ratio to each peer at the same size")
    print(f"{'size':>8} {'op':5} | {'shm':>6} {'memcpy':>6} {'x':>5} {'ucxshm':>6} {'x':>5} {'redis':>6} {'x':>6} |"
          f" {'tcp':>6} {'iperf3':>6} {'x':>5} {'ucxtcp':>6} {'x':>5} {'x redis':>7}")
    checks = []
    for size in sizes:
        for op in ("write", "read"):
            shm, tcp = best(results, "scad-shm", op, size), best(results, "scad-tcp", op, size)
            mc, us, ut, rd = (best(results, p, op, size) for p in ("memcpy", "ucx-shm", "ucx-tcp", "redis"))
            g = lambda r: r["gbps"] if r else None  # noqa: E731
            r_mc, r_us, r_rd = ratio(g(shm), g(mc)), ratio(g(shm), g(us)), ratio(g(shm), g(rd))
            r_ip, r_ut, r_trd = ratio(g(tcp), iperf), ratio(g(tcp), g(ut)), ratio(g(tcp), g(rd))
            print(f"{human(size):>8} {op:5} | {fmt(g(shm))} {fmt(g(mc))} {fmt(r_mc)} {fmt(g(us))} {fmt(r_us)}"
                  f" {fmt(g(rd))} {fmt(r_rd, 1)} | {fmt(g(tcp))} {fmt(iperf)} {fmt(r_ip)} {fmt(g(ut))} {fmt(r_ut)}"
                  f" {fmt(r_trd, 1)}")
            if size >= MiB:
                checks.append((f"shm {op} {human(size)} >= 0.9x memcpy", r_mc, 0.9))
                checks.append((f"shm {op} {human(size)} >= 0.9x UCX shm", r_us, 0.9))
                checks.append((f"tcp {op} {human(size)} >= 0.9x iperf3", r_ip, 0.9))
            checks.append((f"shm {op} {human(size)} >= 5x Redis", r_rd, 5.0))
            checks.append((f"tcp {op} {human(size)} >= 1x UCX tcp", r_ut, 1.0))
            checks.append((f"tcp {op} {human(size)} >= 1x Redis", r_trd, 1.0))
    print()
    print(f"64-byte read latency: scad-tcp {lat_ours:.1f} us (median of {len(ours)}), raw TCP ping-pong "
          f"{lat_raw:.1f} us blocking, {statistics.median(raw_busy):.1f} us busy-polling -> ratio "
          f"{lat_ours / lat_raw:.2f} (target <= 1.2, same polling choice: blocking)")
    checks.append(("tcp 64 B read latency <= 1.2x raw ping-pong", lat_raw / lat_ours * 1.2, 1.0))
    med = {k: statistics.median(v) for k, v in polled.items()}
    print(f"64-byte read latency, every side polling (client busy_poll_us,{CLIENT_POLL_US}, server "
          f"--busy-poll-us {SERVER_POLL_US}): scad-tcp {med['ours']:.1f} us, raw TCP ping-pong busy-polling "
          f"{med['raw']:.1f} us -> ratio {med['ours'] / med['raw']:.2f} (target <= 1.5)")
    print(f"  CPU per operation: scad-tcp client {med['ours_client_cpu']:.1f} us + server "
          f"{med['ours_server_cpu']:.1f} us; raw ping-pong (both ends) {med['raw_cpu']:.1f} us; blocking scad-tcp "
          f"{lat_ours:.1f} us a read, sleeping between")
    checks.append(("tcp 64 B read latency polling <= 1.5x busy-polling ping-pong", med["raw"] * 1.5 / med["ours"], 1.0))
    print()
    missed = [(n, v, t) for n, v, t in checks if v is not None and v < t]
    unknown = [n for n, v, t in checks if v is None]
    print(f"targets: {len(checks) - len(missed) - len(unknown)} met, {len(missed)} missed, {len(unknown)} without a peer figure")
    for n, v, t in missed:
        print(f"  MISSED {n}: {v:.2f}")
    out = ROOT / "bench/out"
    out.mkdir(exist_ok=True)
    path = out / time.strftime("results-%Y%m%d-%H%M%S.json")
    path.write_text(json.dumps({"results": results, "latency": {"scad_tcp_64B_read_us": ours, "raw_us": raw,
                                                                  "raw_busy_us": raw_busy,
                                                                  "polling": polled}}, indent=1))
    print(f"raw results: {path.relative_to(ROOT)}; took {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
