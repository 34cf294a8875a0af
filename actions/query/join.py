"""Joins every scan's output with item on item_sk (a hash join: a table built on item's key,
probed with each sale's) and writes (category, revenue in cents) per sale to `joined`."""
import numpy

from scad.state import carried, open_state


def main(args, action):
    parts = len(args["scan"])
    st = open_state(action, args)
    item = st.get("dims", 0, numpy.int64, slots=2).reshape(-1, 2)  # generate.py: item in slot 0 of 2
    # Build: an open-addressed table of item_sk -> category (numpy, power-of-two size).
    size = 1 << int(2 * item.shape[0] - 1).bit_length()
    keys = numpy.zeros(size, dtype=numpy.int64)
    values = numpy.zeros(size, dtype=numpy.int64)
    slot = (item[:, 0] * 0x9E3779B1) & (size - 1)
    for _ in range(size):  # linear probing, all keys placed at once per round
        free = keys[slot] == 0
        first = numpy.zeros(slot.size, dtype=bool)
        _, at = numpy.unique(slot, return_index=True)
        first[at] = True
        place = free & first
        keys[slot[place]], values[slot[place]] = item[place, 0], item[place, 1]
        item, slot = item[~place], (slot[~place] + 1) & (size - 1)
        if not item.shape[0]:
            break
    out = []
    for i in range(parts):
        rows = st.get("filtered", i, numpy.int64, slots=parts).reshape(-1, 3)
        probe = (rows[:, 0] * 0x9E3779B1) & (size - 1)
        found = numpy.full(rows.shape[0], -1, dtype=numpy.int64)
        pending = numpy.arange(rows.shape[0])
        while pending.size:
            hit = keys[probe[pending]] == rows[pending, 0]
            found[pending[hit]] = values[probe[pending[hit]]]
            pending = pending[~hit & (keys[probe[pending]] != 0)]
            probe[pending] = (probe[pending] + 1) & (size - 1)
        matched = found >= 0
        out.append(numpy.stack([found[matched], rows[matched, 1] * rows[matched, 2]], axis=1))
    joined = numpy.concatenate(out) if out else numpy.zeros((0, 2), dtype=numpy.int64)
    st.put("joined", 0, joined)
    return {"rows": int(joined.shape[0]), "scanned": sum(s["scanned"] for s in args["scan"]),
            "states": {**carried(args, "scan"), "join#0": st.counters()}}
