"""bench/transfer.py's worker for this project's APIs, in the project's environment (.venv and the
build's disagg module). One process is the owner, the other the active side (transfer_pair.py).

    python bench/transfer_scad.py owner API TRANSPORT PLAN_JSON     (a result line per cell the driver asks for)

API: libd (plain transport reads and writes, xfer cells), connect (scad.connect), rdma (scad.rdma),
tensor (scad.tensor_transport); TRANSPORT: shm or tcp (forced on the active side).
"""
import asyncio
import base64
import json
import os
import pathlib
import pickle
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "build" / "python"), str(ROOT / "bindings" / "python"), str(ROOT / "bench")]

import numpy  # noqa: E402,F401 - loaded before anything is timed (transfer_pair.array makes the buffers)

# How long our waits poll before they sleep (the APIs' busy_poll_us): NIXL and Mooncake poll their
# transfers (and NIXL's owner its notifications) with a core spinning, so ours do too.
BUSY_POLL_US = 500.0
# scad.connect's owner waits for the peer's word as NIXL's owner spins on its notifications: as
# long as any operation here takes (up to a second), never asleep in the middle of a large copy
# (over shm a 16 MiB one outlasts 500 µs, and the wake-up cost 30-40 µs). The owners of scad.rdma
# and scad.tensor_transport poll the pipe for their peer's word, without limit.
OWNER_POLL_US = 1_000_000.0
# How long the plain-libd owner's memory server polls after each request before its thread sleeps
# (the server's busy_poll_us), as NIXL's owner drives its worker while the peer transfers. Longer
# windows take a core the bulk transfers need on two cores.
SERVER_POLL_US = 100.0

from transfer_pair import array, arrays, pin_main_thread, await_command, check, claim_stdout, Channel, driver_cells, emit, fail, fill_value, measure, measure_async, pause_active, pause_for_driver, relay_pauses, start_active, stdio_channel  # noqa: E402

perf = time.perf_counter

# The APIs' classes, loaded by load_apis() once stdout is claimed and before anything is timed, as
# the peers' workers load their libraries and make their agents and engines up front: an import
# statement inside a timed step would cost a lookup in every operation.
Connector = Descriptor = RdmaMetadata = RdmaBuffer = RdmaManager = ScadTensorTransport = None


def load_apis():
    global Connector, Descriptor, RdmaMetadata, RdmaBuffer, RdmaManager, ScadTensorTransport
    from scad.connect import Connector, Descriptor, RdmaMetadata
    from scad.rdma import RdmaBuffer, RdmaManager
    from scad.tensor_transport import ScadTensorTransport


