"""The platform end to end on a real scad-server: deploy, invoke, DAG fan-out/fan-in with shared
memory, invoke/release from inside an action, bad manifests, auth, crashes, restarts, OpenWhisk
actions, and the CLI."""
import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
import urllib.request

from scadtest import ROOT, Gate, Platform, wait_until

APPS = pathlib.Path(__file__).parent / "apps"
DEMO = ROOT / "actions" / "sumsq"


def test_deploy_and_invoke_the_demo_dag(platform):
    status, app = platform.deploy(DEMO)
    assert status == 200, app
    assert app["version"] == 1 and sorted(app["files"]) == ["generate.py", "partial.py", "total.py"]
    status, rec = platform.invoke("sumsq", {"n": 100000})
    assert status == 200, rec
    result = rec["response"]["result"]
    assert result == {"n": 100000, "instances": 4, "sum_of_squares": result["sum_of_squares"], "verified": True}
    assert rec["response"]["status"] == "success" and rec["duration"] > 0
    keys = {a["key"] for a in rec["annotations"]}
    assert {"waitTime", "initTime", "kind", "path"} <= keys
    # Every instance of the fan-out ran and logged under its own name.
    status, logs = platform.call("GET", f"/api/v1/namespaces/_/activations/{rec['activationId']}/logs")
    assert status == 200
    status, elements = platform.call("GET", "/api/v1/namespaces/_/elements")
    assert elements == [], "memory elements are freed when the activation ends"
    status, only = platform.invoke("sumsq", {"n": 1000}, result=True)
    assert status == 200 and only["verified"] and only["n"] == 1000, only


def test_non_blocking_invoke_returns_an_id_then_the_record(platform):
    platform.deploy(DEMO)
    gate = Gate()
    platform.deploy(APPS / "slow")
    status, body = platform.invoke("slow", {"gate": gate.address}, blocking=False)
    assert status == 202 and set(body) == {"activationId"}
    gate.wait_arrivals(1)    # the action is running now
    path = f"/api/v1/namespaces/_/activations/{body['activationId']}"
    status, running = platform.call("GET", path)
    assert status == 404, running  # as OpenWhisk: not found until it is done
    status, listing = platform.call("GET", "/api/v1/namespaces/_/activations", params="?limit=5")
    assert body["activationId"] not in [a["activationId"] for a in listing]
    status, els = platform.call("GET", "/api/v1/namespaces/_/elements")
    assert [e["kind"] for e in els] == ["memory"]
    gate.close()
    assert wait_until(lambda: platform.call("GET", path)[0] == 200, 60)
    status, listing = platform.call("GET", "/api/v1/namespaces/_/activations", params="?limit=5")
    assert body["activationId"] in [a["activationId"] for a in listing]


def test_invoke_and_release_from_inside_an_action(platform):
    assert platform.deploy(APPS / "grow")[0] == 200
    status, rec = platform.invoke("grow", {"size": 4 << 20})
    assert status == 200, rec
    assert rec["response"]["result"] == {"read_back": "grown", "size": 4 << 20, "after_release": "refused"}
    # Its pages had ahead (a writer racing the prefetch loses nothing), and a bad ask refused.
    status, rec = platform.invoke("grow", {"size": 64 << 20, "prefetch": True})
    assert status == 200 and rec["response"]["result"]["read_back"] == "grown", rec
    status, rec = platform.invoke("grow", {"size": 1 << 20, "prefetch": "yes"})
    assert "props.prefetch must be true or false" in json.dumps(rec["response"]), rec


def test_bad_manifests_list_every_problem_and_deploy_nothing(platform):
    status, body = platform.deploy(APPS / "bad")
    assert status == 400
    problems = "\n".join(body["problems"])
    for expected in ["size 2 TiB cannot be met", "unknown element 'nowhere'", "unknown dependent 'ghost'",
                     "code file 'missing.py' is missing", "'parallelism' must be an integer",
                     "unknown field 'colour'", "dependents form a cycle",
                     "environment variable '__OW_API_KEY': __OW_ names are the platform's",
                     "environment variable 'SCAD_X': SCAD_ names are the runtime's own",
                     "environment variable '9LIVES': a name must start with a letter",
                     "environment variable 'COUNT': the value must be text",
                     "element 'ahead': 'prefetch' must be true or false"]:
        assert expected in problems, problems
    assert platform.call("GET", "/api/v1/namespaces/_/apps/bad")[0] == 404
    status, body = platform.call("PUT", "/api/v1/namespaces/_/apps/x", {"manifest": "name: [unclosed", "files": {}})
    assert status == 400 and "not valid YAML" in body["error"]
    status, body = platform.call("PUT", "/api/v1/namespaces/_/apps/x", raw=b"{not json")
    assert status == 400 and "not JSON" in body["error"]


