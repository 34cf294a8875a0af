#!/usr/bin/env python3
"""A peer's operation taken apart as bench/api_steps.py takes ours apart: the same pair of
processes, pipe and stamps, so that a step of ours can be set beside the peer's. Runs in the
peers' environment (.bench-venv, made by bench/transfer.py's set-up), over tcp:

    .bench-venv/bin/python bench/peer_steps.py [--peer mooncake|nixl] [--op read|write] [--size 64] [--runs 1000]

Each is driven as bench/transfer_peers.py drives it. Mooncake Transfer Engine (protocol tcp,
P2PHANDSHAKE): the owner registers its memory and hands the address to the peer over the pipe;
the peer moves the bytes with one synchronous transfer and says so; the owner unregisters. NIXL
(UCX_TLS=tcp, no progress thread): the owner registers its memory and hands the registration's
metadata and descriptors to the peer; the peer loads them, moves the bytes with one transfer
request that notifies the owner, and releases it; the owner waits for the notification and
deregisters (the peer's word on the pipe, untimed, comes after). The peer's own memory is
registered once, outside the timed part. Medians in microseconds after 100 warm-up operations. The host's pace moves by
half from one minute to the next: compare with a run of bench/api_steps.py made right before or
after, not with figures from another hour.
"""
import argparse
import base64
import os
import pathlib
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import numpy  # noqa: E402,F401 - loaded before anything is timed (transfer_pair.array makes the buffers)

from transfer_pair import array, fork_pair, pin_main_thread, stamped_command  # noqa: E402

perf = time.perf_counter
WARMUP = 100
STEPS = {"mooncake": ("owner: register_memory", "owner: the address onto the pipe", "pipe to the peer",
         "peer: the line read and parsed", "peer: transfer_sync_read|write", "the peer's word reaches the owner",
         "owner: unregister_memory"),
         "nixl": ("owner: register_memory", "owner: metadata and descriptors", "owner: the record onto the pipe",
                  "pipe to the peer", "peer: the line read and parsed", "peer: add_remote_agent, deserialize_descs",
                  "peer: initialize_xfer, transfer, wait, release", "the notification reaches the owner",
                  "owner: deregister_memory")}


def engine():
    from mooncake.engine import TransferEngine
    e = TransferEngine()
    if e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") != 0:
        raise RuntimeError("Mooncake's transfer engine did not initialize")
    return e


def peer(chan, size, write):
    e = engine()
    pin_main_thread("active")  # as bench/transfer.py's workers run
    local = array(size, 3)
    if e.register_memory(local.ctypes.data, size) != 0:
        raise RuntimeError("Mooncake register_memory failed")
    target = chan.recv()["target"]
    chan.send({"ok": True})
    move = e.transfer_sync_write if write else e.transfer_sync_read
    stamp = time.perf_counter_ns  # integers to the owner, as bench/api_steps.py's peer sends them
    while True:
        seen, msg = stamped_command(chan)
        if msg is None:
            return
        t = [seen, stamp()]
        if move(target, local.ctypes.data, msg["addr"], size) != 0:
            raise RuntimeError("Mooncake transfer failed")
        t.append(stamp())
        chan.send({"t": t})


def owner(chan, size, runs):
    e = engine()
    pin_main_thread("owner")
    chan.send({"target": f"127.0.0.1:{e.get_rpc_port()}"})
    chan.recv()
    lent = array(size, 7)
    rows = []
    for _ in range(runs):
        t0 = perf()
        if e.register_memory(lent.ctypes.data, size) != 0:
            raise RuntimeError("Mooncake register_memory failed")
        t1 = perf()
        chan.send({"addr": lent.ctypes.data})
        t2 = perf()
        theirs = [ns * 1e-9 for ns in chan.recv_polling()["t"]]  # perf_counter's clock, in nanoseconds
        t3 = perf()
        e.unregister_memory(lent.ctypes.data)
        t4 = perf()
        rows.append([t0, t1, t2] + theirs + [t3, t4])
    chan.send({"quit": True})
    return rows


