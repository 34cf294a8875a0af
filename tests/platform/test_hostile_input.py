"""Input that once crashed or stalled scad-server, sent to a real one: output that is not UTF-8,
results forged on the launcher's pipe, limits of the wrong type or range, bodies and manifests
nested or expanded past any reason, an agent that answers nonsense. Each must get a clear error
(or a clean activation record), and the server must go on serving everyone else."""
import base64
import http.client
import http.server
import json
import pathlib
import select
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest

from scadtest import Gate, Platform, cluster_token

ACTIONS = "/api/v1/namespaces/_/actions"


def put_action(platform, name, code, **extra):
    return platform.call("PUT", f"{ACTIONS}/{name}?overwrite=true",
                         {"exec": {"kind": "python:3", "code": code}, **extra})


def assert_alive(platform):
    assert platform.proc.poll() is None, "scad-server died: " + platform.proc.stderr.read()
    status, body = platform.call("GET", "/api/v1")
    assert status == 200 and body["openwhisk_compatible"]


NOT_UTF8 = '''
import os, sys

def main(args):
    sys.stderr.buffer.write(b"err \\xff\\xfe end\\n")
    sys.stderr.flush()
    sys.stdout.buffer.write(b"out \\xc3\\x28 end\\n")
    sys.stdout.flush()
    os.write(1, b'{"ok": 1}\\n')     # straight to fd 1: never taken for the result
    os.write(1, b'{"ok": false, "error": {"traceback": 7}}\\n')
    return {"fine": True}
'''


def test_output_that_is_not_utf8_and_lines_on_fd1_end_up_in_the_logs(platform):
    assert put_action(platform, "bytes", NOT_UTF8)[0] == 200
    for _ in range(2):  # cold, then warm: the process stays healthy
        status, rec = platform.call("POST", f"{ACTIONS}/bytes", {}, params="?blocking=true")
        assert status == 200, rec
        assert rec["response"]["result"] == {"fine": True}
        logs = "\n".join(rec["logs"])
        assert "err \ufffd\ufffd end" in logs and "out \ufffd( end" in logs
        assert '{"ok": 1}' in logs and '"traceback": 7' in logs
    status, listing = platform.call("GET", "/api/v1/namespaces/_/activations", params="?docs=true")
    assert status == 200 and len(listing) == 2
    assert_alive(platform)


@pytest.mark.parametrize("limits, named", [
    ({"timeout": "soon"}, "timeout"), (5, "limits must be an object"), ({"timeout": -1}, "timeout"),
    ({"timeout": 10**15}, "timeout"), ({"timeout": 2**63}, "timeout"), ({"timeout": 99}, "timeout"),
    ({"timeout": 1.5e3}, "timeout"), ({"memory": 4096}, "memory"), ({"logs": 11}, "logs"),
    ({"concurrency": 0}, "concurrency"), ({"colour": 1}, "unknown limit 'colour'"),
])
def test_limits_are_checked_when_an_action_is_stored(platform, limits, named):
    status, body = put_action(platform, "limited", "def main(a): return a", limits=limits)
    assert status == 400 and named in body["error"], body
    assert platform.call("GET", f"{ACTIONS}/limited")[0] == 404
    assert_alive(platform)


def test_valid_limits_are_stored_with_defaults_and_applied(platform):
    code = "import time\ndef main(a):\n    time.sleep(a.get('s', 0))\n    return {'slept': a.get('s', 0)}\n"
    status, body = put_action(platform, "sleepy", code, limits={"timeout": 500, "memory": 128})
    assert status == 200, body
    assert body["limits"] == {"timeout": 500, "memory": 128, "logs": 10, "concurrency": 1}
    status, rec = platform.call("POST", f"{ACTIONS}/sleepy", {"s": 30}, params="?blocking=true")
    assert status == 502 and rec["response"]["status"] == "action developer error"
    assert rec["response"]["result"]["error"] == "The action exceeded its time limits of 500 milliseconds."
    assert rec["duration"] < 10000