# ---- the owner ---------------------------------------------------------------------------------
class Owner:
    def __init__(self, api, transport):
        self.api, self.transport = api, transport
        argv = [sys.executable, __file__, "active", api, transport]
        self.proc, self.peer = start_active(argv)
        self.connector = self.manager = self.tensors = None
        self.objects = 0
        # The API's object made now, as the peers' workers make their agents and engines before
        # anything is timed (each starts its memory server at its first loan, inside the pair's
        # first operation).
        if api == "connect":
            self.connector = Connector(busy_poll_us=OWNER_POLL_US)
        elif api in ("rdma", "tensor"):
            self.manager = RdmaManager.get()
            if api == "tensor":
                self.tensors = ScadTensorTransport()
        # Over tcp scad.rdma's and scad.tensor_transport's owners serve the peer's transfers on
        # their own thread while they poll for its word (RdmaManager.progress), as NIXL's owner
        # drives its agent (scad.connect's wait does so itself). Over shm the owner's server takes
        # no part in a transfer.
        self.drive = self.manager.progress if self.manager is not None and transport == "tcp" else None
        pin_main_thread("owner")

    async def run(self, plan):
        self.peer.send({"cmd": "ping"})
        self.peer.recv()
        emit({"ready": True})
        for index in driver_cells():
            mode, size, op, inflight = plan[index]
            value = fill_value(index)
            if mode == "xfer":
                row = self.xfer(size, op, inflight, value)
            else:
                row = await self.op(size, op, inflight, value)
            row.update(api=self.api, transport=self.transport, mode=mode, size=size, op=op, inflight=inflight)
            self.peer.send({"cmd": "rest"})  # its active side sleeps until the pair's next cell
            self.peer.recv()
            emit(row)
        self.peer.send({"cmd": "quit"})
        self.proc.wait(30)

    # Steady-state transfers: the owner only serves one lent array, the active side measures.
    def xfer(self, size, op, inflight, value):
        from scad import _memserver  # (plain libd: the memory server alone)
        action, srv, ep = _memserver.start(f"bench-owner-{os.getpid()}", "127.0.0.1", False, SERVER_POLL_US)
        remote = array(size, value)
        srv.expose("x", remote.ctypes.data, remote.nbytes)
        config = srv.grant_ex("x", "*", rights="rw")
        self.peer.send({"cmd": "xfer", "config": config, "endpoint": ep, "size": size, "op": op,
                        "inflight": inflight, "value": value})
        row = relay_pauses(self.peer)
        if op == "write":
            row["verified"] = row["verified"] and int(remote[0]) == 255 - value
        action.terminate()
        return row

    async def op(self, size, op, inflight, value):
        lent = arrays(inflight, size, value)
        self.peer.send({"cmd": "prepare", "size": size, "op": op, "inflight": inflight, "value": value})
        self.peer.recv()
        cycle = {"connect": self.connect_cycle, "rdma": self.rdma_cycle, "tensor": self.tensor_cycle}[self.api]
        first, times = await measure_async(lambda: cycle(lent, op), self.pause)
        verified = True
        if op == "write":
            verified = check(lent, 255 - value)
        else:
            self.peer.send({"cmd": "verify"})
            verified = self.peer.recv()["verified"]
        return {"first": first, "times": times, "verified": verified}

    def pause(self):
        """Between two slices of a cell: the active side sleeps on the pipe, and so does this
        owner, on the driver's, until the pair's turn comes again."""
        self.peer.send({"cmd": "pause"})
        self.peer.recv()
        pause_for_driver()

    async def connect_cycle(self, lent, op):
        t0 = perf()
        make = self.connector.create_readable if op == "read" else self.connector.create_writable
        # Several buffers at once are one operation over a list of descriptors (Dynamo's way).
        descs = [Descriptor(a) for a in lent]
        passive = make(descs[0] if len(descs) == 1 else descs)
        self.peer.send({"cmd": "go", "records": [passive.metadata().to_json()]})
        await passive.wait_for_completion()
        t1 = perf()
        # Untimed, the peer's word that its side ended too, polled like every wait of the pair: an
        # owner asleep on the pipe begins its next operation just woken, on cold caches, and that
        # operation would carry it (a 1 MiB one over shm took 190-250 µs instead of 145).
        self.peer.recv_polling()
        return t1 - t0

    async def rdma_cycle(self, lent, op):
        t0 = perf()
        # Several memories: one buffer over the list, under one key (a buffer each, Monarch's
        # own way, costs a key, a queue pair and a transfer per memory); a buffer each where the
        # host has an RDMA device (a remote key reaches one memory there).
        try:
            bufs = [self.manager.request_buffer(lent if len(lent) > 1 else lent[0])]
        except NotImplementedError:
            bufs = [self.manager.request_buffer(a) for a in lent]
        self.peer.send({"cmd": "go", "records": [b.to_json() for b in bufs]})
        self.peer.recv_polling(self.drive)  # Monarch has no completion signal: the peer says so
        for b in bufs:
            b.drop()
        return perf() - t0

    async def tensor_cycle(self, lent, op):
        self.objects += 1
        obj = f"obj-{self.objects}"
        t0 = perf()
        meta = self.tensors.extract_tensor_transport_metadata(obj, lent)
        self.peer.send({"cmd": "go", "object": obj, "meta": base64.b64encode(pickle.dumps(meta)).decode()})
        self.peer.recv_polling(self.drive)  # Ray calls garbage_collect once the object is out of scope
        self.tensors.garbage_collect(obj, meta)
        return perf() - t0


