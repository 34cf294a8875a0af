"""Sorts this instance's slice of the keys and cuts it into one bucket per merge instance, by key
range, writing bucket j to slot (instance * parts + j) of `buckets`.

Keys are below 2^63 and uniform. Each key's top FINE_BITS bits name its fine range; merge instance
j takes the fine ranges f with (f * parts) >> FINE_BITS == j. The slice is sorted, so every bucket
is a sorted run, grouped by fine range, and the result carries the counts of each bucket's fine
ranges, in key order: a merge instance then merges the runs of one fine range at a time (see
merge.py), in cache."""
import numpy

from scad.state import carried, open_state

FINE_BITS = 8  # 256 fine ranges


def main(args, action):
    i, parts = args["_instance"], args["_parallelism"]
    if parts > 1 << FINE_BITS:
        raise ValueError(f"parallelism {parts}: at most {1 << FINE_BITS} merge instances")
    st = open_state(action, args)
    ordered = numpy.sort(st.get("input", i, numpy.uint64, slots=parts))  # a copy: what get gives is read-only
    if ordered.size and int(ordered[-1]) >> 63:
        raise ValueError("keys must be below 2^63 (the top bit names no fine range)")
    # Where each fine range starts: 257 edges, the last one 2^63 (the end).
    starts = numpy.arange((1 << FINE_BITS) + 1, dtype=numpy.uint64) << numpy.uint64(63 - FINE_BITS)
    fine_counts = numpy.diff(numpy.searchsorted(ordered, starts))
    merge_of = (numpy.arange(1 << FINE_BITS) * parts) >> FINE_BITS  # the merge instance of each fine range
    fine = [fine_counts[merge_of == j] for j in range(parts)]
    counts = [int(f.sum()) for f in fine]
    start = 0
    for j in range(parts):
        st.put("buckets", i * parts + j, ordered[start:start + counts[j]], slots=parts * parts)
        start += counts[j]
    generated = next(g for g in args["generate"] if g["instance"] == i)
    return {"instance": i, "counts": counts, "fine": [[int(c) for c in f] for f in fine],
            "generated": {"count": generated["count"], "checksum": generated["checksum"]},
            "states": {**carried(args, "generate"), f"partition#{i}": st.counters()}}
