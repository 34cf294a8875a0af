"""bench/transfer.py's worker for the peers, in their own environment (.bench-venv, made by
bench/peer-venv from the package registry): NIXL 1.5.1 (UCX inside) and Mooncake Transfer Engine
(mooncake-transfer-engine-non-cuda), each driven through its own Python API the way
transfer_scad.py drives ours (transfer_pair.py says what a cell is).

    python bench/transfer_peers.py owner nixl|mooncake shm|tcp PLAN_JSON

NIXL runs its UCX backend with the transports the driver picks (UCX_TLS); it runs without its
progress thread and its waits spin with sched_yield: on this 2-core machine that is its fastest
stable setting (with the progress thread, or spinning without yielding, a transfer now and then
stalls for 8-30 ms). Mooncake runs protocol tcp with P2PHANDSHAKE metadata (no metadata server):
a peer is named by its host and RPC port.
"""
import base64
import json
import os
import pathlib
import select
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import numpy  # noqa: E402,F401 - loaded before anything is timed (transfer_pair.array makes the buffers)

from transfer_pair import array, arrays, pin_main_thread, await_command, check, claim_stdout, driver_cells, emit, fail, fill_value, measure, pause_active, pause_for_driver, relay_pauses, start_active, stdio_channel  # noqa: E402

perf = time.perf_counter
yield_cpu = os.sched_yield


def b64(data):
    return base64.b64encode(data).decode()


# ---- NIXL ---------------------------------------------------------------------------------------
class Nixl:
    def __init__(self, name):
        from nixl._api import nixl_agent, nixl_agent_config
        self.agent = nixl_agent(name, nixl_agent_config(enable_prog_thread=False, backends=["UCX"]))
        self.name = name

    def reg(self, a):
        return self.agent.register_memory([(a.ctypes.data, a.nbytes, 0, "")], "DRAM")

    def descs(self, pairs):
        return self.agent.get_xfer_descs([(addr, size, 0) for addr, size in pairs], "DRAM")

    # owner
    def lend(self, lent):
        regs = [self.reg(a) for a in lent]
        meta = self.agent.get_partial_agent_metadata(regs[0] if len(regs) == 1 else self._merge(lent), False, ["UCX"])
        # One descriptor list for all of them: a batch is one transfer request (see transfer()).
        descs = self.descs([(a.ctypes.data, a.nbytes) for a in lent])
        return regs, {"meta": b64(meta), "descs": [b64(self.agent.get_serialized_descs(descs))]}

    def _merge(self, lent):
        return self.agent.get_reg_descs([(a.ctypes.data, a.nbytes, 0, "") for a in lent], "DRAM")

    def wait_notifs(self, peer, tags):
        for tag in tags:
            while not self.agent.check_remote_xfer_done(peer, tag):
                yield_cpu()

    def end(self, regs):
        for r in regs:
            self.agent.deregister_memory(r)

    # active
    def transfer(self, op, local, remote_descs, peer, tag):
        """One transfer request for every buffer of the batch, with one notification (NIXL's own
        way of moving several buffers at once)."""
        handle = self.agent.initialize_xfer("READ" if op == "read" else "WRITE",
                                            self.descs([(l.ctypes.data, l.nbytes) for l in local]), remote_descs, peer, tag)
        self.run([handle])
        handle.release()

    def run(self, handles):
        states = [self.agent.transfer(h) for h in handles]
        for h, st in zip(handles, states):
            while st == "PROC":
                yield_cpu()
                st = self.agent.check_xfer_state(h)
            if st != "DONE":
                raise RuntimeError(f"NIXL transfer ended {st}")


# ---- Mooncake -----------------------------------------------------------------------------------
class Mooncake:
    def __init__(self):
        from mooncake.engine import TransferEngine
        self.engine = TransferEngine()
        rc = self.engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "")
        if rc != 0:
            raise RuntimeError(f"Mooncake initialize failed ({rc})")
        self.target = f"127.0.0.1:{self.engine.get_rpc_port()}"

    def reg(self, a):
        rc = self.engine.register_memory(a.ctypes.data, a.nbytes)
        if rc != 0:
            raise RuntimeError(f"Mooncake register_memory failed ({rc})")

    def transfer(self, op, local, remote_addrs, target):
        e = self.engine
        if len(local) == 1:
            fn = e.transfer_sync_read if op == "read" else e.transfer_sync_write
            rc = fn(target, local[0].ctypes.data, remote_addrs[0], local[0].nbytes)
        else:
            fn = e.batch_transfer_sync_read if op == "read" else e.batch_transfer_sync_write
            rc = fn(target, [l.ctypes.data for l in local], remote_addrs, [l.nbytes for l in local])
        if rc != 0:
            raise RuntimeError(f"Mooncake transfer failed ({rc})")