# ---- the active side ---------------------------------------------------------------------------
class Active:
    def __init__(self, api, transport, chan):
        self.api, self.transport, self.chan = api, transport, chan
        self.local = []
        self.op = "read"
        self.connector = self.manager = self.tensors = None
        if api == "connect":  # made now, as the owner's (above)
            self.connector = Connector(transport=transport, busy_poll_us=BUSY_POLL_US)
        elif api == "rdma":
            self.manager = RdmaManager.get(transport=transport, busy_poll_us=BUSY_POLL_US)
        elif api == "tensor":
            RdmaManager.get(transport=transport)  # the transport the tensor transport's reads use
            self.tensors = ScadTensorTransport(busy_poll_us=BUSY_POLL_US)
        pin_main_thread("active")

    async def serve(self):
        resting = True  # between cells: asleep on the pipe
        while True:
            await_command(spin=not resting)
            msg = self.chan.recv()
            cmd = msg["cmd"]
            if cmd == "quit":
                return
            if cmd in ("ping", "rest"):
                resting = True
                self.local = []
                self.chan.send({"ok": True})
            elif cmd == "pause":  # between two slices of a cell: asleep, the cell's memory kept
                resting = True
                self.chan.send({"ok": True})
            elif cmd == "xfer":
                resting = False
                self.chan.send(self.xfer(msg))
            elif cmd == "prepare":
                resting = False
                self.op, self.value = msg["op"], msg["value"]
                self.local = arrays(msg["inflight"], msg["size"], 255 - msg["value"])
                self.chan.send({"ok": True})
            elif cmd == "verify":
                self.chan.send({"verified": check(self.local, self.value)})
            elif cmd == "go":
                resting = False  # (after a pause, too: the cell goes on)
                after = await getattr(self, f"{self.api}_go")(msg)
                self.chan.send({"done": True})
                if after is not None:
                    after()  # clean-up the owner need not wait for (as NIXL's initiator releases its handle)

    def xfer(self, msg):
        from disagg import LibdAction
        size, inflight, ep = msg["size"], msg["inflight"], msg["endpoint"]
        local = array(size * inflight, 255 - msg["value"])
        action = LibdAction("bench")
        where = f"path,{ep['path']}" if self.transport == "shm" else f"host,{ep['host']};port,{ep['port']}"
        spin = f";busy_poll_us,{int(BUSY_POLL_US)}" if self.transport == "tcp" else ""
        action.add_transport(f"x;{self.transport};{where};timeout_ms,60000{spin}")
        config = ";".join(p for p in msg["config"].split(";") if p.split(",", 1)[0] in ("grant", "secret"))
        action.config_transport("x", config)
        t = action.get_transport("x", "rdma")
        t.reg_memory(local.ctypes.data, local.nbytes, keep=local)
        t.connect()
        read = msg["op"] == "read"
        sync = t.read if read else t.write
        start = t.read_async if read else t.write_async

        def cycle():
            t0 = perf()
            if inflight == 1:
                sync(size, 0, 0)
            else:
                ops = [start(size, 0, i * size) for i in range(inflight)]
                for o in ops:
                    o.wait()
            return perf() - t0

        first, times = measure(cycle, lambda: pause_active(self.chan))
        verified = (not read) or (int(local[0]) == msg["value"] and int(local[-1]) == msg["value"])
        action.terminate()
        return {"first": first, "times": times, "verified": verified, "impl": self.transport}

    async def connect_go(self, msg):
        md = RdmaMetadata.from_json(msg["records"][0])
        descs = [Descriptor(a) for a in self.local]
        local = descs[0] if len(descs) == 1 else descs
        active = self.connector.begin_read(md, local) if self.op == "read" else self.connector.begin_write(local, md)
        await active.wait_for_completion()

    async def rdma_go(self, msg):
        bufs = [RdmaBuffer.from_json(text) for text in msg["records"]]
        if len(bufs) == 1:  # one buffer, over the list when there are several
            local = self.local if len(self.local) > 1 else self.local[0]
            await (bufs[0].read_into(local) if self.op == "read" else bufs[0].write_from(local))
        else:  # a buffer each, moved at once
            await asyncio.gather(*[(b.read_into(l) if self.op == "read" else b.write_from(l))
                                   for b, l in zip(bufs, self.local)])
        # A peer done with a buffer lets go of its link to it, once it has told the owner: the
        # owner waits for its word, not for that (NIXL's initiator releases its transfer handle
        # after its notification has gone, scad.connect's active side after its notification).
        return lambda: [b.drop() for b in bufs]

    async def tensor_go(self, msg):
        meta = pickle.loads(base64.b64decode(msg["meta"]))
        self.tensors.recv_multiple_tensors(msg["object"], meta, self.tensors.get_communicator_metadata(),
                                           target_buffers=self.local)


def main():
    role, api, transport = sys.argv[1:4]
    claim_stdout()
    load_apis()
    if role == "owner":
        plan = json.loads(sys.argv[4])
        try:
            asyncio.run(Owner(api, transport).run(plan))
        except Exception as e:  # the driver prints it and goes on with the other APIs
            fail(f"{type(e).__name__}: {e}")
            raise
    else:
        chan = stdio_channel()
        try:
            asyncio.run(Active(api, transport, chan).serve())
        except Exception as e:
            chan.send({"error": f"{type(e).__name__}: {e}"})
            raise


if __name__ == "__main__":
    main()
