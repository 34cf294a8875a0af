"""Several hosts: a scheduler and two agents, each in a network namespace this test makes (veth
pairs on a bridge). Agent A has cpus and no memory pool, agent B a pool and no cpus, so the compute
element runs on A and reaches its memory element on B over tcp."""
import json
import os
import pathlib
import select
import shutil
import subprocess
import sys
import time

import pytest

from scadtest import BUILD, ROOT, Gate, Platform, cluster_token, stop_processes

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("ip"),
                                reason="network namespaces need root and iproute2")

NET = "10.213.7"   # only inside the namespaces made here


def sh(*args):
    subprocess.run(args, check=True, capture_output=True, text=True)


@pytest.fixture
def hosts(tmp_path):
    tag = f"scad{os.getpid() % 100000}"
    names = {"s": f"{tag}s", "a": f"{tag}a", "b": f"{tag}b"}
    procs = []
    try:
        for n in names.values():
            sh("ip", "netns", "add", n)
            sh("ip", "-n", n, "link", "set", "lo", "up")
        sh("ip", "-n", names["s"], "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", names["s"], "link", "set", "br0", "up")
        sh("ip", "-n", names["s"], "addr", "add", f"{NET}.1/24", "dev", "br0")
        for i, key in enumerate(["a", "b"], start=2):
            sh("ip", "link", "add", f"{tag}{key}0", "type", "veth", "peer", "name", f"{tag}{key}1")
            sh("ip", "link", "set", f"{tag}{key}0", "netns", names[key])
            sh("ip", "link", "set", f"{tag}{key}1", "netns", names["s"])
            sh("ip", "-n", names[key], "link", "set", f"{tag}{key}0", "name", "eth0")
            sh("ip", "-n", names[key], "addr", "add", f"{NET}.{i}/24", "dev", "eth0")
            sh("ip", "-n", names[key], "link", "set", "eth0", "up")
            sh("ip", "-n", names["s"], "link", "set", f"{tag}{key}1", "master", "br0")
            sh("ip", "-n", names["s"], "link", "set", f"{tag}{key}1", "up")
        token = cluster_token(tmp_path)
        import disagg
        pythonpath = f"{os.path.dirname(disagg.__file__)}:{ROOT / 'bindings' / 'python'}"

        agents = {}

        def start(ns, argv):
            p = subprocess.Popen(["ip", "netns", "exec", ns, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True)
            procs.append(p)
            if "--id" in argv:
                agents[argv[argv.index("--id") + 1]] = p
            ready, _, _ = select.select([p.stdout], [], [], 30)
            assert ready, f"{argv[0]} did not start: {p.stderr.read() if p.poll() is not None else ''}"
            return p.stdout.readline()

        home = tmp_path / "sched"
        # host-a registers with the cluster token, host-b with a key of its own (`scad host key`).
        keys = tmp_path / "host-keys"
        key_b = subprocess.run([sys.executable, "-m", "scad.cli", "host", "key", "host-b", "--keys", str(keys)],
                               capture_output=True, text=True, check=True,
                               env=dict(os.environ, PYTHONPATH=str(ROOT / "bindings" / "python"))).stdout.strip()
        token_b = tmp_path / "host-b.key"
        token_b.write_text(key_b + "\n")
        token_b.chmod(0o600)
        sched_argv = [str(BUILD / "scheduler" / "scad-server"), "--home", str(home), "--host", f"{NET}.1",
                      "--port", "0", "--no-local-agent", "--cluster-token-file", str(token),
                      "--host-keys", str(keys), "--python", sys.executable, "--pythonpath", pythonpath]
        start(names["s"], sched_argv)
        url = dict(l.split("=", 1) for l in (home / "wskprops").read_text().split())["APIHOST"]
        sched_argv[sched_argv.index("--port") + 1] = url.rsplit(":", 1)[1]  # a restart keeps the address
        for key, i, pool, cpus in (("a", 2, "0", "2"), ("b", 3, "256MiB", "0")):
            line = start(names[key], [str(BUILD / "agent" / "scad-agent"), "--scheduler", url, "--address",
                                      f"{NET}.{i}", "--token-file", str(token if key == "a" else token_b),
                                      "--id", f"host-{key}",
                                      "--home", str(tmp_path / f"agent-{key}"), "--pool", pool, "--cpus", cpus,
                                      "--python", sys.executable, "--pythonpath", pythonpath])
            assert f"host-{key} serving" in line and "registered" in line, line
        platform = Platform.__new__(Platform)  # a client of the scheduler in its namespace
        platform.home, platform.url = home, url
        platform.auth = dict(l.split("=", 1) for l in (home / "wskprops").read_text().split())["AUTH"]
        platform.agents = agents

        def restart_scheduler():
            """kill -9 of scad-server, then the same command again."""
            sched = procs[0]
            sched.kill()
            sched.wait(10)
            procs.remove(sched)
            return start(names["s"], sched_argv)

        platform.restart_scheduler = restart_scheduler
        yield platform, names
    finally:
        stop_processes(procs)
        for n in names.values():
            subprocess.run(["ip", "netns", "del", n], capture_output=True)


def in_ns(ns, platform, method, path, body=None):
    """Calls the scheduler from inside its namespace (the test process is outside)."""
    code = ("import json,sys,base64,urllib.request,urllib.error\n"
            "a=json.loads(sys.argv[1]);r=urllib.request.Request(a['url']+a['path'],method=a['method'],"
            "data=json.dumps(a['body']).encode() if a['body'] is not None else None)\n"
            "r.add_header('Content-Type','application/json');"
            "r.add_header('Authorization','Basic '+base64.b64encode(a['auth'].encode()).decode())\n"
            "try:\n with urllib.request.urlopen(r,timeout=120) as x: print(json.dumps([x.status,json.loads(x.read() or b'null')]))\n"
            "except urllib.error.HTTPError as e: print(json.dumps([e.code,json.loads(e.read() or b'null')]))\n")
    arg = json.dumps({"url": platform.url, "path": path, "method": method, "body": body, "auth": platform.auth})
    out = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", code, arg], capture_output=True,
                         text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def deploy_and_invoke_with_gate(platform, names, app):
    """Deploys the app in folder `app`, opens a gate (scadtest.Gate) on the scheduler's bridge and
    invokes the app (blocking) in a thread with {"gate": address}. Returns (gate, thread, done);
    done["rec"] holds the activation once it ends."""
    files = {f.name: f.read_text() for f in app.glob("*.py")}
    status, body = in_ns(names["s"], platform, "PUT", f"/api/v1/namespaces/_/apps/{app.name}",
                         {"manifest": (app / "scad.yaml").read_text(), "files": files})
    assert status == 200, body
    gate = Gate(f"{NET}.1", netns=names["s"])
    done = {}

    def invoke():
        done["rec"] = in_ns(names["s"], platform, "POST", f"/api/v1/namespaces/_/apps/{app.name}?blocking=true",
                            {"gate": gate.address})[1]

    import threading
    runner = threading.Thread(target=invoke)
    runner.start()
    return gate, runner, done


def test_compute_on_one_host_reaches_memory_on_another_over_tcp(hosts):
    platform, names = hosts
    status, listed = in_ns(names["s"], platform, "GET", "/api/v1/hosts")
    assert status == 200 and sorted(h["id"] for h in listed) == ["host-a", "host-b"]
    assert all(h["isolation"]["sandbox"] for h in listed), listed  # as each agent reported it
    app = pathlib.Path(__file__).parent / "app"
    status, body = in_ns(names["s"], platform, "PUT", "/api/v1/namespaces/_/apps/across",
                         {"manifest": (app / "scad.yaml").read_text(), "files": {"use.py": (app / "use.py").read_text()}})
    assert status == 200, body
    status, rec = in_ns(names["s"], platform, "POST", "/api/v1/namespaces/_/apps/across?blocking=true")
    assert status == 200, rec
    assert rec["response"]["result"] == {"verified": True, "impl": "rdma_tcp"}
    wiring = next(a["value"] for a in rec["annotations"] if a["key"] == "wiring")
    assert list(wiring.values()) == ["host-a"] and list(wiring)[0].endswith("data;tcp")


def test_a_zip_action_runs_on_an_agent_of_another_host(hosts):
    # The zip travels in the compute spec to host-a (the one with cpus), which unpacks it; a warm
    # run there gets the spec without it.
    import base64
    import io
    import zipfile
    platform, names = hosts
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("__main__.py", "from helper import where\ndef main(args):\n    return {'where': where()}\n")
        z.writestr("helper.py", "def where():\n    return 'zip'\n")
    code = base64.b64encode(buf.getvalue()).decode()
    status, body = in_ns(names["s"], platform, "PUT", "/api/v1/namespaces/_/actions/zipped",
                         {"exec": {"kind": "python:3", "code": code, "binary": True}})
    assert status == 200, body
    for warm in (False, True):
        status, rec = in_ns(names["s"], platform, "POST", "/api/v1/namespaces/_/actions/zipped?blocking=true", {})
        assert status == 200 and rec["response"]["result"] == {"where": "zip"}, rec
        assert ("warm" in next(a["value"] for a in rec["annotations"] if a["key"] == "starts")) == warm, rec


def test_a_crash_on_one_host_is_told_to_its_peer_and_frees_grants_on_the_other(hosts):
    # Both instances run on host-a; their memory is on host-b. The scheduler reaches both agents
    # over HTTP: the revoke goes to host-b, the notice to host-a.
    platform, names = hosts
    app = pathlib.Path(__file__).parents[1] / "platform" / "apps" / "peers"
    gate, runner, done = deploy_and_invoke_with_gate(platform, names, app)
    try:
        gate.wait_arrivals(1)  # instance 1 connects once it has the notice
        status, els = in_ns(names["s"], platform, "GET", "/api/v1/namespaces/_/elements")
        assert [(e["name"], e["host"]) for e in els] == [("data", "host-b")], els
    finally:
        gate.close()
    runner.join(120)
    rec = done["rec"]
    assert "work#0" in rec["response"]["result"]["error"], rec["response"]
    told = [json.loads(line.split("peer failure: ", 1)[1]) for line in rec["logs"] if "peer failure: " in line]
    assert len(told) == 1 and told[0]["instance"] == 0 and told[0]["shared"] == ["data"], rec["logs"]


def test_a_host_that_dies_takes_its_memory_and_its_clients_are_told(hosts):
    # The compute instance runs on host-a, its memory element on host-b. host-b is killed (no
    # goodbye): once its heartbeats are missed the scheduler tells the instance which memory is gone.
    platform, names = hosts
    gate, runner, done = deploy_and_invoke_with_gate(platform, names, pathlib.Path(__file__).parent / "lost")
    conn, = gate.wait_arrivals(1)  # the instance has written to its memory on host-b
    assert conn.makefile().readline() == "connected\n"
    gate.close()
    agent_b = platform.agents["host-b"]
    agent_b.kill()
    agent_b.wait(10)
    runner.join(120)
    rec = done["rec"]
    assert rec["response"]["status"] == "success", rec["response"]
    notice = rec["response"]["result"]["notice"]
    assert notice is not None, rec["logs"]
    assert notice["type"] == "host_lost" and notice["host"] == "host-b" and notice["shared"] == ["data"], notice
    assert "host-b" in notice["reason"] and "'data'" in notice["reason"], notice
    # The transport found out by itself as well: its control connection died with the agent.
    assert rec["response"]["result"]["state"] == "ERROR", rec["response"]["result"]
    status, listed = in_ns(names["s"], platform, "GET", "/api/v1/hosts")
    assert {h["id"]: h["state"] for h in listed} == {"host-a": "up", "host-b": "down"}, listed


def test_a_partition_between_hosts_times_out_then_heals(hosts):
    # The instance on host-a uses memory on host-b; host-b's link goes down (no reset, packets
    # just stop), then comes back. The instance sees a timeout within its deadline (1.5 s), then
    # recovers its transport and reads its data again.
    platform, names = hosts
    gate, runner, done = deploy_and_invoke_with_gate(platform, names, pathlib.Path(__file__).parent / "partition")
    link = next(l for l in subprocess.run(["ip", "-n", names["s"], "-o", "link"], capture_output=True, text=True,
                                          check=True).stdout.splitlines() if "b1@" in l).split(":")[1].strip().split("@")[0]
    try:
        conn, = gate.wait_arrivals(1)
        lines = conn.makefile("r")
        assert lines.readline() == "ready\n"
        sh("ip", "-n", names["s"], "link", "set", link, "down")
        conn.sendall(b"cut\n")
        kind, ms = lines.readline().split()
        print(f"\npartition: {kind} after {ms} ms")
        assert kind in ("TimeoutError", "ConnectionError") and int(ms) < 1500 + 1000, (kind, ms)
        sh("ip", "-n", names["s"], "link", "set", link, "up")
        conn.sendall(b"healed\n")
        assert lines.readline() == "recovered partitio\n"
    finally:
        subprocess.run(["ip", "-n", names["s"], "link", "set", link, "up"], capture_output=True)
        gate.close()
    runner.join(120)
    assert done["rec"]["response"]["result"] == {"ok": True}, done["rec"]["response"]


def test_a_restarted_scheduler_takes_its_hosts_back(hosts):
    # kill -9 of scad-server: the agents keep heartbeating and register again with the new one
    # (host-b with its own key); applications deployed before are still there and run across hosts.
    platform, names = hosts
    app = pathlib.Path(__file__).parent / "app"
    status, body = in_ns(names["s"], platform, "PUT", "/api/v1/namespaces/_/apps/across",
                         {"manifest": (app / "scad.yaml").read_text(), "files": {"use.py": (app / "use.py").read_text()}})
    assert status == 200, body
    banner = platform.restart_scheduler()
    assert "platform up" in banner, banner
    deadline = time.monotonic() + 30
    while True:  # heartbeats come every 2 s
        status, listed = in_ns(names["s"], platform, "GET", "/api/v1/hosts")
        if status == 200 and sorted(h["id"] for h in listed if h["state"] == "up") == ["host-a", "host-b"]:
            break
        assert time.monotonic() < deadline, listed
    status, rec = in_ns(names["s"], platform, "POST", "/api/v1/namespaces/_/apps/across?blocking=true")
    assert status == 200 and rec["response"]["result"] == {"verified": True, "impl": "rdma_tcp"}, rec

