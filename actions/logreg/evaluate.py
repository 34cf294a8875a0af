"""Averages the training instances' models and measures their accuracy on the test set."""
import hashlib

import numpy

from scad.state import carried, merge_counters, open_state


def main(args, action):
    trained = sorted(args["train"], key=lambda t: t["instance"])
    parts, features = trained[0]["parts"], trained[0]["features"]
    slots = 2 * parts + 2
    st = open_state(action, args)
    x = st.get("shards", slots - 2, numpy.float64, slots=slots).reshape(-1, features)
    y = st.get("shards", slots - 1, numpy.float64, slots=slots)
    w = numpy.mean([t["weights"] for t in trained], axis=0)
    b = float(numpy.mean([t["bias"] for t in trained]))
    accuracy = float(numpy.mean(((x @ w + b) > 0) == (y > 0.5)))
    state = merge_counters(*carried(args, "train").values(), st.counters())
    return {"accuracy": round(accuracy, 6), "test_rows": int(y.size),
            "model": hashlib.sha256(numpy.round(w, 9).tobytes()).hexdigest()[:16], "storage": st.kind, "state": state}
