"""cgroup v2 limits on compute elements (agent/src/cgroup.h), in the Soft-RoCE guest, whose
/sys/fs/cgroup is a cgroup2 mount with the cpu and memory controllers (this project's CI host has
a hybrid hierarchy whose cgroup2 part has neither, so there the agent says limits are off)."""
import os
import pathlib
import select
import subprocess
import sys

import pytest

from scadtest import BUILD, ROOT, Gate, Platform, cluster_token, stop_processes, wait_until

APP = pathlib.Path(__file__).parent / "apps" / "limits"


def _controllers():
    f = pathlib.Path("/sys/fs/cgroup/cgroup.controllers")
    return f.read_text().split() if f.exists() else []


pytestmark = pytest.mark.skipif(not os.environ.get("LIBD_REQUIRE_VERBS") and
                                not {"cpu", "memory"} <= set(_controllers()),
                                reason="needs cgroup v2 with cpu and memory (run through tests/softroce/run)")


@pytest.fixture
def platform(tmp_path):
    token = cluster_token(tmp_path)
    plat = Platform(tmp_path / "sched", extra=["--no-local-agent", "--cluster-token-file", str(token)])
    procs = [plat.proc]
    try:
        import disagg
        pythonpath = f"{os.path.dirname(disagg.__file__)}:{ROOT / 'bindings' / 'python'}"
        agent = subprocess.Popen([str(BUILD / "agent" / "scad-agent"), "--scheduler", plat.url, "--address", "127.0.0.1",
                                  "--token-file", str(token), "--id", "limited", "--home", str(tmp_path / "agent"),
                                  "--python", sys.executable, "--pythonpath", pythonpath],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs.append(agent)
        ready, _, _ = select.select([agent.stdout], [], [], 30)
        assert ready, f"the agent did not register: {agent.stderr.read() if agent.poll() is not None else ''}"
        plat.banner = agent.stdout.readline()
        plat.agent_pid = agent.pid
        yield plat
    finally:
        stop_processes(procs)


def worker_cgroups(agent_pid):
    """The agent's per-process cgroups (B/workers/*, cgroup.h) that hold processes now."""
    line = next(l for l in pathlib.Path(f"/proc/{agent_pid}/cgroup").read_text().splitlines() if l.startswith("0::"))
    own = line[3:].rstrip("/")
    base = own[:-len("/agent")] if own.endswith("/agent") else own  # it moved into B/agent, unless B is the root
    workers = pathlib.Path("/sys/fs/cgroup" + base) / "workers"
    return [d.resolve() for d in workers.iterdir() if d.is_dir() and (d / "cgroup.procs").read_text().split()]


def test_compute_elements_run_under_their_cpu_and_memory_limits(platform):
    assert "cgroup v2 limits" in platform.banner, platform.banner
    status, body = platform.deploy(APP)
    assert status == 200, body
    gate = Gate()
    try:
        status, body = platform.invoke("limits", {"gate": gate.address}, blocking=False)
        assert status == 202, body
        gate.wait_arrivals(1)
        # Seen from the host: one cgroup holds the element's processes (in a sandbox: bubblewrap,
        # its init and the launcher); cpu: 0.5 is half of each 100 ms period, memory.max 96 MiB.
        cgroups = worker_cgroups(platform.agent_pid)
        busy = [c for c in cgroups if len((c / "cgroup.procs").read_text().split()) >= 1]
        assert len(busy) >= 1, cgroups
        held = [c for c in busy if (c / "cpu.max").read_text().strip() == "50000 100000"]
        assert len(held) == 1 and (held[0] / "memory.max").read_text().strip() == str(96 << 20), held
        seen = held[0]
        gate.open()
        path = f"/api/v1/namespaces/_/activations/{body['activationId']}"
        assert wait_until(lambda: platform.call("GET", path)[0] == 200, 60)  # found once it has ended
        assert platform.call("GET", path)[1]["response"]["status"] == "success"
    finally:
        gate.close()

    status, rec = platform.invoke("limits", {"allocate_mib": 384})
    response = rec["response"]
    assert response["status"] == "action developer error", response
    error = response["result"]["error"]
    assert "OOM killer" in error and "96 MiB" in error, error
    # The killed process's cgroup went with it (the first run's process was reused warm).
    assert not seen.exists(), seen
