#!/usr/bin/env python3
"""One-sided transfers through this project's Python APIs beside the peers our users would pick
instead, in one run, with ratios:

    bench/transfer.py [--quick] [--no-setup] [--transports shm,tcp] [--apis ...] [--skip-peers] [--rounds 3]
                      [--no-pin]

Ours (the project's .venv and build): plain libd transport reads and writes (`libd`), scad.connect
(`connect`), scad.rdma (`rdma`), scad.tensor_transport (`tensor`). Peers (their own environment,
.bench-venv, made by bench/peer-venv from the package registry): NIXL 1.5.1 (CPU-only, UCX inside)
over UCX tcp and over UCX shared memory, and Mooncake Transfer Engine over tcp. Everything stays on
this host and on 127.0.0.1.

Each API runs as a pair of processes (the owner lends memory, the active side reads or writes it;
bench/transfer_pair.py). Two kinds of figure, both medians, in microseconds per operation:
  - an *operation* (connect, rdma, tensor, and NIXL / Mooncake driven the same way): lend the
    memory, hand the record to the peer, the peer moves the bytes, the owner learns it finished
    and ends the loan; timed in the owner;
  - a *transfer* (libd, and NIXL / Mooncake with memory registered and connected once): one read
    or write; timed in the active side.
Sizes 64 B .. 16 MiB, read and write, 1 and 16 in flight (per buffer: the batch's time / 16; a
batch is each API's own way of moving several buffers at once, transfer_pair.py says which).
The ratio is the peer's time over ours: above 1, ours is faster. Raw results go to bench/out/.

A run is several rounds. In a round the driver starts every pair of a transport at once and
steps them through the cells together: each cell is measured by every pair in turn (ours first
for one cell, the peers first for the next, and within each group a different pair first from
cell to cell), in five slices taken by turns (every pair's first slice, then every pair's
second...), the others asleep meanwhile. On a shared two-core virtual machine one operation's
time drifts by half from one minute to the next, and either virtual CPU runs slower for a second
or more at a time, so a ratio is taken within a round, from figures measured in the same spells,
and the figures printed are medians over the rounds. Before every cell a pair measures, the driver runs
bench/cross_core_probe.cc, which times a 64 KiB buffer handed between the two CPUs and back;
the report prints each round's figures. Each worker keeps its main thread on one CPU, a pair's
owner on the first and its active side on the second (transfer_pair.pin_main_thread; --no-pin
leaves them be): unpinned, the kernel often left both sides of a pair on one CPU for a whole cell.
"""
import argparse
import json
import os
import pathlib
import select
import signal
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
SIZES = [64, 4096, 65536, 1 << 20, 16 << 20]
QUICK_SIZES = [64, 65536, 1 << 20]
OURS = ("libd", "connect", "rdma", "tensor")
NAMES = {"libd": "libd", "connect": "scad.connect", "rdma": "scad.rdma", "tensor": "scad.tensor_transport",
         "nixl": "NIXL 1.5.1", "mooncake": "Mooncake TE"}
# UCX transports NIXL uses. Shared memory: its UCX backend creates endpoints with peer error
# handling, which UCX's shared-memory transports do not offer for active messages, so with
# UCX_TLS=shm alone the agent cannot even start ("no active messages transport ... no peer failure
# handler"); with tcp beside it, tcp carries the active messages (connection set-up, notifications)
# and UCX moves the data by cross-memory attach (cma) or shared memory.
NIXL_TLS = {"tcp": "tcp", "shm": "shm,tcp"}
MOONCAKE_TRANSPORTS = ("tcp",)  # the PyPI build has tcp (and rdma); no shared-memory protocol
# Run before every cell a pair measures: what handing memory between two cores costs at that
# moment (bench/cross_core_probe.cc). Its figure goes with the cell's row (probe_us).
PROBE = ROOT / "build" / "bench" / "libd-cross-core-probe"


def human(n):
    for unit, f in (("MiB", 1 << 20), ("KiB", 1024)):
        if n >= f:
            return f"{n // f} {unit}"
    return f"{n} B"


