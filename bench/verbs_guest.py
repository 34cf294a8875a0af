"""Runs inside the Soft-RoCE guest (through bench/verbs): Scad's verbs transport beside perftest's
ib_write_bw, ib_read_bw and ib_read_lat on the same rxe device in the same run, and the ratios.

Ours: libd-bench against libd-memd --verbs. Bandwidth: a window of asynchronous operations in
flight (default event-driven completions, the mode users get). Latency: one operation at a time,
median, in polling mode (poll,1) — perftest's latency tests poll too. perftest: server and
client on rxe0, GID index as discovered by libd (RoCE v2, IPv4). Targets: >= 0.9x perftest
bandwidth, <= 1.2x its latency."""
import json
import os
import pathlib
import re
import select
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
BENCH = ROOT / "build/bench/libd-bench"
MEMD = ROOT / "build/libd/libd-memd"
BW_SIZES = [64, 4096, 65536, 1 << 20, 8 << 20]
LAT_SIZES = [64, 4096, 65536]
if os.environ.get("BENCH_SIZES"):  # a quicker look at some sizes: BENCH_SIZES=64,4096 bench/verbs
    BW_SIZES = LAT_SIZES = [int(x) for x in os.environ["BENCH_SIZES"].split(",")]
INFLIGHT = 32


def human(n):
    for unit, div in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n // div} {unit}"
    return f"{n} B"


def libd_bench(*args):
    out = subprocess.run([str(BENCH), *map(str, args)], capture_output=True, text=True, timeout=600,
                         env={"LIBD_ACTION_ID": "bench", "PATH": "/usr/bin:/bin"})
    if out.returncode:
        raise RuntimeError(f"libd-bench failed: {out.stderr}")
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def perftest(tool, size, iters, port, gid):
    """Runs a perftest server and client; returns the client's result row as floats."""
    common = [tool, "-d", "rxe0", "-x", str(gid), "-s", str(size), "-n", str(iters), "-p", str(port), "-F"]
    server = subprocess.Popen(common, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        # The server listens on its tcp port once its device is open: retry until the client gets in.
        deadline = time.monotonic() + 30
        while True:
            client = subprocess.run(common + ["127.0.0.1"], capture_output=True, text=True, timeout=300)
            if client.returncode == 0 or time.monotonic() > deadline or server.poll() is not None:
                break
            time.sleep(0.2)
        server.wait(60)
    finally:
        if server.poll() is None:
            server.kill()
    if client.returncode:
        raise RuntimeError(f"{tool} failed: {client.stdout}{client.stderr}")
    for line in client.stdout.splitlines():
        f = line.split()
        if f and f[0] == str(size) and len(f) >= 4:
            return [float(x) for x in f]
    raise RuntimeError(f"{tool}: no result line in {client.stdout}")


def gid_index_of(description):
    m = re.search(r"gid\[(\d+)\]", description)
    return int(m.group(1)) if m else 0


def main():
    t0 = time.time()
    with tempfile.TemporaryDirectory() as d:
        memd = subprocess.Popen([str(MEMD), "--element", "mem1=320MiB", "--tcp", "127.0.0.1:0", "--verbs",
                                 "--grant", "mem1:bench:rw", "--grants", f"{d}/grants.jsonl"],
                                stdout=subprocess.PIPE, text=True)
        ready, _, _ = select.select([memd.stdout], [], [], 30)
        if not ready:
            sys.exit("libd-memd did not start")
        info = json.loads(memd.stdout.readline())
        config = json.loads(pathlib.Path(f"{d}/grants.jsonl").read_text().splitlines()[0])["config"]
        gid = gid_index_of(info["verbs"])
        print(f"device: {info['verbs']}", flush=True)
        try:
            sizes = ",".join(map(str, BW_SIZES))
            print("measuring scad-verbs bandwidth ...", flush=True)
            ours_bw = libd_bench("transport", "verbs", config + ";depth,128", "--sizes", sizes,
                                 "--inflight", str(INFLIGHT), "--budget-ms", "1500")
            print("measuring scad-verbs bandwidth (poll,1) ...", flush=True)
            ours_bw_poll = libd_bench("transport", "verbs", config + ";depth,128;poll,1", "--sizes", sizes,
                                      "--inflight", str(INFLIGHT), "--budget-ms", "1500")
            print("measuring scad-verbs latency (poll,1) ...", flush=True)
            ours_lat = []
            for _ in range(3):
                ours_lat += libd_bench("transport", "verbs", config + ";poll,1", "--sizes",
                                       ",".join(map(str, LAT_SIZES)), "--inflight", "1", "--budget-ms", "500")
        finally:
            memd.terminate()
            memd.wait(10)

    port = 18515
    theirs = {}
    for size in BW_SIZES:
        iters = max(200, min(5000, (48 << 20) // size))
        for op, tool in (("write", "ib_write_bw"), ("read", "ib_read_bw")):
            port += 1
            print(f"measuring {tool} {human(size)} ...", flush=True)
            row = perftest(tool, size, iters, port, gid)
            theirs[(op, size, "bw")] = row[3] * 1e6 / 1e9  # BW average [MB/s] -> GB/s
    for size in LAT_SIZES:
        port += 1
        print(f"measuring ib_read_lat {human(size)} ...", flush=True)
        lats = [perftest("ib_read_lat", size, 1000, port + 100 * k, gid)[4] for k in range(3)]  # t_typical
        theirs[("read", size, "lat")] = statistics.median(lats)

    print()
    print(f"Bandwidth (GB/s, {INFLIGHT} in flight) and latency (median us), Scad verbs vs perftest on the same rxe device")
    print("(scad events: the default, completions through the event loop; scad poll: poll,1, waiters")
    print(" poll the completion queue as perftest does; the target is judged on poll, like for like)")
    print(f"{'size':>8} {'op':5} | {'events':>8} {'x':>5} | {'poll':>8} {'perftest':>8} {'x':>6}  target >= 0.9")
    checks = []
    for size in BW_SIZES:
        for op in ("write", "read"):
            ev = next(r["gbps"] for r in ours_bw if r["op"] == op and r["size"] == size)
            ours = next(r["gbps"] for r in ours_bw_poll if r["op"] == op and r["size"] == size)
            ref = theirs[(op, size, "bw")]
            x = ours / ref if ref else 0
            checks.append(x >= 0.9)
            print(f"{human(size):>8} {op:5} | {ev:8.4f} {ev / ref if ref else 0:5.2f} | {ours:8.4f} {ref:8.4f} {x:6.2f}"
                  f"  {'ok' if x >= 0.9 else 'MISS'}")
    print()
    print(f"{'size':>8} {'op':5} | {'scad us':>8} {'perftest':>8} {'x':>6}  target <= 1.2 (ib_read_lat t_typical)")
    for size in LAT_SIZES:
        ours = statistics.median(r["median_us"] for r in ours_lat if r["op"] == "read" and r["size"] == size)
        wr = statistics.median(r["median_us"] for r in ours_lat if r["op"] == "write" and r["size"] == size)
        ref = theirs[("read", size, "lat")]
        x = ours / ref if ref else 0
        checks.append(x <= 1.2)
        print(f"{human(size):>8} read  | {ours:8.2f} {ref:8.2f} {x:6.2f}  {'ok' if x <= 1.2 else 'MISS'}"
              f"   (scad write {wr:.2f} us)")
    print()
    print(f"{sum(checks)}/{len(checks)} targets met; {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
