"""scad proxy speaks OpenWhisk's action container contract as the actionloop runtimes answer it,
with Scad's action object injected. The proxy is a real process, driven as the invoker drives it."""
import json
import pathlib
import subprocess
import sys
import threading
import time

import pytest

from owproxy import SENTINEL, Proxy, zipped

SCAD_ACTION = """
def main(args, action):
    t = action.get_transport('mem1', 'rdma')
    t.reg(64)
    t.buf[0:5] = args['word'].encode()
    t.write(5, 0)
    t.read(5, 0, 32)
    print('written and read back')
    return {'echo': bytes(t.buf[32:37]).decode()}
"""
PLAIN_ACTION = "def main(args):\n    return {'greeting': 'hello ' + args.get('name', 'world')}\n"
SECRET = "23bc46b1-71f6-4ed5-8c54-816aa4f8c502:s3cr3t-k3y-never-logged"


@pytest.fixture
def proxy():
    p = Proxy()
    yield p
    p.stop()


def test_init_once_then_many_runs_over_one_connection(proxy):
    assert proxy.run({}) == (500, {"error": "no action defined yet"})
    assert proxy.init(PLAIN_ACTION) == (200, {"ok": True})
    assert proxy.init(PLAIN_ACTION) == (403, {"error": "Cannot initialize the action more than once."})
    sock = proxy.conn.sock
    for i in range(50):
        assert proxy.run({"name": f"whisk{i}"}, activation_id=f"a{i}") == (200, {"greeting": f"hello whisk{i}"})
    assert proxy.conn.sock is sock, "the connection was kept alive across runs"
    proxy.out.sentinels(50)
    proxy.err.sentinels(50)


def test_bad_inits_are_refused_and_a_good_one_still_works(proxy):
    assert proxy.init("") == (403, {"error": "Missing main/no code to execute."})
    assert proxy.post("/init", {"value": {}}) == (403, {"error": "Missing main/no code to execute."})
    assert proxy.post("/init", {}) == (403, {"error": "Missing main/no code to execute."})
    status, body = proxy.init("def main(args:\n    return {}\n")
    assert (status, body) == (502, {"error": "The action failed to generate or locate a binary. See logs for details."})
    assert "SyntaxError" in proxy.err.sentinels(1)
    assert proxy.init("def handler(args):\n    return {}\n") == (
        502, {"error": "Cannot start action. Check logs for details."})
    assert "no function 'main'" in proxy.err.sentinels(2)
    assert proxy.init("raise RuntimeError('at import')\n")[0] == 502
    assert "RuntimeError: at import" in proxy.err.sentinels(3)
    assert proxy.init("main = 3\n")[0] == 502
    assert proxy.post("/init", b"{not json")[0] == 400
    assert proxy.post("/init", {"value": {"code": 42}})[0] == 400
    assert proxy.run({}) == (500, {"error": "no action defined yet"})
    # A failed init leaves the container uninitialised, as the runtimes do: the action can still come.
    assert proxy.init("def entry(args):\n    return {'entry': True}\n", main="entry") == (200, {"ok": True})
    assert proxy.run({}) == (200, {"entry": True})
    # Each stream is read by a thread of its own: wait for the fifth marker on both, then count.
    assert proxy.out.sentinels(5).count(SENTINEL) == 5 and proxy.err.sentinels(5).count(SENTINEL) == 5


def test_an_exception_is_an_application_error_with_the_traceback_in_the_logs(proxy):
    code = "def main(args):\n    if args.get('fail'):\n        raise ValueError('asked to fail')\n    return args\n"
    assert proxy.init(code)[0] == 200
    assert proxy.run({"fail": True}) == (200, {"error": "asked to fail"})
    err = proxy.err.sentinels(1)
    assert "Traceback (most recent call last)" in err and "ValueError: asked to fail" in err
    assert proxy.run({"x": 1}) == (200, {"x": 1}), "the container serves on"


def test_exit_and_interrupt_in_main_end_the_activation_not_the_container(proxy):
    code = ("import sys\ndef main(args):\n    if args['how'] == 'exit':\n        sys.exit('leaving')\n"
            "    raise KeyboardInterrupt\n")
    assert proxy.init(code)[0] == 200
    assert proxy.run({"how": "exit"}) == (200, {"error": "leaving"})
    assert proxy.run({"how": "interrupt"}) == (200, {"error": "KeyboardInterrupt"})
    assert proxy.proc.poll() is None