def test_the_logs_limit_truncates_with_a_note(platform):
    code = "import sys\ndef main(a):\n    sys.stderr.write('x' * 100 + '\\n' * 0 + 'y' * (3 << 20))\n    return {}\n"
    assert put_action(platform, "chatty", code, limits={"logs": 1})[0] == 200
    status, rec = platform.call("POST", f"{ACTIONS}/chatty", {}, params="?blocking=true")
    assert status == 200, rec
    text = "\n".join(rec["logs"])
    assert len(text) < (1 << 20) + 4096
    assert "output limit of 1048576 bytes was reached" in text and str((3 << 20) + 100 - (1 << 20)) in text


def test_deeply_nested_bodies_are_refused(platform):
    deep = b"[" * 100000 + b"]" * 100000
    for method, path in [("POST", f"{ACTIONS}/anything"), ("PUT", f"{ACTIONS}/nested"),
                         ("PUT", "/api/v1/namespaces/_/apps/nested"), ("POST", "/api/v1/namespaces/_/apps/x")]:
        status, body = platform.call(method, path, raw=deep)
        assert status == 400 and "nests deeper than 128" in body["error"], (path, body)
    # 128 levels are fine: the parameters reach the action and come back.
    assert put_action(platform, "echo", "def main(a): return a")[0] == 200
    nested = {"v": 1}
    for _ in range(100):
        nested = {"n": nested}
    status, rec = platform.call("POST", f"{ACTIONS}/echo", nested, params="?blocking=true&result=true")
    assert status == 200 and rec == nested
    assert_alive(platform)


def manifest(text):
    return {"manifest": text, "files": {"a.py": "def main(a, action): return {}"}}


def test_manifests_that_would_overflow_or_explode_are_refused(platform):
    apps = "/api/v1/namespaces/_/apps"
    digits = "1" * 100000
    status, body = platform.call("PUT", f"{apps}/digits", manifest(
        f"name: digits\nelements:\n  m: {{kind: memory, size: {digits}}}\n  a: {{kind: compute, code: a.py, timeout: {digits}}}\n"))
    assert status == 400 and any("'size' must be a size" in p for p in body["problems"]), body
    assert any("'timeout' must be milliseconds" in p for p in body["problems"]), body
    status, body = platform.call("PUT", f"{apps}/deep", manifest("name: deep\nelements: " + "[" * 100000))
    assert status == 400 and "scad.yaml" in body["error"], body
    laughs = "name: lol\nelements:\n  a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"  a{i}: &a{i} [*a{i-1}, *a{i-1}, *a{i-1}, *a{i-1}, *a{i-1}, *a{i-1}, *a{i-1}, *a{i-1}, *a{i-1}, *a{i-1}]\n"
        for i in range(1, 9))
    status, body = platform.call("PUT", f"{apps}/lol", manifest(laughs))
    assert status == 400 and "expands to more than 100000 values" in body["error"], body
    status, body = platform.call("PUT", f"{apps}/{'n' * 100000}", manifest("name: x"))
    assert status in (400, 414) and (status == 414 or "is not valid" in body["error"])
    for cpu in ("1e-9", "-1", "100000"):
        status, body = platform.call("PUT", f"{apps}/cpu", manifest(
            f"name: cpu\nelements:\n  a: {{kind: compute, code: a.py, cpu: {cpu}}}\n"))
        assert status == 400 and any("'cpu' must be a number of cores" in p for p in body["problems"]), (cpu, body)
    assert_alive(platform)


class EvilAgent(http.server.BaseHTTPRequestHandler):
    """An agent that registers, then answers the scheduler with whatever `replies` says."""
    replies = {}

    def log_message(self, *args):
        pass

    def answer(self):
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        status, body = self.replies.get((self.command, self.path.split("?")[0]), (404, b"{}"))
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_DELETE = do_GET = answer


@pytest.fixture
def clustered(tmp_path):
    token = cluster_token(tmp_path)
    p = Platform(tmp_path / "home", extra=["--cluster-token-file", str(token)])
    p.token = token.read_text().strip()
    yield p
    p.stop()


def register(platform, agent_url):
    req = urllib.request.Request(platform.url + "/api/v1/hosts/register", method="POST", data=json.dumps(
        {"id": "evil", "url": agent_url, "cpus": 64, "pool": 1 << 40}).encode())
    req.add_header("Authorization", "Bearer " + platform.token)
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 200


