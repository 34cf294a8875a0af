"""The applications in actions/ (sort, query, logreg, elastic), each run twice at a small size:
with their intermediate state in memory elements and in Redis (Debian's redis-server, started
here), through the same code. Both runs must give the same, correct answer."""
import os
import shutil
import socket
import subprocess
import sys

import pytest

from scadtest import ROOT, Platform

APPS = {
    "sort": {"n": 200_000},
    "query": {"scale": 0.2},
    "logreg": {"rows": 20_000, "features": 8, "epochs": 2},
    "elastic": {"chunks": 11, "chunk_kib": 64},
}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    server = shutil.which("redis-server")
    if server is None:
        pytest.fail("redis-server is missing: scripts/setup installs it")
    port = free_port()
    proc = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(tmp_path_factory.mktemp("redis"))],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:  # it says when it accepts connections
        if "Ready to accept connections" in line:
            break
    else:
        pytest.fail("redis-server did not start")
    yield f"redis://127.0.0.1:{port}/0"
    proc.terminate()
    proc.wait(30)


@pytest.fixture(scope="module")
def apps_platform(tmp_path_factory):
    # The sort's elements alone are 3.3 GiB as declared (the pool counts declared sizes; the
    # memory is only touched as it is written).
    p = Platform(tmp_path_factory.mktemp("apps") / "home", extra=["--pool", "6GiB"])
    for name in APPS:
        status, body = p.deploy(ROOT / "actions" / name)
        assert status == 200, (name, body)
    yield p
    p.stop()


def run(platform, name, params):
    status, rec = platform.invoke(name, params)
    assert status == 200 and rec["response"]["status"] == "success", (name, rec["response"], rec.get("logs", [])[-8:])
    return rec["response"]["result"]


@pytest.mark.parametrize("name", list(APPS))
def test_an_application_gives_the_same_answer_from_memory_elements_and_from_redis(apps_platform, redis_url, name):
    params = APPS[name]
    in_memory = run(apps_platform, name, dict(params))
    in_redis = run(apps_platform, name, dict(params, storage="redis", redis=redis_url, run=f"t-{name}"))
    assert in_memory["storage"] == "memory" and in_redis["storage"] == "redis"
    for r in (in_memory, in_redis):  # the state went through the store, both ways
        assert r["state"]["write_bytes"] > 0 and r["state"]["read_bytes"] > 0 and r["state"]["ops"] > 0
    strip = lambda r: {k: v for k, v in r.items() if k not in ("storage", "state")}  # noqa: E731
    assert strip(in_memory) == strip(in_redis)
    if name == "sort":
        assert in_memory["sorted"] and in_memory["n"] == params["n"]
    elif name == "query":
        assert in_memory["rows"] > 0 and sum(in_memory["revenue_by_category"]) > 0
        assert in_memory["scanned"] == int(500_000 * params["scale"])
    elif name == "logreg":
        assert in_memory["accuracy"] > 0.75, in_memory  # the labels come from a logistic model
    elif name == "elastic":
        assert in_memory["grown"] == 2  # room for 4, then 8, then 16 chunks for 11
        assert in_memory["bytes"] == params["chunks"] * params["chunk_kib"] * 1024


def test_the_record_says_where_the_time_went(apps_platform):
    """Each instance's transports in the activation record: what they moved and how long it took."""
    status, rec = apps_platform.invoke("sort", {"n": 100_000})
    assert status == 200 and rec["response"]["status"] == "success", rec["response"]
    transfers = next(a["value"] for a in rec["annotations"] if a["key"] == "transfers")
    assert sorted(transfers) == sorted([f"{e}#{i}" for e in ("generate", "partition", "merge") for i in range(4)]
                                       + ["check#0"])
    gen = {t["transport"]: t for t in transfers["generate#0"]}
    assert set(gen) == {"input"} and gen["input"]["kind"] == "shm"
    assert gen["input"]["write_bytes"] == 25_000 * 8 + 8 and gen["input"]["write_ops"] == 2
    assert gen["input"]["read_ops"] == 0 and gen["input"]["errors"] == 0 and gen["input"]["seconds"] > 0
    merge = {t["transport"]: t for t in transfers["merge#2"]}
    assert merge["output"]["write_ops"] == 2
    # On the elements' host scad.state reads a slot in place (mapped): nothing crosses libd, so
    # the reads are in the application's own counters and not among the transfers.
    assert merge["buckets"]["read_ops"] == 0 and merge["buckets"]["read_bytes"] == 0
    assert rec["response"]["result"]["state"]["read_bytes"] >= 2 * 100_000 * 8
    # `scad activation get` shows it as a table after the record.
    env = dict(os.environ, SCAD_HOME=str(apps_platform.home),
               PYTHONPATH=f"{ROOT / 'build' / 'python'}:{ROOT / 'bindings' / 'python'}")
    shown = subprocess.run([sys.executable, "-m", "scad.cli", "activation", "get", rec["activationId"]],
                           capture_output=True, text=True, env=env, timeout=60)
    assert shown.returncode == 0, shown.stderr
    rows = [line.split() for line in shown.stdout.splitlines() if line.startswith("merge#2 ")]
    assert sorted(r[1] for r in rows) == ["buckets", "output"] and all(r[2] == "shm" for r in rows), shown.stdout


def test_the_elastic_job_gives_back_what_it_grew(apps_platform):
    run(apps_platform, "elastic", {"chunks": 9, "chunk_kib": 16})
    status, elements = apps_platform.call("GET", "/api/v1/namespaces/_/elements")
    assert status == 200 and elements == [], elements  # nothing left once the activation ended


def test_application_instances_see_openwhisks_variables(apps_platform):
    code = ("import os\n\ndef main(args):\n"
            "    return {k: v for k, v in os.environ.items() if k.startswith('__OW_')}\n")
    manifest = "name: owenv\nelements:\n  probe: {kind: compute, code: probe.py, timeout: 30000}\n"
    status, body = apps_platform.call("PUT", "/api/v1/namespaces/_/apps/owenv",
                                      {"manifest": manifest, "files": {"probe.py": code}})
    assert status == 200, body
    status, rec = apps_platform.invoke("owenv")
    assert status == 200 and rec["response"]["status"] == "success", rec["response"]
    env = rec["response"]["result"]
    assert env["__OW_ACTIVATION_ID"] == rec["activationId"]
    assert env["__OW_NAMESPACE"] == rec["namespace"] and env["__OW_ACTION_NAME"].endswith("/owenv")
    assert rec["start"] < int(env["__OW_DEADLINE"]) <= rec["end"] + 30_000
    assert "__OW_API_KEY" not in env  # not asked for (provide-api-key)
