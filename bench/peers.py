"""Measure the peer systems Scad's benchmark compares against, on loopback.

Peers: redis (redis-server + redis-benchmark), iperf3 (one TCP stream) and
UCX (ucx_perftest over tcp or shared memory).  Every function starts the
server it needs on a free 127.0.0.1 port, stops it before returning (also on
errors), and bounds every wait with a timeout.  Standard library only.

Result rows: {"peer", "op", "size", "inflight", "gbps", "median_us"} where
gbps is GB/s with GB = 1e9 bytes, plus an optional "note".

Run by itself:  python3 bench/peers.py   (prints one JSON object per line)
"""

import contextlib
import csv
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

HOST = "127.0.0.1"  # everything stays on loopback
READY_TIMEOUT_S = 10.0  # how long a server may take to start listening
STOP_TIMEOUT_S = 10.0  # how long a server may take to exit when asked


# ---------------------------------------------------------------- helpers

def _free_port():
    """A currently free loopback TCP port (bind to port 0, let the kernel pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _need(tool):
    path = shutil.which(tool)
    if path is None:
        raise RuntimeError(f"{tool} not found in PATH")
    return path


def _listening(port):
    """True if some socket is in LISTEN state on `port` (IPv4 or IPv6).

    Read from /proc/net/tcp* instead of connecting, because iperf3 -s -1 and
    the ucx_perftest server serve exactly one connection: a probing connect
    would be taken as the real client (verified: it makes iperf3 -1 exit).
    """
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)  # header
                for line in f:
                    fields = line.split()
                    local, state = fields[1], fields[3]
                    if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                        return True
        except FileNotFoundError:
            continue
    return False


def _can_connect(port):
    try:
        with socket.create_connection((HOST, port), timeout=0.5):
            return True
    except OSError:
        return False


def _wait_ready(proc, port, probe, what):
    """Poll `probe(port)` until true; fail if the server exits or 10 s pass."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited early (rc={proc.returncode}):\n"
                               f"{_read_log(proc)}")
        if probe(port):
            return
        time.sleep(0.02)
    raise RuntimeError(f"{what} not listening on {HOST}:{port} after "
                       f"{READY_TIMEOUT_S:.0f}s:\n{_read_log(proc)}")


@contextlib.contextmanager
def _server(argv, port, probe, env=None, sigterm_ok=True):
    """Run a server process for the duration of a `with` block.

    Output goes to a temp file (not a pipe, which could fill and block the
    server).  On exit the server is given STOP_TIMEOUT_S to finish by itself
    (one-shot servers exit after their client), then SIGTERM, then SIGKILL.
    """
    log = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                            stderr=subprocess.STDOUT, env=env)
    proc._peers_log = log
    try:
        _wait_ready(proc, port, probe, os.path.basename(argv[0]))
        yield proc
    except BaseException:
        if proc.poll() is None:
            proc.terminate()  # failing: don't wait for a one-shot server
        raise
    finally:
        try:
            if sigterm_ok and proc.poll() is None:
                proc.terminate()  # e.g. redis-server: SIGTERM = clean shutdown
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        finally:
            log.close()


def _read_log(proc, limit=4000):
    log = getattr(proc, "_peers_log", None)
    if log is None or log.closed:
        return ""
    log.flush()
    log.seek(0)
    return log.read()[-limit:]


def _run(argv, timeout, env=None):
    """Run a client to completion; subprocess.run kills it on timeout."""
    try:
        return subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as e:
        raise RuntimeError(f"timed out after {timeout}s: {' '.join(argv)}\n"
                           f"stderr: {e.stderr!r}") from None


# ---------------------------------------------------------------- redis

def _redis_cmd(port, *args):
    """Send one RESP command on a fresh connection, return the raw reply line."""
    payload = f"*{len(args)}\r\n" + "".join(
        f"${len(str(a).encode())}\r\n{a}\r\n" for a in args)
    with socket.create_connection((HOST, port), timeout=5) as s:
        s.sendall(payload.encode())
        return s.makefile("rb").readline().decode().strip()


def _redis_requests(size, inflight, seconds):
    """-n so one SET or GET run takes about `seconds`.

    Rough model from runs on this machine: ~60 us per request plus the value
    moving at ~0.5 GB/s (64 B: ~18k req/s, 64 MiB: ~7 req/s with -c 1).  At
    least `inflight` requests, else fewer than N clients would ever be busy
    (so 64 MiB with -c 16 takes ~4 s per op no matter what).
    """
    est_rps = 1.0 / (60e-6 + size / 0.5e9)
    return max(inflight, 3, min(20000, int(seconds * est_rps)))


