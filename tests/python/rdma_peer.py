"""One process of a scad.rdma test: the owner of memory or a peer using it, driven over a pipe.

Commands arrive as JSON lines on stdin, answers leave as JSON lines on stdout.

  owner:  {"cmd": "array", "size": n, "seed": s}                 -> {"digest": ...}
          {"cmd": "lend", "size": n, "seed": s}  a new array, lent whole -> {"json": ..., "digest": ..., "index": i}
          {"cmd": "digest_lent", "index": i}                     -> {"digest": ...} of that array now
          {"cmd": "buffer", "start": a, "stop": b, "ttl": s}     -> {"json": ..., "pickle": base64, "index": i}
          {"cmd": "drop", "index": i}                             -> {"regions": [...]}
          {"cmd": "buffers", "slices": [[a, b], ...]}  one buffer over the list -> {"json": ...}
          {"cmd": "digest", "start": a, "stop": b}               -> {"digest": ...}
          {"cmd": "digest", "slices": [[a, b], ...]}  of the slices end to end -> {"digest": ...}
          {"cmd": "regions"}                                      -> {"regions": [...]}
  peer:   {"cmd": "read", "buffer": json|pickle, "size": n, "offset": o} -> {"digest": ..., "via": "once"|"link",
                "link": n (which link carried it, numbered as first seen; null for a transfer of its own), "impl": ...} | error
          ("sizes": [n, ...] instead of "size": into a list of arrays, with one read_into; the
          digest is of them end to end; the same for "write")
          {"cmd": "write", "buffer": ..., "size": n, "seed": s, "offset": o} -> {"digest": ...} | error
          {"cmd": "qp", "buffer": ..., "size": n, "put": [[json, seed], ...]}  two gets of the buffer
                and a put into each other buffer of its owner, through one queue pair -> {...}
          {"cmd": "qp_get", "buffer": ...}  a get of the whole buffer through the queue pair to its owner
          {"cmd": "qp_connect", "buffer": ...}  request_queue_pair (the buffer's key connected)
          {"cmd": "qp_release", "buffer": ...}  release_queue_pair
          {"cmd": "forget", "buffer": ...}  drop() in a peer: lets go of its queue pair
                                            -> {"ok": true, "last_read_kept": bool}
          {"cmd": "start", "buffer": ..., "op": "read"|"write", "seed": s, "stop": bool}  a transfer
                of the whole buffer started through the queue pair; with stop the process stops
                itself (SIGSTOP) right after answering, the transfer posted -> {"ok": true}
          {"cmd": "finish", "timeout": t}  waits for it -> {"digest": ...} | error
          {"cmd": "cancel"}  cancels it -> {"stopped": bool (its transfers all ended), "idle": bool}
          {"cmd": "links", "buffer": ...} -> {"count": n} the links the manager holds to its owner
  both:   {"cmd": "usage"} -> {"fds": n, "rss_kib": n, "objects": n}
          {"cmd": "stop"} -> {"ok": true}, then the process stops itself until continued
Errors come back as {"error": type name, "message": ...}.
"""
import asyncio
import base64
import gc
import hashlib
import json
import os
import pickle
import signal
import sys
import weakref

import numpy

from scad.rdma import RdmaBuffer, RdmaManager

