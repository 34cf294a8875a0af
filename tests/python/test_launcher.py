"""The launcher and action.runtime: DESIGN.md's example end to end, errors as results."""
import json
import pathlib
import subprocess
import sys

import pytest

from scadtest import BUILD, ROOT
from scad.launcher import run_action
from scad.runtime_client import RuntimeClient, RuntimeRequestError

ACTIONS = pathlib.Path(__file__).parent / "actions"


def spec(memd_server, impl, code, aid="it-client", args=None):
    return {"aid": aid, "code": str(ACTIONS / code), "main": "main", "args": args or {},
            "transports": [{"durl": f"mem1;{impl}", "config": memd_server.config()}]}


@pytest.mark.parametrize("impl", ["shm", "tcp"])
def test_design_example_runs_unchanged(memd, runtime, impl):
    server = memd()
    out = run_action(spec(server, impl, "design_example.py"))
    assert out["ok"] and out["result"] == {"ok": True}, out.get("error")
    assert out["init_ms"] >= 0 and out["run_ms"] >= 0
    posts = [r for r in runtime.requests if r[0] == "POST"]
    assert posts[0][2] == {"template": "mem1", "name": "mem2", "props": {"size": 1 << 30}}
    assert [r[0] for r in runtime.requests] == ["POST", "DELETE"]
    assert runtime.elements == {}, "release freed the element"
    # The data the action wrote is in the memory element for the next action.
    import disagg
    with disagg.LibdAction("it-client") as a:
        a.add_transport("mem1;tcp;" + server.config())
        t = a.get_transport("mem1", "rdma")
        t.reg(8)
        t.read(5, 0)
        assert bytes(t.buf[:5]) == b"hello"


def test_invoke_returns_a_usable_transport_and_release_revokes(memd, runtime):
    server = memd()
    out = run_action(spec(server, "tcp", "grow_and_use.py", args={"size": 1 << 20}))
    assert out["ok"], out.get("error")
    assert out["result"] == {"seen": "grow", "transports": ["mem1", "scratch"]}


def test_runtime_errors_are_clear(memd, runtime):
    from scad.action import Action
    a = Action("it-client")
    with pytest.raises(RuntimeRequestError, match="409 template 'big' cannot be met"):
        runtime.refuse.add("big")
        a.runtime.invoke("big", "m")
    with pytest.raises(KeyError, match="no transport named 'ghost'"):
        a.runtime.release("ghost")
    bad = RuntimeClient(a, runtime.url, token="wrong")
    with pytest.raises(RuntimeRequestError, match="401") as e:
        bad.invoke("mem1", "x")
    assert e.value.status == 401
    nowhere = RuntimeClient(a, "http://127.0.0.1:9")
    with pytest.raises(RuntimeRequestError, match="unreachable"):
        nowhere.invoke("mem1", "y")
    a.terminate()


def test_no_endpoint_says_so(monkeypatch):
    monkeypatch.delenv("SCAD_RUNTIME_URL", raising=False)
    import disagg
    from scad.action import Action
    a = Action("alone")
    with pytest.raises(RuntimeRequestError, match="SCAD_RUNTIME_URL is not set"):
        a.runtime.invoke("mem1", "m")
    # The binding alone has no runtime: it is the platform's, added by scad.action.
    assert not hasattr(disagg.LibdAction("bare"), "runtime")


@pytest.mark.parametrize("how,etype", [("raise", "RuntimeError"), ("exit", "SystemExit"), ("not-json", "TypeError")])
def test_failures_become_error_results_and_the_action_is_terminated(memd, how, etype):
    server = memd()
    out = run_action(spec(server, "tcp", "faulty.py", args={"how": how}))
    assert out["ok"] is False
    assert out["error"]["type"] == etype
    assert "Traceback" in out["error"]["traceback"]
    # Terminated means released: the memory element serves the next action without trouble.
    assert run_action(spec(server, "tcp", "faulty.py", args={"how": "fine"}))["result"] == {"fine": True}


def test_bad_code_is_an_error_result(memd, tmp_path):
    server = memd()
    out = run_action(spec(server, "tcp", "does_not_exist.py"))
    assert out["ok"] is False and out["error"]["type"] in ("FileNotFoundError", "ImportError")
    (tmp_path / "nomain.py").write_text("x = 1\n")
    s = spec(server, "tcp", "x")
    s["code"] = str(tmp_path / "nomain.py")
    out = run_action(s)
    assert out["error"]["type"] == "AttributeError" and "no function 'main'" in out["error"]["message"]


def test_launcher_as_a_program_prints_only_the_result_on_stdout(memd):
    server = memd()
    env = {"PYTHONPATH": f"{BUILD / 'python'}:{ROOT / 'bindings' / 'python'}", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-m", "scad.launcher"], input=json.dumps(spec(server, "shm", "faulty.py")),
                          capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["result"] == {"fine": True}
    assert "user output goes to stderr" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "scad.launcher"], input="{not json", capture_output=True, text=True,
                          timeout=60, env=env)
    assert proc.returncode == 2 and json.loads(proc.stdout)["error"]["message"].startswith("bad spec")


