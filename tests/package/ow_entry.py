#!/usr/bin/env python3
"""The action runtime image's entry point, driven as OpenWhisk's invoker drives a container, with
an installed scad (not the source tree): inside the built image, or from a fresh `pip install .`.

    tests/package/ow_entry.py [--action-dir DIR] -- PYTHON-COMMAND...
e.g.
    tests/package/ow_entry.py -- /tmp/venv/bin/python
    tests/package/ow_entry.py --action-dir /action -- buildah run --isolation chroot CTR -- /opt/scad/bin/python

Each container: /init once, then runs. Checks a plain action, a Scad main(args, action) whose
transport reaches a libd-memd of this machine over tcp (given in the run's value), an exception, a
zip with a virtualenv, the __OW_* environment and the sentinels. Exit status 0 if all hold.
"""
import argparse
import os
import pathlib
import signal
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "python")]
from owproxy import SENTINEL, Proxy, zipped  # noqa: E402
from scadtest import Memd  # noqa: E402

SCAD_ACTION = """
import os
def main(args, action):
    t = action.get_transport('mem1', 'rdma')
    t.reg(64)
    t.buf[0:5] = args['word'].encode()
    t.write(5, 0)
    t.read(5, 0, 32)
    print('written and read back')
    return {'echo': bytes(t.buf[32:37]).decode(), 'aid': os.environ['__OW_ACTIVATION_ID']}
"""


def stop(proxy):
    """The proxy and whatever started it (buildah run's child in the image's root): by pid, the
    process tree under the one this script started, leaves first."""
    tree, frontier = [], [proxy.proc.pid]
    while frontier:
        pid = frontier.pop()
        tree.append(pid)
        for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                frontier.append(int(stat.parent.name))
    for pid in reversed(tree[1:]):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proxy.stop()


def check(label, got, want):
    ok = got == want
    print(f"{'ok ' if ok else 'FAIL'} {label}: {got!r}" + ("" if ok else f" (wanted {want!r})"))
    return ok


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--action-dir")
    p.add_argument("python", nargs="+")
    args = p.parse_args()
    extra = ("--action-dir", args.action_dir) if args.action_dir else ()
    env = {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin"}  # nothing of the source tree on the path
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        memd = Memd(pathlib.Path(tmp))
        proxy = Proxy(*extra, python=args.python, env=env, module="scad.proxy", command=())
        try:
            results.append(check("run before init", proxy.run({}), (500, {"error": "no action defined yet"})))
            results.append(check("init", proxy.init(SCAD_ACTION), (200, {"ok": True})))
            transports = [{"durl": "mem1;tcp", "config": memd.config()}]
            for word in ("first", "again"):
                results.append(check("main(args, action) over tcp", proxy.run(
                    {"word": word[:5], "__scad_transports": transports}, activation_id="it-client", api_key="k"),
                    (200, {"echo": word[:5], "aid": "it-client"})))
            status, body = proxy.run({"word": "nope!"}, activation_id="x")
            results.append(check("an exception is an application error", (status, "mem1" in body.get("error", "")),
                                 (200, True)))
            out = proxy.out.sentinels(3)
            results.append(check("sentinels after each run", (out.count(SENTINEL), proxy.err.sentinels(3).count(SENTINEL)),
                                 (3, 3)))
        finally:
            stop(proxy)
            memd.stop()

        venv = pathlib.Path(tmp) / "virtualenv"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        site = next(venv.glob("lib/python*/site-packages"))
        (site / "ow_smoke_pkg.py").write_text("WHO = 'from the zip'\n")
        files = {str(f.relative_to(venv.parent)): f.read_text() for f in venv.rglob("*")
                 if f.is_file() and "bin" not in f.relative_to(venv).parts}
        files["__main__.py"] = "import ow_smoke_pkg\ndef main(args):\n    return {'who': ow_smoke_pkg.WHO}\n"
        proxy = Proxy(*extra, python=args.python, env=env, module="scad.proxy", command=())
        try:
            results.append(check("zip with a virtualenv", proxy.post(
                "/init", {"value": {"code": zipped(files), "binary": True, "main": "main"}}), (200, {"ok": True})))
            results.append(check("its run", proxy.run({}), (200, {"who": "from the zip"})))
        finally:
            stop(proxy)
    print("all checks passed" if all(results) else "some checks FAILED")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
