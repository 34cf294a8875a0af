"""One process of a scad.rdma test: the owner of memory or a peer using it, driven over a pipe.

Commands arrive as JSON lines on stdin, answers leave as JSON lines on stdout.

  owner:  {"cmd": "array", "size": n, "seed": s}                 -> {"digest": ...}
          {"cmd": "lend", "size": n, "seed": s}  a new array, lent whole -> {"json": ..., "digest": ..., "index": i}
          {"cmd": "buffer", "start": a, "stop": b}               -> {"json": ..., "pickle": base64}
          {"cmd": "drop", "index": i}                             -> {"regions": [...]}
          {"cmd": "buffers", "slices": [[a, b], ...]}  one buffer over the list -> {"json": ...}
          {"cmd": "digest", "start": a, "stop": b}               -> {"digest": ...}
          {"cmd": "digest", "slices": [[a, b], ...]}  of the slices end to end -> {"digest": ...}
          {"cmd": "regions"}                                      -> {"regions": [...]}
  peer:   {"cmd": "read", "buffer": json|pickle, "size": n, "offset": o} -> {"digest": ..., "same_pair": bool (as the previous read's), "impl": ...} | error
          ("sizes": [n, ...] instead of "size": into a list of arrays, with one read_into; the
          digest is of them end to end; the same for "write")
          {"cmd": "write", "buffer": ..., "size": n, "seed": s, "offset": o} -> {"digest": ...} | error
          {"cmd": "qp", "buffer": ..., "size": n}  two gets through one queue pair -> {...}
          {"cmd": "forget", "buffer": ...}  drop() in a peer: lets go of its queue pair
                                            -> {"ok": true, "last_read_kept": bool}
  both:   {"cmd": "usage"} -> {"fds": n, "objects": n}
Errors come back as {"error": type name, "message": ...}.
"""
import asyncio
import base64
import gc
import hashlib
import json
import os
import pickle
import sys
import weakref

import numpy

from scad.rdma import RdmaBuffer, RdmaManager


def digest(a):
    return hashlib.sha256(numpy.ascontiguousarray(a).tobytes()).hexdigest()


def seeded(size, seed):
    return numpy.random.default_rng(seed).integers(0, 256, size=size, dtype=numpy.uint8)


def load(msg):
    if msg.get("pickled"):
        return pickle.loads(base64.b64decode(msg["buffer"]))
    return RdmaBuffer.from_json(msg["buffer"])


class Peer:
    def __init__(self):
        self.manager = RdmaManager.get(transport=os.environ.get("PEER_TRANSPORT") or None, timeout=20.0)
        self.array = None
        self.buffers = []
        self.kept = []
        self.last_pair = None
        self.last_dst = None

    async def handle(self, msg):
        cmd = msg["cmd"]
        if cmd == "array":
            self.array = seeded(msg["size"], msg["seed"])
            return {"digest": digest(self.array)}
        if cmd == "lend":  # a new array of its own, lent whole
            array = seeded(msg["size"], msg["seed"])
            buf = self.manager.request_buffer(array)
            self.buffers.append(buf)
            self.kept.append(array)
            return {"json": buf.to_json(), "digest": digest(array), "index": len(self.buffers) - 1}
        if cmd == "buffer":
            view = self.array[msg.get("start", 0):msg.get("stop", len(self.array))]
            buf = self.manager.request_buffer(view)
            self.buffers.append(buf)
            return {"json": buf.to_json(), "pickle": base64.b64encode(pickle.dumps(buf)).decode(),
                    "regions": self.manager.regions()}
        if cmd == "buffers":
            buf = self.manager.request_buffer([self.array[a:b] for a, b in msg["slices"]])
            self.buffers.append(buf)
            return {"json": buf.to_json(), "regions": self.manager.regions()}
        if cmd == "drop":
            self.buffers[msg["index"]].drop()
            self.buffers[msg["index"]] = None  # the test holds no dropped handle either
            return {"regions": self.manager.regions()}
        if cmd == "digest":
            if "slices" in msg:
                return {"digest": digest(numpy.concatenate([self.array[a:b] for a, b in msg["slices"]]))}
            return {"digest": digest(self.array[msg.get("start", 0):msg.get("stop", len(self.array))])}
        if cmd == "regions":
            return {"regions": self.manager.regions()}
        if cmd == "read":
            if "sizes" in msg:
                dst = [numpy.zeros(n, numpy.uint8) for n in msg["sizes"]]
                await load(msg).read_into(dst, offset=msg.get("offset", 0), timeout=20)
                return {"digest": digest(numpy.concatenate(dst))}
            dst = numpy.zeros(msg["size"], numpy.uint8)
            buf = load(msg)
            await buf.read_into(dst, offset=msg.get("offset", 0), timeout=20)
            # Which queue pair carried it: the one of the previous read again? (A weak reference:
            # one closed and freed meanwhile is not mistaken for a new one at the same address.)
            qp = self.manager._qps.get(buf.route)
            same = self.last_pair is not None and self.last_pair() is qp
            self.last_pair = weakref.ref(qp)
            self.last_dst = weakref.ref(dst)
            return {"digest": digest(dst), "same_pair": same, "impl": qp.impl}
        if cmd == "write":
            if "sizes" in msg:
                src = seeded(sum(msg["sizes"]), msg["seed"])
                cuts = numpy.cumsum(msg["sizes"])[:-1]
                await load(msg).write_from(numpy.split(src, cuts), offset=msg.get("offset", 0), timeout=20)
                return {"digest": digest(src)}
            src = seeded(msg["size"], msg["seed"])
            await load(msg).write_from(src, offset=msg.get("offset", 0), timeout=20)
            return {"digest": digest(src)}
        if cmd == "qp":
            buf = load(msg)
            qp = await self.manager.request_queue_pair(buf)
            same = qp is await self.manager.request_queue_pair(buf)
            first, second = numpy.zeros(msg["size"], numpy.uint8), numpy.zeros(msg["size"], numpy.uint8)
            both = numpy.zeros(2 * msg["size"], numpy.uint8)  # one local region for both transfers
            qp.get(both[:msg["size"]], buf)
            qp.get(both[msg["size"]:], buf)
            await qp.wait(20)
            first[:], second[:] = both[:msg["size"]], both[msg["size"]:]
            return {"same": same, "impl": qp.impl, "idle": qp.poll(), "digests": [digest(first), digest(second)]}
        if cmd == "forget":
            load(msg).drop()
            gc.collect()
            # Whether the memory the last read went into is still kept alive (by a queue pair).
            return {"ok": True, "last_read_kept": self.last_dst is not None and self.last_dst() is not None}
        if cmd == "usage":
            gc.collect()
            return {"fds": len(os.listdir("/proc/self/fd")), "objects": len(gc.get_objects())}
        raise ValueError(f"unknown command {cmd!r}")


async def main():
    peer = Peer()
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            return
        try:
            reply = await peer.handle(json.loads(line))
        except Exception as e:  # reported to the test, which asserts on it
            reply = {"error": type(e).__name__, "message": str(e)}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    asyncio.run(main())
