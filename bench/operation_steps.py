#!/usr/bin/env python3
"""Where one small one-sided operation's time goes, step by step, between two processes:

    bench/operation_steps.py [shm|tcp] [--runs 400]

The owner lends 64 bytes with scad.connect (create_readable) and hands the record over a pipe;
the peer makes the libd calls an active scad.connect operation makes, one at a time (the
transport set up, the read that attaches the grant and moves the bytes, the owner's verdict, the
wait, the word with the grant let go), and the owner waits for that word. Both sides poll the
pipe, as the peers' do in bench/transfer.py. Medians in microseconds of each step after 50
warm-up operations; the sum is a floor under what scad.connect's own operation costs.
"""
import argparse
import asyncio
import os
import pathlib
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "build" / "python"), str(ROOT / "bindings" / "python"), str(ROOT / "bench")]

import numpy  # noqa: E402

from transfer_pair import fork_pair  # noqa: E402

perf = time.perf_counter
BUSY_POLL_US = 500.0
WARMUP = 50


def peer(transport, runs, chan):
    """The active side: libd's calls in scad.connect's order, each timed."""
    from disagg import LibdAction
    from scad import _memserver
    from scad.connect import Connector, Descriptor, RdmaMetadata

    connector = Connector(transport=transport, busy_poll_us=BUSY_POLL_US)
    local = Descriptor(numpy.zeros(64, dtype=numpy.uint8))
    for _ in range(runs):
        msg = chan.recv_polling()
        t = [perf()]
        md = RdmaMetadata.from_json(msg["record"])
        t.append(perf())
        d = md.descriptors[0]
        impl = connector._choose_transport(md)
        action = LibdAction(connector.name)
        # As scad.connect's active side: over tcp it polls its socket for the owner's verdict.
        spin = f"busy_poll_us,{int(BUSY_POLL_US)};" if impl == "tcp" else ""
        action.add_transport(f"d0;{impl};{_memserver.where(impl, md.host, md.port, md.path)};timeout_ms,30000;"
                             f"{spin}grant,{d.grant};secret,{d.secret}")
        tr = action.get_transport("d0", "rdma")
        tr.reg_memory(local.ptr, local.size, keep=local)
        t.append(perf())
        op = tr.read_async(local.size, 0, 0)
        t.append(perf())
        tr.remote()
        t.append(perf())
        op.wait(3)
        t.append(perf())
        tr.notify(int(md.notification_key, 16), 0, last=True)
        t.append(perf())
        action.terminate()
        t.append(perf())
        chan.send({"t": t})


async def owner(runs, chan):
    from scad.connect import Connector, Descriptor

    connector = Connector(busy_poll_us=BUSY_POLL_US)
    lent = Descriptor(numpy.full(64, 3, dtype=numpy.uint8))
    rows = []
    for _ in range(runs):
        t0 = perf()
        op = connector.create_readable(lent)
        t1 = perf()
        record = op.metadata().to_json()
        t2 = perf()
        chan.send({"record": record})
        t3 = perf()
        await op.wait_for_completion()
        t4 = perf()
        rows.append(([t0, t1, t2, t3, t4], chan.recv_polling()["t"]))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("transport", nargs="?", default="shm", choices=("shm", "tcp"))
    ap.add_argument("--runs", type=int, default=400)
    args = ap.parse_args()
    runs = args.runs + WARMUP
    pid, chan = fork_pair(lambda chan: peer(args.transport, runs, chan))  # before either side has loaded libd
    rows = asyncio.run(owner(runs, chan))
    os.waitpid(pid, 0)
    steps = {}
    for (t0, t1, t2, t3, t4), a in rows[WARMUP:]:
        for name, us in (("owner: create_readable (expose, grant)", t1 - t0), ("owner: the record's JSON", t2 - t1),
                         ("owner: record onto the pipe", t3 - t2), ("pipe to the peer", a[0] - t3),
                         ("peer: RdmaMetadata.from_json", a[1] - a[0]),
                         ("peer: transport set up (action, durl, local memory)", a[2] - a[1]),
                         ("peer: read_async (attach + read sent)", a[3] - a[2]), ("peer: the owner's verdict", a[4] - a[3]),
                         ("peer: wait for the read", a[5] - a[4]), ("peer: notify (and let the grant go)", a[6] - a[5]),
                         ("the word reaches the owner's wait", t4 - a[6]), ("total (owner's view)", t4 - t0)):
            steps.setdefault(name, []).append(us * 1e6)
    print(f"one 64-byte read operation over {args.transport}, median µs of {args.runs}:")
    for name, v in steps.items():
        print(f"  {name:52} {statistics.median(v):8.1f}")


if __name__ == "__main__":
    main()