def test_authentication_and_namespaces(platform):
    assert platform.call("GET", "/api/v1/namespaces/_/apps", auth="")[0] == 401
    uuid, key = platform.auth.split(":")
    assert platform.call("GET", "/api/v1/namespaces/_/apps", auth=f"{uuid}:{'0' * len(key)}")[0] == 401
    assert platform.call("GET", "/api/v1/namespaces/_/apps", auth="nobody:nothing")[0] == 401
    assert platform.call("GET", "/api/v1/namespaces/someone-else/apps")[0] == 403
    status, body = platform.call("GET", "/api/v1/namespaces")
    assert status == 200 and body == ["guest"]
    assert oct(os.stat(platform.home / "wskprops").st_mode & 0o777) == "0o600"
    # The runtime endpoint refuses callers without a live token.
    req_status, body = platform.call("POST", "/v1/actions/anyone/elements", {"template": "t", "name": "n"}, auth="")
    assert req_status == 404, "the runtime endpoint has a listener of its own"
    runtime = Platform.__new__(Platform)
    runtime.url, runtime.auth = json.loads((platform.home / "server.json").read_text())["runtime_url"], ""
    req_status, body = runtime.call("POST", "/v1/actions/anyone/elements", {"template": "t", "name": "n"})
    assert req_status == 401 and "unknown or expired token" in body["error"]


def test_a_crashing_compute_element_fails_the_activation_and_frees_everything(platform):
    platform.deploy(APPS / "crash")
    status, rec = platform.invoke("crash")
    assert status == 502
    resp = rec["response"]
    assert resp["status"] == "action developer error" and not resp["success"]
    assert "crashed" in resp["result"]["error"] and "signal 9" in resp["result"]["error"]
    assert any("about to crash" in line for line in rec["logs"])
    assert platform.call("GET", "/api/v1/namespaces/_/elements")[1] == []
    status, hosts = platform.call("GET", "/api/v1/hosts")
    assert hosts[0]["memory_pool_used"] == 0 and hosts[0]["cpus_free"] == 2


def test_a_crashed_instance_is_freed_at_once_and_its_peers_are_told(platform):
    # Two instances share `data`; #0 invokes a memory element of its own and is killed, #1 waits
    # for the notice, then for the test (a gate) while the test looks at what is still allocated.
    assert platform.deploy(APPS / "peers")[0] == 200
    gate = Gate()
    done = {}

    def invoke():
        done["rec"] = platform.invoke("peers", {"gate": gate.address})[1]

    runner = threading.Thread(target=invoke)
    runner.start()
    try:
        gate.wait_arrivals(1)  # #1 connects only once it has the notice
        status, els = platform.call("GET", "/api/v1/namespaces/_/elements")
        assert "rec" not in done, done.get("rec")
        assert [e["name"] for e in els] == ["data"], "the crashed instance's own element is freed at once"
    finally:
        gate.close()
    runner.join(120)
    rec = done["rec"]
    assert rec["response"]["status"] == "action developer error"
    assert "work#0" in rec["response"]["result"]["error"] and "crashed" in rec["response"]["result"]["error"]
    told = [json.loads(line.split("peer failure: ", 1)[1]) for line in rec["logs"] if "peer failure: " in line]
    assert len(told) == 1, rec["logs"]
    assert told[0]["element"] == "work" and told[0]["instance"] == 0 and told[0]["shared"] == ["data"]
    assert told[0]["type"] == "Crash" and "signal 9" in told[0]["reason"]
    assert platform.call("GET", "/api/v1/namespaces/_/elements")[1] == []


def test_a_restarted_scheduler_keeps_apps_and_finished_activations(platform):
    platform.deploy(DEMO)
    platform.deploy(APPS / "slow")
    status, done = platform.invoke("sumsq", {"n": 1000})
    assert status == 200
    gate = Gate()
    status, body = platform.invoke("slow", {"gate": gate.address}, blocking=False)
    gate.wait_arrivals(1)          # the slow activation is now running
    platform.stop(signal.SIGKILL)  # a crash mid-way
    gate.close()
    platform.start()
    assert "1 unfinished activation(s) marked failed" in platform.banner
    status, apps = platform.call("GET", "/api/v1/namespaces/_/apps")
    assert sorted(a["name"] for a in apps) == ["slow", "sumsq"]
    status, rec = platform.call("GET", f"/api/v1/namespaces/_/activations/{done['activationId']}")
    assert status == 200 and rec["response"]["result"]["verified"]
    status, lost = platform.call("GET", f"/api/v1/namespaces/_/activations/{body['activationId']}")
    assert lost["response"]["status"] == "whisk internal error"
    status, again = platform.invoke("sumsq", {"n": 1000}, result=True)
    assert status == 200 and again["verified"]


