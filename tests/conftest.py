"""Fixtures shared by the integration and binding tests: the build's binaries and Python
module, and memory element servers as real processes."""
import json
import os
import pathlib
import select
import subprocess
import sys

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


@pytest.fixture
def memd(tmp_path):
    servers = []

    def start(*extra, **kw):
        m = Memd(tmp_path, *extra, **kw)
        servers.append(m)
        return m

    yield start
    for m in servers:
        m.stop()
