"""Gathers key range `_instance` from every partition's buckets, sorts it and writes it to slot
`_instance` of `output`."""
import numpy

from scad.state import carried, open_state


def main(args, action):
    j, parts = args["_instance"], args["_parallelism"]
    st = open_state(action, args)
    pieces = [st.get("buckets", i * parts + j, numpy.uint64, slots=parts * parts) for i in range(parts)]
    keys = numpy.sort(numpy.concatenate(pieces))
    st.put("output", j, keys, slots=parts)
    return {"instance": j, "count": int(keys.size), "generated": [p["generated"] for p in args["partition"]],
            "states": {**carried(args, "partition"), f"merge#{j}": st.counters()}}
