"""Reads its share of the vector straight from the memory element and sums the squares."""
from array import array


def main(args, action):
    n = args["generate"][0]["n"]                     # the parent's result
    i, parts = args["_instance"], args["_parallelism"]
    lo, hi = n * i // parts, n * (i + 1) // parts
    t = action.get_transport("data", "rdma")
    t.reg((hi - lo) * 8)
    t.read((hi - lo) * 8, lo * 8)                    # one one-sided read of the whole share
    values = array("d")
    values.frombytes(t.buf[:(hi - lo) * 8])
    return {"instance": i, "count": len(values), "sum_sq": sum(v * v for v in values)}
