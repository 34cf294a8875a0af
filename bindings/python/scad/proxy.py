"""scad proxy: the OpenWhisk action runtime contract, so a Scad action runs unchanged on a real
OpenWhisk deployment (as the action container's server) and OpenWhisk's invoker can drive it.

    POST /init  {"value": {"code": "...", "main": "main", "binary": false, "env": {...}}}
    POST /run   {"value": {...args...}, "activation_id", "action_name", "namespace", "deadline", ...}

/init once (403 after that); /run answers main's result (a JSON object) or 502 {"error": "..."}.
After every run, stdout and stderr each end with OpenWhisk's sentinel line. The action object is
injected: transports come in the run's value under "__scad_transports" ([{"durl", "config"}]) —
for an action that has none, `action` is still a working LibdAction.
"""
import json
import os
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

from scad.launcher import run_action

SENTINEL = "XXX_THE_END_OF_A_WHISK_ACTIVATION_XXX"


class ActionProxy:
    def __init__(self):
        self.code_file = None
        self.main = "main"
        self.env = {}
        self.lock = threading.Lock()  # one activation at a time, as OpenWhisk's runtimes do

    def init(self, value):
        if self.code_file is not None:
            return 403, {"error": "Cannot initialize the action more than once."}
        if not isinstance(value, dict) or not isinstance(value.get("code"), str):
            return 400, {"error": "init needs {\"value\": {\"code\": \"...\", \"main\": \"main\"}}"}
        if value.get("binary"):
            return 502, {"error": "binary (zipped) actions are not supported by the Scad proxy yet"}
        fd, path = tempfile.mkstemp(prefix="scad-action-", suffix=".py")
        with os.fdopen(fd, "w") as f:
            f.write(value["code"])
        self.code_file, self.main = path, value.get("main") or "main"
        self.env = {k: str(v) for k, v in (value.get("env") or {}).items()}
        return 200, {"ok": True}

    def run(self, body):
        if self.code_file is None:
            return 502, {"error": "The action has not been initialized: POST /init first."}
        value = dict(body.get("value") or {})
        transports = value.pop("__scad_transports", [])
        env = {f"__OW_{k.upper()}": str(v) for k, v in body.items() if k != "value"}
        with self.lock:
            os.environ.update(self.env)
            os.environ.update(env)
            out = run_action({"aid": body.get("activation_id") or "ow-action", "code": self.code_file,
                              "main": self.main, "args": value, "transports": transports})
            for stream in (sys.stdout, sys.stderr):
                print(SENTINEL, file=stream, flush=True)
        if not out["ok"]:
            return 502, {"error": f"{out['error']['type']}: {out['error']['message']}"}
        result = out["result"]
        if not isinstance(result, dict):
            return 502, {"error": "The action did not return a dictionary."}
        return 200, result


def make_handler(proxy):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            except ValueError:
                return self.reply(400, {"error": "the body is not JSON"})
            if self.path == "/init":
                return self.reply(*proxy.init(body.get("value")))
            if self.path == "/run":
                return self.reply(*proxy.run(body))
            self.reply(404, {"error": f"no such endpoint {self.path}: the proxy answers /init and /run"})

        def reply(self, status, body):
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler


def serve(host="127.0.0.1", port=8080, ready=None):
    server = HTTPServer((host, port), make_handler(ActionProxy()))
    if ready:
        ready(server.server_address)
    server.serve_forever()