@pytest.mark.parametrize("result, status, expected", [
    ("[1, {'a': 2}]", 200, [1, {"a": 2}]),                      # arrays are results, as in the runtimes
    ("{'nested': {'list': [1.5, None, True]}}", 200, {"nested": {"list": [1.5, None, True]}}),
    ("'a string'", 502, {"error": "The action did not return a dictionary or array."}),
    ("42", 502, {"error": "The action did not return a dictionary or array."}),
    ("None", 502, {"error": "The action did not return a dictionary or array."}),
    ("{'s': {1, 2}}", 502, {"error": "The action did not return a dictionary or array."}),
    ("{'nan': float('nan')}", 502, {"error": "The action did not return a dictionary or array."}),
    ("{'bad': '\\udc80'}", 502, {"error": "The action did not return a dictionary or array."}),
])
def test_results_that_are_not_a_json_object_or_array(proxy, result, status, expected):
    assert proxy.init(f"def main(args):\n    return {result}\n")[0] == 200
    assert proxy.run({}) == (status, expected)
    assert proxy.run({})[0] == status, "and again: the proxy is still there"


def test_results_over_the_invokers_limit_are_an_application_error(proxy):
    code = "def main(args):\n    return {'x': 'a' * args['n']}\n"
    assert proxy.init(code)[0] == 200
    limit = 1048576                                   # whisk.activation.payload.max, the invoker's default
    fits = limit - len('{"x": ""}')
    assert proxy.run({"n": fits}) == (200, {"x": "a" * fits})
    status, body = proxy.run({"n": fits + 1})
    assert status == 200
    assert body == {"error": f"The action produced a response that exceeded the allowed length: {limit + 1} > {limit} bytes."}
    assert proxy.run({"n": 1}) == (200, {"x": "a"})


def test_the_limit_follows_the_deployments_setting():
    p = Proxy("--max-result", "100")
    try:
        assert p.init("def main(args):\n    return {'x': 'a' * args['n']}\n")[0] == 200
        assert p.run({"n": 200})[1]["error"].endswith("209 > 100 bytes.")
        assert p.run({"n": 10}) == (200, {"x": "a" * 10})
    finally:
        p.stop()


def test_a_deadline_that_passes_is_the_invokers_to_act_on(proxy):
    # The runtimes give the deadline to the action (__OW_DEADLINE) and enforce nothing: the invoker
    # times the request out and destroys the container. A late result is still answered.
    code = ("import os, time\ndef main(args):\n    deadline = int(os.environ['__OW_DEADLINE'])\n"
            "    while time.time() * 1000 <= deadline:\n        pass\n"
            "    return {'deadline': deadline, 'late_ms': int(time.time() * 1000) - deadline}\n")
    assert proxy.init(code)[0] == 200
    soon = int(time.time() * 1000) + 50
    status, body = proxy.run({}, deadline=str(soon), activation_id="late")
    assert status == 200 and body["deadline"] == soon and body["late_ms"] >= 0
    past = int(time.time() * 1000) - 60000
    assert proxy.run({}, deadline=str(past))[1]["deadline"] == past
    assert proxy.run({}, deadline=str(int(time.time() * 1000) + 10))[0] == 200


def test_globals_survive_between_warm_runs(proxy):
    code = ("import uuid\nCLIENT = None\ncalls = 0\ndef main(args):\n    global CLIENT, calls\n"
            "    if CLIENT is None:\n        CLIENT = uuid.uuid4().hex\n    calls += 1\n"
            "    return {'client': CLIENT, 'calls': calls}\n")
    assert proxy.init(code)[0] == 200
    first = proxy.run({})[1]
    for n in range(2, 6):
        assert proxy.run({}) == (200, {"client": first["client"], "calls": n})


