"""One actor of a scad.tensor_transport test, driven over a pipe (JSON lines in and out).

  {"cmd": "lend", "obj": id, "shapes": [[...], ...], "dtypes": [...], "seed": s}
        -> {"meta": base64 pickle of the metadata, "digests": [...]}
  {"cmd": "recv", "obj": id, "meta": ..., "into": bool} -> {"digests": [...], "dtypes": [...], "same": bool}
  {"cmd": "gc", "obj": id} -> {"ok": true}
  {"cmd": "fetch", "obj": id, "meta": ..., "into": bool, "poll": s} -> {"pending": bool}: a receive
        started (fetch_multiple_tensors), then waited for `poll` seconds
  {"cmd": "wait", "obj": id} -> like recv's answer, for the receive fetch started
  {"cmd": "abort", "obj": id} -> {"ok": true}
  {"cmd": "recv_aside", "obj": id, "meta": ...} -> {"running": bool}: recv_multiple_tensors into zeroed
        targets on a thread of its own, answered once its read is under way (or it has ended)
  {"cmd": "joined", "obj": id} -> like wait's answer, for the receive recv_aside started
  {"cmd": "counters"} -> ScadTensorTransport.counters()
  {"cmd": "fetch", ..., "stop": true} -> {"pending": true}: a receive started and seen posted (its
        read on the wire), then the process stops itself (SIGSTOP) until continued or killed
  {"cmd": "recv", ..., "timeout": s}: that receive with the transport's timeout set to s
  {"cmd": "stop"} -> {"ok": true}, then the process stops itself (SIGSTOP) until continued
  {"cmd": "usage"} -> {"fds": n, "rss_kib": n, "objects": n}
Errors come back as {"error": type name, "message": ...}.
"""
import base64
import hashlib
import json
import os
import pickle
import signal
import sys
import threading
import time

import numpy

from scad.rdma import RdmaManager
from scad.tensor_transport import ScadTensorTransport

from peer_usage import no_huge_pages, usage


def digest(a):
    return hashlib.sha256(a.tobytes()).hexdigest()


def received(out, into):
    return {"digests": [digest(a) for a in out], "dtypes": [str(a.dtype) for a in out],
            "same": into is not None and all(a is b for a, b in zip(out, into))}


def posted(transport, obj, request, timeout=30.0):
    """Waits until the receive of obj has a read on the wire (its link has a transfer pending), or
    has finished (over shm a read is done as it starts)."""
    deadline = time.monotonic() + timeout
    def on_the_wire():
        with transport._lock:  # the module's loop thread adds and removes receives under it
            receives = list(transport._receiving.get(obj, ()))
        return any(link._pending for r in receives for link in list(r._links))

    while not (request.future.done() or on_the_wire()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the receive of {obj} posted no read within {timeout} s")
        time.sleep(0.001)


def under_way(transport, obj, thread, timeout=30.0):
    """Waits until the receive of obj that `thread` runs has its read under way (one read of its
    own: its slot shows it), or the thread has ended."""
    deadline = time.monotonic() + timeout
    while thread.is_alive():
        slot = transport._lone.get(obj)
        if slot is not None and slot.running:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"the receive of {obj} started no read within {timeout} s")
        time.sleep(0.001)


def main():
    no_huge_pages()
    RdmaManager.get(transport=os.environ.get("PEER_TRANSPORT") or None)  # the libd transport a test forces
    transport = ScadTensorTransport(timeout=20)
    lent, fetching, aside = {}, {}, {}
    for line in sys.stdin:
        msg = json.loads(line)
        try:
            if msg["cmd"] == "lend":
                rng = numpy.random.default_rng(msg["seed"])
                arrays = [rng.integers(0, 100, size=shape).astype(dtype) for shape, dtype in zip(msg["shapes"], msg["dtypes"])]
                lent[msg["obj"]] = arrays  # Ray's object store would hold them
                meta = transport.extract_tensor_transport_metadata(msg["obj"], arrays)
                reply = {"meta": base64.b64encode(pickle.dumps(meta)).decode(), "digests": [digest(a) for a in arrays]}
            elif msg["cmd"] == "recv":
                meta = pickle.loads(base64.b64decode(msg["meta"]))
                into = [numpy.empty(shape, dtype) for shape, dtype in meta.tensor_meta] if msg.get("into") else None
                transport._timeout = msg.get("timeout", 20)
                out = transport.recv_multiple_tensors(msg["obj"], meta, transport.get_communicator_metadata(), into)
                reply = received(out, into)
            elif msg["cmd"] == "fetch":
                meta = pickle.loads(base64.b64decode(msg["meta"]))
                into = [numpy.zeros(shape, dtype) for shape, dtype in meta.tensor_meta] if msg.get("into") else None
                request = transport.fetch_multiple_tensors(msg["obj"], meta, transport.get_communicator_metadata(), into)
                fetching[msg["obj"]] = (request, into)
                if msg.get("stop"):
                    posted(transport, msg["obj"], request)
                    sys.stdout.write(json.dumps({"pending": True}) + "\n")
                    sys.stdout.flush()
                    os.kill(os.getpid(), signal.SIGSTOP)  # the test continues us (or kills us)
                    continue
                try:
                    transport.wait_fetch_complete(request, msg["poll"])
                    reply = {"pending": False}
                except TimeoutError:
                    reply = {"pending": True}
            elif msg["cmd"] == "wait":
                request, into = fetching.pop(msg["obj"])
                try:
                    reply = received(transport.wait_fetch_complete(request), into)
                except Exception as e:  # with what the failed receive left in its targets
                    reply = {"error": type(e).__name__, "message": str(e), "targets": [digest(a) for a in into or []]}
            elif msg["cmd"] == "recv_aside":
                meta = pickle.loads(base64.b64decode(msg["meta"]))
                into = [numpy.zeros(shape, dtype) for shape, dtype in meta.tensor_meta]
                outcome = {}

                def receive(obj=msg["obj"], meta=meta, into=into, outcome=outcome):
                    try:
                        outcome["reply"] = received(transport.recv_multiple_tensors(obj, meta, None, into), into)
                    except Exception as e:  # with what the failed receive left in its targets
                        outcome["reply"] = {"error": type(e).__name__, "message": str(e),
                                            "targets": [digest(a) for a in into]}

                thread = threading.Thread(target=receive)
                thread.start()
                aside[msg["obj"]] = (thread, outcome)
                under_way(transport, msg["obj"], thread)
                reply = {"running": thread.is_alive()}
            elif msg["cmd"] == "joined":
                thread, outcome = aside.pop(msg["obj"])
                thread.join()
                reply = outcome["reply"]
            elif msg["cmd"] == "abort":
                transport.abort_transport(msg["obj"], transport.get_communicator_metadata())
                reply = {"ok": True}
            elif msg["cmd"] == "usage":
                reply = usage()
            elif msg["cmd"] == "counters":
                reply = ScadTensorTransport.counters()
            elif msg["cmd"] == "stop":
                sys.stdout.write(json.dumps({"ok": True}) + "\n")
                sys.stdout.flush()
                os.kill(os.getpid(), signal.SIGSTOP)  # the test continues us
                continue
            elif msg["cmd"] == "gc":
                transport.garbage_collect(msg["obj"], None, lent.pop(msg["obj"], None))
                reply = {"ok": True}
            else:
                raise ValueError(f"unknown command {msg['cmd']!r}")
        except Exception as e:  # reported to the test, which asserts on it
            reply = {"error": type(e).__name__, "message": str(e)}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