# ---- the owner ---------------------------------------------------------------------------------
class Owner:
    def __init__(self, api, transport):
        self.api, self.transport = api, transport
        self.proc, self.peer = start_active([sys.executable, __file__, "active", api, transport])
        if api == "nixl":
            self.lib = Nixl("owner")
            self.peer.send({"owner_meta": b64(self.lib.agent.get_agent_metadata())})
        else:
            self.lib = Mooncake()
            self.peer.send({"target": self.lib.target})
        pin_main_thread("owner")
        self.peer.recv()
        self.ops = 0

    def run(self, plan):
        emit({"ready": True})
        for index in driver_cells():
            mode, size, op, inflight = plan[index]
            value = fill_value(index)
            row = (self.xfer if mode == "xfer" else self.op)(size, op, inflight, value)
            row.update(api=self.api, transport=self.transport, mode=mode, size=size, op=op, inflight=inflight)
            self.peer.send({"cmd": "rest"})  # its active side sleeps until the pair's next cell
            self.peer.recv()
            emit(row)
        self.peer.send({"cmd": "quit"})
        self.proc.wait(30)

    def xfer(self, size, op, inflight, value):
        remote = array(size, value)
        if self.api == "nixl":
            reg, rec = self.lib.lend([remote])
        else:
            self.lib.reg(remote)
            rec = {"addrs": [remote.ctypes.data]}
        self.peer.send({"cmd": "xfer", "size": size, "op": op, "inflight": inflight, "value": value, **rec})
        drive = None
        if self.api == "nixl":
            # Without a progress thread the owner's UCX worker must be driven while the peer
            # transfers (over tcp UCX emulates get and put with active messages the target answers).
            def drive():
                while not select.select([self.proc.stdout], [], [], 0)[0]:
                    self.lib.agent.get_new_notifs()
                    yield_cpu()
        row = relay_pauses(self.peer, drive)
        if op == "write":
            row["verified"] = row["verified"] and int(remote[0]) == 255 - value
        if self.api == "nixl":
            self.lib.end(reg)
        else:
            self.lib.engine.unregister_memory(remote.ctypes.data)
        return row

    def op(self, size, op, inflight, value):
        lent = arrays(inflight, size, value)
        self.peer.send({"cmd": "prepare", "size": size, "op": op, "inflight": inflight, "value": value})
        self.peer.recv()
        cycle = self.nixl_cycle if self.api == "nixl" else self.mooncake_cycle
        first, times = measure(lambda: cycle(lent, op), self.pause)
        if op == "write":
            verified = check(lent, 255 - value)
        else:
            self.peer.send({"cmd": "verify"})
            verified = self.peer.recv()["verified"]
        return {"first": first, "times": times, "verified": verified}

    def pause(self):
        """Between two slices of a cell (transfer_scad.py's Owner.pause)."""
        self.peer.send({"cmd": "pause"})
        self.peer.recv()
        pause_for_driver()

    def nixl_cycle(self, lent, op):
        self.ops += 1
        tag = f"op{self.ops:09d}"  # fixed width: NIXL matches a tag as a prefix
        t0 = perf()
        regs, rec = self.lib.lend(lent)
        self.peer.send({"cmd": "go", "tag": tag, **rec})
        self.lib.wait_notifs("active", [tag.encode()])  # NIXL's own completion signal
        self.lib.end(regs)
        t1 = perf()
        self.peer.recv_polling()  # untimed, polled as scad.connect's owner polls it (transfer_scad.py)
        return t1 - t0

    def mooncake_cycle(self, lent, op):
        t0 = perf()
        for a in lent:
            self.lib.reg(a)
        self.peer.send({"cmd": "go", "addrs": [a.ctypes.data for a in lent]})
        self.peer.recv_polling()  # the peer's word: the transfer engine has no completion signal for the target
        for a in lent:
            self.lib.engine.unregister_memory(a.ctypes.data)
        return perf() - t0


