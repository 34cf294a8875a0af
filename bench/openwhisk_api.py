#!/usr/bin/env python3
"""Warm blocking invocations per second through the OpenWhisk REST API of a real `scad-server`
(single machine): a trivial Python action invoked with `POST .../actions/NAME?blocking=true`
from 1 client and from 16 clients at once (each a thread with a kept-alive HTTP connection),
after a warm-up that leaves warm processes behind. Each figure is the median of --rounds rounds
of --seconds each.

The peer, Apache OpenWhisk itself (its standalone controller), needs a JVM and Docker to run its
action containers; neither is available on this machine, so no OpenWhisk figure is printed here.

    bench/openwhisk_api.py [--rounds 5] [--seconds 3]
"""
import argparse
import base64
import http.client
import json
import pathlib
import statistics
import sys
import tempfile
import threading
import time
import urllib.parse

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "build" / "python"), str(ROOT / "bindings" / "python")]
from scadtest import Platform  # noqa: E402

ACTION = "def main(args):\n    return {'echo': args.get('n', 0)}\n"
PATH = "/api/v1/namespaces/_/actions/bench?blocking=true"


class Client:
    """One kept-alive connection, as an OpenWhisk client library holds it."""

    def __init__(self, url, auth):
        u = urllib.parse.urlparse(url)
        self.conn = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
        self.headers = {"Authorization": "Basic " + base64.b64encode(auth.encode()).decode(),
                        "Content-Type": "application/json"}

    def invoke(self, n):
        self.conn.request("POST", PATH, json.dumps({"n": n}), self.headers)
        r = self.conn.getresponse()
        body = json.loads(r.read())
        if r.status != 200 or body["response"]["result"] != {"echo": n}:
            raise RuntimeError(f"invocation failed: {r.status} {body}")


def rate(p, clients, seconds):
    """Invocations per second completed by `clients` threads invoking back to back for `seconds`."""
    done = [0] * clients
    errors = []
    start = threading.Barrier(clients + 1)
    stop = threading.Event()

    def loop(i):
        c = Client(p.url, p.auth)
        start.wait()
        try:
            while not stop.is_set():
                c.invoke(done[i])
                done[i] += 1
        except Exception as e:  # noqa: BLE001 - reported below, the round fails
            errors.append(e)

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.monotonic()
    stop.wait(seconds)
    stop.set()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - t0
    if errors:
        raise errors[0]
    return sum(done) / elapsed


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as home:
        p = Platform(pathlib.Path(home) / "home")
        try:
            status, body = p.call("PUT", "/api/v1/namespaces/_/actions/bench?overwrite=true",
                                  {"exec": {"kind": "python:3", "code": ACTION}})
            assert status == 200, body
            rate(p, 16, 1)  # warm-up: warm processes for the action, as many as the clients use
            for clients in (1, 16):
                figures = [rate(p, clients, args.seconds) for _ in range(args.rounds)]
                print(f"warm blocking invokes, {clients:2} client(s): median {statistics.median(figures):7.1f}/s "
                      f"(rounds: {', '.join(f'{f:.1f}' for f in figures)})")
        finally:
            p.stop()
    print("peer: Apache OpenWhisk is not runnable here (needs a JVM and Docker); no ratio")


if __name__ == "__main__":
    main()
