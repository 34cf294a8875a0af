"""Writes this instance's slice of the n keys (uniform random 64-bit integers, seeded by the
instance so that every run and both storages see the same keys) into slot `_instance` of `input`."""
import numpy

from scad.state import open_state


def main(args, action):
    n, i, parts = int(args.get("n", 1 << 20)), args["_instance"], args["_parallelism"]
    lo, hi = n * i // parts, n * (i + 1) // parts
    keys = numpy.random.default_rng(1000 + i).integers(0, 2**63 - 1, hi - lo, dtype=numpy.uint64)
    st = open_state(action, args)
    st.put("input", i, keys, slots=parts)
    return {"instance": i, "count": int(keys.size), "checksum": int(keys.sum(dtype=numpy.uint64)),
            "states": {f"generate#{i}": st.counters()}}
