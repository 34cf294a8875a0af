"""End to end over RDMA verbs, in the Soft-RoCE guest (tests/softroce/run): a memory element in
libd-memd served over verbs, and a Python compute element, started by the launcher as the agent
does, that reads and writes it. The data is then checked through a second client over tcp."""
import os
import pathlib

import pytest

from scad.launcher import run_action

ACTIONS = pathlib.Path(__file__).parent / "actions"

def _has_rdma():
    devices = pathlib.Path("/sys/class/infiniband")
    return devices.is_dir() and any(devices.iterdir())


# In the guest LIBD_REQUIRE_VERBS is set: there a missing device fails instead of skipping.
pytestmark = pytest.mark.skipif(not os.environ.get("LIBD_REQUIRE_VERBS") and not _has_rdma(),
                                reason="needs an RDMA device (run through tests/softroce/run)")


def spec(server, args, aid="it-client"):
    return {"aid": aid, "code": str(ACTIONS / "verbs_roundtrip.py"), "main": "main", "args": args,
            "transports": [{"durl": "mem1;verbs", "config": server.config()}]}


@pytest.mark.parametrize("windows", ["1", "0"])
def test_python_action_reads_and_writes_over_verbs(memd, windows):
    server = memd("--verbs", f"mw={windows}", element="mem1=8MiB")
    assert "port" in server.ready["verbs"], server.ready  # the device it serves on, e.g. "rxe0 port 1 gid[1] ..."
    out = run_action(spec(server, {"size": 1 << 20, "offset": 4096}))
    assert out["ok"], out.get("error")
    assert out["result"] == {"same": True, "same_async": True, "writes": 5, "reads": 2}

    # What the action wrote is in the element, as another client (over tcp) sees it.
    import disagg
    with disagg.LibdAction("it-client") as a:
        a.add_transport("mem1;tcp;" + server.config())
        t = a.get_transport("mem1", "rdma")
        t.reg(16)
        t.read(8, 4096)
        expect = bytes(reversed(bytes((i * 7 + 3) % 251 for i in range(1 << 20))))[:8]
        assert bytes(t.buf[:8]) == expect


def test_a_grant_for_another_client_is_refused_with_a_clear_error(memd):
    server = memd("--verbs", element="mem1=1MiB")
    out = run_action(spec(server, {"size": 4096, "offset": 0}, aid="somebody-else"))
    assert not out["ok"]
    assert "refused the grant" in out["error"]["message"], out["error"]
