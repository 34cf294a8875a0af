"""The platform wires hosts that both have RDMA over verbs, in the Soft-RoCE guest: a scheduler and
two scad-agents, each a host of its own (own home, own memory pool, own HTTP endpoint), all on
the guest's rxe0 address. Agent A has cpus and no pool, agent B a pool and no cpus, so the compute
element runs on A and reaches its memory element on B. With RDMA on both the engine picks verbs;
with verbs turned off on B it falls back to tcp. (Separate network namespaces are not possible
here: rxe in 6.1 receives only in the initial namespace.)"""
import os
import pathlib
import select
import subprocess
import sys

import pytest

from scadtest import BUILD, ROOT, Platform, cluster_token, stop_processes

ADDR = "10.0.0.1"  # rxe0's netdev in the guest (tests/softroce/guest-init)
APP = ROOT / "tests" / "multihost" / "app"


def _has_rdma():
    devices = pathlib.Path("/sys/class/infiniband")
    return devices.is_dir() and any(devices.iterdir())


pytestmark = pytest.mark.skipif(not os.environ.get("LIBD_REQUIRE_VERBS") and not _has_rdma(),
                                reason="needs an RDMA device (run through tests/softroce/run)")


@pytest.fixture
def cluster(tmp_path):
    token = cluster_token(tmp_path)
    procs = []

    def start(verbs_b):
        platform = Platform(tmp_path / "sched", extra=["--host", ADDR, "--no-local-agent",
                                                         "--cluster-token-file", str(token)])
        procs.append(platform.proc)
        import disagg
        pythonpath = f"{os.path.dirname(disagg.__file__)}:{ROOT / 'bindings' / 'python'}"
        banners = {}
        for key, pool, cpus, verbs in (("a", "0", "2", "auto"), ("b", "256MiB", "0", verbs_b)):
            p = subprocess.Popen([str(BUILD / "agent" / "scad-agent"), "--scheduler", platform.url, "--address", ADDR,
                                  "--token-file", str(token), "--id", f"host-{key}", "--home", str(tmp_path / key),
                                  "--pool", pool, "--cpus", cpus, "--verbs", verbs, "--python", sys.executable,
                                  "--pythonpath", pythonpath], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            procs.append(p)
            ready, _, _ = select.select([p.stdout], [], [], 30)
            assert ready, f"agent {key} did not register: {p.stderr.read() if p.poll() is not None else ''}"
            banners[key] = p.stdout.readline()
        return platform, banners

    yield start
    stop_processes(procs)


def run_across(platform):
    status, body = platform.deploy(APP)
    assert status == 200, body
    status, rec = platform.invoke("across")
    assert status == 200, "\n".join([str(rec["response"])] + rec["logs"])
    wiring = next(a["value"] for a in rec["annotations"] if a["key"] == "wiring")
    return rec["response"]["result"], wiring


def test_two_hosts_with_rdma_are_wired_over_verbs(cluster):
    platform, banners = cluster("auto")
    assert "RDMA on rxe0" in banners["a"] and "RDMA on rxe0" in banners["b"], banners
    status, hosts = platform.call("GET", "/api/v1/hosts")
    assert status == 200 and {h["id"]: h["rdma"] for h in hosts} == {"host-a": True, "host-b": True}, hosts

    result, wiring = run_across(platform)
    assert result == {"verified": True, "impl": "rdma_uverbs"}
    assert list(wiring.values()) == ["host-a"] and list(wiring)[0].endswith("data;verbs"), wiring


def test_a_host_without_rdma_is_wired_over_tcp(cluster):
    platform, banners = cluster("off")
    assert "no RDMA" in banners["b"], banners
    status, hosts = platform.call("GET", "/api/v1/hosts")
    assert {h["id"]: h["rdma"] for h in hosts} == {"host-a": True, "host-b": False}, hosts

    result, wiring = run_across(platform)
    assert result == {"verified": True, "impl": "rdma_tcp"}
    assert list(wiring)[0].endswith("data;tcp"), wiring
