#!/usr/bin/env python3
"""Where one operation of each Python API spends its time, step by step, between two processes:

    bench/api_steps.py connect|rdma|tensor [shm|tcp] [--op read|write] [--size 64] [--runs 400]

The owner lends memory and hands the record to the peer over a pipe; the peer parses it, moves
the bytes into its own memory and ends its side; the owner learns it finished and ends the loan.
Each API runs as bench/transfer.py's worker runs it (the same calls, both sides polling their
pipe, our APIs polling their transfers for 500 µs and scad.connect's owner its word for up to a
second, an owner of scad.rdma or scad.tensor_transport serving the peer's requests over tcp while
it waits for the peer's word, each side's main thread on a CPU of its own), with a timestamp between the steps. CLOCK_MONOTONIC is one clock for both processes, so a step that crosses the
pipe is timed too. Medians in microseconds after 100 warm-up operations; bench/operation_steps.py
takes scad.connect's operation apart further, into its libd calls.
"""
import argparse
import asyncio
import base64
import os
import pathlib
import pickle
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "build" / "python"), str(ROOT / "bindings" / "python"), str(ROOT / "bench")]

import numpy  # noqa: E402,F401 - loaded before anything is timed (transfer_pair.array makes the buffers)

from transfer_pair import array, fork_pair, pin_main_thread, stamped_command  # noqa: E402

perf = time.perf_counter
BUSY_POLL_US = 500.0
OWNER_POLL_US = 1_000_000.0  # scad.connect's owner waits for the word as transfer_scad.py's does
WARMUP = 100

# Each API's steps: the owner's before the record goes, the peer's (stamped there), the owner's after.
STEPS = {
    "connect": (["owner: Descriptor, create_readable|writable", "owner: the record (to_json)", "owner: record onto the pipe"],
                ["pipe to the peer", "peer: RdmaMetadata.from_json", "peer: Descriptor, begin_read|write",
                 "peer: wait_for_completion (the notification sent)"],
                ["the notification reaches the owner's wait"]),
    "rdma": (["owner: request_buffer", "owner: the record (to_json)", "owner: record onto the pipe"],
             ["pipe to the peer", "peer: RdmaBuffer.from_json", "peer: read_into|write_from", "peer: (nothing more)"],
             ["the peer's word reaches the owner", "owner: drop (the key revoked)"]),
    "tensor": (["owner: extract_tensor_transport_metadata", "owner: the record (pickled)", "owner: record onto the pipe"],
               ["pipe to the peer", "peer: unpickled", "peer: recv_multiple_tensors", "peer: (nothing more)"],
               ["the peer's word reaches the owner", "owner: garbage_collect"]),
}


async def owner(api, transport, size, runs, chan, write):
    lent = array(size, 7)  # as bench/transfer.py's workers make theirs
    drive = None
    if api == "connect":
        from scad.connect import Connector, Descriptor
        connector = Connector(busy_poll_us=OWNER_POLL_US)
    else:
        from scad.rdma import RdmaManager
        manager = RdmaManager.get()
        drive = manager.progress if transport == "tcp" else None  # as bench/transfer_scad.py's owner
        if api == "tensor":
            from scad.tensor_transport import ScadTensorTransport
            tensors = ScadTensorTransport()
    pin_main_thread("owner")  # as bench/transfer.py's workers run
    rows, drops = [], []
    for i in range(runs):
        t = [perf()]
        if api == "connect":
            op = (connector.create_writable if write else connector.create_readable)(Descriptor(lent))
            t.append(perf())
            msg = {"record": op.metadata().to_json()}
        elif api == "rdma":
            buf = manager.request_buffer(lent)
            t.append(perf())
            msg = {"record": buf.to_json()}
        else:
            meta = tensors.extract_tensor_transport_metadata(f"obj-{i}", [lent])
            t.append(perf())
            msg = {"object": f"obj-{i}", "meta": base64.b64encode(pickle.dumps(meta)).decode()}
        t.append(perf())
        chan.send(msg)
        t.append(perf())
        if api == "connect":
            await op.wait_for_completion()
            t.append(perf())
            peer = [ns * 1e-9 for ns in chan.recv_polling()["t"]]  # perf_counter's clock, in nanoseconds
            drops.append(0.0)
        else:
            word = chan.recv_polling(drive)
            peer = [ns * 1e-9 for ns in word["t"]]
            drops.append(word["dropped_ns"] / 1e3)
            t.append(perf())
            if api == "rdma":
                buf.drop()
            else:
                tensors.garbage_collect(f"obj-{i}", meta)
            t.append(perf())
        rows.append((t, peer))
    chan.send({"quit": True})
    return rows, drops[1:]  # each is the operation before's


