"""Zip actions on the platform, as OpenWhisk's python:3 runtime runs them: the zip unpacked once
per version and process, its folder first on sys.path and its virtualenv's site-packages (with
their .pth files) before it, each tenant's code private to its own sandbox. The JavaScript
client's suite (tests/openwhisk, zip_actions and zip_errors) covers the API's side and the bad
zips; here are what needs a real virtual environment and a look at the files."""
import base64
import copy
import io
import os
import shutil
import stat
import subprocess
import sys
import zipfile

import pytest

from scadtest import Platform

ACTIONS = "/api/v1/namespaces/_/actions"


def zipped(folder):
    """base64 of a zip of folder's files, with their modes, as `zip -r` makes it (the venv's
    links to the interpreter left out, as `zip -r --symlinks` would store them as links)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for path in sorted(folder.rglob("*")):
            if path.is_file() and not path.is_symlink():
                z.write(path, str(path.relative_to(folder)))
    return base64.b64encode(buf.getvalue()).decode()


def put_zip(platform, name, folder, **exec_extra):
    return platform.call("PUT", f"{ACTIONS}/{name}?overwrite=true",
                         {"exec": {"kind": "python:3", "code": zipped(folder), "binary": True, **exec_extra}})


def invoke(platform, name, params=None):
    return platform.call("POST", f"{ACTIONS}/{name}", params or {}, params="?blocking=true")


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    p = Platform(tmp_path_factory.mktemp("zip") / "home")
    yield p
    p.stop()


def test_a_virtualenv_in_the_zip_is_used_before_the_zips_own_modules(platform, tmp_path):
    action = tmp_path / "action"
    venv = action / "virtualenv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next(venv.glob("lib/python*/site-packages"))
    (site / "tinypkg").mkdir()
    (site / "tinypkg" / "__init__.py").write_text("from tinypkg.words import greet\nVERSION = '0.1.0'\n")
    (site / "tinypkg" / "words.py").write_text("def greet(w):\n    return 'hello ' + w\n")
    (site / "shadow.py").write_text("WHO = 'virtualenv'\n")
    (site / "tiny_extra.pth").write_text("extra\n")  # a .pth file adds a folder, as in the environment
    (site / "extra").mkdir()
    (site / "extra" / "via_pth.py").write_text("OK = True\n")
    (action / "shadow.py").write_text("WHO = 'the zip'\n")
    (action / "__main__.py").write_text(
        "import os, sys\nimport tinypkg, via_pth, shadow\n"
        "def main(args):\n"
        "    return {'greeting': tinypkg.greet(args['w']), 'version': tinypkg.VERSION, 'pth': via_pth.OK,\n"
        "            'shadow': shadow.WHO, 'venv': os.environ.get('VIRTUAL_ENV', '').endswith('virtualenv'),\n"
        "            'first': sys.path[0].endswith('site-packages')}\n")
    assert put_zip(platform, "venv", action)[0] == 200
    for word in ("zip", "warm"):
        status, rec = invoke(platform, "venv", {"w": word})
        assert status == 200, rec
        assert rec["response"]["result"] == {"greeting": f"hello {word}", "version": "0.1.0", "pth": True,
                                             "shadow": "virtualenv", "venv": True, "first": True}
    assert {a["key"]: a["value"] for a in rec["annotations"]}["starts"] == {"warm": 1}


def test_a_virtualenv_without_site_packages_fails_the_start(platform, tmp_path):
    (tmp_path / "virtualenv").mkdir()
    (tmp_path / "virtualenv" / "README").write_text("empty\n")
    (tmp_path / "__main__.py").write_text("def main(args):\n    return {}\n")
    assert put_zip(platform, "novenv", tmp_path)[0] == 200
    status, rec = invoke(platform, "novenv")
    assert status == 502
    assert rec["response"]["status"] == "action developer error"
    assert rec["response"]["result"] == {"error": "Cannot start action. Check logs for details."}
    assert any("Invalid virtualenv" in line for line in rec["logs"]), rec["logs"]


PROBE = '''
import os
def main(args):
    seen = {"cwd": os.getcwd(), "code": sorted(os.listdir("/code")), "uid": os.getuid()}
    try:
        open("written-by-the-action", "w").close()
        seen["writable"] = True
    except OSError:
        seen["writable"] = False
    other = args.get("other")
    seen["other_visible"] = bool(other) and os.path.exists(other)
    return seen
'''


@pytest.mark.skipif(not shutil.which("bwrap"), reason="bubblewrap is not installed")
def test_each_tenants_unpacked_code_is_its_own_and_read_only(tmp_path):
    p = Platform(tmp_path / "home", extra=["--namespace", "alice", "--namespace", "bob"])
    try:
        if "NOT sandboxed" in p.banner:
            pytest.skip("compute processes are not sandboxed here")
        views = {}
        for tenant in ("alice", "bob"):
            props = dict(line.split("=", 1) for line in (p.home / "namespaces" / f"{tenant}.wskprops").read_text().split())
            views[tenant] = copy.copy(p)
            views[tenant].auth = props["AUTH"]
        (tmp_path / "action").mkdir()
        (tmp_path / "action" / "__main__.py").write_text(PROBE)
        seen = {}
        for tenant, view in views.items():
            assert put_zip(view, "probe", tmp_path / "action")[0] == 200
            other = seen["alice"]["cwd"] if seen else None
            status, rec = invoke(view, "probe", {"other": other})
            assert status == 200, rec
            seen[tenant] = rec["response"]["result"]
        assert seen["alice"]["cwd"].startswith("/code/alice/actions/probe/")
        assert seen["alice"]["code"] == ["alice"] and seen["bob"]["code"] == ["bob"]
        assert not seen["bob"]["other_visible"], "bob sees alice's unpacked code"
        assert not seen["alice"]["writable"] and not seen["bob"]["writable"], "the unpacked code is writable"
        if os.geteuid() == 0:
            assert seen["alice"]["uid"] != seen["bob"]["uid"]
    finally:
        p.stop()


def test_without_a_sandbox_the_unpacked_code_is_the_agents_alone(tmp_path):
    p = Platform(tmp_path / "home", extra=["--sandbox", "off"])
    try:
        (tmp_path / "action").mkdir()
        (tmp_path / "action" / "__main__.py").write_text("import os\ndef main(args):\n    return {'cwd': os.getcwd()}\n")
        (tmp_path / "action" / "tool.sh").write_text("#!/bin/sh\necho tool\n")
        (tmp_path / "action" / "tool.sh").chmod(0o755)
        assert put_zip(p, "hosted", tmp_path / "action")[0] == 200
        for _ in range(2):
            status, rec = invoke(p, "hosted")
            assert status == 200, rec
        folder = rec["response"]["result"]["cwd"]
        assert folder.startswith(str(p.home / "code" / "guest" / "actions" / "hosted"))
        for level in (p.home / "code", p.home / "code" / "guest", p.home / "code" / "guest" / "actions"):
            assert stat.S_IMODE(level.stat().st_mode) == 0o700, level
        assert stat.S_IMODE(os.stat(folder + "/__main__.py").st_mode) == 0o400
        assert stat.S_IMODE(os.stat(folder + "/tool.sh").st_mode) == 0o500  # its execute bit kept
        assert [d for d in os.listdir(os.path.dirname(folder)) if d.startswith(".new")] == []
        # Deleting the action removes its unpacked code.
        assert p.call("DELETE", f"{ACTIONS}/hosted")[0] == 200
        assert not os.path.exists(folder)
    finally:
        p.stop()
