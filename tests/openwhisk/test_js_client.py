"""Scad's REST API through OpenWhisk's own JavaScript client (npm's `openwhisk`, pinned in
package-lock.json, installed by scripts/setup): each scenario of scenarios.js runs as a node
process against one platform, as an OpenWhisk user's code would."""
import os
import pathlib
import shutil
import subprocess

import pytest

from scadtest import Platform

HERE = pathlib.Path(__file__).resolve().parent
NODE = shutil.which("node")


def scenario_names():
    if not NODE or not (HERE / "node_modules" / "openwhisk").is_dir():
        return ["setup"]
    out = subprocess.run([NODE, str(HERE / "scenarios.js"), "--list"], capture_output=True, text=True, timeout=60)
    return out.stdout.split() or ["setup"]


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    p = Platform(tmp_path_factory.mktemp("openwhisk") / "home")
    yield p
    p.stop()


@pytest.mark.parametrize("scenario", scenario_names())
def test_openwhisk_js_client(platform, scenario):
    if scenario == "setup":
        pytest.fail("node and tests/openwhisk/node_modules are missing: run scripts/setup")
    env = dict(os.environ, APIHOST=platform.url, AUTH=platform.auth)
    r = subprocess.run([NODE, str(HERE / "scenarios.js"), scenario], capture_output=True, text=True, env=env,
                       timeout=300, cwd=HERE)
    assert r.returncode == 0, f"{scenario} failed:\n{r.stdout}\n{r.stderr}"
    assert r.stdout.strip() == f"ok {scenario}"
