"""Splits this instance's slice of the keys into one bucket per merge instance, by key range, and
writes bucket j to slot (instance * parts + j) of `buckets`.

Keys are below 2^63 and uniform. Each key's top FINE_BITS bits name its fine range; merge instance
j takes the fine ranges f with (f * parts) >> FINE_BITS == j. A bucket is written grouped by fine
range, and the result carries the counts of each bucket's fine ranges, in key order, so that a
merge instance sorts each fine range on its own: many small sorts that stay in cache, not one
large one."""
import numpy

from scad.state import carried, open_state

FINE_BITS = 8  # 256 fine ranges: a radix sort of one byte a key groups them (numpy's stable sort of uint8)


def main(args, action):
    i, parts = args["_instance"], args["_parallelism"]
    if parts > 1 << FINE_BITS:
        raise ValueError(f"parallelism {parts}: at most {1 << FINE_BITS} merge instances")
    st = open_state(action, args)
    keys = st.get("input", i, numpy.uint64, slots=parts)
    if keys.size and int(keys.max()) >> 63:
        raise ValueError("keys must be below 2^63 (the top bit names no fine range)")
    fine_ids = (keys >> numpy.uint64(63 - FINE_BITS)).astype(numpy.uint8)
    grouped = numpy.take(keys, numpy.argsort(fine_ids, kind="stable"))
    fine_counts = numpy.bincount(fine_ids, minlength=1 << FINE_BITS)
    merge_of = (numpy.arange(1 << FINE_BITS) * parts) >> FINE_BITS  # the merge instance of each fine range
    fine = [fine_counts[merge_of == j] for j in range(parts)]
    counts = [int(f.sum()) for f in fine]
    start = 0
    for j in range(parts):
        st.put("buckets", i * parts + j, grouped[start:start + counts[j]], slots=parts * parts)
        start += counts[j]
    generated = next(g for g in args["generate"] if g["instance"] == i)
    return {"instance": i, "counts": counts, "fine": [[int(c) for c in f] for f in fine],
            "generated": {"count": generated["count"], "checksum": generated["checksum"]},
            "states": {**carried(args, "generate"), f"partition#{i}": st.counters()}}
