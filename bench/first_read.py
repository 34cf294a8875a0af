#!/usr/bin/env python3
"""A new buffer's first read over tcp: libd's C API alone beside scad.rdma's read_into and
scad.tensor_transport's recv_multiple_tensors of the same, against one owner's server:

    bench/first_read.py [--size 64] [--reads 3000] [--rounds 3]

build/bench/libd-first-read-steps lends a region in a process of its own (its server thread
polling) and grants slices of it, each read once; it times libd's calls step by step itself, and
with --serve hands the grants to this script, which reads each through the Python APIs (the
buffer's record made beforehand: only the read is timed, as api_steps.py's "read_into" step).
The variants run by turns, `--rounds` times; the figures are the medians of each round's median,
in µs, and the Python APIs' time over libd's (the Python layers' cost on this step). The libd
figure is the sum of the step medians, a floor under the whole.
"""
import argparse
import asyncio
import pathlib
import re
import socket
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "build" / "python"), str(ROOT / "bindings" / "python")]
TOOL = ROOT / "build" / "bench" / "libd-first-read-steps"
WARMUP = 200

import numpy  # noqa: E402


def libd_floor(size, reads):
    out = subprocess.run([str(TOOL), "--size", str(size), "--reads", str(reads)], check=True,
                         capture_output=True, text=True).stdout
    print(out, end="")
    return float(re.search(r"sum of the medians\s+([0-9.]+)", out).group(1))


def records(configs, size):
    """An RdmaBuffer per grant line, as the owner's record would describe it."""
    from scad._memserver import config_value
    from scad.rdma import RdmaBuffer
    return [RdmaBuffer(owner="first-read-owner", hostname=socket.gethostname(), host=config_value(line, "host"),
                       port=int(config_value(line, "port")), path="", verbs=False, grant=config_value(line, "grant"),
                       secret=config_value(line, "secret"), offset=int(config_value(line, "offset")), size=size, whole=False)
            for line in configs]


def python_reads(api, size, reads):
    """Median µs of `reads` first reads through `api` (read_into or tensor) against a fresh owner."""
    from scad.rdma import RdmaManager
    RdmaManager.get(transport="tcp", busy_poll_us=500.0)  # this process's reads: over tcp, polling
    owner = subprocess.Popen([str(TOOL), "--serve", "--size", str(size), "--reads", str(reads)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        bufs = records([owner.stdout.readline().strip() for _ in range(reads)], size)
        local = numpy.zeros(size, dtype=numpy.uint8)
        asyncio.run(bufs[0].read_into(local))  # the server reached once, as in a running pair
        ns, times = time.perf_counter_ns, []
        if api == "read_into":
            async def run():
                for b in bufs[1:]:
                    local[0] = 0
                    t0 = ns()
                    await b.read_into(local)
                    times.append(ns() - t0)
                    if local[0] != ord("x"):
                        raise RuntimeError("read_into brought the wrong bytes")
                    b.drop()
            asyncio.run(run())
        else:
            from scad.tensor_transport import ScadTensorTransport
            from scad.tensor_transport._metadata import ScadTransportMetadata
            tensors = ScadTensorTransport(busy_poll_us=500.0)
            comm = tensors.get_communicator_metadata()
            dtype = numpy.dtype(numpy.uint8)
            metas = [ScadTransportMetadata(tensor_meta=[((size,), dtype)], tensor_device="cpu",
                                           buffers=[b.to_json()], lent_list="") for b in bufs[1:]]
            for i, meta in enumerate(metas):
                local[0] = 0
                t0 = ns()
                tensors.recv_multiple_tensors(f"obj-{i}", meta, comm, target_buffers=[local])
                times.append(ns() - t0)
                if local[0] != ord("x"):
                    raise RuntimeError("recv_multiple_tensors brought the wrong bytes")
        return statistics.median(times[WARMUP:]) / 1e3
    finally:
        owner.stdin.close()
        owner.wait(30)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--reads", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if not TOOL.exists():
        sys.exit(f"{TOOL.relative_to(ROOT)} is missing: build the project first (scripts/setup)")
    if args.reads <= WARMUP + 1 or args.rounds < 1 or not 1 <= args.size <= 1 << 20:
        ap.error(f"--reads must exceed {WARMUP + 1}, --rounds be at least 1, --size 1..1048576")
    figures = {"libd": [], "read_into": [], "tensor": []}
    for rnd in range(args.rounds):
        print(f"round {rnd + 1} of {args.rounds}")
        figures["libd"].append(libd_floor(args.size, args.reads))
        for api in ("read_into", "tensor"):
            figures[api].append(python_reads(api, args.size, args.reads))
    floor = statistics.median(figures["libd"])
    print(f"\na new buffer's first {args.size}-byte read over tcp, median µs over {args.rounds} rounds:")
    print(f"  {'libd C API (sum of its steps)':44} {floor:8.2f}")
    for api, label in (("read_into", "scad.rdma RdmaBuffer.read_into"),
                       ("tensor", "scad.tensor_transport recv_multiple_tensors")):
        us = statistics.median(figures[api])
        print(f"  {label:44} {us:8.2f}  ({us / floor:.2f}x libd's)")


if __name__ == "__main__":
    main()
