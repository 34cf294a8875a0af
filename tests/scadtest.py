"""Helpers for the Python test tiers: the build's binaries and Python module, memory element
servers (libd-memd) and platforms (scad-server) as real processes. Fixtures are in conftest.py."""
import base64
import ctypes
import json
import os
import pathlib
import select
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
BUILD = pathlib.Path(os.environ.get("SCAD_BUILD", ROOT / "build"))
# The extension built by CMake, and the pure-Python package from the source tree.
sys.path[:0] = [str(BUILD / "python"), str(ROOT / "bindings" / "python")]


def binary(name):
    path = BUILD / "libd" / name
    if not path.exists():
        pytest.fail(f"{path} is missing: run scripts/setup first")
    return str(path)


class Memd:
    """A libd-memd process; `ready` is the JSON line it prints once listening."""

    def __init__(self, tmp_path, *extra, client="it-client", element="mem1=64MiB", rights="rw", tcp="127.0.0.1:0",
                 tag="mem"):
        self.grants = tmp_path / f"{tag}-grants.jsonl"
        self.sock = tmp_path / f"{tag}.sock"
        name = element.split("=")[0]
        self.args = [binary("libd-memd"), "--element", element, "--tcp", tcp, "--unix", str(self.sock),
                     "--grant", f"{name}:{client}:{rights}", "--grants", str(self.grants), *extra]
        self.start()

    def start(self):
        self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        ready, _, _ = select.select([self.proc.stdout], [], [], 20)
        assert ready, "libd-memd did not report ready within 20 s"
        self.ready = json.loads(self.proc.stdout.readline())
        self.args[self.args.index("--tcp") + 1] = self.ready["tcp"]  # a restart keeps the address

    def config(self):
        return json.loads(self.grants.read_text().splitlines()[0])["config"]

    def kill(self):
        self.proc.kill()
        self.proc.wait(10)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)



def needs_torch():
    """torch, or a skip; the torch tier (SCAD_REQUIRE_TORCH=1, scripts/test) turns the skip into a failure."""
    if os.environ.get("SCAD_REQUIRE_TORCH") == "1":
        import torch
        return torch
    return pytest.importorskip("torch")


def wait_until(condition, timeout_s):
    """Checks condition() every 10 ms until it is true (returns True) or timeout_s passes (False)."""
    import time
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


class Gate:
    """A rendezvous between a test and the actions it runs, over TCP: a sandboxed action sees none
    of the test's files (no FIFO can be shared), but it shares the host's network. An action
    connects to `address` (it is running now: wait_arrivals), may send a line, and waits until the
    test opens the gate (its connection closes). `netns` listens inside that network namespace."""

    def __init__(self, host="127.0.0.1", netns=None):
        self.conns = []
        if netns is None:
            self.sock = socket.create_server((host, 0))
        else:  # a thread that enters the namespace makes the socket there, then ends
            made = {}

            def make():
                libc = ctypes.CDLL(None, use_errno=True)
                fd = os.open(f"/run/netns/{netns}", os.O_RDONLY)
                try:
                    if libc.setns(fd, 0x40000000) != 0:  # CLONE_NEWNET
                        made["error"] = OSError(ctypes.get_errno(), "setns")
                        return
                    made["sock"] = socket.create_server((host, 0))
                finally:
                    os.close(fd)

            t = threading.Thread(target=make)
            t.start()
            t.join()
            if "error" in made:
                raise made["error"]
            self.sock = made["sock"]
        self.address = [host, self.sock.getsockname()[1]]

    def wait_arrivals(self, n=1, timeout=60):
        """Blocks until n more actions have connected; returns their connections."""
        self.sock.settimeout(timeout)
        new = [self.sock.accept()[0] for _ in range(n)]
        self.conns += new
        return new

    def open(self):
        for c in self.conns:
            c.close()
        self.conns = []

    def close(self):
        self.open()
        self.sock.close()


SERVER = BUILD / "scheduler" / "scad-server"


def cluster_token(folder):
    """A fresh cluster token in folder/cluster-token (mode 0600), as scad-server and scad-agent read it."""
    token = pathlib.Path(folder) / "cluster-token"
    token.write_text(os.urandom(24).hex() + "\n")
    token.chmod(0o600)
    return token


def stop_processes(procs, grace_s=10):
    """SIGTERM to all, then waits; whatever is still there after grace_s is killed."""
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(grace_s)
        except subprocess.TimeoutExpired:
            p.kill()


class Platform:
    def __init__(self, home, port=0, extra=()):
        self.home = pathlib.Path(home)
        self.port = port
        self.extra = list(extra)
        self.start()

    def start(self):
        import disagg
        pythonpath = f"{os.path.dirname(disagg.__file__)}:{ROOT / 'bindings' / 'python'}"
        self.proc = subprocess.Popen([str(SERVER), "--home", str(self.home), "--port", str(self.port),
                                      "--python", sys.executable, "--pythonpath", pythonpath, "--pool", "1GiB",
                                      "--cpus", "2", *self.extra],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        ready, _, _ = select.select([self.proc.stdout], [], [], 20)
        assert ready, "scad-server did not start: " + (self.proc.stderr.read() if self.proc.poll() is not None else "")
        self.banner = self.proc.stdout.readline()
        props = dict(line.split("=", 1) for line in (self.home / "wskprops").read_text().split())
        self.url, self.auth = props["APIHOST"], props["AUTH"]
        self.port = int(self.url.rsplit(":", 1)[1])  # a restart keeps the address

    def stop(self, sig=signal.SIGTERM):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(30)

    def call(self, method, path, body=None, auth=None, raw=None, params=""):
        req = urllib.request.Request(self.url + path + params, method=method,
                                     data=raw if raw is not None else (json.dumps(body).encode() if body is not None else None))
        req.add_header("Content-Type", "application/json")
        auth = self.auth if auth is None else auth
        if auth:
            req.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                data = r.read()
                return r.status, json.loads(data) if data else None
        except urllib.error.HTTPError as e:
            data = e.read()
            return e.code, json.loads(data) if data else None

    def deploy(self, folder, name=None):
        folder = pathlib.Path(folder)
        manifest = (folder / "scad.yaml").read_text()
        files = {str(f.relative_to(folder)): f.read_text() for f in folder.rglob("*.py")}
        import yaml
        name = name or yaml.safe_load(manifest)["name"]
        return self.call("PUT", f"/api/v1/namespaces/_/apps/{name}", {"manifest": manifest, "files": files})

    def invoke(self, name, params=None, blocking=True, result=False):
        q = "?blocking=true" if blocking else ""
        if result:
            q += "&result=true"
        return self.call("POST", f"/api/v1/namespaces/_/apps/{name}", params or {}, params=q)