def test_an_agent_that_answers_nonsense_fails_the_activation_not_the_server(clustered, tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), EvilAgent)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    app = tmp_path / "app"
    app.mkdir()
    # More memory than the local host's pool (1 GiB): it can only go to the agent.
    (app / "scad.yaml").write_text("name: app\nelements:\n  data: {kind: memory, size: 2GiB}\n"
                                   "  work: {kind: compute, code: work.py, transports: {data: {element: data}}}\n")
    (app / "work.py").write_text("def main(args, action): return {'ran': True}\n")
    register(clustered, url)
    assert clustered.deploy(app)[0] == 200
    good_grant = json.dumps({"durl": "data;tcp", "config": "host,127.0.0.1", "grant_id": "g1"}).encode()
    cases = [
        ({("POST", "/agent/v1/elements"): (409, b'{"error": 123}')}, "cannot place memory element"),
        ({("POST", "/agent/v1/elements"): (201, b""), ("POST", "/agent/v1/grants"): (200, b'{"durl": 5}')},
         "answered a grant without string"),
        ({("POST", "/agent/v1/elements"): (201, b""), ("POST", "/agent/v1/grants"): (200, good_grant),
          ("POST", "/agent/v1/run"): (200, b'{"ok": "yes"}')}, "needs a boolean"),
        ({("POST", "/agent/v1/elements"): (201, b""), ("POST", "/agent/v1/grants"): (200, good_grant),
          ("POST", "/agent/v1/run"): (200, b"[" * 100000)}, "nests deeper"),
        ({("POST", "/agent/v1/elements"): (201, b""), ("POST", "/agent/v1/grants"): (200, good_grant),
          ("POST", "/agent/v1/run"): (200, b'{"ok": true, "status": "success", "logs": [1, {"x": "\\u00ff"}], '
                                            b'"result": {"r": 1}, "init_ms": "soon"}')}, None),
    ]
    try:
        for replies, expected in cases:
            EvilAgent.replies = replies
            register(clustered, url)
            status, rec = clustered.invoke("app")
            if expected is None:  # an odd but well-formed outcome is taken, with its odd parts ignored
                assert status == 200 and rec["response"]["result"] == {"r": 1}, (rec["response"], rec["logs"])
                assert '{"x":"\u00ff"}' in rec["logs"][1] or '{"x":"ÿ"}' in "".join(rec["logs"]), rec["logs"]
                continue
            assert status == 500, (expected, rec)
            assert rec["response"]["status"] == "whisk internal error"
            assert expected in json.dumps(rec["response"]["result"]), (expected, rec["response"])
            assert_alive(clustered)
    finally:
        server.shutdown()


def test_the_built_in_host_cannot_be_replaced(clustered):
    for body, why in [({"id": "local", "url": "http://127.0.0.1:9", "cpus": 512, "pool": 1 << 40}, "reserved"),
                      ({"id": "../x", "url": "http://127.0.0.1:9", "cpus": 1, "pool": 1}, "not a name"),
                      ({"id": "big", "url": "http://127.0.0.1:9", "cpus": 1e9, "pool": 1}, "cpus")]:
        req = urllib.request.Request(clustered.url + "/api/v1/hosts/register", method="POST", data=json.dumps(body).encode())
        req.add_header("Authorization", "Bearer " + clustered.token)
        try:
            urllib.request.urlopen(req, timeout=30)
            raise AssertionError(f"{body} was accepted")
        except urllib.error.HTTPError as e:
            assert e.code == 400 and why in json.loads(e.read())["error"]
    status, hosts = clustered.call("GET", "/api/v1/hosts")
    assert [(h["id"], h["cpus"]) for h in hosts] == [("local", 2.0)]


def test_slow_clients_of_the_api_cannot_keep_actions_from_the_runtime_endpoint(platform):
    assert platform.deploy(pathlib.Path(__file__).parent / "apps" / "grower")[0] == 200
    gate = Gate()
    slow = []
    stop = threading.Event()
    try:
        status, body = platform.invoke("grower", {"gate": gate.address}, blocking=False)
        assert status == 202
        conn, = gate.wait_arrivals(1)
        host, port = platform.url.split("//")[1].split(":")
        for _ in range(40):  # more than the API's threads, each a request that never ends
            s = socket.create_connection((host, int(port)), timeout=10)
            s.sendall(b"GET /api/v1 HTTP/1.1\r\nHost: x\r\n")
            slow.append(s)

        def trickle():  # a header line a second: no read timeout ever fires
            while not stop.wait(1):
                for s in slow:
                    try:
                        s.sendall(b"X-Slow: 1\r\n")
                    except OSError:
                        pass

        threading.Thread(target=trickle, daemon=True).start()
        conn.sendall(b"go\n")
        conn.settimeout(30)
        said = conn.makefile().readline()
        assert said.startswith("ok "), said
        assert int(said.split()[1]) < 5000, said
    finally:
        stop.set()
        for s in slow:
            s.close()
        gate.close()