# ---- the active side ---------------------------------------------------------------------------
class Active:
    def __init__(self, api, chan):
        self.api, self.chan = api, chan
        hello = chan.recv()
        if api == "nixl":
            self.lib = Nixl("active")
            self.lib.agent.add_remote_agent(base64.b64decode(hello["owner_meta"]))
        else:
            self.lib = Mooncake()
            self.target = hello["target"]
        pin_main_thread("active")
        self.registered = []
        chan.send({"ok": True})

    def serve(self):
        resting = True  # between cells: asleep on the pipe (the owner has had every notification)
        while True:
            # NIXL without a progress thread: the agent is driven while it waits for the next
            # command, or a notification still queued in UCX (they go out over tcp) never leaves.
            await_command(self.lib.agent.get_new_notifs if self.api == "nixl" else None, spin=not resting)
            msg = self.chan.recv()
            cmd = msg["cmd"]
            if cmd == "quit":
                return
            if cmd in ("rest", "pause"):  # (a pause, between two slices of a cell, keeps the cell's memory)
                resting = True
                self.chan.send({"ok": True})
            elif cmd == "xfer":
                resting = False
                self.chan.send(self.xfer(msg))
            elif cmd == "prepare":
                resting = False
                self.op, self.value = msg["op"], msg["value"]
                self.local = arrays(msg["inflight"], msg["size"], 255 - msg["value"])
                self.register(self.local)
                self.chan.send({"ok": True})
            elif cmd == "verify":
                self.chan.send({"verified": check(self.local, self.value)})
            elif cmd == "go":
                resting = False  # (after a pause, too: the cell goes on)
                if self.api == "nixl":
                    self.lib.agent.add_remote_agent(base64.b64decode(msg["meta"]))  # the new registrations' keys
                    remote = self.lib.agent.deserialize_descs(base64.b64decode(msg["descs"][0]))
                    self.lib.transfer(self.op, self.local, remote, "owner", msg["tag"].encode())
                else:
                    self.lib.transfer(self.op, self.local, msg["addrs"], self.target)
                self.chan.send({"done": True})

    def register(self, local):
        """The active side's own memory is registered once per cell, outside the timed part."""
        for r in self.registered:
            if self.api == "nixl":
                self.lib.agent.deregister_memory(r)
            else:
                self.lib.engine.unregister_memory(r)
        self.registered = []
        for a in local:
            if self.api == "nixl":
                self.registered.append(self.lib.reg(a))
            else:
                self.lib.reg(a)
                self.registered.append(a.ctypes.data)

    def xfer(self, msg):
        size, inflight, read = msg["size"], msg["inflight"], msg["op"] == "read"
        value = msg["value"]
        local = array(size * inflight, 255 - value)
        slots = [local[i * size:(i + 1) * size] for i in range(inflight)]
        if self.api == "nixl":
            agent = self.lib.agent
            reg = self.lib.reg(local)
            agent.add_remote_agent(base64.b64decode(msg["meta"]))
            remote = agent.deserialize_descs(base64.b64decode(msg["descs"][0]))
            rside = agent.prep_xfer_dlist("owner", remote)
            lside = agent.prep_xfer_dlist("NIXL_INIT_AGENT", self.lib.descs([(s.ctypes.data, size) for s in slots]))
            handles = [agent.make_prepped_xfer("READ" if read else "WRITE", lside, [i], rside, [0])
                       for i in range(inflight)]

            def cycle():
                t0 = perf()
                self.lib.run(handles)
                return perf() - t0
        else:
            self.lib.reg(local)
            addrs = msg["addrs"] * inflight
            target = self.target
            e = self.lib.engine
            one = e.transfer_sync_read if read else e.transfer_sync_write
            many = e.batch_transfer_sync_read if read else e.batch_transfer_sync_write
            ptrs, lens = [s.ctypes.data for s in slots], [size] * inflight

            def cycle():
                t0 = perf()
                rc = one(target, ptrs[0], addrs[0], size) if inflight == 1 else many(target, ptrs, addrs, lens)
                if rc != 0:
                    raise RuntimeError(f"Mooncake transfer failed ({rc})")
                return perf() - t0
        first, times = measure(cycle, lambda: pause_active(self.chan))
        verified = (not read) or (int(local[0]) == value and int(local[-1]) == value)
        if self.api == "nixl":
            for h in handles:
                h.release()
            rside.release()
            lside.release()
            self.lib.agent.deregister_memory(reg)
        else:
            self.lib.engine.unregister_memory(local.ctypes.data)
        return {"first": first, "times": times, "verified": verified}


def main():
    role, api, transport = sys.argv[1:4]
    claim_stdout()
    if role == "owner":
        plan = json.loads(sys.argv[4])
        try:
            Owner(api, transport).run(plan)
        except Exception as e:
            fail(f"{type(e).__name__}: {e}")
            raise
    else:
        chan = stdio_channel()
        try:
            Active(api, chan).serve()
        except Exception as e:
            chan.send({"error": f"{type(e).__name__}: {e}"})
            raise


if __name__ == "__main__":
    main()
