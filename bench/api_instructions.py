#!/usr/bin/env python3
"""Instructions one operation of each Python API executes, counted by valgrind (callgrind):

    bench/api_instructions.py [--apis rdma,tensor,connect,nixl] [--ops 2000] [--top 0]

On a shared two-core host one operation's time drifts by a third from one minute to the next, and
a change worth a few percent cannot be seen in microseconds. An instruction count is the same
from run to run, whatever else the host does, so it says whether a change to an API's Python
made its operation cheaper (it does not count the kernel's work: the system calls' share, and
waiting, are bench/api_steps.py's and bench/transfer.py's to show).

Both sides run in one process, over shm, as bench/transfer.py's pair runs them: the owner lends a
64-byte array and writes the record into a JSON line (base64 of the pickle for
scad.tensor_transport), the peer parses it and reads the bytes into its own array, then each
side ends its part (the peer lets go of its link, the owner ends the loan; scad.connect's owner
waits for the peer's notification, polling as bench/transfer.py's does: its count varies by about
2% from run to run, the others' by less than 0.3%). `nixl` counts NIXL 1.5.1's operation, driven
as bench/transfer_peers.py drives it, in the bench's own environment (it spins on the transfer's
state and the notification: its count varies with the timing too). Per operation: the instructions of a run of --ops
operations less those of a run of none, after 50 operations of warm-up in both (the first
connects). --top K also lists the K functions (inclusive) that cost most per operation.
"""
import argparse
import os
import pathlib
import re
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
WARMUP = 50
SIZE = 64


def run_nixl(ops: int) -> None:
    """NIXL 1.5.1's operation as bench/transfer_peers.py drives it, both agents in this process
    (in the bench's own environment, .bench-venv): the owner registers the memory and writes its
    metadata and descriptors into a JSON line (base64), the peer loads them, makes and runs a
    transfer request with a notification, and releases it; the owner sees the notification and
    deregisters. Both spin where the bench's processes spin (the transfer's state, the
    notification)."""
    import base64
    import json

    import numpy
    from nixl._api import nixl_agent, nixl_agent_config

    owner = nixl_agent("owner", nixl_agent_config(enable_prog_thread=False, backends=["UCX"]))
    peer = nixl_agent("active", nixl_agent_config(enable_prog_thread=False, backends=["UCX"]))
    peer.add_remote_agent(owner.get_agent_metadata())
    owner.add_remote_agent(peer.get_agent_metadata())
    lent = numpy.full(SIZE, 7, dtype=numpy.uint8)
    local = numpy.zeros(SIZE, dtype=numpy.uint8)
    peer.register_memory([(local.ctypes.data, local.nbytes, 0, "")], "DRAM")  # once, as the bench's peer
    local_descs = peer.get_xfer_descs([(local.ctypes.data, local.nbytes, 0)], "DRAM")

    def operation(i):
        tag = f"op{i:09d}"
        reg = owner.register_memory([(lent.ctypes.data, lent.nbytes, 0, "")], "DRAM")
        meta = owner.get_partial_agent_metadata(reg, False, ["UCX"])
        descs = owner.get_xfer_descs([(lent.ctypes.data, lent.nbytes, 0)], "DRAM")
        line = json.dumps({"cmd": "go", "tag": tag, "meta": base64.b64encode(meta).decode(),
                           "descs": [base64.b64encode(owner.get_serialized_descs(descs)).decode()]})
        msg = json.loads(line)
        peer.add_remote_agent(base64.b64decode(msg["meta"]))
        remote = peer.deserialize_descs(base64.b64decode(msg["descs"][0]))
        handle = peer.initialize_xfer("READ", local_descs, remote, "owner", msg["tag"].encode())
        state = peer.transfer(handle)
        while state == "PROC":
            owner.get_new_notifs()  # the owner's worker driven, as the bench's owner does
            state = peer.check_xfer_state(handle)
        if state != "DONE":
            raise SystemExit(f"NIXL transfer ended {state}")
        handle.release()
        while not owner.check_remote_xfer_done("active", tag.encode()):
            pass
        owner.deregister_memory(reg)

    for i in range(WARMUP + ops):
        operation(i)
    if int(local[0]) != 7:
        raise SystemExit("the bytes did not arrive")
    sys.stdout.flush()
    os._exit(0)  # NIXL 1.5.1's agents crash in their teardown at exit (SIGSEGV, as bench/transfer.py notes)


