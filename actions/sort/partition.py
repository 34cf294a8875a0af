"""Splits this instance's slice of the keys into one bucket per merge instance, by key range
(keys are uniform: range j is [j * 2^63 / parts, (j + 1) * 2^63 / parts)), and writes bucket j to
slot (instance * parts + j) of `buckets`."""
import numpy

from scad.state import carried, open_state


def main(args, action):
    i, parts = args["_instance"], args["_parallelism"]
    st = open_state(action, args)
    keys = st.get("input", i, numpy.uint64, slots=parts)
    bucket = ((keys >> numpy.uint64(31)) * numpy.uint64(parts)) >> numpy.uint64(32)  # range of each key
    # Bucket ids as the narrowest integers that hold them: numpy's stable sort of 8- or 16-bit
    # integers is a radix sort, linear in the keys (5x faster than a merge sort of 64-bit ids).
    bucket = bucket.astype(numpy.uint8 if parts <= 1 << 8 else numpy.uint16 if parts <= 1 << 16 else numpy.int64)
    order = numpy.argsort(bucket, kind="stable")
    grouped, counts = keys[order], numpy.bincount(bucket, minlength=parts)
    start = 0
    for j in range(parts):
        st.put("buckets", i * parts + j, grouped[start:start + counts[j]], slots=parts * parts)
        start += int(counts[j])
    generated = next(g for g in args["generate"] if g["instance"] == i)
    return {"instance": i, "counts": [int(c) for c in counts],
            "generated": {"count": generated["count"], "checksum": generated["checksum"]},
            "states": {**carried(args, "generate"), f"partition#{i}": st.counters()}}
