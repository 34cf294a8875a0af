"""One actor of a scad.tensor_transport test, driven over a pipe (JSON lines in and out).

  {"cmd": "lend", "obj": id, "shapes": [[...], ...], "dtypes": [...], "seed": s}
        -> {"meta": base64 pickle of the metadata, "digests": [...]}
  {"cmd": "recv", "obj": id, "meta": ..., "into": bool} -> {"digests": [...], "dtypes": [...], "same": bool}
  {"cmd": "gc", "obj": id} -> {"ok": true}
Errors come back as {"error": type name, "message": ...}.
"""
import base64
import hashlib
import json
import pickle
import sys

import numpy

from scad.tensor_transport import ScadTensorTransport


def digest(a):
    return hashlib.sha256(a.tobytes()).hexdigest()


def main():
    transport = ScadTensorTransport(timeout=20)
    lent = {}
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
                out = transport.recv_multiple_tensors(msg["obj"], meta, transport.get_communicator_metadata(), into)
                reply = {"digests": [digest(a) for a in out], "dtypes": [str(a.dtype) for a in out],
                         "same": into is not None and all(a is b for a, b in zip(out, into))}
            elif msg["cmd"] == "gc":
                transport.garbage_collect(msg["obj"], None, lent.pop(msg["obj"]))
                reply = {"ok": True}
            else:
                raise ValueError(f"unknown command {msg['cmd']!r}")
        except Exception as e:  # reported to the test, which asserts on it
            reply = {"error": type(e).__name__, "message": str(e)}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