def nixl_peer(chan, size, write):
    from transfer_peers import Nixl
    lib = Nixl("active")
    pin_main_thread("active")
    local = array(size, 3)
    lib.reg(local)
    lib.agent.add_remote_agent(base64.b64decode(chan.recv()["owner_meta"]))
    chan.send({"ok": True})
    stamp = time.perf_counter_ns
    while True:
        lib.agent.get_new_notifs()  # (a notification still queued in UCX leaves meanwhile, as in transfer_peers.py)
        seen, msg = stamped_command(chan, lib.agent.get_new_notifs)
        if msg is None:
            return
        t = [seen, stamp()]
        lib.agent.add_remote_agent(base64.b64decode(msg["meta"]))
        remote = lib.agent.deserialize_descs(base64.b64decode(msg["descs"][0]))
        t.append(stamp())
        lib.transfer("write" if write else "read", [local], remote, "owner", msg["tag"].encode())
        t.append(stamp())
        chan.send({"t": t})


def nixl_owner(chan, size, runs):
    from transfer_peers import Nixl
    lib = Nixl("owner")
    pin_main_thread("owner")
    chan.send({"owner_meta": base64.b64encode(lib.agent.get_agent_metadata()).decode()})
    chan.recv()
    lent = array(size, 7)
    rows = []
    for i in range(runs):
        tag = f"op{i:09d}"
        t0 = perf()
        reg = lib.reg(lent)
        t1 = perf()
        meta = lib.agent.get_partial_agent_metadata(reg, False, ["UCX"])
        record = {"tag": tag, "meta": base64.b64encode(meta).decode(),
                  "descs": [base64.b64encode(lib.agent.get_serialized_descs(lib.descs([(lent.ctypes.data, size)]))).decode()]}
        t2 = perf()
        chan.send(record)
        t3 = perf()
        lib.wait_notifs("active", [tag.encode()])
        t4 = perf()
        lib.end([reg])
        t5 = perf()
        theirs = [ns * 1e-9 for ns in chan.recv_polling()["t"]]
        rows.append([t0, t1, t2, t3] + theirs + [t4, t5])
    chan.send({"quit": True})
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peer", choices=("mooncake", "nixl"), default="mooncake")
    ap.add_argument("--op", choices=("read", "write"), default="read")
    ap.add_argument("--size", type=int, default=64, help="bytes moved (default 64)")
    ap.add_argument("--runs", type=int, default=1000)
    args = ap.parse_args()
    if args.size < 1 or args.runs < 1:
        ap.error("--size and --runs must be at least 1")
    if args.peer == "nixl":
        os.environ.update(UCX_TLS="tcp", UCX_NET_DEVICES="lo")  # as bench/transfer.py runs it over tcp
    peer_fn, owner_fn = (nixl_peer, nixl_owner) if args.peer == "nixl" else (peer, owner)
    # Forked before either side has loaded the engine.
    pid, chan = fork_pair(lambda chan: peer_fn(chan, args.size, args.op == "write"))
    rows = owner_fn(chan, args.size, args.runs + WARMUP)
    os.waitpid(pid, 0)
    name = "NIXL" if args.peer == "nixl" else "Mooncake Transfer Engine"
    print(f"one {args.size}-byte {args.op} operation of {name} over tcp, median µs of {args.runs}:")
    rows = rows[WARMUP:]
    for i, name in enumerate(STEPS[args.peer]):
        print(f"  {name:52} {statistics.median([(r[i + 1] - r[i]) * 1e6 for r in rows]):8.1f}")
    total = statistics.median([(r[-1] - r[0]) * 1e6 for r in rows])
    label = "total (the owner's view)"
    print(f"  {label:52} {total:8.1f}")


if __name__ == "__main__":
    main()
