"""Normalises the features (zero mean, unit variance), holds out a fifth as the test set and cuts
the rest into one shard per training instance. Slot layout of `shards` (2 * parts + 2 slots):
shard i's features in slot 2i and labels in 2i + 1; the test set's in the last two."""
import numpy

from scad.state import carried, open_state


def main(args, action):
    rows, features = args["load"][0]["rows"], args["load"][0]["features"]
    parts = int(args.get("parts", 4))
    st = open_state(action, args)
    x = st.get("parsed", 0, numpy.float64, slots=2).reshape(rows, features)
    y = st.get("parsed", 1, numpy.float64, slots=2)
    x = (x - x.mean(axis=0)) / x.std(axis=0)
    order = numpy.random.default_rng(5).permutation(rows)
    test, train = order[: rows // 5], order[rows // 5:]
    slots = 2 * parts + 2
    for i, shard in enumerate(numpy.array_split(train, parts)):
        st.put("shards", 2 * i, x[shard], slots=slots)
        st.put("shards", 2 * i + 1, y[shard], slots=slots)
    st.put("shards", slots - 2, x[test], slots=slots)
    st.put("shards", slots - 1, y[test], slots=slots)
    return {"features": features, "parts": parts, "train_rows": int(train.size), "test_rows": int(test.size),
            "states": {**carried(args, "load"), "prepare#0": st.counters()}}
