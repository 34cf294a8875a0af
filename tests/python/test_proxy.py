"""scad proxy speaks OpenWhisk's action runtime contract, with the action object injected."""
import json
import socket
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from scadtest import BUILD, ROOT

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


@pytest.fixture
def proxy():
    proc = subprocess.Popen([sys.executable, "-m", "scad.cli", "proxy", "--port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={"PYTHONPATH": f"{BUILD / 'python'}:{ROOT / 'bindings' / 'python'}", "PATH": "/usr/bin:/bin"})
    line = proc.stdout.readline()
    assert "scad proxy" in line, proc.stderr.read()
    port = int(line.rsplit(":", 1)[1])

    def post(path, body):
        req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(), method="POST")
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    yield post, proc
    proc.kill()
    proc.wait()


def test_plain_openwhisk_action(proxy):
    post, _ = proxy
    assert post("/run", {"value": {}})[0] == 502       # not initialized yet
    assert post("/init", {"value": {"code": PLAIN_ACTION, "main": "main", "binary": False}}) == (200, {"ok": True})
    assert post("/init", {"value": {"code": PLAIN_ACTION}})[0] == 403
    assert post("/run", {"value": {"name": "whisk"}, "activation_id": "a1"}) == (200, {"greeting": "hello whisk"})


def test_scad_action_gets_its_action_object(proxy, memd):
    post, proc = proxy
    server = memd()
    assert post("/init", {"value": {"code": SCAD_ACTION, "main": "main"}})[0] == 200
    status, body = post("/run", {"value": {"word": "scad!", "__scad_transports": [
        {"durl": "mem1;tcp", "config": server.config()}]}, "activation_id": "it-client"})
    assert (status, body) == (200, {"echo": "scad!"})
    status, body = post("/run", {"value": {"word": "again"}, "activation_id": "x"})
    assert status == 502 and "KeyError" in body["error"]   # no transport given this time: a clear error
    proc.kill()
    out, err = proc.communicate()
    assert out.count("XXX_THE_END_OF_A_WHISK_ACTIVATION_XXX") == 2
    assert err.count("XXX_THE_END_OF_A_WHISK_ACTIVATION_XXX") == 2
