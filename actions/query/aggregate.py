"""Revenue by category, the query's answer; and the storage's counters of every stage."""
import numpy

from scad.state import carried, merge_counters, open_state


def main(args, action):
    st = open_state(action, args)
    joined = st.get("joined", 0, numpy.int64).reshape(-1, 2)
    revenue = numpy.bincount(joined[:, 0], weights=joined[:, 1], minlength=10)  # generate.py's 10 categories
    join = args["join"][0]
    state = merge_counters(*carried(args, "join").values(), st.counters())
    return {"revenue_by_category": [int(r) for r in revenue], "rows": int(joined.shape[0]),
            "scanned": join["scanned"], "storage": st.kind, "state": state}