def redis(sizes, inflight_values=(1, 16), seconds_budget=1.0):
    """SET ("write") and GET ("read") throughput and p50 latency per size.

    seconds_budget: target duration of each single SET or GET measurement.
    """
    server, bench = _need("redis-server"), _need("redis-benchmark")
    port = _free_port()
    rows = []
    with tempfile.TemporaryDirectory(prefix="peers-redis-") as workdir:
        argv = [server, "--port", str(port),
                "--bind", HOST,                # loopback only
                "--protected-mode", "no",      # no auth prompts for the bench
                "--save", "", "--appendonly", "no",  # no persistence / disk I/O
                # Max size of one bulk string in a request.  The 7.0 default
                # (512mb) already fits 64 MiB; 1gb leaves headroom.
                "--proto-max-bulk-len", "1gb",
                "--dir", workdir,              # nothing lands in the cwd
                "--daemonize", "no"]
        with _server(argv, port, _can_connect):
            for size in sizes:
                for inflight in inflight_values:
                    n = _redis_requests(size, inflight, seconds_budget)
                    # Many in flight = -c N: N connections, each with one request
                    # outstanding, so p50 is a per-request latency.  Not -P N
                    # (pipelining on one connection): with 64 MiB values
                    # redis-benchmark -P 16 grew past 24 GB RSS here and was
                    # OOM-killed, and its latency is per pipeline batch.
                    # No -r: every request uses the same key, so GET (run after
                    # SET in the same invocation) reads a value of `size` bytes.
                    cmd = [bench, "-h", HOST, "-p", str(port),
                           "-t", "set,get", "-n", str(n), "-c", str(inflight),
                           "-d", str(size), "--csv"]
                    timeout = 60 + 4 * n * (60e-6 + size / 0.1e9)
                    res = _run(cmd, timeout)
                    stats = _parse_redis_csv(res, cmd)
                    # Sanity check: the stored value really has `size` bytes.
                    stored = _redis_cmd(port, "STRLEN", "key:__rand_int__")
                    if stored != f":{size}":
                        raise RuntimeError(f"redis value has {stored!r}, expected "
                                           f"{size} bytes after {' '.join(cmd)}\n"
                                           f"stderr: {res.stderr}")
                    for test, op in (("SET", "write"), ("GET", "read")):
                        rps, p50_ms = stats[test]
                        rows.append({"peer": "redis", "op": op, "size": size,
                                     "inflight": inflight,
                                     "gbps": rps * size / 1e9,
                                     "median_us": p50_ms * 1000.0})
    return rows


def _parse_redis_csv(res, cmd):
    """{"SET": (rps, p50_ms), "GET": ...} from redis-benchmark --csv output.

    Format (redis 7.0):
      "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms",...
      "SET","20833.33","0.044","0.016","0.055",...
    """
    try:
        if res.returncode != 0:
            raise ValueError(f"exit code {res.returncode}")
        lines = [l for l in res.stdout.splitlines() if l.startswith('"')]
        out = {}
        for row in csv.DictReader(io.StringIO("\n".join(lines))):
            out[row["test"]] = (float(row["rps"]), float(row["p50_latency_ms"]))
        if not {"SET", "GET"} <= out.keys():
            raise ValueError("missing SET or GET row")
        return out
    except (ValueError, KeyError) as e:
        raise RuntimeError(f"cannot parse redis-benchmark output ({e}): "
                           f"{' '.join(cmd)}\nstdout: {res.stdout!r}\n"
                           f"stderr: {res.stderr}") from None


# ---------------------------------------------------------------- iperf3

def same_host_congestion(flag):
    """[flag, "cubic"] where the host's default congestion control is BBR, else []: libd gives
    its own same-host connections cubic instead of BBR (docs/transports.md), so a peer's loopback
    stream gets the same."""
    try:
        with open("/proc/sys/net/ipv4/tcp_congestion_control") as f:
            default = f.read().strip()
        with open("/proc/sys/net/ipv4/tcp_available_congestion_control") as f:
            available = f.read().split()
    except OSError:
        return []
    return [flag, "cubic"] if default.startswith("bbr") and "cubic" in available else []


