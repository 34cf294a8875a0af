"""Generates the data set as CSV text (args: rows, features; seeded, so every run sees the same
data) and parses it: the features (float64, rows x features) go to slot 0 of `parsed`, the labels
to slot 1."""
import io

import numpy

from scad.state import open_state


def main(args, action):
    rows, features = int(args.get("rows", 100_000)), int(args.get("features", 32))
    rng = numpy.random.default_rng(11)
    truth = rng.normal(0, 1, features)
    x = rng.normal(0, 1, (rows, features)) * rng.uniform(0.5, 20, features) + rng.uniform(-5, 5, features)
    z = ((x - x.mean(axis=0)) / x.std(axis=0)) @ truth
    y = (rng.uniform(0, 1, rows) < 1 / (1 + numpy.exp(-z))).astype(numpy.float64)
    text = io.StringIO()
    numpy.savetxt(text, numpy.column_stack([x, y]), delimiter=",", fmt="%.6g")
    table = numpy.loadtxt(io.StringIO(text.getvalue()), delimiter=",", ndmin=2)
    st = open_state(action, args)
    st.put("parsed", 0, table[:, :features], slots=2)
    st.put("parsed", 1, table[:, features], slots=2)
    return {"rows": rows, "features": features, "csv_bytes": len(text.getvalue()),
            "states": {"load#0": st.counters()}}
