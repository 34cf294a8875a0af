"""Compute processes run in a sandbox (bubblewrap): they see none of the platform's state and no
other process, run as their namespace's own uid, cannot change their code, keep /tmp to
themselves, and nothing they start outlives them. Each test runs an action that probes its
surroundings and returns what it found."""
import json
import os
import pathlib
import shutil
import signal
import socket

import pytest

from scadtest import Gate, Platform

pytestmark = pytest.mark.skipif(not shutil.which("bwrap"), reason="bubblewrap is not installed")

ACTIONS = "/api/v1/namespaces/_/actions"

PROBE = '''
import os, sys

def main(args):
    home = args["home"]
    found = {}
    found["uid"] = os.getuid()
    # Of $SCAD_HOME only the memory pool's socket is there (and the folders above it).
    found["home"] = sorted(os.listdir(home)) if os.path.isdir(home) else None
    found["run"] = sorted(os.listdir(home + "/run")) if os.path.isdir(home + "/run") else None
    pids = [p for p in os.listdir("/proc") if p.isdigit()]
    found["processes"] = len(pids)
    found["sees_server"] = any("scad-server" in open(f"/proc/{p}/cmdline", "rb").read().decode(errors="replace")
                               for p in pids if os.path.exists(f"/proc/{p}/cmdline"))
    found["code"] = __file__
    try:
        open(__file__, "a").close()
        found["code_writable"] = True
    except OSError:
        found["code_writable"] = False
    found["tmp_before"] = sorted(os.listdir("/tmp"))
    with open("/tmp/mark-" + args["tag"], "w") as f:
        f.write("x")
    found["no_new_privs"] = open("/proc/self/status").read().split("NoNewPrivs:")[1].split()[0]
    return found
'''


def tenant_uid(ns):
    h = 2166136261
    for c in ns.encode():
        h = ((h ^ c) * 16777619) & 0xFFFFFFFF
    return (1 << 30) + (h & ((1 << 28) - 1))


def run(platform, name, args, code=PROBE, **extra):
    status, body = platform.call("PUT", f"{ACTIONS}/{name}?overwrite=true", {"exec": {"kind": "python:3", "code": code},
                                                                             **extra})
    assert status == 200, body
    return platform.call("POST", f"{ACTIONS}/{name}", args, params="?blocking=true")


def test_an_action_sees_nothing_of_the_platform_and_runs_as_its_namespace(platform):
    assert "NOT sandboxed" not in platform.banner, platform.banner
    status, hosts = platform.call("GET", "/api/v1/hosts")
    assert hosts[0]["isolation"]["sandbox"] is True, hosts
    assert hosts[0]["isolation"]["cgroup_limits"] or hosts[0]["isolation"]["cgroup_limits_off"], hosts
    status, rec = run(platform, "probe", {"home": str(platform.home), "tag": "a"})
    assert status == 200, rec
    found = rec["response"]["result"]
    assert found["home"] == ["run"] and found["run"] == ["memory.sock"], found
    assert sorted(os.listdir(platform.home)) != ["run"], "the platform's state is there, only hidden"
    assert not found["sees_server"] and found["processes"] < 10, found
    if os.geteuid() == 0:
        assert found["uid"] == tenant_uid("guest"), found
    assert found["code"].startswith("/code/") and not found["code_writable"], found
    assert found["no_new_privs"] == "1"


def test_tmp_is_private_to_each_action(platform):
    assert run(platform, "one", {"home": str(platform.home), "tag": "one"})[0] == 200
    status, rec = platform.call("POST", f"{ACTIONS}/one", {"home": str(platform.home), "tag": "one-again"},
                                params="?blocking=true")
    assert status == 200 and "mark-one" in rec["response"]["result"]["tmp_before"], "a warm process keeps its /tmp"
    status, rec = run(platform, "two", {"home": str(platform.home), "tag": "two"})
    assert status == 200, rec
    assert not [f for f in rec["response"]["result"]["tmp_before"] if f.startswith("mark-")], rec["response"]


SPAWNS = '''
import socket, subprocess, sys, time

CHILD = """
import socket, sys, time
s = socket.create_connection((sys.argv[1], int(sys.argv[2])))
s.sendall(b"child\\\\n")
time.sleep(3600)
"""

def main(args):
    host, port = args["gate"]
    subprocess.Popen([sys.executable, "-c", CHILD, host, str(port)], start_new_session=True,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(3600)
'''


def child_connection(gate):
    conn, = gate.wait_arrivals(1)
    conn.settimeout(60)
    assert conn.recv(6) == b"child\n"
    return conn