def test_openwhisk_actions(platform):
    code = "def main(args, action):\n    return {'greeting': 'hello ' + args.get('name', 'world')}\n"
    path = "/api/v1/namespaces/_/actions/hello"
    status, body = platform.call("PUT", path, {"exec": {"kind": "python:3", "code": code}})
    assert status == 200 and body["version"] == "0.0.1" and "code" not in body["exec"]
    assert platform.call("PUT", path, {"exec": {"kind": "python:3", "code": code}})[0] == 409
    status, body = platform.call("PUT", path, {"exec": {"kind": "python:3", "code": code},
                                                 "parameters": [{"key": "name", "value": "scad"}]}, params="?overwrite=true")
    assert status == 200 and body["version"] == "0.0.2"
    status, result = platform.call("POST", path, {}, params="?blocking=true&result=true")
    assert status == 200 and result == {"greeting": "hello scad"}
    status, result = platform.call("POST", path, {"name": "you"}, params="?blocking=true&result=true")
    assert result == {"greeting": "hello you"}
    status, rec = platform.call("POST", path, {}, params="?blocking=true")
    assert rec["response"]["success"] and rec["name"] == "hello"
    assert platform.call("PUT", "/api/v1/namespaces/_/actions/js", {"exec": {"kind": "nodejs:18", "code": "x"}})[0] == 400
    status, got = platform.call("GET", path)
    assert got["exec"]["code"] == code
    assert platform.call("DELETE", path)[0] == 200
    assert platform.call("POST", path, {})[0] == 404


def test_cli(platform):
    env = dict(os.environ, SCAD_HOME=str(platform.home), PYTHONPATH=f"{ROOT / 'build' / 'python'}:{ROOT / 'bindings' / 'python'}")
    scad = [sys.executable, "-m", "scad.cli"]

    def run(*args):
        return subprocess.run([*scad, *args], capture_output=True, text=True, env=env, timeout=120)

    r = run("app", "deploy", str(DEMO))
    assert r.returncode == 0 and "ok: deployed sumsq" in r.stdout, r.stderr
    r = run("app", "invoke", "sumsq", "-p", "n", "2000", "--result")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["n"] == 2000          # --result: only the result JSON on stdout
    r = run("app", "list", "--json")
    assert [a["name"] for a in json.loads(r.stdout)] == ["sumsq"]
    r = run("activation", "list")
    assert "sumsq" in r.stdout and "success" in r.stdout
    r = run("app", "deploy", str(APPS / "bad"))
    assert r.returncode == 1 and "invalid manifest" in r.stderr and "  - " in r.stderr
    r = run("app", "invoke", "nope")
    assert r.returncode == 1 and "does not exist" in r.stderr
    r = run("host", "list")
    assert "local" in r.stdout and "memory pool" in r.stdout
    env["SCAD_HOME"] = str(platform.home / "nowhere")
    r = run("app", "list")
    assert r.returncode == 1 and "scad up" in r.stderr


def starts(record):
    return next(a["value"] for a in record["annotations"] if a["key"] == "starts")


def test_warm_processes_serve_only_their_own_action(platform):
    platform.deploy(DEMO)
    status, first = platform.invoke("sumsq", {"n": 1000})
    # (an instance of `partial` may already reuse a sibling's process: the same action)
    assert status == 200 and sum(starts(first).values()) == 6
    status, second = platform.invoke("sumsq", {"n": 1000})
    assert status == 200 and starts(second).get("warm", 0) >= 4, starts(second)   # reused, same app version
    platform.deploy(APPS / "grow")
    status, other = platform.invoke("grow", {"size": 1 << 20})
    assert status == 200 and "warm" not in starts(other), "another action never gets a warm process"
    platform.deploy(APPS / "crash")
    platform.invoke("crash")
    status, again = platform.invoke("crash")
    assert "warm" not in starts(again), "a crashed process is not reused"


def test_each_element_runs_with_its_own_environment_also_warm(platform):
    assert platform.deploy(APPS / "envs")[0] == 200
    processes = set()
    for run in range(3):  # the later runs on warm processes
        status, rec = platform.invoke("envs")
        assert status == 200, rec
        got = rec["response"]["result"]
        assert got["first"] | {"process": ""} == {"at_import": "first", "now": "first", "empty": "", "process": ""}
        assert got["second"] | {"process": ""} == {"at_import": "second", "now": "second", "empty": None, "process": ""}
        # The second element starts once the first is done, its process idle: never given it.
        assert got["first"]["process"] != got["second"]["process"]
        processes |= {got["first"]["process"], got["second"]["process"]}
        if run:
            assert starts(rec).get("warm", 0) >= 1, starts(rec)
    assert len(processes) < 6, "warm processes served the later runs"


