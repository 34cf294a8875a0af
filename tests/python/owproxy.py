"""The action proxy as a real process, driven the way OpenWhisk's invoker drives an action
container: POST /init once, then POST /run after /run over a kept-alive HTTP/1.1 connection.
stdout and stderr are drained by threads (a full pipe would stall the proxy) and can be waited on
for the sentinel lines the invoker reads logs up to."""
import base64
import http.client
import io
import json
import queue
import subprocess
import sys
import threading
import time
import zipfile

from scadtest import BUILD, ROOT

SENTINEL = "XXX_THE_END_OF_A_WHISK_ACTIVATION_XXX"


class Stream:
    def __init__(self, pipe):
        self.lines = []
        self.arrived = queue.Queue()
        self.cond = threading.Condition()
        threading.Thread(target=self._drain, args=(pipe,), daemon=True).start()

    def _drain(self, pipe):
        for line in pipe:
            with self.cond:
                self.lines.append(line)
                self.cond.notify_all()
        with self.cond:
            self.lines.append(None)  # end of stream
            self.cond.notify_all()

    def text(self):
        with self.cond:
            return "".join(x for x in self.lines if x is not None)

    def wait_for(self, predicate, timeout=30):
        """Until predicate(text so far) holds; the stream's own progress wakes the wait."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                text = "".join(x for x in self.lines if x is not None)
                if predicate(text):
                    return text
                left = deadline - time.monotonic()
                if left <= 0 or (self.lines and self.lines[-1] is None):
                    raise AssertionError(f"not seen on the proxy's output: {text[-2000:]!r}")
                self.cond.wait(left)

    def closed(self, timeout=30):
        """All of it, once the process closed the stream."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while not (self.lines and self.lines[-1] is None):
                left = deadline - time.monotonic()
                assert left > 0, "the proxy's output did not end"
                self.cond.wait(left)
            return "".join(x for x in self.lines if x is not None)

    def sentinels(self, n, timeout=30):
        return self.wait_for(lambda t: t.count(SENTINEL) >= n, timeout)


class Proxy:
    def __init__(self, *extra, python=(sys.executable,), env=None, module="scad.cli", command=("proxy",)):
        """python: the interpreter's command (a fresh venv's, or one run inside the image)."""
        env = env if env is not None else {
            "PYTHONPATH": f"{BUILD / 'python'}:{ROOT / 'bindings' / 'python'}", "PATH": "/usr/bin:/bin"}
        self.proc = subprocess.Popen([*python, "-m", module, *command, "--port", "0", *extra],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        self.out = Stream(self.proc.stdout)
        self.err = Stream(self.proc.stderr)
        try:
            line = self.out.wait_for(lambda t: "\n" in t)
        except AssertionError:
            raise AssertionError(f"the proxy did not start: {self.err.text()}") from None
        assert "scad proxy" in line, line
        self.port = int(line.splitlines()[0].rsplit(":", 1)[1])
        self.out.lines[0] = ""  # the ready line is not the action's output
        self.conn = self.connect()

    def connect(self):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)

    def post(self, path, body, conn=None):
        """(status, parsed JSON) over the kept-alive connection (or conn)."""
        conn = conn or self.conn
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        conn.request("POST", path, body=data, headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        raw = r.read()
        assert r.getheader("Content-Length") == str(len(raw)), "every answer has its length (the invoker needs it)"
        return r.status, json.loads(raw)

    def init(self, code, **value):
        return self.post("/init", {"value": {"code": code, "main": "main", "binary": False, **value}})

    def run(self, args=None, **env):
        return self.post("/run", {"value": args or {}, **env})

    def stop(self):
        self.conn.close()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


def zipped(files):
    """base64 of a zip holding files ({name: text})."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    return base64.b64encode(buf.getvalue()).decode()
