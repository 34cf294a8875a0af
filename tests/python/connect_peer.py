"""One side of a scad.connect transfer, as a real process the tests drive over a pipe.

Commands arrive as JSON lines on stdin, answers leave as JSON lines on stdout (nothing else is
printed there). Buffers are filled from a seed, and answers carry their SHA-256, so the test
checks the bytes that arrived without moving them through the pipe.

  {"cmd": "create", "kind": "read"|"write", "sizes": [...], "seed": n, "expires_in": s}
        -> {"metadata": "<json>"}                  a passive operation (one at a time)
  {"cmd": "begin", "kind": ..., "metadata": ..., "sizes": [...], "seed": n, "style": "await"|"direct",
   "stop": bool}
        -> {"ok": true} | {"error": ..., "message": ...}  an active operation; with stop the
           process stops itself (SIGSTOP) right after answering, its transfers posted
  {"cmd": "wait", "timeout": s} -> {"status": ..., "error": ..., "message": ..., "digests": [...]}
  {"cmd": "cancel"} -> {"status": ...}
  {"cmd": "status"} -> {"status": ...}
  {"cmd": "usage"} -> {"fds": n, "rss_kib": n, "objects": n}   (objects: Python's, after a collection)
"""
import asyncio
import hashlib
import json
import os
import signal
import sys
import time

import numpy

from scad.connect import Connector, Descriptor, RdmaMetadata
from scad.connect import _passive

from peer_usage import no_huge_pages, usage


def buffers(sizes, seed):
    rng = numpy.random.default_rng(seed)
    return [rng.integers(0, 256, size=s, dtype=numpy.uint8) if seed is not None else numpy.zeros(s, numpy.uint8)
            for s in sizes]


def digests(bufs):
    return [hashlib.sha256(memoryview(b)).hexdigest() for b in bufs]


def memories(msg):
    """The operation's memory: seeded (or zero) arrays, or the same bytes as `bytes` objects
    (read-only: a readable's memory or a write's source)."""
    bufs = buffers(msg["sizes"], msg.get("seed"))
    return [bytes(memoryview(b)) for b in bufs] if msg.get("as_bytes") else bufs


class Peer:
    def __init__(self):
        self.connector = Connector(transport=os.environ.get("PEER_TRANSPORT") or None, timeout=20.0)
        self.op = None
        self.bufs = []

    async def handle(self, msg):
        cmd = msg["cmd"]
        if cmd == "create":
            self.bufs = memories(msg)
            descs = [Descriptor(b) for b in self.bufs]
            make = self.connector.create_readable if msg["kind"] == "read" else self.connector.create_writable
            self.op = make(descs if len(descs) > 1 else descs[0], expires_in=msg.get("expires_in"))
            return {"metadata": self.op.metadata().to_json()}
        if cmd == "begin":
            self.bufs = memories(msg)
            descs = [Descriptor(b) for b in self.bufs]
            local = descs if len(descs) > 1 else descs[0]
            md = RdmaMetadata.from_json(msg["metadata"])
            try:
                if msg["kind"] == "read":
                    op = self.connector.begin_read(md, local)
                else:
                    op = self.connector.begin_write(local, md)
                self.op = await op if msg.get("style") == "await" else op
            except Exception as e:  # reported to the test, which asserts on it
                return {"error": type(e).__name__, "message": str(e)}
            return {"ok": True, "transport": self.op.impl}
        if cmd == "wait":
            # An owner that polls drives its memory server while it waits (the server's loop, leased).
            self.connector.busy_poll_us = float(msg.get("busy_poll_us", 0))
            if "lease_us" in msg:
                _passive._LEASE_US = int(msg["lease_us"])
            try:
                await self.op.wait_for_completion(timeout=msg.get("timeout"))
                error, message = None, ""
            except Exception as e:
                error, message = type(e).__name__, str(e)
            return {"status": self.op.status.name, "error": error, "message": message, "digests": digests(self.bufs),
                    "at": time.monotonic()}
        if cmd == "cancel":
            self.op.cancel()
            return {"status": self.op.status.name}
        if cmd == "drop":
            self.op = None  # the finaliser must end an unfinished operation
            return {"ok": True}
        if cmd == "status":
            return {"status": self.op.status.name}
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
        msg = json.loads(line)
        try:
            reply = await peer.handle(msg)
        except Exception as e:  # reported to the test, which asserts on it
            reply = {"error": type(e).__name__, "message": str(e)}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()
        if msg.get("stop"):
            os.kill(os.getpid(), signal.SIGSTOP)  # the test continues us (or kills us)


if __name__ == "__main__":
    asyncio.run(main())