def test_a_child_in_its_own_session_dies_with_the_action_at_its_timeout(platform):
    gate = Gate()
    try:
        status, rec = run(platform, "spawner", {"gate": gate.address}, code=SPAWNS, limits={"timeout": 3000})
        assert status == 502 and "time limits of 3000 milliseconds" in rec["response"]["result"]["error"], rec["response"]
        conn = child_connection(gate)
        assert conn.recv(1) == b"", "the child outlived its action"
    finally:
        gate.close()


def test_a_child_dies_when_the_server_is_killed(platform):
    gate = Gate()
    try:
        status, body = platform.call("PUT", f"{ACTIONS}/spawner", {"exec": {"kind": "python:3", "code": SPAWNS}})
        assert status == 200
        status, body = platform.call("POST", f"{ACTIONS}/spawner", {"gate": gate.address})
        assert status == 202
        conn = child_connection(gate)
        platform.stop(signal.SIGKILL)
        assert conn.recv(1) == b"", "the child outlived scad-server"
    finally:
        gate.close()


READ_ONLY = '''
import os

def main(args, action):
    t = action.get_transport("data", "rdma")
    t.reg(64)
    t.read(8, 0)
    try:
        t.write(8, 0)
        wrote = True
    except PermissionError:
        wrote = False
    return {"wrote": wrote, "uid": os.getuid()}
'''


@pytest.mark.skipif(os.geteuid() != 0, reason="the namespace's own uid needs an agent running as root")
def test_a_read_only_grant_cannot_be_reopened_writable(platform, tmp_path):
    app = tmp_path / "ro"
    app.mkdir()
    (app / "scad.yaml").write_text("name: ro\nelements:\n  data: {kind: memory, size: 1MiB}\n"
                                   "  peek: {kind: compute, code: peek.py, transports: {data: {element: data, rights: r}}}\n")
    (app / "peek.py").write_text(READ_ONLY)
    assert platform.deploy(app)[0] == 200
    status, rec = platform.invoke("ro")
    assert status == 200, rec
    result = rec["response"]["result"]
    # The mapping is read-only (the kernel refuses writes), and the element's memfd is mode 0600
    # while the action runs as another uid, so it cannot be reopened writable either.
    assert result["wrote"] is False and result["uid"] != os.geteuid(), result
    wiring = next(a["value"] for a in rec["annotations"] if a["key"] == "wiring")
    assert list(wiring)[0].endswith("data;shm"), wiring


HOLDS = '''
import socket

def main(args):
    with socket.create_connection(tuple(args["gate"])) as s:
        s.sendall(b"child\\n")
        s.recv(1)
'''


def test_an_unsandboxed_action_still_dies_with_the_server(tmp_path):
    from scadtest import Platform
    p = Platform(tmp_path / "home", extra=["--sandbox", "off"])
    gate = Gate()
    try:
        assert "NOT sandboxed" in p.banner
        assert p.call("PUT", f"{ACTIONS}/holds", {"exec": {"kind": "python:3", "code": HOLDS}})[0] == 200
        assert p.call("POST", f"{ACTIONS}/holds", {"gate": gate.address})[0] == 202
        conn = child_connection(gate)
        p.stop(signal.SIGKILL)
        assert conn.recv(1) == b"", "the action's process outlived scad-server"
    finally:
        gate.close()
        p.stop()


def test_an_element_without_network_reaches_only_its_memory(platform):
    status, body = platform.deploy(pathlib.Path(__file__).parent / "apps" / "offline")
    assert status == 200, body
    host, port = platform.url.split("//")[1].split(":")
    status, body = platform.invoke("offline", {"scheduler": [host, int(port)]})
    assert status == 200, body
    sealed, opened = body["response"]["result"]["sealed"], body["response"]["result"]["open"]
    # No route out (a network namespace with loopback only), the runtime endpoint out of reach with
    # a message that says why; its memory over shm works, and the next element reads what it wrote.
    assert sealed["tcp"] == "ConnectionRefusedError", sealed
    assert "no network" in sealed["runtime"], sealed
    assert opened == {"tcp": "connected", "read_back": "wrote", "runtime": "reached"}, opened


def test_no_network_is_refused_where_there_is_no_sandbox(tmp_path):
    p = Platform(tmp_path / "home", extra=["--sandbox", "off"])
    try:
        status, body = p.deploy(pathlib.Path(__file__).parent / "apps" / "offline")
        assert status == 200, body
        status, body = p.invoke("offline", {"scheduler": ["127.0.0.1", 1]})
        result = body["response"]["result"]
        assert body["response"]["status"] == "whisk internal error", body
        assert "asks for no network" in json.dumps(result) and "without a sandbox" in json.dumps(result), result
    finally:
        p.stop()