def test_the_action_object_goes_only_to_a_main_that_asks_for_it():
    from scad.main_signature import takes_action
    assert takes_action(lambda args, action: None)
    assert takes_action(lambda args, act: None)            # Scad's form under another name
    assert takes_action(lambda args, action=None: None)    # named for it: asked for
    assert takes_action(lambda *args: None)
    assert not takes_action(lambda args: None)             # OpenWhisk's form
    assert not takes_action(lambda args, verbose=False: None)
    assert not takes_action(lambda args, *, action: None)


def test_a_main_with_a_default_second_parameter_keeps_its_default(tmp_path):
    code = tmp_path / "verbose.py"
    code.write_text("def main(args, verbose=False):\n    return {'verbose': verbose}\n")
    out = run_action({"aid": "v", "code": str(code), "args": {}})
    assert out["ok"] and out["result"] == {"verbose": False}, out


def launch(spec, env=None):
    """One run by `python -m scad.launcher` (its own process: a zip action changes the working
    directory and sys.path of the process that loads it)."""
    env = env or {"PYTHONPATH": f"{BUILD / 'python'}:{ROOT / 'bindings' / 'python'}", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-m", "scad.launcher"], input=json.dumps(spec), capture_output=True,
                          text=True, timeout=60, env=env)
    return json.loads(proc.stdout)


def zip_spec(root, files=None, key="guest/actions/z/1-abc"):
    import base64
    import io
    import zipfile
    spec = {"aid": "z", "code": "__main__.py", "code_key": key, "code_root": str(root), "files": {}, "binary": True,
            "main": "main", "args": {}}
    if files is not None:
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as z:
            for name, text in files.items():
                z.writestr(name, text)
        spec["zip"] = base64.b64encode(buf.getvalue()).decode()
    return spec


def test_a_zip_is_unpacked_once_per_code_key_and_loaded_from_its_folder(tmp_path):
    files = {"__main__.py": "import os\nfrom helper import n\ndef main(a):\n    return {'n': n, 'cwd': os.getcwd()}\n",
             "helper.py": "n = 42\n"}
    out = launch(zip_spec(tmp_path, files))
    folder = tmp_path / "guest" / "actions" / "z" / "1-abc"
    assert out["ok"] and out["result"] == {"n": 42, "cwd": str(folder)}, out
    # Another process of the host finds it in place: the spec need not carry the zip again.
    assert launch(zip_spec(tmp_path))["result"]["n"] == 42
    assert [p.name for p in folder.parent.iterdir()] == ["1-abc"]


def test_code_that_does_not_load_is_an_init_failure(tmp_path):
    out = launch(zip_spec(tmp_path, {"main.py": ""}))
    assert out["ok"] is False and out["error"]["init"] == "start"
    assert "Zip file does not include '__main__.py'." in out["error"]["traceback"]
    assert not (tmp_path / "guest" / "actions" / "z" / "1-abc").exists()
    assert launch(zip_spec(tmp_path, {"__main__.py": "def main(a:\n"}, key="guest/actions/z/2-abc"))["error"]["init"] == "build"
    missing = launch(zip_spec(tmp_path, key="guest/actions/z/3-abc"))  # neither on the host nor in the spec
    assert missing["error"]["init"] == "start" and "does not carry it" in missing["error"]["message"]
    (tmp_path / "nomain.py").write_text("x = 1\n")
    out = launch({"aid": "s", "code": str(tmp_path / "nomain.py"), "args": {}})
    assert out["error"]["init"] == "start" and "no function 'main'" in out["error"]["message"]
    (tmp_path / "raises.py").write_text("def main(a):\n    raise ValueError('in main')\n")
    out = launch({"aid": "s", "code": str(tmp_path / "raises.py"), "args": {}})
    assert out["error"]["type"] == "ValueError" and "init" not in out["error"]  # main's own: an application error


def test_a_runs_environment_is_set_before_its_code_loads_and_undone_after(tmp_path, monkeypatch):
    (tmp_path / "show_env.py").write_text(
        "import os\nAT_IMPORT = os.environ.get('SCAD_TEST_MODE')\n"
        "def main(args, action):\n"
        "    return {'at_import': AT_IMPORT, 'now': os.environ.get('SCAD_TEST_MODE'), 'home': os.environ.get('HOME')}\n")
    monkeypatch.setenv("HOME", "/the/launchers/home")
    monkeypatch.delenv("SCAD_TEST_MODE", raising=False)
    run = {"aid": "env-run", "code": str(tmp_path / "show_env.py"), "main": "main", "args": {},
           "env": {"SCAD_TEST_MODE": "fast", "HOME": "/elsewhere", "bad name": "x", "NUL": "a\0b", "NUMBER": 3}}
    out = run_action(run)
    assert out["ok"], out.get("error")
    assert out["result"] == {"at_import": "fast", "now": "fast", "home": "/elsewhere"}
    # The process's own variables are back as they were; what it did not have is gone again.
    import os
    assert os.environ["HOME"] == "/the/launchers/home" and "SCAD_TEST_MODE" not in os.environ
    assert "bad name" not in os.environ and "NUL" not in os.environ and "NUMBER" not in os.environ
