"""A test peer: a Python script run as a process of its own, driven with JSON lines over its
stdin and stdout (tests/python/connect_peer.py, rdma_peer.py)."""
import json
import os
import select
import signal
import subprocess
import sys

from scadtest import BUILD, ROOT


class PeerProc:
    def __init__(self, script, transport):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(BUILD / "python"), str(ROOT / "bindings" / "python")]),
                   PEER_TRANSPORT=transport or "")
        self.transport = transport
        self.proc = subprocess.Popen([sys.executable, script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env)

    def send(self, **msg):
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()

    def recv(self, timeout=60):
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        assert ready, f"the peer did not answer within {timeout} s"
        line = self.proc.stdout.readline()
        assert line, f"the peer exited: {self.proc.stderr.read()}"
        return json.loads(line)

    def call(self, **msg):
        """Sends a command, returns the answer; a wait's own timeout plus a margin bounds it."""
        self.send(**msg)
        return self.recv((msg.get("timeout") or 0) + 60)

    def wait_stopped(self):
        _, status = os.waitpid(self.proc.pid, os.WUNTRACED)
        assert os.WIFSTOPPED(status), "the peer did not stop itself"

    def resume(self):
        os.kill(self.proc.pid, signal.SIGCONT)

    def kill(self):
        self.proc.kill()
        self.proc.wait(10)

    def close(self):
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)  # a stopped peer could not read its EOF
            self.proc.stdin.close()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
