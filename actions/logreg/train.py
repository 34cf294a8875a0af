"""SGD epochs (args: epochs, default 5; minibatches of 256; learning rate 0.1) over this instance's
shard, read once from `shards`; returns the weights it learned (the evaluation averages them)."""
import numpy

from scad.state import carried, open_state


def main(args, action):
    prep = args["prepare"][0]
    i, parts, features = args["_instance"], args["_parallelism"], prep["features"]
    if parts != prep["parts"]:
        raise ValueError(f"train runs {parts} instances but prepare cut {prep['parts']} shards (args.parts)")
    slots = 2 * parts + 2
    st = open_state(action, args)
    x = st.get("shards", 2 * i, numpy.float64, slots=slots).reshape(-1, features)
    y = st.get("shards", 2 * i + 1, numpy.float64, slots=slots)
    w, b = numpy.zeros(features), 0.0
    rng = numpy.random.default_rng(100 + i)
    for _ in range(int(args.get("epochs", 5))):
        for batch in numpy.array_split(rng.permutation(y.size), max(1, y.size // 256)):
            p = 1 / (1 + numpy.exp(-(x[batch] @ w + b)))
            w -= 0.1 * (x[batch].T @ (p - y[batch])) / batch.size
            b -= 0.1 * float(numpy.mean(p - y[batch]))
    return {"instance": i, "rows": int(y.size), "weights": [float(v) for v in w], "bias": b,
            "features": features, "parts": parts, "states": {**carried(args, "prepare"), f"train#{i}": st.counters()}}