async def peer(api, transport, size, chan, write):
    local = array(size, 3)  # real pages (zeros would all be the one zero page)
    if api == "connect":
        from scad.connect import Connector, Descriptor, RdmaMetadata
        connector = Connector(transport=transport, busy_poll_us=BUSY_POLL_US)
    else:
        from scad.rdma import RdmaBuffer, RdmaManager
        if api == "rdma":
            RdmaManager.get(transport=transport, busy_poll_us=BUSY_POLL_US)
        else:
            RdmaManager.get(transport=transport)  # the transport the tensor transport's reads use
            from scad.tensor_transport import ScadTensorTransport
            tensors = ScadTensorTransport(busy_poll_us=BUSY_POLL_US)
    pin_main_thread("active")
    # The peer's stamps go to the owner as integer nanoseconds: the repr of a float, Python's
    # shortest round-trip digits, costs about a microsecond each, and the word's step would carry it.
    stamp = time.perf_counter_ns
    dropped_ns = 0  # scad.rdma: how long the last operation's drop took, after its word
    while True:
        seen, msg = stamped_command(chan)
        if msg is None:
            return
        t = [seen]
        if api == "connect":
            md = RdmaMetadata.from_json(msg["record"])
            t.append(stamp())
            op = connector.begin_write(Descriptor(local), md) if write else connector.begin_read(md, Descriptor(local))
            t.append(stamp())
            await op.wait_for_completion()
        elif api == "rdma":
            buf = RdmaBuffer.from_json(msg["record"])
            t.append(stamp())
            await (buf.write_from(local) if write else buf.read_into(local))
            t.append(stamp())
        else:
            meta = pickle.loads(base64.b64decode(msg["meta"]))
            t.append(stamp())
            tensors.recv_multiple_tensors(msg["object"], meta, tensors.get_communicator_metadata(), target_buffers=[local])
            t.append(stamp())
        t.append(stamp())
        chan.send({"t": t, "dropped_ns": dropped_ns})
        if api == "rdma":  # its link let go of once the owner has its word, as transfer_scad.py's peer does
            t0 = stamp()
            buf.drop()
            dropped_ns = stamp() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("api", choices=tuple(STEPS))
    ap.add_argument("transport", nargs="?", default="shm", choices=("shm", "tcp"))
    ap.add_argument("--op", choices=("read", "write"), default="read",
                    help="the peer reads the lent memory or writes it (scad.tensor_transport only reads)")
    ap.add_argument("--size", type=int, default=64, help="bytes moved (default 64)")
    ap.add_argument("--runs", type=int, default=400)
    args = ap.parse_args()
    if args.size < 1 or args.runs < 1:
        ap.error("--size and --runs must be at least 1")
    if args.api == "tensor" and args.op == "write":
        ap.error("scad.tensor_transport only reads (Ray's receiver fetches the sender's tensors)")
    write = args.op == "write"
    runs = args.runs + WARMUP
    # Forked before either side has loaded libd.
    pid, chan = fork_pair(lambda chan: asyncio.run(peer(args.api, args.transport, args.size, chan, write)))
    rows, drops = asyncio.run(owner(args.api, args.transport, args.size, runs, chan, write))
    os.waitpid(pid, 0)
    before, at_peer, after = STEPS[args.api]
    names = before + at_peer + after + ["total (the owner's view)"]
    steps = {name: [] for name in names}
    for own, theirs in rows[WARMUP:]:
        # The owner's stamps before the record went, the peer's (its first: the line seen), the owner's after.
        marks = own[:4] + theirs + own[4:]
        for name, a, b in zip(names, marks, marks[1:]):
            steps[name].append((b - a) * 1e6)
        steps[names[-1]].append((own[-1] - own[0]) * 1e6)
    print(f"one {args.size}-byte {args.op} operation of scad.{args.api if args.api != 'tensor' else 'tensor_transport'} "
          f"over {args.transport}, median µs of {args.runs}:")
    for name, v in steps.items():
        print(f"  {name:52} {statistics.median(v):8.1f}")
    if args.api == "rdma":
        print(f"  {'peer, after its word: drop (its link let go)':52} {statistics.median(drops[WARMUP:]):8.1f}")


if __name__ == "__main__":
    main()