def plan_for(api, sizes, mode):
    """Cells (mode, size, op, inflight); the 1 MiB read of one at a time goes first, so that the
    pair's very first operation (cold: memory server start, first connection) is that one."""
    ops = ("read",) if api == "tensor" else ("read", "write")  # Ray's transport only reads
    cells = [(mode, s, op, k) for s in sizes for op in ops for k in (1, 16)]
    head = (mode, 1 << 20, "read", 1)
    if head in cells:
        cells.remove(head)
        cells.insert(0, head)
    return cells


# How long a pair may take to start (NIXL's agents, Mooncake's engines, imports) and one cell (a
# cell takes about a second: 0.25 s of measured batches, warm-up, a 16 MiB cell's copies).
READY_LIMIT_S = 120
CELL_LIMIT_S = 60


class Pair:
    """One worker pair (its owner process, which starts its active side), stepped through its plan
    by the driver one cell at a time. A pair that fails, or takes longer than its limit (a NIXL pair
    once spun for 8 minutes), is killed with its active side, the whole process group, and the run
    goes on with the others."""

    def __init__(self, python, script, api, mode, transport, plan, env, log, key):
        self.api, self.mode, self.plan, self.key = api, mode, plan, key
        self.index = {cell: i for i, cell in enumerate(plan)}
        argv = [python, str(BENCH / script), "owner", api, transport, json.dumps(plan)]
        # A session of its own: killed, its active side goes too.
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=env,
                                     start_new_session=True)
        self.pending = b""
        self.rows, self.error, self.busy_s = [], None, 0.0
        self.round, self.probe = 0, None  # of the cell being measured

    def alive(self):
        return self.error is None

    def message(self, limit_s):
        """The owner's next line for the driver, as a dict."""
        deadline = time.time() + limit_s
        fd = self.proc.stdout.fileno()
        while True:
            nl = self.pending.find(b"\n")
            if nl >= 0:
                line, self.pending = self.pending[:nl], self.pending[nl + 1:]
                if line.startswith(b"@@"):
                    msg = json.loads(line[2:])
                    if "error" in msg:
                        raise RuntimeError(msg["error"])
                    return msg
                continue
            left = deadline - time.time()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError(f"no answer within {limit_s} s")
            chunk = os.read(fd, 65536)
            if not chunk:
                raise EOFError(f"the owner ended (status {self.proc.wait()})")
            self.pending += chunk

    def fail(self, why):
        self.error = why
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()

    def wait_ready(self):
        try:
            self.message(READY_LIMIT_S)
        except (RuntimeError, TimeoutError, EOFError) as e:
            self.fail(f"did not start: {e}")

    def start_cell(self, cell, rnd):
        """Starts measuring `cell` (mode, size, op, inflight) if it is in this pair's plan; True if
        the pair then paused after the cell's first slice (resume() goes on with it)."""
        if not self.alive() or cell not in self.index:
            return False
        self.round, self.probe = rnd, cross_core_probe()
        return self._step({"cell": self.index[cell]})

    def resume(self):
        """Measures the cell's next slice; True if the pair paused again, False once its row is in."""
        return self.alive() and self._step({"resume": True})

    def _step(self, command):
        t0 = time.time()
        paused = False
        try:
            self.proc.stdin.write(f"@@{json.dumps(command)}\n".encode())
            self.proc.stdin.flush()
            msg = self.message(CELL_LIMIT_S)
            paused = bool(msg.get("paused"))
            if not paused:
                self.rows.append(dict(msg, round=self.round, probe_us=self.probe))
        except (RuntimeError, TimeoutError, EOFError, BrokenPipeError) as e:
            self.fail(f"{e} (after {len(self.rows)} of {len(self.plan)} cells)")
        self.busy_s += time.time() - t0
        return paused

    def finish(self):
        """Tells the owner to quit; the note about how it ended ("" if it ended well)."""
        if not self.alive():
            return ""
        try:
            self.proc.stdin.write(b'@@{"quit":true}\n')
            self.proc.stdin.close()
        except BrokenPipeError:
            pass
        try:
            code = self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.fail("did not end within 60 s of its last cell")
            return ""
        # Seen with NIXL: SIGSEGV in the agent's teardown, after every figure.
        return f" (the process then ended with status {code})" if code != 0 else ""


