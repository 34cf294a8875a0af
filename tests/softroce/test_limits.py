"""cgroup v2 limits on compute elements (runtime/src/cgroup.h), in the Soft-RoCE guest, whose
/sys/fs/cgroup is a cgroup2 mount with the cpu and memory controllers (this project's CI host has
a hybrid hierarchy whose cgroup2 part has neither, so there the agent says limits are off)."""
import os
import pathlib
import select
import subprocess
import sys

import pytest

from scadtest import BUILD, ROOT, Platform, cluster_token, stop_processes

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
        agent = subprocess.Popen([str(BUILD / "runtime" / "scad-agent"), "--scheduler", plat.url, "--address", "127.0.0.1",
                                  "--token-file", str(token), "--id", "limited", "--home", str(tmp_path / "agent"),
                                  "--python", sys.executable, "--pythonpath", pythonpath],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs.append(agent)
        ready, _, _ = select.select([agent.stdout], [], [], 30)
        assert ready, f"the agent did not register: {agent.stderr.read() if agent.poll() is not None else ''}"
        plat.banner = agent.stdout.readline()
        yield plat
    finally:
        stop_processes(procs)


def test_compute_elements_run_under_their_cpu_and_memory_limits(platform):
    assert "cgroup v2 limits" in platform.banner, platform.banner
    status, body = platform.deploy(APP)
    assert status == 200, body
    status, rec = platform.invoke("limits")
    assert status == 200, rec
    seen = rec["response"]["result"]
    # cpu: 0.5 is half of each 100 ms period; memory: 96MiB is memory.max in bytes.
    assert seen["cpu.max"] == "50000 100000" and seen["memory.max"] == str(96 << 20), seen
    assert "/workers/" in seen["cgroup"], seen

    status, rec = platform.invoke("limits", {"allocate_mib": 384})
    response = rec["response"]
    assert response["status"] == "action developer error", response
    error = response["result"]["error"]
    assert "OOM killer" in error and "96 MiB" in error, error
    # The killed process's cgroup went with it (the first run's process was reused warm).
    assert not pathlib.Path(seen["cgroup"]).exists(), seen["cgroup"]
