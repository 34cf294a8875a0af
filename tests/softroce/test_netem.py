"""Network faults between two hosts, made with tc netem (the Soft-RoCE guest's kernel has sch_netem;
this project's CI host does not, so the tier runs in the guest): a memory element served over tcp
in one network namespace, its client in another, joined by a veth pair. Delay and loss slow the
client down but never corrupt a byte; total loss is a TimeoutError within the client's deadline;
once the network returns, the client recovers its transport and carries on."""
import json
import os
import pathlib
import select
import shutil
import subprocess
import sys

import pytest

from scadtest import ROOT, binary, stop_processes

NET = "10.214.9"  # only inside the namespaces made here
DEADLINE_MS = 4000  # well above what a few retransmissions under 1 % loss can take


def sh(*args, check=True):
    return subprocess.run(args, check=check, capture_output=True, text=True)


def netem_works():
    if os.geteuid() != 0 or not shutil.which("tc") or not shutil.which("ip"):
        return False
    ns = f"netemprobe{os.getpid()}"
    try:
        sh("ip", "netns", "add", ns)
        return sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms",
                  check=False).returncode == 0
    except subprocess.CalledProcessError:
        return False
    finally:
        sh("ip", "netns", "del", ns, check=False)


# In the guest (tests/softroce/run sets LIBD_REQUIRE_VERBS) netem must work: a missing module fails.
pytestmark = pytest.mark.skipif(not os.environ.get("LIBD_REQUIRE_VERBS") and not netem_works(),
                                reason="needs tc netem (run through tests/softroce/run)")

CLIENT = r"""
import json, sys, time, zlib
from disagg import LibdAction
config, deadline_ms = sys.argv[1], int(sys.argv[2])
action = LibdAction("netem-client", timeout_ms=deadline_ms)
action.add_transport("mem1;tcp")
action.config_transport("mem1", config)
t = action.get_transport("mem1", "rdma")
SIZE = 64 << 10
t.reg(2 * SIZE)
say = lambda *words: print(*words, flush=True)
say("ready")
for line in sys.stdin:
    cmd, *arg = line.split()
    if cmd == "ops":  # write a pattern, read it back elsewhere, compare; the pattern changes each time
        times, bad = [], 0
        for i in range(int(arg[0])):
            pattern = bytes((i * 7 + j) & 0xFF for j in range(256)) * (SIZE // 256)
            t.buf[0:SIZE] = pattern
            t0 = time.monotonic()
            t.write(SIZE, 0)
            t.read(SIZE, 0, SIZE)
            times.append(time.monotonic() - t0)
            bad += zlib.crc32(t.buf[SIZE:2 * SIZE]) != zlib.crc32(pattern)
        times.sort()
        say("ok", bad, round(times[len(times) // 2] * 1000, 1), round(times[-1] * 1000, 1))
    elif cmd == "one":
        t0 = time.monotonic()
        try:
            t.read(SIZE, 0, SIZE)
            say("ok")
        except (TimeoutError, ConnectionError) as e:
            say(type(e).__name__, int((time.monotonic() - t0) * 1000))
    elif cmd == "recover":
        t0 = time.monotonic()
        while True:
            try:
                t.recover()
                t.read(SIZE, 0, SIZE)
                break
            except (TimeoutError, ConnectionError):
                if time.monotonic() - t0 > 30:
                    raise
        say("recovered", int((time.monotonic() - t0) * 1000))
"""


@pytest.fixture
def link(tmp_path):
    tag = f"nm{os.getpid() % 100000}"
    a, b = f"{tag}a", f"{tag}b"
    procs = []
    try:
        for ns in (a, b):
            sh("ip", "netns", "add", ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "link", "add", f"{tag}0", "type", "veth", "peer", "name", f"{tag}1")
        for ns, end, i in ((a, f"{tag}0", 1), (b, f"{tag}1", 2)):
            sh("ip", "link", "set", end, "netns", ns)
            sh("ip", "-n", ns, "link", "set", end, "name", "eth0")
            sh("ip", "-n", ns, "addr", "add", f"{NET}.{i}/24", "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")
        grants = tmp_path / "grants.jsonl"
        server = subprocess.Popen(["ip", "netns", "exec", a, binary("libd-memd"), "--element", "mem1=4MiB",
                                   "--tcp", f"{NET}.1:0", "--unix", str(tmp_path / "mem.sock"),
                                   "--grant", "mem1:netem-client:rw", "--grants", str(grants)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs.append(server)
        assert select.select([server.stdout], [], [], 20)[0], "libd-memd did not start"
        json.loads(server.stdout.readline())
        config = json.loads(grants.read_text().splitlines()[0])["config"]
        env = dict(os.environ, PYTHONPATH=f"{ROOT / 'build' / 'python'}:{ROOT / 'bindings' / 'python'}")
        client = subprocess.Popen(["ip", "netns", "exec", b, sys.executable, "-c", CLIENT, config, str(DEADLINE_MS)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=env)
        procs.append(client)

        def ask(cmd, timeout=120):
            if cmd:
                client.stdin.write(cmd + "\n")
                client.stdin.flush()
            ready, _, _ = select.select([client.stdout], [], [], timeout)
            assert ready, f"the client did not answer {cmd!r}"
            line = client.stdout.readline()
            assert line, "the client ended: " + client.stderr.read()
            return line.split()

        def netem(*spec):
            """Applies netem `spec` to both ends of the link (both directions), or removes it."""
            for ns in (a, b):
                sh("tc", "-n", ns, "qdisc", "del", "dev", "eth0", "root", check=False)
                if spec:
                    sh("tc", "-n", ns, "qdisc", "add", "dev", "eth0", "root", "netem", *spec)

        assert ask(None) == ["ready"]
        yield ask, netem
    finally:
        stop_processes(procs)
        for ns in (a, b):
            sh("ip", "netns", "del", ns, check=False)


def test_delay_and_loss_slow_a_client_down_total_loss_times_out_and_it_recovers(link):
    ask, netem = link
    ok, bad, clean_median, _ = ask("ops 50")
    assert (ok, bad) == ("ok", "0")

    # 20 ms each way and 1 % of packets lost in both directions: slower, never wrong.
    netem("delay", "20ms", "loss", "1%")
    ok, bad, median, worst = ask("ops 50")
    print(f"\nnetem 20 ms + 1 % loss: 64 KiB write+read median {median} ms, worst {worst} ms "
          f"(clean {clean_median} ms)")
    assert (ok, bad) == ("ok", "0")
    assert float(median) >= 40, median  # two round trips of at least 40 ms: the delay was in effect

    # Every packet lost: the client's operation fails within its deadline instead of hanging.
    netem("loss", "100%")
    kind, ms = ask("one")
    print(f"netem 100 % loss: {kind} after {ms} ms (deadline {DEADLINE_MS} ms)")
    assert kind in ("TimeoutError", "ConnectionError") and int(ms) < DEADLINE_MS + 1000, (kind, ms)

    # The network returns: the client recovers its transport and moves data correctly again.
    netem()
    said, ms = ask("recover")
    print(f"network back: recovered after {ms} ms")
    assert said == "recovered"
    ok, bad, _, _ = ask("ops 20")
    assert (ok, bad) == ("ok", "0")
