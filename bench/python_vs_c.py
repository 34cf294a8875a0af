#!/usr/bin/env python3
"""The Python API (disagg) against the C API (libd-bench) on the same transports and sizes, in one
run, interleaved round by round so that drift on a shared machine hits both alike.

    bench/python_vs_c.py [--rounds 3]

Both sides measure the same thing the same way: one operation in flight; operations shorter than
~20 us are timed in back-to-back batches and averaged (as perftest does), so neither side's clock
is part of the figure; latency is the median of those per-operation times, bandwidth the median
of the matching bandwidths. Targets (issue 3): 64 B latency <= 1.5x C; bandwidth >= 0.95x C at >= 1 MiB.
"""
import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "build" / "python"), str(ROOT / "bindings" / "python"), str(ROOT / "bench")]
import disagg  # noqa: E402
from transports import MemoryElement, libd_bench  # noqa: E402

SIZES = [64, 4096, 1 << 20, 16 << 20]


def python_side(impl, config, size, budget_s=0.3):
    a = disagg.LibdAction("bench")
    a.add_transport(f"mem;{impl}")
    a.config_transport("mem", config)
    t = a.get_transport("mem", "rdma")
    t.reg(max(size, 4096))
    # Touch every page first, as libd-bench does: untouched pages all map the kernel's zero page,
    # which would make reading the local buffer (a write) look faster than memory is.
    t.buf[:] = b"\x5a" * t.size
    out = {}
    for op in ("write", "read"):
        fn = t.read if op == "read" else t.write
        for _ in range(3):
            fn(size, 0, 0)
        t0 = time.perf_counter()
        for _ in range(3):
            fn(size, 0, 0)
        one = max((time.perf_counter() - t0) / 3, 1e-9)
        # Short operations in back-to-back batches, averaged: exactly what libd-bench does.
        batch = max(1, int(20e-6 / one))
        reps = max(3, min(20000, int(budget_s / (one * batch))))
        lat = []
        clock = time.perf_counter_ns
        loop = range(batch)
        for _ in range(reps):
            s = clock()
            for _ in loop:
                fn(size, 0, 0)
            lat.append((clock() - s) / batch)
        m = statistics.median(lat) / 1e3
        out[op] = {"median_us": m, "gbps": statistics.median(size / (x / 1e9) / 1e9 for x in lat)}
    a.terminate()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    os.environ["LIBD_ACTION_ID"] = "bench"
    rows = {}
    with MemoryElement() as mem:
        for _ in range(args.rounds):
            for impl in ("shm", "tcp"):
                c = libd_bench("transport", impl, mem.config, "--sizes", ",".join(map(str, SIZES)), "--inflight", "1")
                for r in c:
                    rows.setdefault((impl, r["size"], r["op"]), {"c": [], "py": []})["c"].append(r)
                for size in SIZES:
                    py = python_side(impl, mem.config, size)
                    for op in ("write", "read"):
                        rows[(impl, size, op)]["py"].append(py[op])
    print(f"{'transport':9} {'size':>8} {'op':5} | {'C us':>9} {'Py us':>9} {'Py/C':>5} | {'C GB/s':>7} {'Py GB/s':>7} {'Py/C':>5}")
    missed = []
    summary = []
    for (impl, size, op), v in sorted(rows.items()):
        c_us = statistics.median(r["median_us"] for r in v["c"])
        p_us = statistics.median(r["median_us"] for r in v["py"])
        c_bw = statistics.median(r["gbps"] for r in v["c"])
        p_bw = statistics.median(r["gbps"] for r in v["py"])
        lat_ratio, bw_ratio = p_us / c_us, p_bw / c_bw
        print(f"{impl:9} {size:>8} {op:5} | {c_us:9.2f} {p_us:9.2f} {lat_ratio:5.2f} | {c_bw:7.2f} {p_bw:7.2f} {bw_ratio:5.2f}")
        summary.append({"impl": impl, "size": size, "op": op, "c_us": c_us, "py_us": p_us, "c_gbps": c_bw, "py_gbps": p_bw})
        if size == 64 and lat_ratio > 1.5:
            missed.append(f"{impl} {op} 64 B latency {lat_ratio:.2f}x C (target <= 1.5)")
        if size >= 1 << 20 and bw_ratio < 0.95:
            missed.append(f"{impl} {op} {size >> 20} MiB bandwidth {bw_ratio:.2f}x C (target >= 0.95)")
    print("targets:", "all met" if not missed else f"{len(missed)} missed")
    for m in missed:
        print("  MISSED", m)
    out = ROOT / "bench" / "out"
    out.mkdir(exist_ok=True)
    (out / time.strftime("python-vs-c-%Y%m%d-%H%M%S.json")).write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