def iperf3(seconds=3):
    """One TCP stream over loopback, as GB/s of payload received."""
    tool = _need("iperf3")
    port = _free_port()
    # -s -1: serve exactly one test then exit; -B: listen on loopback only.
    server = [tool, "-s", "-1", "-B", HOST, "-p", str(port)]
    # -J: JSON report; -t: duration; one stream is the default (-P 1).
    client = [tool, "-c", HOST, "-p", str(port), "-J", "-t", str(seconds)] + same_host_congestion("-C")
    with _server(server, port, _listening, sigterm_ok=False):
        res = _run(client, timeout=seconds + 30)
    try:
        report = json.loads(res.stdout)
        # iperf3 -J exits 0 even on some failures and reports them in "error".
        if "error" in report:
            raise ValueError(report["error"])
        bits = report["end"]["sum_received"]["bits_per_second"]
    except (ValueError, KeyError, TypeError) as e:
        raise RuntimeError(f"cannot parse iperf3 output ({e}): {' '.join(client)}\n"
                           f"stdout: {res.stdout[-2000:]!r}\nstderr: {res.stderr}") from None
    return {"peer": "iperf3", "op": "stream", "size": 0, "inflight": 1,
            "gbps": bits / 8e9, "median_us": None}


# ---------------------------------------------------------------- UCX

# UCX_TLS per transport.  "shm": UCX 1.13's shared-memory transports (posix and
# sysv mappings, cma = process_vm_readv/writev) plus "self"; tested equivalent
# to "sm,self" here (both select rma(sysv/memory posix/memory)).
_UCX_TLS = {"tcp": "tcp", "shm": "posix,sysv,cma,self"}

# Iteration budgets: total bytes per run and a cap on iterations.  tcp is much
# slower for put_bw/get (see _UCX_TCP_NOTE), so it gets a smaller budget to keep
# ucx(sizes, "tcp") for 64 B..64 MiB around half a minute.
_UCX_BUDGET = {"tcp": (64 << 20, 300), "shm": (1 << 30, 10000)}

# Attached to every ucx-tcp row.  put_lat (ping-pong, both sides poll) is not
# affected; put_bw and get are.
_UCX_TCP_NOTE = ("UCX tcp has no native RMA and emulates put/get with active "
                 "messages (lane rma_am(tcp/lo)); ucx_perftest 1.13's passive "
                 "target seems not to poll during one-sided tests, so put_bw/get "
                 "are tool-limited here (~1 ms per small get), not TCP-limited")


