"""Sandboxed compute processes with network are forked by the agent's fork server (an interpreter
with the launcher imported) instead of starting an interpreter each. A forked process must be
sandboxed as one started afresh: pid 1 of a pid namespace of its own (the fork server's init),
no capability left once it runs as its namespace's uid, /proc's kernel knobs read-only, its own
/tmp; how it ended must be reported as exactly; and where the fork server is gone, processes start
afresh."""
import os
import shutil
import signal

import pytest

from scadtest import Platform

pytestmark = [pytest.mark.skipif(not shutil.which("bwrap"), reason="bubblewrap is not installed"),
              pytest.mark.skipif(os.geteuid() != 0, reason="the fork server serves an agent running as root")]

ACTIONS = "/api/v1/namespaces/_/actions"

PROBE = '''
import os

def main(args):
    status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines() if ":" in line)
    knobs = "read-only" if os.statvfs("/proc/sys").f_flag & os.ST_RDONLY else "writable"
    with open("/tmp/mark-" + args["tag"], "w") as f:
        f.write("x")
    return {"init": open("/proc/1/cmdline", "rb").read().replace(b"\\0", b" ").decode(),
            "pid": os.getpid(), "pids": sorted(p for p in os.listdir("/proc") if p.isdigit()),
            "caps": {k: int(status[k].strip(), 16) for k in ("CapEff", "CapPrm", "CapInh", "CapAmb", "CapBnd")},
            "no_new_privs": status["NoNewPrivs"].strip(), "uid": os.getuid(), "knobs": knobs,
            "tmp": sorted(os.listdir("/tmp")),
            "ns": {n: os.readlink("/proc/self/ns/" + n) for n in ("pid", "mnt", "ipc", "uts", "cgroup")},
            "pts": os.stat("/dev/pts").st_dev}
'''


def run(platform, name, args, code=PROBE):
    status, body = platform.call("PUT", f"{ACTIONS}/{name}?overwrite=true", {"exec": {"kind": "python:3", "code": code}})
    assert status == 200, body
    return platform.call("POST", f"{ACTIONS}/{name}", args, params="?blocking=true")


@pytest.fixture
def cold(tmp_path):
    """A platform with no pre-warmed processes: every new action's process is made for it."""
    p = Platform(tmp_path / "home", extra=["--prewarm", "0"])
    yield p
    p.stop()


def test_a_forked_process_has_a_sandbox_of_its_own(cold):
    status, one = run(cold, "one", {"tag": "one"})
    assert status == 200, one
    one = one["response"]["result"]
    # The process (pid 2) under the fork server's init (pid 1): nothing else is visible.
    assert "scad.zygote" in one["init"] and one["pid"] == 2 and one["pids"] == ["1", "2"], one
    assert one["no_new_privs"] == "1" and one["knobs"] == "read-only", one
    if os.geteuid() == 0:
        # Root gave everything up with its uid; what is left could never come back (bounding set).
        assert one["uid"] >= 1 << 30, one
        assert {k: v for k, v in one["caps"].items() if k != "CapBnd"} == dict.fromkeys(
            ("CapEff", "CapPrm", "CapInh", "CapAmb"), 0), one
        assert one["caps"]["CapBnd"] & ~((1 << 6) | (1 << 7)) == 0, one  # at most CAP_SETGID, CAP_SETUID
    # A second action's process, while the first's is still up (kept warm): a /tmp of its own.
    status, two = run(cold, "two", {"tag": "two"})
    assert status == 200, two
    two = two["response"]["result"]
    assert two["pids"] == ["1", "2"] and "mark-one" not in two["tmp"] and "mark-two" in two["tmp"], two
    # Namespaces of its own, not the other's (nor the fork server's, shared by both if they were).
    assert all(one["ns"][n] != two["ns"][n] for n in one["ns"]), (one["ns"], two["ns"])
    assert one["pts"] != two["pts"], "one devpts for both: each would see the other's terminals"
    status, again = cold.call("POST", f"{ACTIONS}/one", {"tag": "again"}, params="?blocking=true")
    assert status == 200 and "mark-one" in again["response"]["result"]["tmp"], "a warm process keeps its /tmp"


EXITS = '''
import os, signal, sys

def main(args):
    print("init:", open("/proc/1/cmdline", "rb").read().replace(b"\\0", b" ").decode(), file=sys.stderr, flush=True)
    if args["how"] == "exit":
        os._exit(3)
    os.kill(os.getpid(), signal.SIGABRT)
'''


def test_how_a_forked_process_ended_is_reported(cold):
    status, rec = run(cold, "exits", {"how": "exit"}, code=EXITS)
    assert status == 502 and "exited with status 3 without a result" in rec["response"]["result"]["error"], rec
    assert any("scad.zygote" in line for line in rec["logs"]), rec["logs"]
    status, rec = run(cold, "aborts", {"how": "abort"}, code=EXITS)
    assert status == 502 and "killed by signal 6" in rec["response"]["result"]["error"], rec
    assert any("scad.zygote" in line for line in rec["logs"]), rec["logs"]


CLOSES = '''
import os, time

def main(args):
    os.close(1)
    os.close(2)
    time.sleep(3600)
'''


def test_a_process_that_closes_its_output_still_ends_at_its_timeout(cold):
    # Its pipes close but the process goes on: it is ended at its time limit, as any other.
    status, body = cold.call("PUT", f"{ACTIONS}/closes", {"exec": {"kind": "python:3", "code": CLOSES},
                                                        "limits": {"timeout": 2000}})
    assert status == 200, body
    status, rec = cold.call("POST", f"{ACTIONS}/closes", {}, params="?blocking=true")
    assert status == 502 and "time limits of 2000 milliseconds" in rec["response"]["result"]["error"], rec
    assert run(cold, "after", {"tag": "after"})[0] == 200


def children_of():
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    return children


def descendants(pid):
    children = children_of()
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def cmdline(pid):
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_without_the_fork_server_processes_start_afresh(cold, tmp_path):
    status, rec = run(cold, "before", {"tag": "before"})
    assert status == 200 and "scad.zygote" in rec["response"]["result"]["init"], rec
    # The fork server is bubblewrap's child (the processes it forks run the same program).
    children = children_of()
    zygotes = [c for p in descendants(cold.proc.pid) if os.path.basename(cmdline(p).split(" ")[0]) == "bwrap"
               for c in children.get(p, []) if cmdline(c).endswith("-m scad.zygote ")]
    assert len(zygotes) == 1, [cmdline(p) for p in descendants(cold.proc.pid)]
    os.kill(zygotes[0], signal.SIGKILL)
    # The processes it made went with it; the next is started by bubblewrap, as with --fork-server off.
    status, rec = run(cold, "after", {"tag": "after"})
    assert status == 200, rec
    result = rec["response"]["result"]
    assert "bwrap" in result["init"] and result["pids"] == ["1", "2"], result
    status, rec = cold.call("POST", f"{ACTIONS}/before", {"tag": "again"}, params="?blocking=true")
    assert status == 200 and "mark-before" not in rec["response"]["result"]["tmp"], "a process of the gone fork server"

    off = Platform(tmp_path / "off", extra=["--prewarm", "0", "--fork-server", "off"])
    try:
        status, rec = run(off, "plain", {"tag": "plain"})
        assert status == 200 and "bwrap" in rec["response"]["result"]["init"], rec
        assert not [p for p in descendants(off.proc.pid) if "scad.zygote" in cmdline(p)]
    finally:
        off.stop()