def run_operations(api: str, ops: int) -> None:
    """The measured program: WARMUP + ops operations of `api` in this process."""
    if api == "nixl":
        run_nixl(ops)
        return
    sys.path[:0] = [str(ROOT / "build" / "python"), str(ROOT / "bindings" / "python")]
    import asyncio
    import base64
    import json
    import pickle

    import numpy

    lent = numpy.full(SIZE, 7, dtype=numpy.uint8)
    local = numpy.zeros(SIZE, dtype=numpy.uint8)
    if api == "connect":
        from scad.connect import Connector, Descriptor, RdmaMetadata
        owner, peer = Connector(busy_poll_us=500), Connector(transport="shm", busy_poll_us=500)  # as the bench polls

        async def operation(i):
            passive = owner.create_readable(Descriptor(lent))
            line = json.dumps({"cmd": "go", "records": [passive.metadata().to_json()]})
            msg = json.loads(line)
            active = peer.begin_read(RdmaMetadata.from_json(msg["records"][0]), Descriptor(local))
            await active.wait_for_completion()
            await passive.wait_for_completion()
    elif api == "rdma":
        from scad.rdma import RdmaBuffer, RdmaManager
        owner = RdmaManager.get()
        peer = RdmaManager(host=None, transport="shm", timeout=30.0)  # its own queue pairs: not the owner's

        async def operation(i):
            buf = owner.request_buffer(lent)
            msg = json.loads(json.dumps({"cmd": "go", "records": [buf.to_json()]}))
            remote = RdmaBuffer.from_json(msg["records"][0])
            await peer.transfer(remote, local, 0, 3.0, read=True)
            peer.drop(remote)
            buf.drop()
    elif api == "tensor":
        from scad.rdma import RdmaManager
        from scad.tensor_transport import ScadTensorTransport
        RdmaManager.get(transport="shm")
        transport = ScadTensorTransport()

        async def operation(i):
            meta = transport.extract_tensor_transport_metadata(f"o{i}", [lent])
            line = json.dumps({"cmd": "go", "object": f"o{i}", "meta": base64.b64encode(pickle.dumps(meta)).decode()})
            msg = json.loads(line)
            got = pickle.loads(base64.b64decode(msg["meta"]))
            transport.recv_multiple_tensors(msg["object"], got, transport.get_communicator_metadata(),
                                            target_buffers=[local])
            transport.garbage_collect(f"o{i}", meta)
    else:
        raise SystemExit(f"no API {api!r}")

    async def main():
        for i in range(WARMUP + ops):
            await operation(i)
        if int(local[0]) != 7:
            raise SystemExit("the bytes did not arrive")

    asyncio.run(main())


def python_for(api: str) -> str:
    """NIXL runs in the bench's own environment (bench/peer-venv makes it), ours in this one."""
    if api != "nixl":
        return sys.executable
    return subprocess.run([str(ROOT / "bench" / "peer-venv")], capture_output=True, text=True, check=True).stdout.strip()


def count(api: str, ops: int, out: str) -> int:
    # UCX_TLS: NIXL's transports in bench/transfer.py's shm cells.
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", PYTHONHASHSEED="0", UCX_TLS="shm,tcp")
    proc = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", python_for(api), __file__,
                           "--run", api, str(ops)], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        sys.exit(f"{api}: the measured run failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    found = re.search(r"Collected : (\d+)", proc.stderr)
    if not found:
        sys.exit(f"{api}: valgrind printed no count:\n{proc.stderr[-2000:]}")
    return int(found.group(1))


def functions(path: str) -> dict:
    """Inclusive instructions per function of a callgrind output."""
    text = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--auto=no", "--threshold=100", path],
                          capture_output=True, text=True).stdout
    out = {}
    for line in text.splitlines():
        m = re.match(r"\s*([\d,]+) \(\s*[\d.]+%\)\s+(\S.*)", line)
        if m and "PROGRAM TOTALS" not in line:
            # One function may be listed under its source's absolute and relative path: the same
            # count, kept once.
            name = re.sub(r"\s\[.*\]$", "", m.group(2)).replace(f"{ROOT}/", "")
            name = re.sub(r"^/tmp/python-build[^/]*/[^/]*/", "", name)
            out[name] = max(out.get(name, 0), int(m.group(1).replace(",", "")))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--apis", default="rdma,tensor,connect")
    ap.add_argument("--ops", type=int, default=2000)
    ap.add_argument("--top", type=int, default=0)
    ap.add_argument("--run", nargs=2, help=argparse.SUPPRESS)  # the measured program, under valgrind
    args = ap.parse_args()
    if args.run:
        run_operations(args.run[0], int(args.run[1]))
        return
    if args.ops < 1:
        ap.error("--ops must be at least 1")
    with tempfile.TemporaryDirectory() as tmp:
        for api in args.apis.split(","):
            base, full = os.path.join(tmp, f"{api}.0"), os.path.join(tmp, f"{api}.n")
            per_op = (count(api, args.ops, full) - count(api, 0, base)) / args.ops
            name = {"tensor": "scad.tensor_transport", "nixl": "NIXL 1.5.1"}.get(api, f"scad.{api}")
            print(f"{name:27} {per_op:>10,.0f} instructions per operation "
                  f"({args.ops} operations)")
            if args.top:
                a, b = functions(base), functions(full)
                rows = sorted(((b.get(k, 0) - a.get(k, 0)) / args.ops, k) for k in set(a) | set(b))
                for n, name in [r for r in reversed(rows) if r[0] > 0][:args.top]:
                    print(f"    {n:>10,.0f}  {name[:140]}")


if __name__ == "__main__":
    main()