def _ucx_iters(size, transport, min_iters):
    """(iterations, warm-up iterations) for one run; -w 0 is accepted."""
    budget, cap = _UCX_BUDGET[transport]
    n = max(min_iters, min(cap, budget // size))
    return n, n // 10


def _ucx_env(transport):
    env = dict(os.environ)
    env["UCX_TLS"] = _UCX_TLS[transport]
    # Without this, the tcp transport would also use eth0; keep it on loopback.
    env["UCX_NET_DEVICES"] = "lo"
    # INFO makes UCX log the lanes it picked ("ep_cfg[0]: rma(sysv/memory ...)")
    # which we check; send logs to stderr so stdout holds only the CSV.
    env["UCX_LOG_LEVEL"] = "info"
    env["UCX_LOG_FILE"] = "stderr"
    return env


def _ucx_check_lanes(stderr, transport, cmd):
    """Make sure UCX really used the requested transport (from its INFO log)."""
    lanes = [l.split("ep_cfg", 1)[1] for l in stderr.splitlines() if "ep_cfg[" in l]
    if not lanes:
        raise RuntimeError(f"UCX did not report its lanes: {' '.join(cmd)}\n{stderr}")
    text = " ".join(lanes)
    if transport == "tcp":
        ok = "tcp/lo" in text and not any(t in text for t in ("posix", "sysv", "cma"))
    else:
        ok = "tcp" not in text and any(t in text for t in ("posix", "sysv", "cma"))
    if not ok:
        raise RuntimeError(f"UCX used {text!r}, not {transport}: {' '.join(cmd)}")
    return text


def _ucx_run(test, size, transport, min_iters, extra=()):
    """One ucx_perftest server+client run.

    Returns (overall bandwidth in GB/s, 50th-percentile latency in us), or a
    string explaining why the test could not run (tool exited non-zero, e.g.
    a test not supported by the transport).
    """
    tool = _need("ucx_perftest")
    env = _ucx_env(transport)
    port = _free_port()
    n, warmup = _ucx_iters(size, transport, min_iters)
    # Server: no host argument = wait for a client on -p; it gets the test
    # parameters from the client and exits after one test.  Note: ucx_perftest
    # 1.13 has no bind option, this control socket listens on 0.0.0.0:port.
    server = [tool, "-p", str(port)]
    # Client: -t test, -s message size, -n iterations, -w warm-up iterations,
    # -f final result only, -v CSV output.
    client = [tool, HOST, "-p", str(port), "-t", test, "-s", str(size),
              "-n", str(n), "-w", str(warmup), "-f", "-v", *extra]
    with _server(server, port, _listening, env=env, sigterm_ok=False) as srv:
        res = _run(client, timeout=120, env=env)
        if res.returncode != 0:
            srv.terminate()  # it may still wait for a test that never comes
            return (f"{test} failed (exit {res.returncode}): "
                    + " | ".join(res.stderr.strip().splitlines()[-3:]))
    _ucx_check_lanes(res.stderr, transport, client)
    # CSV (ucx 1.13):
    #   iterations,50.0_percentile_lat,avg_lat,overall_lat,avg_bw,overall_bw,avg_mr,overall_mr
    #   1000,13.633,150.793,150.793,414.48,414.48,6632,6632
    # latencies in us; bandwidth in "MB/s" which is MiB/s (414.48 * 2**20 B/s =
    # 6632 msg/s * 64 KiB).
    try:
        lines = [l.strip() for l in res.stdout.splitlines() if l.strip()]
        i = next(i for i, l in enumerate(lines) if l.startswith("iterations,"))
        row = dict(zip(lines[i].split(","), lines[i + 1].split(",")))
        p50_key = next(k for k in row if k.endswith("_percentile_lat"))
        return float(row["overall_bw"]) * 2**20 / 1e9, float(row[p50_key])
    except (StopIteration, ValueError, IndexError, KeyError) as e:
        raise RuntimeError(f"cannot parse ucx_perftest output ({e!r}): "
                           f"{' '.join(client)}\nstdout: {res.stdout!r}\n"
                           f"stderr: {res.stderr}") from None


def ucx(sizes, transport):
    """UCP put ("write") and get ("read") bandwidth and latency per size.

    gbps: ucp_put_bw / ucp_get (bandwidth tests; ucx_perftest may keep several
          operations outstanding from its single endpoint).
    median_us: the tools' 50th-percentile column ("typical" latency):
      write: ucp_put_lat, a ping-pong test which ucx_perftest reports as HALF
             the round trip (one-way latency);
      read:  ucp_get with -O 1 (one outstanding get), i.e. the full
             request-to-data time of one get.
    A test that fails to run gives None values and a "note".
    """
    if transport not in _UCX_TLS:
        raise ValueError(f"transport must be one of {tuple(_UCX_TLS)}")
    rows = []
    for size in sizes:
        for op, bw_test, lat_test, lat_extra in (
                ("write", "ucp_put_bw", "ucp_put_lat", ()),
                ("read", "ucp_get", "ucp_get", ("-O", "1"))):
            row = {"peer": f"ucx-{transport}", "op": op, "size": size,
                   "inflight": 1, "gbps": None, "median_us": None}
            notes = []
            # Bandwidth: one iteration is enough at 64 MiB (tcp put_bw takes
            # ~2.5 s per 64 MiB put here).  Latency: at least 10 samples, since
            # the percentile column is garbage with n=1 (seen: 12 us for a
            # 64 MiB get over tcp).
            bw = _ucx_run(bw_test, size, transport, 1)
            if isinstance(bw, str):
                notes.append(bw)
            else:
                row["gbps"] = bw[0]
            lat = _ucx_run(lat_test, size, transport, 10, lat_extra)
            if isinstance(lat, str):
                notes.append(lat)
            else:
                row["median_us"] = lat[1]
            if transport == "tcp":
                notes.append(_UCX_TCP_NOTE)
            if notes:
                row["note"] = "; ".join(notes)
            rows.append(row)
    return rows


# ---------------------------------------------------------------- main

if __name__ == "__main__":
    SIZES = [64, 4096, 65536, 1 << 20, 16 << 20, 64 << 20]
    t0 = time.monotonic()
    for name, fn in (("redis", lambda: redis(SIZES)),
                     ("iperf3", lambda: [iperf3()]),
                     ("ucx-tcp", lambda: ucx(SIZES, "tcp")),
                     ("ucx-shm", lambda: ucx(SIZES, "shm"))):
        t = time.monotonic()
        for r in fn():
            print(json.dumps(r), flush=True)
        print(f"# {name}: {time.monotonic() - t:.1f}s", file=sys.stderr, flush=True)
    print(f"# total: {time.monotonic() - t0:.1f}s", file=sys.stderr)
