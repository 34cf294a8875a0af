#!/usr/bin/env python3
"""The control plane on a real `scad-server` (single machine), in one run:

- memory element invoke -> transport usable: action.runtime.invoke() inside a running action,
  timed around the call (target: median <= 2 ms);
- warm per-element overhead in a chain of 8 no-op compute elements and in a fan-out of 8: the
  invocation's wall time (client side) divided by 8, after a first run made the processes warm
  (targets <= 5 ms per element; Scad published 9-15 ms, OpenWhisk 26-35 ms);
- start of a Python compute element, request to the start of main: from the pre-warmed pool (a new
  action each time, so never a warm process) and truly cold (a platform started with --prewarm 0),
  the process forked by the fork server (target <= 20 ms); and cold with --fork-server off (an
  interpreter started in bubblewrap for the run), for comparison.

    bench/control_plane.py [--runs 7]
"""
import argparse
import json
import pathlib
import statistics
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "build" / "python"), str(ROOT / "bindings" / "python")]
from scadtest import Platform  # noqa: E402

NOOP = "import time\n\ndef main(args, action):\n    return {'t': time.time()}\n"
INVOKER = """import time

def main(args, action):
    out = []
    for i in range(args.get('n', 20)):
        t0 = time.perf_counter()
        t = action.runtime.invoke('tmpl', 'm%d' % i, {'size': 1 << 20})   # returns once usable
        out.append((time.perf_counter() - t0) * 1000)
        t.reg(64)
        t.write(8, 0)
        action.runtime.release('m%d' % i)
    return {'ms': out}
"""


def app(elements, files):
    return {"manifest": json.dumps({"name": "x", "elements": elements}), "files": files}


def start_times(p, runs, prefix="noop"):
    """Request -> main starts (main reports its start time), each time for a new action."""
    out = []
    for i in range(runs):
        name = f"{prefix}{i}"
        assert p.call("PUT", f"/api/v1/namespaces/_/actions/{name}", {"exec": {"kind": "python:3", "code": NOOP}})[0] == 200
        t0 = time.time()
        status, res = p.call("POST", f"/api/v1/namespaces/_/actions/{name}", {}, params="?blocking=true&result=true")
        assert status == 200, res
        out.append((res["t"] - t0) * 1000)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="scad-cp-") as home:
        p = Platform(pathlib.Path(home))
        try:
            # 1. invoke -> usable
            body = app({"tmpl": {"kind": "memory", "size": "1MiB"}, "inv": {"kind": "compute", "code": "inv.py"}},
                       {"inv.py": INVOKER})
            body["manifest"] = body["manifest"].replace('"x"', '"inv"')
            assert p.call("PUT", "/api/v1/namespaces/_/apps/inv", body)[0] == 200
            status, rec = p.call("POST", "/api/v1/namespaces/_/apps/inv", {"n": 50}, params="?blocking=true&result=true")
            assert status == 200, rec
            invoke_ms = rec["ms"][5:]  # the first calls warm the endpoint's connection

            # 2. chain and fan-out of 8 no-op elements
            chain = {f"e{i}": {"kind": "compute", "code": "noop.py", "cpu": 0.25,
                               **({"dependents": [f"e{i + 1}"]} if i < 7 else {})} for i in range(8)}
            fan = {"e": {"kind": "compute", "code": "noop.py", "parallelism": 8, "cpu": 0.25}}
            per_element = {}
            for name, elements in (("chain8", chain), ("fanout8", fan)):
                body = app(elements, {"noop.py": NOOP})
                body["manifest"] = body["manifest"].replace('"x"', f'"{name}"')
                assert p.call("PUT", f"/api/v1/namespaces/_/apps/{name}", body)[0] == 200
                assert p.call("POST", f"/api/v1/namespaces/_/apps/{name}", {}, params="?blocking=true")[0] == 200
                ms = []
                for _ in range(args.runs):
                    t0 = time.perf_counter()
                    status, rec = p.call("POST", f"/api/v1/namespaces/_/apps/{name}", {}, params="?blocking=true")
                    wall = (time.perf_counter() - t0) * 1000
                    assert status == 200, rec
                    ms.append(wall / 8)
                per_element[name] = ms

            prewarmed = start_times(p, args.runs)
        finally:
            p.stop()
    cold = {}
    for how, extra in (("forked", []), ("afresh", ["--fork-server", "off"])):
        with tempfile.TemporaryDirectory(prefix="scad-cp-cold-") as home:
            p = Platform(pathlib.Path(home), extra=["--prewarm", "0", *extra])
            try:
                start_times(p, 1, "first")  # the platform's first run may wait for the fork server's imports
                cold[how] = start_times(p, args.runs)
            finally:
                p.stop()

    med = statistics.median
    rows = [("memory element invoke -> transport usable", med(invoke_ms), 2.0),
            ("warm, per element, chain of 8", med(per_element["chain8"]), 5.0),
            ("warm, per element, fan-out of 8", med(per_element["fanout8"]), 5.0),
            ("start from the pre-warmed pool (request -> main)", med(prewarmed), 20.0),
            ("cold start, no pool (request -> main)", med(cold["forked"]), 20.0),
            ("cold start, no pool, --fork-server off", med(cold["afresh"]), None)]
    print(f"{'measure':62} {'median ms':>10} {'target':>8}")
    for name, v, target in rows:
        verdict = "" if target is None else f"{'<= ' + str(target):>8} {'met' if v <= target else 'MISSED'}"
        print(f"{name:62} {v:10.2f} {verdict}")
    print(f"cold start: the fork server is {med(cold['afresh']) / med(cold['forked']):.1f}x faster than starting afresh")


if __name__ == "__main__":
    main()
