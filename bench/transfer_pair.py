"""What both kinds of worker of bench/transfer.py share (standard library only, so it runs in the
project's environment and in the peers' own, .bench-venv).

A worker pair is two processes on this host: the *owner* lends memory and the *active* side reads
or writes it. The driver starts the owner with a plan (a list of cells); the owner starts its
active side itself and talks to it over a pipe, one JSON line each way per command, so the
channel that carries a record (metadata, a buffer handle, a descriptor list) to the peer is the
same for every API. Lines meant for the other side start with "@@"; what libraries print on
stdout goes to stderr (claim_stdout).

The driver starts every pair of a round at once and steps them through the cells together: each
cell is measured by every pair in turn (ours first for one cell, the peers first for the next),
in SLICES slices taken by turns (pair A's first slice, B's, ..., then A's second...), the others
asleep meanwhile (their owners on the driver's pipe, driver_cells and pause_for_driver; their
active sides on the owner's, after its "rest" or "pause"), so that a ratio compares figures
taken in the same spells of the host's: on a shared virtual machine the host's pace moves by half
for a second or more at a time, and a cell measured whole by one pair after another put some
pairs in a slow spell and others not.

A cell is (mode, size, op, inflight):
  op    one operation as users run it, timed in the owner: lend the memory (register, grant),
        hand the record over, the peer moves the bytes, the owner learns it finished and ends the
        loan. `inflight` buffers (each its own memory) move at once, the way each API moves
        several: scad.connect and NIXL one operation over the list (one record, one completion
        word), scad.tensor_transport one object of that many tensors, Mooncake one batch
        transfer, scad.rdma one buffer over the list (request_buffer with a list: one key) read
        or written with one read_into/write_from of a list (Monarch's own buffers cover one
        memory each; a buffer per memory is scad.rdma's single-buffer cell).
  xfer  steady-state transfers, timed in the active side: memory registered and connected once,
        then reads or writes of `size`, `inflight` of them at a time (each from its own local
        slot, all to the same remote range, as bench/transports.py does).
"""
import json
import os
import select
import subprocess
import sys
import time

PREFIX = "@@"
WARMUP = 2
MIN_REPS = 5
MAX_REPS = 200
# A cell's measurement is cut into this many slices, the pairs taking turns slice by slice. Each
# slice gets an equal share of the time budget and of MAX_REPS, at least one batch, and after a
# pause one untimed batch first (both sides of the pair were asleep).
SLICES = 5


# From this size on a buffer is a mapping of its own that asks for transparent huge pages.
HUGE_FROM = 2 << 20
CACHE_LINE = 64  # where every buffer below that starts


def array(size, value):
    """A buffer of `size` bytes holding `value`, its pages backed and its start aligned the same
    way in every worker.

    numpy asks for huge pages for a large array (madvise), but whether it gets them depends on
    the process's malloc history (a mapping of its own, or heap carved out once glibc has raised
    its mmap threshold, with pages already touched as 4 KiB ones; docs/benchmarks.md). A 16 MiB
    copy over shared memory takes 2.2-2.5 ms on 4 KiB pages against 1.6-1.8 on huge pages, so an
    API's figure would follow the allocations its earlier cells happened to make. A large buffer
    here is a fresh private mapping of its own with MADV_HUGEPAGE, for ours and the peers alike."""
    import numpy  # the workers' environments have it; the driver never calls this

    if size < HUGE_FROM:
        # On a cache line: numpy's arrays start 16 bytes into one, or 0, 32 or 48 as the
        # process's heap happens to lie, and a copy whose source and destination sit at
        # different offsets in their lines runs slower (a C loop of cross-memory attach, 16
        # reads of 1 MiB: 1.8-2.1 ms with the source 16 bytes off against 1.3-1.5 aligned), so a
        # cell's ratio would follow the two processes' malloc histories (docs/benchmarks.md).
        spare = numpy.empty(size + CACHE_LINE, dtype=numpy.uint8)
        skip = -spare.ctypes.data % CACHE_LINE
        a = spare[skip:skip + size]  # holds `spare` for as long as it lives
        a.fill(value)
        return a
    import mmap

    pages = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS,
                      prot=mmap.PROT_READ | mmap.PROT_WRITE)
    pages.madvise(mmap.MADV_HUGEPAGE)
    a = numpy.frombuffer(pages, dtype=numpy.uint8)  # holds the mapping for as long as it lives
    a.fill(value)
    return a