def read_until_closed(s, deadline_s):
    """What the server wrote before it closed the connection (b"" if it stayed open too long)."""
    s.settimeout(deadline_s)
    reply = b""
    try:
        while chunk := s.recv(4096):
            reply += chunk
    except socket.timeout:
        return b""
    return reply


@pytest.fixture
def guarded(tmp_path):
    started = []

    def start(limits):
        started.append(Platform(tmp_path / f"home{len(started)}", extra=["--connection-limits", limits]))
        return started[-1]

    yield start
    for p in started:
        p.stop()


def slow_clients(platform, count, stop):
    """`count` requests whose headers never end: a header line every half second from the moment
    each connects, so that no read timeout of the HTTP library ever fires (connecting 40 can take
    seconds: the library listens with a backlog of 5)."""
    host, port = platform.url.split("//")[1].split(":")
    slow = []
    lock = threading.Lock()

    def trickle():
        while not stop.wait(0.5):
            with lock:
                for s in slow:
                    try:
                        s.sendall(b"X-Slow: 1\r\n")
                    except OSError:
                        pass

    threading.Thread(target=trickle, daemon=True).start()
    for _ in range(count):
        s = socket.create_connection((host, int(port)), timeout=10)
        s.sendall(b"GET /api/v1 HTTP/1.1\r\nHost: x\r\n")
        with lock:
            slow.append(s)
    return slow


def test_connections_beyond_a_clients_cap_are_refused_and_others_are_served(guarded):
    platform = guarded("deadline=600000,per-client=8")
    host, port = platform.url.split("//")[1].split(":")
    stop = threading.Event()
    slow = slow_clients(platform, 40, stop)
    try:
        # Stalled for a second, beyond 8 from one address, the newest are answered 503 and closed; 8 stay.
        ended = {}
        while len(ended) < 32:
            readable, _, _ = select.select([s for s in slow if s not in ended], [], [], 10)
            assert readable, f"only {len(ended)} of 40 connections were ended"
            for s in readable:
                ended[s] = read_until_closed(s, 10)
        assert all(r.startswith(b"HTTP/1.1 503 ") and b"too many stalled connections from 127.0.0.1 (at most 8)" in r
                   for r in ended.values()), [r for r in ended.values() if not r.startswith(b"HTTP/1.1 503 ")][0]
        assert not select.select([s for s in slow if s not in ended], [], [], 0.5)[0]
        # Another address is served at once.
        other = http.client.HTTPConnection(host, int(port), timeout=5, source_address=("127.0.0.2", 0))
        other.request("GET", "/api/v1")
        assert other.getresponse().status == 200
        other.close()
    finally:
        stop.set()
        for s in slow:
            s.close()
    assert_alive(platform)


def test_a_request_has_a_deadline_and_handling_time_is_not_the_clients(guarded):
    platform = guarded("deadline=1500,per-client=64")
    host, port = platform.url.split("//")[1].split(":")
    stop = threading.Event()
    started = time.monotonic()
    slow = slow_clients(platform, 10, stop)
    try:
        replies = [read_until_closed(s, 10) for s in slow]
        waited = time.monotonic() - started
    finally:
        stop.set()
        for s in slow:
            s.close()
    assert all(r.startswith(b"HTTP/1.1 408 ") and b"did not arrive within 1500 ms" in r for r in replies), replies
    assert waited >= 1.5

    # A body is timed too, at the deadline plus its length at 1 MiB/s.
    guarded_auth = base64.b64encode(platform.auth.encode()).decode()
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(f"PUT {ACTIONS}/slow?overwrite=true HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"Authorization: Basic {guarded_auth}\r\n"
                  f"Content-Length: 1000\r\n\r\n{{".encode())
        assert read_until_closed(s, 10).startswith(b"HTTP/1.1 408 ")

    # Handling time is the server's: an action that takes longer than the deadline, called with a
    # body on a kept-alive connection, answers; the connection then serves another request.
    code = "import time\ndef main(a):\n    time.sleep(a['s'])\n    return {'slept': a['s']}\n"
    assert put_action(platform, "sleeper", code)[0] == 200
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    headers = {"Authorization": "Basic " + base64.b64encode(platform.auth.encode()).decode(),
               "Content-Type": "application/json"}
    conn.request("POST", f"{ACTIONS}/sleeper?blocking=true&result=true", json.dumps({"s": 2.5}), headers)
    r = conn.getresponse()
    assert (r.status, json.loads(r.read())) == (200, {"slept": 2.5})
    conn.request("GET", "/api/v1")
    assert conn.getresponse().status == 200
    conn.close()
    assert_alive(platform)


