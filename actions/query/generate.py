"""Makes partition `_instance` of store_sales (and, in instance 0, the item and date_dim tables),
seeded so that every run and both storages see the same data.

The layout the other stages read: store_sales rows are five int64 columns (item_sk, date_sk,
store_sk, quantity, price in cents), one (rows, 5) array per slot of `sales`; `dims` holds item
(item_sk, category) in slot 0 and date_dim (date_sk, year, month) in slot 1."""
import numpy

from scad.state import open_state

ROWS_PER_SCALE = 500_000
ITEMS = 18_000
CATEGORIES = 10
FIRST_YEAR, YEARS = 1998, 6
FIRST_DATE_SK = 2_450_000


def dates():
    days = numpy.arange(YEARS * 365, dtype=numpy.int64)
    return numpy.stack([days + FIRST_DATE_SK, FIRST_YEAR + days // 365, 1 + (days % 365) * 12 // 365], axis=1)


def items(rng):
    return numpy.stack([numpy.arange(1, ITEMS + 1, dtype=numpy.int64), rng.integers(0, CATEGORIES, ITEMS)], axis=1)


def sales(rng, rows):
    return numpy.stack([rng.integers(1, ITEMS + 1, rows), rng.integers(0, YEARS * 365, rows) + FIRST_DATE_SK,
                        rng.integers(1, 100, rows), rng.integers(1, 100, rows), rng.integers(100, 30_000, rows)],
                       axis=1).astype(numpy.int64)


def main(args, action):
    sf, i, parts = float(args.get("scale", 1)), args["_instance"], args["_parallelism"]
    rows = int(ROWS_PER_SCALE * sf)
    lo, hi = rows * i // parts, rows * (i + 1) // parts
    st = open_state(action, args)
    st.put("sales", i, sales(numpy.random.default_rng(7 + i), hi - lo), slots=parts)
    if i == 0:
        st.put("dims", 0, items(numpy.random.default_rng(3)), slots=2)
        st.put("dims", 1, dates(), slots=2)
    return {"instance": i, "rows": hi - lo, "states": {f"generate#{i}": st.counters()}}
