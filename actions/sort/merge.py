"""Gathers key range `_instance` from every partition's bucket, merges it and writes it to slot
`_instance` of `output`. Each bucket is a sorted run, grouped by fine range (see partition.py), so
the range is merged one fine range at a time, straight into the output array: numpy's stable sort
(a timsort) finds the runs and merges them, at about a tenth of the cost of sorting the keys anew."""
import numpy

from scad.state import carried, open_state


def main(args, action):
    j, parts = args["_instance"], args["_parallelism"]
    st = open_state(action, args)
    partitions = sorted(args["partition"], key=lambda p: p["instance"])
    pieces = [st.get("buckets", i * parts + j, numpy.uint64, slots=parts * parts) for i in range(parts)]
    # bounds[i][k]: where my k-th fine range starts in piece i
    bounds = [[0, *numpy.cumsum(p["fine"][j]).tolist()] for p in partitions]
    for i, (piece, b) in enumerate(zip(pieces, bounds)):
        if len(piece) != b[-1]:
            raise ValueError(f"partition {i}'s bucket {j} holds {len(piece)} keys, its counts say {b[-1]}")
    keys = numpy.empty(sum(int(b[-1]) for b in bounds), dtype=numpy.uint64)
    at = 0
    for k in range(len(bounds[0]) - 1):
        run = [piece[b[k]:b[k + 1]] for piece, b in zip(pieces, bounds)]
        size = sum(len(r) for r in run)
        numpy.concatenate(run, out=keys[at:at + size])
        keys[at:at + size].sort(kind="stable")
        at += size
    st.put("output", j, keys, slots=parts)
    return {"instance": j, "count": int(keys.size), "generated": [p["generated"] for p in args["partition"]],
            "states": {**carried(args, "partition"), f"merge#{j}": st.counters()}}
