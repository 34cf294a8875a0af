"""The two-guest verbs test (tests/softroce/run-pair): the memory element in one guest, the compute
element in the other, each guest with its own rxe0 on a virtio NIC that qemu joins to the other's.
This is the path the single guest cannot give (there client and server share one rxe device).

    pair.py serve ADDR     guest A: libd-memd --verbs on ADDR; hands the grant to the client over
                           a plain tcp socket (port 7471), waits for its verdict, exits with it
    pair.py client ADDR    guest B: fetches the grant, runs the Python action over verbs, checks
                           the data and that rxe0's packet counters moved, tells A, exits 0 or 1

Every wait has a deadline; a failure says what it was waiting for."""
import json
import pathlib
import select
import socket
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "build" / "python"), str(ROOT / "bindings" / "python")]
MEMD_PORT, GRANT_PORT = 7470, 7471
DEADLINE_S = 240


def counter(name):
    """One of rxe0's hardware counters (sent_pkts, rcvd_pkts)."""
    path = pathlib.Path("/sys/class/infiniband/rxe0/ports/1/hw_counters") / name
    return int(path.read_text())


def cm_counter(direction, msg):
    """The IB connection manager's message counters: cm_tx_msgs/req, cm_rx_msgs/rep..."""
    path = pathlib.Path("/sys/class/infiniband/rxe0/ports/1") / f"cm_{direction}_msgs" / msg
    return int(path.read_text())


def serve(addr):
    grants = pathlib.Path("/tmp/pair-grants.jsonl")
    memd = subprocess.Popen([str(ROOT / "build" / "libd" / "libd-memd"), "--element", "mem1=8MiB",
                             "--tcp", f"{addr}:{MEMD_PORT}", "--grant", "mem1:pair-client:rw", "--grants", str(grants),
                             "--verbs"], stdout=subprocess.PIPE, text=True)
    ready, _, _ = select.select([memd.stdout], [], [], 30)
    if not ready:
        sys.exit("pair serve: libd-memd did not report ready within 30 s")
    info = json.loads(memd.stdout.readline())
    print(f"pair serve: memory element on {info['tcp']}, verbs on {info['verbs']}", flush=True)
    config = json.loads(grants.read_text().splitlines()[0])["config"]
    with socket.create_server((addr, GRANT_PORT)) as srv:
        srv.settimeout(DEADLINE_S)
        conn, peer = srv.accept()
        with conn, conn.makefile("rw") as f:
            f.write(json.dumps({"config": config}) + "\n")
            f.flush()
            conn.settimeout(DEADLINE_S)
            verdict = f.readline().strip()
    sent, rcvd = counter("sent_pkts"), counter("rcvd_pkts")
    alive = memd.poll() is None
    memd.terminate()
    memd.wait(10)
    print(f"pair serve: client {peer[0]} says '{verdict}'; rxe0 sent {sent} and received {rcvd} packets", flush=True)
    if not alive:
        sys.exit("pair serve: libd-memd died during the run")
    sys.exit(0 if verdict == "ok" else 1)


def fetch_grant(addr):
    deadline = time.monotonic() + DEADLINE_S
    while True:  # the other guest boots at its own pace: its listener appears when it appears
        try:
            conn = socket.create_connection((addr, GRANT_PORT), timeout=5)
            break
        except OSError as e:
            if time.monotonic() > deadline:
                sys.exit(f"pair client: nothing listens on {addr}:{GRANT_PORT} after {DEADLINE_S} s ({e})")
            time.sleep(0.2)
    conn.settimeout(DEADLINE_S)
    f = conn.makefile("rw")
    return conn, f, json.loads(f.readline())["config"]


def client(addr):
    from scad.launcher import run_action
    conn, f, config = fetch_grant(addr)
    sent0, rcvd0 = counter("sent_pkts"), counter("rcvd_pkts")
    req0, rep0 = cm_counter("tx", "req"), cm_counter("rx", "rep")
    size = 1 << 20
    out = run_action({"aid": "pair-client", "code": str(ROOT / "tests" / "softroce" / "actions" / "verbs_roundtrip.py"),
                      "main": "main", "args": {"size": size, "offset": 4096},
                      "transports": [{"durl": "mem1;verbs", "config": config}]})
    sent, rcvd = counter("sent_pkts") - sent0, counter("rcvd_pkts") - rcvd0
    reqs, reps = cm_counter("tx", "req") - req0, cm_counter("rx", "rep") - rep0
    problems = []
    # The guests reach each other directly: set-up (auto) goes through rdma_cm, one REQ and REP.
    if reqs < 1 or reps < 1:
        problems.append(f"the queue pair was not connected through rdma_cm (REQ sent {reqs}, REP received {reps})")
    if not out["ok"]:
        problems.append(f"the action failed: {out['error']}")
    elif out["result"] != {"same": True, "same_async": True, "writes": 5, "reads": 2}:
        problems.append(f"the action saw other data: {out['result']}")
    # 2 MiB written and 2 MiB read, in MTU-sized packets (1024 B on rxe here): thousands each way.
    if sent < 2 * size // 4096 or rcvd < 2 * size // 4096:
        problems.append(f"rxe0 moved too few packets for 4 MiB of traffic (sent {sent}, received {rcvd})")
    print(f"pair client: action {'ok' if out['ok'] else 'failed'}; rxe0 sent {sent}, received {rcvd} packets; "
          f"rdma_cm REQ sent {reqs}, REP received {reps}", flush=True)
    for p in problems:
        print("pair client: " + p, flush=True)
    f.write(("ok" if not problems else "failed") + "\n")
    f.flush()
    conn.close()
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    role, addr = sys.argv[1], sys.argv[2]
    serve(addr) if role == "serve" else client(addr)
