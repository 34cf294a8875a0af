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

    def stop(self):
        """Stops the peer (SIGSTOP) and returns once it is stopped."""
        os.kill(self.proc.pid, signal.SIGSTOP)
        self.wait_stopped()

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


def assert_a_thousand_leak_nothing(one, peers, names):
    """Runs one() 1,200 times and checks each peer's usage (its "usage" command) for growth.

    Warm-up first (caches, imports, the allocator's arenas for the waiting threads), then two
    windows of 500. File descriptors must not change at all; Python objects not grow in the
    second window (a leaked operation, descriptor or transport object shows at once); resident
    memory, which the allocator grows in steps, not by more than 3 MiB over the 1,000 (a leaked
    connection holds tens of KiB: 1,000 of them are tens of MiB)."""
    def usage():
        return [p.call(cmd="usage") for p in peers]

    for _ in range(200):
        one()
    start = usage()
    for _ in range(500):
        one()
    middle = usage()
    for _ in range(500):
        one()
    end = usage()
    for i, name in enumerate(names):
        seen = f"{name}: {start[i]} -> {middle[i]} -> {end[i]}"
        assert start[i]["fds"] == middle[i]["fds"] == end[i]["fds"], f"file descriptors leak: {seen}"
        assert end[i]["objects"] - middle[i]["objects"] < 50, f"Python objects leak: {seen}"
        assert end[i]["rss_kib"] - start[i]["rss_kib"] < 3072, f"memory leaks: {seen}"
