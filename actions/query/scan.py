"""Scans one partition of store_sales and keeps the rows sold in November and December of the
year asked for (args["year"], default 2001), joined with date_dim by a lookup on date_sk."""
import numpy

from scad.state import carried, open_state


def main(args, action):
    i, parts, year = args["_instance"], args["_parallelism"], int(args.get("year", 2001))
    st = open_state(action, args)
    # The layouts generate.py writes: sales rows of 5 columns, date_dim in slot 1 of 2 in `dims`.
    sales = st.get("sales", i, numpy.int64, slots=parts).reshape(-1, 5)
    dates = st.get("dims", 1, numpy.int64, slots=2).reshape(-1, 3)
    # date_dim is dense in date_sk: the join on it is an index.
    day = sales[:, 1] - dates[0, 0]
    wanted = (dates[day, 1] == year) & (dates[day, 2] >= 11)
    kept = numpy.ascontiguousarray(sales[wanted][:, [0, 3, 4]])  # item_sk, quantity, price
    st.put("filtered", i, kept, slots=parts)
    return {"instance": i, "scanned": int(sales.shape[0]), "kept": int(kept.shape[0]),
            "states": {**carried(args, "generate"), f"scan#{i}": st.counters()}}
