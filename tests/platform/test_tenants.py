"""Several tenants (namespaces) on one platform: each sees only its own, each's actions run as its
own uid, and many small applications deployed and invoked at once by all of them lose nothing."""
import copy
import os
import threading

import pytest

from scadtest import Platform, wait_until

TENANTS = ["alice", "bob"]


@pytest.fixture
def tenants(tmp_path):
    p = Platform(tmp_path / "home", extra=[a for t in TENANTS for a in ("--namespace", t)])
    views = {"guest": p}
    for t in TENANTS:
        props = dict(line.split("=", 1) for line in (p.home / "namespaces" / f"{t}.wskprops").read_text().split())
        view = copy.copy(p)
        view.auth = props["AUTH"]
        views[t] = view
    yield views
    p.stop()


def server_status(pid):
    """Threads and VmRSS (KiB) of a process, from /proc."""
    with open(f"/proc/{pid}/status") as f:
        fields = dict(line.split(":", 1) for line in f)
    return {"Threads": int(fields["Threads"]), "VmRSS": int(fields["VmRSS"].split()[0])}


WHO = "import os\ndef main(args):\n    return {'uid': os.getuid(), 'n': args.get('n', 0)}\n"


def test_each_tenant_sees_only_its_own(tenants):
    guest, alice = tenants["guest"], tenants["alice"]
    assert oct((guest.home / "namespaces" / "alice.wskprops").stat().st_mode & 0o777) == "0o600"
    assert alice.call("GET", "/api/v1/namespaces")[1] == ["alice"]
    assert guest.call("PUT", "/api/v1/namespaces/_/actions/who", {"exec": {"kind": "python:3", "code": WHO}})[0] == 200
    status, rec = guest.call("POST", "/api/v1/namespaces/_/actions/who", {}, params="?blocking=true")
    assert status == 200
    assert alice.call("GET", "/api/v1/namespaces/_/actions/who")[0] == 404
    assert alice.call("GET", "/api/v1/namespaces/guest/actions/who")[0] == 403
    assert alice.call("GET", f"/api/v1/namespaces/_/activations/{rec['activationId']}")[0] == 404
    assert alice.call("GET", "/api/v1/namespaces/_/activations")[1] == []
    assert alice.call("PUT", "/api/v1/namespaces/_/actions/who", {"exec": {"kind": "python:3", "code": WHO}})[0] == 200
    status, mine = alice.call("POST", "/api/v1/namespaces/_/actions/who", {}, params="?blocking=true")
    assert status == 200
    if os.geteuid() == 0 and "NOT sandboxed" not in guest.banner:
        assert mine["response"]["result"]["uid"] != rec["response"]["result"]["uid"], "tenants share a uid"


def test_many_small_applications_of_several_tenants_at_once(tenants, tmp_path):
    apps_per_tenant, calls_per_app = 6, 3
    for ns, view in tenants.items():
        for i in range(apps_per_tenant):
            app = tmp_path / f"{ns}-{i}"
            app.mkdir()
            (app / "scad.yaml").write_text(f"name: small{i}\nelements:\n  m: {{kind: memory, size: 64KiB}}\n"
                                           "  w: {kind: compute, code: w.py, transports: {m: {element: m}}}\n")
            (app / "w.py").write_text("def main(args, action):\n"
                                      "    t = action.get_transport('m', 'rdma')\n    t.reg(8)\n"
                                      "    t.buf[0:8] = args['n'].to_bytes(8, 'little')\n    t.write(8, 0)\n"
                                      "    t.read(8, 0)\n    return {'n': int.from_bytes(t.buf[0:8], 'little'),"
                                      f" 'ns': '{ns}'}}\n")
            assert view.deploy(app)[0] == 200
    answers, errors = [], []
    lock = threading.Lock()
    server = tenants["guest"].proc.pid
    before = server_status(server)
    peak = dict(before)
    sampling = threading.Event()

    def sample():  # the server's threads and resident memory, every 20 ms while the calls run
        while not sampling.wait(0.02):
            now = server_status(server)
            for k in peak:
                peak[k] = max(peak[k], now[k])

    sampler = threading.Thread(target=sample)
    sampler.start()

    def call(ns, view, i, n):
        status, rec = view.invoke(f"small{i}", {"n": n})
        if status == 202:  # past the blocking waits the server holds: poll, as OpenWhisk clients do
            path = f"/api/v1/namespaces/_/activations/{rec['activationId']}"
            assert wait_until(lambda: view.call("GET", path)[0] == 200, 120)  # found once it has ended
            status, rec = view.call("GET", path)
        with lock:
            if status == 200 and rec["response"]["result"] == {"n": n, "ns": ns}:
                answers.append((ns, rec["activationId"]))
            else:
                errors.append((status, rec))

    callers = [threading.Thread(target=call, args=(ns, view, i, k * 1000 + i))
               for ns, view in tenants.items() for i in range(apps_per_tenant) for k in range(calls_per_app)]
    for c in callers:
        c.start()
    for c in callers:
        c.join(300)
    sampling.set()
    sampler.join()
    assert errors == [] and len(answers) == len(tenants) * apps_per_tenant * calls_per_app
    # Bounded: the server's fixed pools plus at most one thread per activation in flight (which
    # the activations quota bounds per namespace), none per instance or connection; a few MiB of
    # records and code, not a copy per call; all given back.
    after = server_status(server)
    print(f"\nscad-server: threads {before['Threads']} -> peak {peak['Threads']} -> {after['Threads']}; "
          f"RSS {before['VmRSS'] >> 10} -> peak {peak['VmRSS'] >> 10} -> {after['VmRSS'] >> 10} MiB")
    assert peak["Threads"] <= before["Threads"] + len(callers), (before, peak)
    assert after["Threads"] <= before["Threads"] + 8, (before, after)
    assert peak["VmRSS"] - before["VmRSS"] < 128 << 10, (before, peak)
    for ns, view in tenants.items():  # every activation is on record, each in its own namespace only
        status, listed = view.call("GET", "/api/v1/namespaces/_/activations", params="?limit=200")
        assert sorted(a["activationId"] for a in listed) == sorted(i for n, i in answers if n == ns)
        assert view.call("GET", "/api/v1/namespaces/_/elements")[1] == []
    status, hosts = tenants["guest"].call("GET", "/api/v1/hosts")
    assert hosts[0]["memory_pool_used"] == 0 and hosts[0]["cpus_free"] == 2