def cross_core_probe():
    """Microseconds a 64 KiB buffer takes to go to another core and back, now (None: no probe,
    or fewer than two CPUs). On this host's virtual machine it doubles in spells, and every
    cross-core transfer slows with it: it tells a slow round from a slow API."""
    try:
        out = subprocess.run([str(PROBE)], capture_output=True, text=True, timeout=10).stdout.strip()
        return float(out)
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None


def cell_order(sizes):
    """Every cell (size, op, inflight) of a transport, in the order the pairs measure them: that
    of an operation plan (the 1 MiB read of one at a time first, each pair's cold first figure)."""
    return [(size, op, k) for _, size, op, k in plan_for("rdma", sizes, "op")]


def rotated(items, by):
    """items, starting at index `by` (modulo their number) and wrapping round."""
    if not items:
        return items
    by %= len(items)
    return items[by:] + items[:by]


def run_round(specs, transport, sizes, rnd, log):
    """One round over `transport`: every pair started at once and stepped through the cells
    together, each cell measured by every pair that has it, slice by slice in turns
    (transfer_pair.SLICES), ours first for one cell and the peers first for the next (which go
    first in the round's first cell alternates by round), and within ours and within the peers a
    different pair first from one cell and round to the next, the pairs not measuring asleep
    meanwhile. Returns the pairs, done."""
    pairs = [Pair(python, script, api, mode, transport, plan_for(api, sizes, mode), env, log, key)
             for python, script, api, mode, env, key, _ in specs]
    ours = [p for p, spec in zip(pairs, specs) if spec[6]]
    peers = [p for p, spec in zip(pairs, specs) if not spec[6]]
    for p in pairs:
        p.wait_ready()
    for n, (size, op, k) in enumerate(cell_order(sizes)):
        turn = n + rnd
        # Within each group too, who goes first moves every two turns (the group that goes first
        # alternates with turn's parity, so every pair takes the very first place in turn): where
        # a pair stands in the cell's sequence shows in memory-bound cells (scad.rdma and
        # scad.tensor_transport in a fixed order, five runs: the first of the two read 16 x 1 MiB
        # over shm 17-44 µs a buffer faster than the second, whichever it was).
        mine, theirs = rotated(ours, turn // 2), rotated(peers, turn // 2)
        # The cell's slices by turns, in that order: the pairs measure it in the same spells.
        going = [p for p in (mine + theirs if turn % 2 == 0 else theirs + mine)
                 if p.start_cell((p.mode, size, op, k), rnd)]
        while going:
            going = [p for p in going if p.resume()]
    for p in pairs:
        crash = p.finish()
        print(f"  {NAMES[p.api]:22} {transport:4} {p.mode:4} {len(p.rows):3} cells, {p.busy_s:5.1f} s measuring{crash}"
              + (f"  FAILED: {p.error}" if p.error else ""), flush=True)
    return pairs


def per_op_us(row):
    return statistics.median(row["times"]) / row["inflight"] * 1e6


def fmt(x, width=9, digits=1):
    return f"{'-':>{width}}" if x is None else f"{x:{width}.{digits}f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help=f"sizes {', '.join(map(human, QUICK_SIZES))} only")
    ap.add_argument("--no-setup", action="store_true", help="skip scripts/setup (the build is up to date)")
    ap.add_argument("--transports", default="shm,tcp")
    ap.add_argument("--apis", default=",".join(OURS))
    ap.add_argument("--skip-peers", action="store_true")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of every API and peer (default 3)")
    ap.add_argument("--no-pin", action="store_true",
                    help="leave every worker's main thread unpinned (by default a pair's owner runs on one CPU, "
                         "its active side on another)")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    unknown = sorted(set(args.apis.split(",")) - set(OURS))
    if unknown:
        ap.error(f"--apis: unknown {', '.join(unknown)} (ours are {', '.join(OURS)})")
    t_start = time.time()
    load_before = os.getloadavg()
    if not args.no_setup:
        subprocess.run([str(ROOT / "scripts/setup")], check=True)
    ours_python = str(ROOT / ".venv/bin/python")
    peer_python = None
    if not args.skip_peers:
        peer_python = subprocess.run([str(BENCH / "peer-venv")], check=True, capture_output=True,
                                     text=True).stdout.strip().splitlines()[-1]
    sizes = QUICK_SIZES if args.quick else SIZES
    transports = args.transports.split(",")
    apis = args.apis.split(",")
    out = BENCH / "out"
    out.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    log_path = out / f"transfer-{stamp}.log"
    rows, failures, notes = [], {}, []
    # numpy's OpenBLAS starts a pool of threads that spin for a while; nothing here does algebra.
    base_env = dict(os.environ, PYTHONUNBUFFERED="1", OPENBLAS_NUM_THREADS="1", BENCH_PIN="0" if args.no_pin else "1")
    with open(log_path, "w") as log:
        for rnd in range(args.rounds):
            for transport in transports:
                print(f"round {rnd + 1} of {args.rounds}: measuring over {transport} ...", flush=True)
                # (python, script, api, mode, env, failure key, ours?) of every worker pair of the round
                specs = [(ours_python, "transfer_scad.py", api, "xfer" if api == "libd" else "op", base_env,
                          (api, transport), True) for api in apis]
                if not args.skip_peers:
                    # NIXL: operations and steady-state transfers.
                    env = dict(base_env, UCX_TLS=NIXL_TLS[transport], UCX_NET_DEVICES="lo")
                    specs += [(peer_python, "transfer_peers.py", "nixl", mode, env, ("nixl", transport, mode), False)
                              for mode in ("op", "xfer")]
                    if transport in MOONCAKE_TRANSPORTS:
                        specs += [(peer_python, "transfer_peers.py", "mooncake", mode, base_env,
                                   ("mooncake", transport, mode), False) for mode in ("op", "xfer")]
                for p in run_round(specs, transport, sizes, rnd, log):
                    rows += p.rows
                    if p.error:
                        failures[p.key] = p.error
    if not args.skip_peers:
        notes.append(f"NIXL over shm is UCX_TLS={NIXL_TLS['shm']}: with shared memory alone its UCX backend "
                     "cannot start (UCX: 'no active messages transport ... no peer failure handler').")
        notes.append("Mooncake has no figure over shm: the transfer engine on PyPI (0.3.13.post1) offers tcp and "
                     "rdma only (its shared-memory transport is in a later release); tried protocol shm and "
                     "MC_USE_TENT=1, both run tcp.")
        notes.append("scad.tensor_transport has no write: Ray's tensor transport is one-sided and only reads "
                     "(the destination pulls).")
    report(rows, sizes, transports, apis, failures, notes, args.rounds)
    load_after = os.getloadavg()
    print(f"\nload average (1, 5, 15 min) before: {' '.join(f'{x:.2f}' for x in load_before)}, after: "
          f"{' '.join(f'{x:.2f}' for x in load_after)} (2 cores: anything else running shows in the figures)")
    path = out / f"transfer-{stamp}.json"
    path.write_text(json.dumps({"rows": rows, "failures": {" ".join(k): v for k, v in failures.items()}}, indent=1))
    print(f"\nraw results: {path.relative_to(ROOT)}, worker logs: {log_path.relative_to(ROOT)}; "
          f"took {time.time() - t_start:.0f} s")


def index(rows):
    """{cell key: {round: row}}"""
    ix = {}
    for r in rows:
        ix.setdefault((r["api"], r["transport"], r["mode"], r["size"], r["op"], r["inflight"]), {})[r.get("round", 0)] = r
    return ix


def median_or_none(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def report(rows, sizes, transports, apis, failures, notes, rounds=1):
    ix = index(rows)

    def med(key):
        """The cell's median time per operation, the median over the rounds."""
        return median_or_none([per_op_us(r) for r in ix.get(key, {}).values()])

    def ratio(peer_key, our_key):
        """The peer's time over ours, taken within each round (both measured then), median over rounds."""
        ours, peer = ix.get(our_key, {}), ix.get(peer_key, {})
        return median_or_none([per_op_us(peer[n]) / per_op_us(ours[n]) for n in ours if n in peer])

    checks = []
    print()
    print(f"Microseconds per operation (median; over {rounds} round{'s' if rounds > 1 else ''}: the median of each "
          "round's median);")
    print("x = the peer's time / ours within a round, median over the rounds (above 1: ours is faster).")
    print("libd rows: one transfer on a connected transport, beside the peers' steady-state transfers;")
    print("API rows: one whole operation (lend, hand over, transfer, completion, end), beside the peers' operations.")
    unverified = [r for r in rows if not r.get("verified", True)]
    for transport in transports:
        title = {"shm": "shm (same host)", "tcp": "tcp (127.0.0.1)"}.get(transport, transport)
        print(f"\n== {title}")
        print(f"{'API':22} {'size':>7} {'op':5} {'k':>2} | {'ours':>9} {'GB/s':>6} | {'NIXL':>9} {'x':>6} | "
              f"{'Mooncake':>9} {'x':>6}")
        for api in apis:
            mode = "xfer" if api == "libd" else "op"
            for size in sizes:
                for op in ("read", "write"):
                    for k in (1, 16):
                        ours = med((api, transport, mode, size, op, k))
                        if ours is None and (api == "tensor" and op == "write"):
                            continue
                        key = (api, transport, mode, size, op, k)
                        nixl = med(("nixl", transport, mode, size, op, k))
                        moon = med(("mooncake", transport, mode, size, op, k))
                        xn = ratio(("nixl", transport, mode, size, op, k), key)
                        xm = ratio(("mooncake", transport, mode, size, op, k), key)
                        gbs = size / (ours * 1e3) if ours else None
                        print(f"{NAMES[api]:22} {human(size):>7} {op:5} {k:>2} | {fmt(ours)} {fmt(gbs, 6, 2)} | "
                              f"{fmt(nixl)} {fmt(xn, 6, 2)} | {fmt(moon)} {fmt(xm, 6, 2)}")
                        for peer, x in (("NIXL", xn), ("Mooncake", xm)):
                            if x is not None:
                                checks.append((f"{transport} {NAMES[api]} {human(size)} {op} x{k} vs {peer}", x))
    print("\nSet-up + one 1 MiB transfer, one at a time (median µs; first: the pair's very first operation)")
    print(f"{'transport':9} {'API':22} | {'read':>9} {'write':>9} {'first':>9}")
    for transport in transports:
        for api in list(apis) + ["nixl", "mooncake"]:
            for mode in (("xfer",) if api == "libd" else ("op",)):
                r = med((api, transport, mode, 1 << 20, "read", 1))
                w = med((api, transport, mode, 1 << 20, "write", 1))
                first = median_or_none([row["first"] * 1e6 for row in ix.get((api, transport, mode, 1 << 20, "read", 1),
                                                                            {}).values()])
                if r is None and w is None:
                    continue
                label = NAMES[api] + (" (transfer)" if mode == "xfer" else "")
                print(f"{transport:9} {label:22} | {fmt(r)} {fmt(w)} {fmt(first)}")
    probes = {}
    for r in rows:
        if r.get("probe_us") is not None:
            probes.setdefault((r["transport"], r.get("round", 0)), []).append(r["probe_us"])
    if probes:
        print("\nCross-core probe before each cell (µs for 64 KiB handed to another core and back, median and "
              "highest of the round): on a virtual machine it doubles in spells of the host's, and every transfer "
              "between processes on different cores slows with it.")
        for transport in transports:
            parts = [f"round {n + 1}: {statistics.median(v):.1f}, {max(v):.1f}" for n in range(rounds)
                     if (v := probes.get((transport, n)))]
            if parts:
                print(f"  {transport:4} " + "; ".join(parts))
    missed = [(n, x) for n, x in checks if x < 1]
    print(f"\ntarget (ahead of NIXL and Mooncake in every cell both can run): {len(checks) - len(missed)} of "
          f"{len(checks)} met")
    for n, x in missed:
        print(f"  MISSED {n}: {x:.2f}")
    for n in notes:
        print("note:", n)
    for key, err in failures.items():
        print("FAILED:", " ".join(key), err)
    for r in unverified:
        print(f"DATA CHECK FAILED: {r['api']} {r['transport']} {r['mode']} {human(r['size'])} {r['op']} x{r['inflight']}")


if __name__ == "__main__":
    main()