def arrays(count, size, value):
    """`count` buffers of `size` bytes holding `value`: what a worker lends or transfers into."""
    return [array(size, value) for _ in range(count)]


def check(local, value):
    return all(int(a[0]) == value and int(a[-1]) == value for a in local)


def pin_main_thread(role):
    """Keeps this process's main thread on a CPU of its own: the owner's on the first allowed CPU,
    the active side's on the second (BENCH_PIN=0, or fewer than two CPUs: left where it is).
    Called once the API's library has made its objects (agent, engine, connector, manager):
    threads a library started by then stay free to run anywhere, threads it starts later (libd's
    start at the first loan or connection) are kept with the main thread. Unpinned, the two
    sides of a pair, each polling, were often left on one CPU for a whole cell by the kernel
    (which wakes a process on its waker's CPU), every operation then twice as long, for ours and
    the peers' alike (docs/benchmarks.md)."""
    if os.environ.get("BENCH_PIN", "1") == "0":
        return
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) >= 2:
        os.sched_setaffinity(0, {cpus[0] if role == "owner" else cpus[1]})  # 0: this thread only


def budget_s():
    return float(os.environ.get("BENCH_TRANSFER_BUDGET", "0.25"))


def fill_value(index):
    """The byte a cell's lent memory holds (the active side checks it arrived)."""
    return 1 + index % 250


class Channel:
    """One JSON line each way, over a pipe (stdin/stdout of the other process)."""

    def __init__(self, rfile, wfile):
        self.r, self.w = rfile, wfile

    def send(self, msg):
        self.w.write(PREFIX + json.dumps(msg, separators=(",", ":")) + "\n")
        self.w.flush()

    def recv(self):
        while True:
            line = self.r.readline()
            if not line:
                raise EOFError("the other side of the pair closed its pipe")
            if line.startswith(PREFIX):
                msg = json.loads(line[len(PREFIX):])
                if "error" in msg:
                    raise RuntimeError(f"the active side failed: {msg['error']}")
                return msg

    def recv_polling(self, progress=None):
        """recv(), waiting the way every active side waits for a command (await_command): polling
        the pipe and yielding the CPU. For an owner that waits for its peer's word, as NIXL's owner
        spins on its notifications, so that no API's figure carries a pipe wake-up the others do
        not. One line is in flight at a time, so nothing waits in the file's buffer unseen.
        `progress` runs each round (an owner driving its library meanwhile, as NIXL's does)."""
        self.wait_readable(progress)
        return self.recv()

    def wait_readable(self, progress=None):
        """Polls the pipe until a line is there (recv_polling's wait alone)."""
        fd = self.r.fileno()
        while not select.select([fd], [], [], 0)[0]:
            if progress is not None:
                progress()
            os.sched_yield()


def fork_pair(peer_side):
    """Forks the peer of a step-timing tool (bench/api_steps.py, operation_steps.py,
    peer_steps.py): the child runs peer_side(its Channel) and exits; the parent gets (pid, its
    Channel). Each side closes the other's ends of the two pipes, so that a side that dies shows
    the other an end of file: a peer whose owner was killed exits instead of polling forever."""
    to_peer, from_peer = os.pipe(), os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(to_peer[1])
            os.close(from_peer[0])
            peer_side(Channel(os.fdopen(to_peer[0], "r"), os.fdopen(from_peer[1], "w")))
        finally:
            os._exit(0)
    os.close(to_peer[0])
    os.close(from_peer[1])
    return pid, Channel(os.fdopen(from_peer[0], "r"), os.fdopen(to_peer[1], "w"))


_proto_out = None


def await_command(progress=None, spin=True):
    """How every active side waits for the owner's next command within a cell: polling its pipe
    (and yielding the CPU), as NIXL's must (without a progress thread its agent has to be driven
    meanwhile), so that no API's figure carries a pipe wake-up the others do not. `progress` runs
    each round. spin=False, between cells: asleep on the pipe, so that a pair waiting for its
    next cell takes no CPU from the pair being measured."""
    if not spin:
        select.select([sys.stdin], [], [])
        return
    while not select.select([sys.stdin], [], [], 0)[0]:
        if progress is not None:
            progress()
        os.sched_yield()