def test_a_body_without_credentials_is_not_read(platform):
    host, port = platform.url.split("//")[1].split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        # 60 MB announced, none sent: the answer must come from the headers alone.
        s.sendall(b"PUT /api/v1/namespaces/_/apps/x HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Authorization: Basic bm9ib2R5Om5vdGhpbmc=\r\nContent-Length: 60000000\r\n\r\n")
        reply = b""
        while b"authentication is invalid" not in reply:  # the answer may come in several segments
            chunk = s.recv(4096)
            if not chunk:
                break
            reply += chunk
        reply = reply.decode(errors="replace")
        assert reply.startswith("HTTP/1.1 401"), reply
        assert "authentication is invalid" in reply
    assert_alive(platform)


@pytest.mark.parametrize("make", ["open to all", "a link", "another user's"])
def test_a_home_others_could_plant_code_in_is_refused(tmp_path, make):
    import os
    import subprocess
    import sys

    from scadtest import SERVER
    home = tmp_path / "home"
    if make == "open to all":
        home.mkdir()
        home.chmod(0o777)
    elif make == "a link":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        home.symlink_to(tmp_path / "elsewhere")
    else:
        if os.geteuid() != 0:
            pytest.skip("making a folder of another uid needs root")
        home.mkdir(mode=0o700)
        os.chown(home, 65534, 65534)
    p = subprocess.run([str(SERVER), "--home", str(home), "--port", "0", "--python", sys.executable],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "refusing the home" in p.stderr, p.stderr


def make_host_key(keys, host_id):
    import os
    import subprocess
    import sys

    from scadtest import ROOT
    env = dict(os.environ, PYTHONPATH=str(ROOT / "bindings" / "python"))
    out = subprocess.run([sys.executable, "-m", "scad.cli", "host", "key", host_id, "--keys", str(keys)],
                         capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_each_host_has_a_key_of_its_own(tmp_path):
    keys = tmp_path / "host-keys"
    h1, h2 = make_host_key(keys, "h1"), make_host_key(keys, "h2")
    assert h1.startswith("h1:") and len(h1) == 3 + 64 and oct(keys.stat().st_mode & 0o777) == "0o600"
    assert h1.split(":")[1] not in keys.read_text(), "only the secret's hash is kept"
    token = cluster_token(tmp_path)
    p = Platform(tmp_path / "home", extra=["--host-keys", str(keys), "--cluster-token-file", str(token)])
    token = token.read_text().strip()

    def register(host_id, bearer):
        req = urllib.request.Request(p.url + "/api/v1/hosts/register", method="POST", data=json.dumps(
            {"id": host_id, "url": "http://127.0.0.1:9", "cpus": 1, "pool": 1 << 20}).encode())
        req.add_header("Authorization", "Bearer " + bearer)
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code

    try:
        assert register("h1", h1) == 200
        assert register("h2", h1) == 401, "one host's key registers no other host"
        assert register("h1", "h1:" + "0" * 64) == 401
        assert register("h1", "no-cluster-token-here") == 401
        assert register("h2", h2) == 200
        assert register("h2", token) == 409, "a live host is not taken over with the cluster token"
        assert register("h3", token) == 200
        assert register("h3", h1) == 401
        keys.write_text("".join(line + "\n" for line in keys.read_text().splitlines() if not line.startswith("h1 ")))
        assert register("h1", h1) == 401, "a deleted line revokes the host"
        assert register("h2", h2) == 200
    finally:
        p.stop()