def test_a_wide_fan_out_of_short_instances_runs_on_the_processes_it_has(platform):
    # 24 instances at once, more than the 16 idle processes an agent keeps: once the action's runs
    # are known to be shorter than starting a process, instances past those wait for a sibling's
    # process (or take a pre-warmed one) instead of starting their own.
    manifest = {"name": "wide", "elements": {"e": {"kind": "compute", "code": "noop.py", "parallelism": 24,
                                                   "cpu": 0.01}}}
    app = {"manifest": json.dumps(manifest), "files": {"noop.py": "def main(args, action):\n    return {}\n"}}
    assert platform.call("PUT", "/api/v1/namespaces/_/apps/wide", app)[0] == 200
    # The agent learns how long a run of the action takes from runs on processes that were
    # already up: the first invocation may have had none (all 24 started for it), the second has.
    for _ in range(2):
        status, first = platform.invoke("wide")
        assert status == 200 and sum(starts(first).values()) == 24, starts(first)
    for _ in range(2):
        status, again = platform.invoke("wide")
        assert status == 200 and sum(starts(again).values()) == 24
        assert "cold" not in starts(again), starts(again)


def test_a_full_warm_pool_makes_room_for_the_action_running_now(tmp_path):
    # One idle process kept (--max-warm 1): the action that ran last keeps it, the one idle
    # longest gives it up, as OpenWhisk evicts its least recently used container.
    p = Platform(tmp_path / "home", extra=["--max-warm", "1", "--prewarm", "0"])
    try:
        code = "def main(args):\n    return {'who': %r}\n"
        for name in ("a", "b"):
            status, _ = p.call("PUT", f"/api/v1/namespaces/_/actions/{name}",
                               {"exec": {"kind": "python:3", "code": code % name}})
            assert status == 200
        path = "/api/v1/namespaces/_/actions/{}"
        assert p.call("POST", path.format("a"), {}, params="?blocking=true")[1]["response"]["result"] == {"who": "a"}
        assert p.call("POST", path.format("b"), {}, params="?blocking=true")[0] == 200
        status, again = p.call("POST", path.format("b"), {}, params="?blocking=true")
        assert status == 200 and starts(again) == {"warm": 1}, starts(again)
        status, first_again = p.call("POST", path.format("a"), {}, params="?blocking=true")
        assert status == 200 and starts(first_again) == {"cold": 1}, starts(first_again)
    finally:
        p.stop()


def test_a_runtime_token_dies_with_its_instance(platform):
    # `first` ends, and `second` (the next wave, same activation) tries first's token.
    assert platform.deploy(APPS / "stale")[0] == 200
    status, rec = platform.invoke("stale")
    assert status == 200, rec
    result = rec["response"]["result"]
    assert result["status"] == 401 and "unknown or expired token" in result["error"], result
    assert platform.call("GET", "/api/v1/namespaces/_/elements")[1] == []


def redeploy_cycle(platform, tmp_path):
    app = tmp_path / "again"
    app.mkdir(exist_ok=True)
    (app / "scad.yaml").write_text("name: again\nelements:\n  say: {kind: compute, code: say.py}\n")
    seen = []
    for word in ("one", "two"):
        (app / "say.py").write_text(f"def main(args, action): return {{'said': '{word}'}}\n")
        status, doc = platform.deploy(app)
        assert status == 200, doc
        status, rec = platform.invoke("again")
        assert status == 200, rec
        seen.append((doc["version"], rec["response"]["result"]["said"]))
        assert platform.call("DELETE", "/api/v1/namespaces/_/apps/again")[0] == 200
    return seen


def test_deleting_and_deploying_again_never_runs_old_code(platform, tmp_path):
    # The warm process of version 1 is still there when the new version 1 would have come.
    assert redeploy_cycle(platform, tmp_path) == [(1, "one"), (2, "two")]


def test_code_kept_on_the_host_is_removed_with_its_application(tmp_path):
    p = Platform(tmp_path / "home", extra=["--sandbox", "off"])  # unsandboxed, the agent keeps code on disk
    try:
        assert redeploy_cycle(p, tmp_path) == [(1, "one"), (2, "two")]
        assert not (p.home / "code" / "guest" / "apps" / "again").exists()
    finally:
        p.stop()


