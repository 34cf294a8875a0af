"""Writes this instance's slice of the n keys (uniform random 63-bit integers, seeded by the
instance so that every run and both storages see the same keys) into slot `_instance` of `input`."""
import numpy

from scad.state import open_state


def main(args, action):
    n, i, parts = int(args.get("n", 1 << 20)), args["_instance"], args["_parallelism"]
    lo, hi = n * i // parts, n * (i + 1) // parts
    # 64 random bits shifted to 63: the generator's raw output, 3-6x faster than a bounded draw.
    keys = numpy.random.default_rng(1000 + i).bit_generator.random_raw(hi - lo)
    keys >>= numpy.uint64(1)
    st = open_state(action, args)
    st.put("input", i, keys, slots=parts)
    return {"instance": i, "count": int(keys.size), "checksum": int(keys.sum(dtype=numpy.uint64)),
            "states": {f"generate#{i}": st.counters()}}
