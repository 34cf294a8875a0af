import json
import os
import pathlib
import subprocess
import select

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILD = pathlib.Path(os.environ.get("SCAD_BUILD", ROOT / "build"))


def binary(name):
    path = BUILD / "libd" / name
    if not path.exists():
        pytest.fail(f"{path} is missing: run scripts/setup first")
    return str(path)


class Memd:
    """A libd-memd process; `ready` is the JSON line it prints once listening."""

    def __init__(self, tmp_path, *extra, client="it-client", element="mem1=64MiB"):
        self.grants = tmp_path / "grants.jsonl"
        self.sock = tmp_path / "mem.sock"
        name = element.split("=")[0]
        self.proc = subprocess.Popen(
            [binary("libd-memd"), "--element", element, "--tcp", "127.0.0.1:0", "--unix", str(self.sock),
             "--grant", f"{name}:{client}:rw", "--grants", str(self.grants), *extra],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        ready, _, _ = select.select([self.proc.stdout], [], [], 20)
        assert ready, "libd-memd did not report ready within 20 s"
        self.ready = json.loads(self.proc.stdout.readline())

    def config(self):
        return json.loads(self.grants.read_text().splitlines()[0])["config"]

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