def metric_values(text):
    """{(name, frozenset of label pairs): value} from Prometheus' text format."""
    import re
    values = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r'([a-z_]+)(?:\{(.*)\})? (\S+)', line)
        assert m, f"not Prometheus text: {line!r}"
        labels = frozenset(re.findall(r'([a-z_]+)="([^"]*)"', m.group(2) or ""))
        values[(m.group(1), labels)] = float(m.group(3))
    return values


def test_metrics_count_activations_starts_and_hosts_and_name_no_tenant(platform):
    code = "def main(a):\n    if a.get('fail'):\n        raise ValueError('asked to')\n    return a\n"
    assert platform.call("PUT", "/api/v1/namespaces/_/actions/counted?overwrite=true",
                         {"exec": {"kind": "python:3", "code": code}})[0] == 200
    for args in ({"n": 1}, {"n": 2}, {"fail": True}):
        platform.call("POST", "/api/v1/namespaces/_/actions/counted", args, params="?blocking=true")
    with urllib.request.urlopen(platform.url + "/metrics", timeout=10) as r:  # no credentials
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = r.read().decode()
    v = metric_values(text)
    assert v[("scad_activations_total", frozenset({("kind", "action"), ("status", "success")}))] == 2
    assert v[("scad_activations_total", frozenset({("kind", "action"), ("status", "application error")}))] == 1
    assert v[("scad_activation_duration_seconds_count", frozenset({("kind", "action")}))] == 3
    assert sum(val for (name, _), val in v.items() if name == "scad_instance_starts_total") == 3
    assert v[("scad_activations_in_flight", frozenset())] == 0
    assert v[("scad_host", frozenset({("host", "local"), ("what", "pool_bytes")}))] == 1 << 30
    assert v[("scad_host", frozenset({("host", "local"), ("what", "up")}))] == 1
    assert "guest" not in text and "counted" not in text  # aggregates: no namespace, no action


def test_a_remote_agent_has_metrics_of_its_own(tmp_path):
    import re
    import select
    from scadtest import BUILD, cluster_token, stop_processes
    token = cluster_token(tmp_path)
    plat = Platform(tmp_path / "sched", extra=["--no-local-agent", "--cluster-token-file", str(token)])
    procs = [plat.proc]
    try:
        import disagg
        pythonpath = f"{os.path.dirname(disagg.__file__)}:{ROOT / 'bindings' / 'python'}"
        agent = subprocess.Popen([str(BUILD / "agent" / "scad-agent"), "--scheduler", plat.url, "--address", "127.0.0.1",
                                  "--token-file", str(token), "--id", "metered", "--home", str(tmp_path / "agent"),
                                  "--pool", "256MiB", "--python", sys.executable, "--pythonpath", pythonpath],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs.append(agent)
        assert select.select([agent.stdout], [], [], 30)[0], "the agent did not register"
        agent_url = re.search(r"serving at (\S+),", agent.stdout.readline()).group(1)
        assert plat.deploy(ROOT / "actions" / "sumsq")[0] == 200
        status, rec = plat.invoke("sumsq", {"n": 1000})
        assert status == 200 and rec["response"]["status"] == "success", (rec["response"], rec["logs"][-5:])
        with urllib.request.urlopen(agent_url + "/metrics", timeout=10) as r:
            v = metric_values(r.read().decode())
        instances = sum(val for (name, _), val in v.items() if name == "scad_agent_starts_total")
        assert v[("scad_agent_runs_total", frozenset({("status", "success")}))] == instances >= 2
        assert v[("scad_agent_pool_bytes", frozenset())] == 256 << 20
        assert v[("scad_agent_pool_used_bytes", frozenset())] == 0  # the activation freed its memory
        # What the runs' transports moved (sumsq, n=1000: generate writes 8000 bytes of one host's
        # element over shm, the four partials read their quarters), on the agent and the scheduler.
        with urllib.request.urlopen(plat.url + "/metrics", timeout=10) as r:
            s = metric_values(r.read().decode())
        for prefix, vals in (("scad_agent", v), ("scad", s)):
            shm = lambda what, op: vals[(f"{prefix}_transport_{what}_total", frozenset({("transport", "shm"), ("op", op)}))]  # noqa: E731
            assert shm("bytes", "write") == 8000 and shm("operations", "write") >= 1, prefix
            assert shm("bytes", "read") >= 8000 and shm("operations", "read") >= 4, prefix
            assert vals[(f"{prefix}_transport_errors_total", frozenset({("transport", "shm")}))] == 0, prefix
    finally:
        stop_processes(procs)