def test_concurrent_runs_are_serialised(proxy):
    # Each run notes how many runs are inside main; a second one inside at the same time is a failure.
    code = ("import threading, time\nlock = threading.Lock()\ninside = 0\npeak = 0\norder = []\n"
            "def main(args):\n    global inside, peak\n    with lock:\n        inside += 1\n        peak = max(peak, inside)\n"
            "    order.append(args['i'])\n    time.sleep(0.005)  # widens the window in which a second run would show\n"
            "    with lock:\n        inside -= 1\n    return {'peak': peak, 'runs': len(order)}\n")
    assert proxy.init(code)[0] == 200
    results, errors = [], []

    def client(k):
        conn = proxy.connect()
        try:
            for j in range(5):
                results.append(proxy.post("/run", {"value": {"i": k * 10 + j}, "activation_id": f"c{k}-{j}"}, conn))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
        finally:
            conn.close()

    threads = [threading.Thread(target=client, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and len(results) == 30
    assert all(status == 200 and body["peak"] == 1 for status, body in results), results
    assert sorted(body["runs"] for _, body in results) == list(range(1, 31))
    out, err = proxy.out.sentinels(30), proxy.err.sentinels(30)
    assert out.count(SENTINEL) == 30 and err.count(SENTINEL) == 30


def test_the_ow_environment_of_each_run(proxy):
    code = ("import os\nAT_IMPORT = os.environ.get('GREETING')\ndef main(args):\n"
            "    env = {k: v for k, v in os.environ.items() if k.startswith('__OW_') or k in ('GREETING', 'LIMITS')}\n"
            "    return {**env, 'at_import': AT_IMPORT}\n")
    assert proxy.init(code, env={"GREETING": "hi", "LIMITS": {"n": 3}})[0] == 200
    run = {"api_host": "https://ow.example", "api_key": SECRET, "namespace": "guest", "action_name": "/guest/x",
           "action_version": "0.0.1", "activation_id": "9f0c", "transaction_id": "tid", "deadline": "1700000000000"}
    status, env = proxy.run({"p": 1}, **run)
    assert status == 200
    assert env == {"GREETING": "hi", "LIMITS": '{"n": 3}', "at_import": "hi",
                   **{f"__OW_{k.upper()}": v for k, v in run.items()}}
    # The next activation, without api_key (the action lost its provide-api-key annotation): none left.
    status, env = proxy.run({}, activation_id="9f0d", namespace="guest")
    assert env == {"GREETING": "hi", "LIMITS": '{"n": 3}', "at_import": "hi",
                   "__OW_ACTIVATION_ID": "9f0d", "__OW_NAMESPACE": "guest"}


def test_secrets_never_reach_the_logs(proxy):
    assert proxy.post("/run", {"value": 3, "api_key": SECRET})[0] == 400
    assert proxy.init("def main(args):\n    raise RuntimeError('failed')\n")[0] == 200
    assert proxy.run({}, api_key=SECRET) == (200, {"error": "failed"})
    assert proxy.post("/run", b'{"api_key": "' + SECRET.encode() + b'", oops')[0] == 400
    proxy.err.sentinels(1)
    proxy.stop()
    assert SECRET not in proxy.out.closed() and SECRET not in proxy.err.closed()


def test_bad_requests_leave_the_proxy_serving(proxy):
    assert proxy.post("/nothing", {})[0] == 404
    assert proxy.post("/run", b"[1, 2]")[0] == 400
    assert proxy.post("/run", {"value": [1]})[0] == 400
    assert proxy.post("/init", b"\xff\xfe")[0] == 400
    conn = proxy.connect()
    conn.request("GET", "/run")
    assert conn.getresponse().status == 404
    conn.close()
    assert proxy.init(PLAIN_ACTION.replace("(args)", "(args, action)"))[0] == 200
    assert proxy.run({"__scad_transports": "nonsense"})[1]["error"].startswith("__scad_transports must be a list")
    assert proxy.run({"name": "still"}) == (200, {"greeting": "hello still"})


def test_zip_action_with_modules_beside_main(proxy):
    code = zipped({"__main__.py": "from helper import shout\ndef go(args):\n    return {'said': shout(args['w'])}\n",
                   "helper.py": "def shout(w):\n    return w.upper() + '!'\n"})
    assert proxy.post("/init", {"value": {"code": code, "binary": True, "main": "go"}}) == (200, {"ok": True})
    assert proxy.run({"w": "zip"}) == (200, {"said": "ZIP!"})


def test_zip_action_with_a_virtualenv(proxy, tmp_path):
    venv = tmp_path / "virtualenv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next(venv.glob("lib/python*/site-packages"))
    (site / "ow_fancy_pkg").mkdir()
    (site / "ow_fancy_pkg" / "__init__.py").write_text("VERSION = '1.2.3'\n")
    (site / "ow_extra_path.pth").write_text("extra\n")          # .pth files work as in the environment
    (site / "extra").mkdir()
    (site / "extra" / "ow_via_pth.py").write_text("OK = True\n")
    files = {str(p.relative_to(tmp_path)): p.read_text() for p in venv.rglob("*")
             if p.is_file() and "bin" not in p.relative_to(venv).parts}
    files["__main__.py"] = ("import ow_fancy_pkg, ow_via_pth, os\n"
                            "def main(args):\n    return {'version': ow_fancy_pkg.VERSION, 'pth': ow_via_pth.OK,\n"
                            "            'from_zip': ow_fancy_pkg.__file__.find('virtualenv') >= 0,\n"
                            "            'venv': os.environ.get('VIRTUAL_ENV', '').endswith('virtualenv')}\n")
    assert proxy.post("/init", {"value": {"code": zipped(files), "binary": True}}) == (200, {"ok": True})
    assert proxy.run({}) == (200, {"version": "1.2.3", "pth": True, "from_zip": True, "venv": True})


def test_bad_zips(proxy):
    no_main = zipped({"main.py": "def main(args): return {}\n"})
    assert proxy.post("/init", {"value": {"code": no_main, "binary": True}}) == (
        502, {"error": "Cannot start action. Check logs for details."})
    assert "Zip file does not include '__main__.py'." in proxy.err.sentinels(1)
    assert proxy.post("/init", {"value": {"code": "bm90IGEgemlw", "binary": True}})[0] == 502   # "not a zip"
    assert proxy.post("/init", {"value": {"code": "%%%", "binary": True}})[0] == 400
    bad_venv = zipped({"__main__.py": "def main(args): return {}\n", "virtualenv/README": "empty\n"})
    assert proxy.post("/init", {"value": {"code": bad_venv, "binary": True}})[0] == 502
    assert "Invalid virtualenv" in proxy.err.sentinels(3)
    slip = zipped({"__main__.py": "def main(args): return {}\n", "../escape.py": "x = 1\n"})
    assert proxy.post("/init", {"value": {"code": slip, "binary": True}})[0] == 502  # as the runtimes' unzip
    assert "entry outside its folder: '../escape.py'" in proxy.err.sentinels(4)
    assert proxy.post("/init", {"value": {"code": zipped({"__main__.py": PLAIN_ACTION}), "binary": True}})[0] == 200


def test_the_action_object_only_for_a_main_that_asks(proxy):
    code = ("def main(args, verbose=False):\n"
            "    return {'verbose': verbose if isinstance(verbose, bool) else type(verbose).__name__}\n")
    assert proxy.init(code)[0] == 200
    assert proxy.run({}) == (200, {"verbose": False})


def test_a_main_with_action_defaulting_to_none_gets_it():
    p = Proxy()
    try:
        assert p.init("def main(args, action=None):\n    return {'has': action is not None}\n")[0] == 200
        assert p.run({}) == (200, {"has": True})
    finally:
        p.stop()


def test_scad_action_gets_its_action_object_with_transports_from_the_run(proxy, memd):
    server = memd()
    assert proxy.init(SCAD_ACTION)[0] == 200
    status, body = proxy.run({"word": "scad!", "__scad_transports": [
        {"durl": "mem1;tcp", "config": server.config()}]}, activation_id="it-client")
    assert (status, body) == (200, {"echo": "scad!"})
    status, body = proxy.run({"word": "again"}, activation_id="x")
    assert status == 200 and "no transport named 'mem1'" in body["error"]   # none given this time: the run's error
    status, body = proxy.run({"word": "third", "__scad_transports": [
        {"durl": "mem1;tcp", "config": server.config()}]}, activation_id="it-client")
    assert (status, body) == (200, {"echo": "third"}), "a failed run left nothing behind"
    assert proxy.out.sentinels(3).count("written and read back") == 2
    assert "KeyError" in proxy.err.sentinels(3)


def test_python_m_scad_proxy_is_the_images_entry_point():
    p = Proxy(module="scad.proxy", command=())
    try:
        assert p.init(PLAIN_ACTION)[0] == 200
        assert p.run({"name": "image"}) == (200, {"greeting": "hello image"})
    finally:
        p.stop()