from peer_usage import no_huge_pages, usage


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
        self.lent = {}  # buffer index -> the array "lend" made for it
        self.started = None  # (queue pair, local memory) of "start", for "finish"
        self.links = weakref.WeakKeyDictionary()  # link -> its number (a freed link is never mistaken for a new one)
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
            self.lent[len(self.buffers) - 1] = array
            return {"json": buf.to_json(), "digest": digest(array), "index": len(self.buffers) - 1}
        if cmd == "digest_lent":
            return {"digest": digest(self.lent[msg["index"]])}
        if cmd == "buffer":
            view = self.array[msg.get("start", 0):msg.get("stop", len(self.array))]
            buf = self.manager.request_buffer(view, ttl=msg.get("ttl"))
            self.buffers.append(buf)
            return {"json": buf.to_json(), "pickle": base64.b64encode(pickle.dumps(buf)).decode(),
                    "regions": self.manager.regions(), "index": len(self.buffers) - 1}
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
            await buf.read_into(dst, offset=msg.get("offset", 0), timeout=msg.get("timeout", 20))
            # What carried it: a link (which one), or a transfer of its own (a buffer's first).
            link = self.manager._links.get(buf.route)
            once = self.manager._one_shots.get(buf.route)
            number = None if link is None else self.links.setdefault(link, len(self.links) + 1)
            self.last_dst = weakref.ref(dst)
            return {"digest": digest(dst), "via": "link" if link is not None else "once" if once is not None else None,
                    "link": number, "impl": self.manager._how(buf)[1]}
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
            # Monarch's queue pair: one per owner's manager; its get and put take any buffer of
            # that owner. Two gets of the first buffer into one local region, then (with "put",
            # a list of [buffer, seed]) a put of seeded bytes into each further buffer, all
            # started before one wait.
            buf = load(msg)
            qp = await self.manager.request_queue_pair(buf)
            same = qp is await self.manager.request_queue_pair(buf)
            n = msg["size"]
            both = numpy.zeros(2 * n, numpy.uint8)  # one local region for both transfers
            qp.get(both[:n], buf)
            qp.get(both[n:], buf)
            sources = []
            for text, seed in msg.get("put", []):
                other = RdmaBuffer.from_json(text)
                same = same and qp is await self.manager.request_queue_pair(other)
                sources.append(seeded(other.size(), seed))
                qp.put(sources[-1], other)
            await qp.wait(20)
            return {"same": same, "impl": qp.impl, "idle": qp.poll(), "digests": [digest(both[:n]), digest(both[n:])],
                    "put": [digest(s) for s in sources]}
        if cmd == "qp_get":  # one get through this process's queue pair to the buffer's owner
            buf = load(msg)
            qp = self.manager._queue_pairs.get((buf.owner, buf.host, buf.port, buf.path))
            if qp is None:
                qp = await self.manager.request_queue_pair(buf)
            dst = numpy.zeros(buf.size(), numpy.uint8)
            qp.get(dst, buf)
            await qp.wait(20)
            return {"digest": digest(dst)}
        if cmd == "qp_connect":  # the queue pair to the buffer's owner, with the buffer's key connected
            await self.manager.request_queue_pair(load(msg))
            return {"ok": True}
        if cmd == "qp_release":
            self.manager.release_queue_pair(load(msg))
            return {"ok": True}
        if cmd == "forget":
            load(msg).drop()
            gc.collect()
            # Whether the memory the last read went into is still kept alive (by a queue pair).
            return {"ok": True, "last_read_kept": self.last_dst is not None and self.last_dst() is not None}
        if cmd == "start":  # a transfer of the whole buffer started through the queue pair to its owner
            buf = load(msg)
            qp = await self.manager.request_queue_pair(buf)
            if msg["op"] == "read":
                local = numpy.zeros(buf.size(), numpy.uint8)
                qp.get(local, buf)
            else:
                local = seeded(buf.size(), msg["seed"])
                qp.put(local, buf)
            self.started = (qp, local)
            return {"ok": True, "impl": qp.impl, "stop": msg.get("stop", False)}
        if cmd == "finish":  # waits for what "start" started
            qp, local = self.started
            await qp.wait(msg["timeout"])
            return {"digest": digest(local)}
        if cmd == "cancel":  # cancels what "start" started, then says whether any of it still runs
            qp, _ = self.started
            ops = [s.op for s in qp._started]
            qp.cancel()
            return {"stopped": bool(ops) and all(op.done() for op in ops), "idle": qp.poll()}
        if cmd == "links":  # how many links this process's manager holds to the buffer's owner
            buf = load(msg)
            return {"count": sum(1 for route in self.manager._links if route[:3] == (buf.host, buf.port, buf.path))}
        if cmd == "stop":  # this process stops itself once it has answered, until continued
            return {"ok": True, "stop": True}
        if cmd == "usage":
            return usage()
        raise ValueError(f"unknown command {cmd!r}")


async def main():
    no_huge_pages()
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
        if reply.get("stop"):
            os.kill(os.getpid(), signal.SIGSTOP)  # the test continues us (or kills us)


if __name__ == "__main__":
    asyncio.run(main())