def stamped_command(chan, progress=None):
    """A step-timing peer's next command (bench/api_steps.py, peer_steps.py): waited for as every
    active side waits (polled, `progress` run each round), stamped in integer nanoseconds of
    perf_counter's clock as its line is seen. (stamp, message), the message None once the owner
    says quit."""
    chan.wait_readable(progress)
    seen = time.perf_counter_ns()
    msg = chan.recv()
    return seen, (None if msg.get("quit") else msg)


def driver_cells():
    """The cells the driver asks an owner for, one at a time: their indices in its plan, read from
    the owner's stdin (asleep in between: a pair waiting for its turn takes no CPU). Ends when the
    driver says quit or closes the pipe."""
    for line in sys.stdin:
        if not line.startswith(PREFIX):
            continue
        msg = json.loads(line[len(PREFIX):])
        if "cell" not in msg:
            return
        yield msg["cell"]


def claim_stdout():
    """Keeps this process's stdout for the protocol and sends everything else written to fd 1
    (libraries' own logging) to stderr. Call before the libraries are loaded."""
    global _proto_out
    if _proto_out is None:
        _proto_out = os.fdopen(os.dup(1), "w")
        os.dup2(2, 1)
        sys.stdout = sys.stderr
    return _proto_out


def stdio_channel():
    return Channel(sys.stdin, claim_stdout())


def start_active(argv, env=None):
    """Starts the active side; its stderr goes to ours (the driver keeps it in a log)."""
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
                            bufsize=1)
    return proc, Channel(proc.stdout, proc.stdin)


def _slice_limits():
    """(seconds, most batches, fewest batches) of one slice."""
    return budget_s() / SLICES, MAX_REPS // SLICES, -(-MIN_REPS // SLICES)


def measure(cycle, pause=None):
    """Runs cycle() (which returns the seconds of one batch) a few times for warm-up, then in
    SLICES slices, each until its share of the time budget is spent (within its share of
    MIN_REPS..MAX_REPS); pause() runs between slices (it returns when this pair's turn comes
    again; None: no pause, the slices run back to back). Returns (first, times): the very first
    batch (cold) and the measured ones."""
    first = cycle()
    for _ in range(WARMUP - 1):
        cycle()
    times = []
    seconds, most, fewest = _slice_limits()
    for n in range(SLICES):
        if n and pause is not None:
            pause()
            cycle()  # untimed: both sides of the pair just woke
        start, taken = time.perf_counter(), 0
        while taken < most and (taken < fewest or time.perf_counter() - start < seconds):
            times.append(cycle())
            taken += 1
    return first, times


async def measure_async(cycle, pause=None):
    """measure() for a cycle that is a coroutine."""
    first = await cycle()
    for _ in range(WARMUP - 1):
        await cycle()
    times = []
    seconds, most, fewest = _slice_limits()
    for n in range(SLICES):
        if n and pause is not None:
            pause()
            await cycle()
        start, taken = time.perf_counter(), 0
        while taken < most and (taken < fewest or time.perf_counter() - start < seconds):
            times.append(await cycle())
            taken += 1
    return first, times


def pause_for_driver():
    """An owner's pause between two slices of a cell: tells the driver, and sleeps on its pipe
    until the driver says this pair's turn has come again."""
    emit({"paused": True})
    while True:
        line = sys.stdin.readline()
        if not line:
            raise EOFError("the driver closed its pipe in the middle of a cell")
        if line.startswith(PREFIX):
            msg = json.loads(line[len(PREFIX):])
            if msg.get("resume"):
                return
            raise RuntimeError(f"the driver sent {msg} in the middle of a cell")


def relay_pauses(chan, wait=None):
    """An owner's wait for its active side's result of a steady-state cell (timed there): each
    pause of the active side's (pause_active) is passed on to the driver, and its resume back.
    wait(): how the owner waits for each line (None: asleep on the pipe)."""
    while True:
        if wait is not None:
            wait()
        msg = chan.recv()
        if not msg.get("paused"):
            return msg
        pause_for_driver()
        chan.send({"cmd": "resume"})


def pause_active(chan):
    """An active side's pause between two slices of a cell it times: tells its owner
    (relay_pauses) and sleeps on the pipe until the owner resumes it."""
    chan.send({"paused": True})
    msg = chan.recv()
    if msg.get("cmd") != "resume":
        raise RuntimeError(f"the owner sent {msg} in the middle of a cell")


def emit(row):
    """A result line for the driver (the owner's stdout)."""
    out = claim_stdout()
    out.write(PREFIX + json.dumps(row, separators=(",", ":")) + "\n")
    out.flush()


def fail(msg):
    emit({"error": msg})
