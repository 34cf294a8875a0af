"""Reads the whole output back and checks it: every key there, in order, with the same checksum as
the keys generated. The result is the same whichever storage ran (the keys' digest)."""
import hashlib

import numpy

from scad.state import carried, merge_counters, open_state


def main(args, action):
    parts = len(args["merge"])
    generated = args["merge"][0]["generated"]
    st = open_state(action, args)
    digest = hashlib.sha256()
    count, checksum, previous, ordered = 0, numpy.uint64(0), None, True
    for j in range(parts):
        keys = st.get("output", j, numpy.uint64, slots=parts)
        if keys.size:
            ordered &= bool(numpy.all(keys[1:] >= keys[:-1])) and (previous is None or keys[0] >= previous)
            previous = keys[-1]
        count += int(keys.size)
        checksum += keys.sum(dtype=numpy.uint64)
        digest.update(keys)  # the array's own buffer, not a copy of it
    expected_sum = numpy.uint64(0)
    for g in generated:
        expected_sum += numpy.uint64(g["checksum"])
    complete = count == sum(g["count"] for g in generated) and checksum == expected_sum
    state = merge_counters(*carried(args, "merge").values(), st.counters())
    return {"n": count, "sorted": bool(ordered and complete), "digest": digest.hexdigest(), "storage": st.kind,
            "state": state}
