"""The fork server of compute processes (a zygote, as SOCK and Android's zygote start processes).

Starting a compute process means starting an interpreter and importing the launcher with disagg
and scad: about 50 ms here, of which the interpreter is 10. The agent instead starts this program
once, in a sandbox like every compute process's, and it imports all of that once. For each process
the agent asks for, it forks; the child makes the sandbox of its own that bubblewrap would have made
for a process started afresh, then serves runs as `python -m scad.launcher --serve` does:

    zygote (in bubblewrap: the system and the runtime read-only, no other tenant's anything)
      └─ init: pid 1 of a new pid namespace, with new mount, ipc, uts and cgroup namespaces;
         a fresh /proc (its /sys, /sysrq-trigger, /irq and /bus read-only, as bubblewrap's),
         /tmp and /code (tmpfs), /dev/pts (a devpts of its own); reaps what the run leaves
         behind, says how the process ended
          └─ the launcher: pid 2, a session of its own; of the capabilities only CAP_SETUID and
             CAP_SETGID (when the agent is root), which it gives up with root for the tenant's uid
             before any user code runs, as a launcher started afresh does

So that the zygote can make those namespaces it keeps CAP_SYS_ADMIN and CAP_SETPCAP (bubblewrap's
--cap-add) and is not in a pid namespace of its own: the pids it reports are the agent's. It runs
no user code and reads nothing but the agent's requests; each child gives up what it does not need
before it reads a spec.

The protocol, on a SOCK_SEQPACKET socket at fd 3 (the agent's end is its only other end):
  agent -> zygote: b"fork", with four descriptors (SCM_RIGHTS): the process's stdin, stdout,
                   stderr, and the write end of its status pipe
  zygote -> agent: b"pid N" with a pidfd of the process (signals it safely, whatever its pid
                   becomes later), or b"error WHY"
On the status pipe the launcher writes "ready" once its sandbox is made, its capabilities given up
and the init has given up its own (or "error WHY", from whichever failed), and the init, when the
launcher has ended,
"exit N" or "signal N"; then it closes (the agent's exit status of a process that is not its
child). The fork server reaps its inits between requests, at least once a second.

The agent uses it when it runs as root. Unprivileged, all tenants share one uid and would share
the fork server's writable root, and a user namespace's CAP_SYS_ADMIN cannot go back to the
agent's pid namespace after making a child's (setns): processes are started by bubblewrap.

Forked children share the zygote's address-space layout and hash seed (as Android's do): a
process learns nothing of another tenant's memory from them, but a layout found in one holds in
the others.
"""
import ctypes
import os
import re
import select
import signal
import socket
import sys
import traceback

from scad import launcher  # noqa: F401 - what every process needs, imported once here

_libc = ctypes.CDLL(None, use_errno=True)

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 0x4000, 1 << 18

CAP_SETGID, CAP_SETUID = 6, 7
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 1, 4, 24, 47, 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522

CONTROL_FD = 3
_PROC_READ_ONLY = ("sys", "sysrq-trigger", "irq", "bus")  # as bubblewrap covers them


def _check(rc, what):
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source, target, fstype, flags, data=None):
    enc = lambda s: s.encode() if s is not None else None  # noqa: E731
    _check(_libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)),
           f"mount {target}")


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _keep_only(caps):
    """Gives up every capability but `caps`, for good: out of the bounding set (while CAP_SETPCAP
    is still held), the ambient set emptied, and effective and permitted set to `caps`."""
    last = int(open("/proc/sys/kernel/cap_last_cap").read())
    for cap in range(last + 1):
        if cap not in caps:
            _check(_libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), f"dropping capability {cap}")
    _check(_libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clearing ambient capabilities")
    mask = sum(1 << c for c in caps)
    data = (_CapData * 2)(_CapData(mask, mask, 0), _CapData(0, 0, 0))
    _check(_libc.capset(ctypes.byref(_CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)), data), "capset")


def _unescape(field):
    """A path as /proc/self/mountinfo writes it (space, tab, newline and backslash as \\ooo)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _binds_under_tmp():
    """What the sandbox mounted inside /tmp (the memory pool's socket, and the interpreter or the
    Python path where they live under /tmp): [(path, is a folder, flags)], the outermost only. A
    child's own /tmp covers them: it mounts each again."""
    found = []
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        for line in f:
            fields = line.split()
            path = _unescape(fields[4])
            if not path.startswith("/tmp/"):
                continue
            options = set(fields[5].split(","))
            flags = (MS_RDONLY if "ro" in options else 0) | (MS_NOSUID if "nosuid" in options else 0) | \
                (MS_NODEV if "nodev" in options else 0) | (MS_NOEXEC if "noexec" in options else 0)
            found.append((path, flags))
    outer = [(p, fl) for p, fl in found if not any(p.startswith(q + "/") for q, _ in found)]
    return [(path, os.path.isdir(path), flags) for path, flags in dict(outer).items()]


def _private_mounts(tmp_binds):
    """The child's own view: nothing it mounts reaches the zygote, a /proc of its pid namespace,
    and a /tmp and /code of its own (with what the sandbox mounted inside /tmp)."""
    _check(_libc.unshare(CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWCGROUP), "unshare")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for name in _PROC_READ_ONLY:
        path = "/proc/" + name
        if os.path.exists(path):
            _mount(path, path, None, MS_BIND | MS_REC)
            _mount(None, path, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
    # Held open across the cover (a bind's source must be a mount of this namespace: opened after
    # the unshare), and mounted again from /proc/self/fd.
    held = [(path, os.open(path, os.O_PATH | os.O_CLOEXEC), is_dir, flags) for path, is_dir, flags in tmp_binds]
    _mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
    for path, fd, is_dir, flags in held:
        parent = os.path.dirname(path)
        os.makedirs(parent, mode=0o755, exist_ok=True)
        if is_dir:
            os.mkdir(path, 0o755)
        else:
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o644))
        _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
        _mount(None, path, None, MS_BIND | MS_REMOUNT | flags)
        os.close(fd)
    _mount("tmpfs", "/code", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755")
    # Terminals of its own, as bubblewrap's --dev gives each sandbox.
    _mount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=620")


def _launcher(stdio, status_fd, umask, init_done):
    """pid 2: the compute process itself. Says "ready" once the init has given up what it held."""
    try:
        os.setsid()
        os.umask(umask)  # the agent's, as a process bubblewrap started has it
        # Root keeps only what switching to the tenant's uid takes (code_folder._take_uid).
        _keep_only({CAP_SETUID, CAP_SETGID} if os.getuid() == 0 else set())
        if os.read(init_done, 1) != b"+":
            os._exit(1)  # the init failed (and said why): its end ends this process anyway
        os.close(init_done)
    except BaseException:  # noqa: BLE001 - said on the status pipe, never handed out
        why = " ".join(traceback.format_exc(limit=1).split())
        os.write(status_fd, f"error {why}\n".encode())
        os._exit(1)
    os.write(status_fd, b"ready\n")  # set up: the agent may hand it runs
    for target, fd in enumerate(stdio):
        os.dup2(fd, target)
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))
    os.chdir("/tmp")
    return launcher.serve()


def _init(stdio, status_fd, tmp_binds):
    """pid 1 of the child's pid namespace: makes its mounts, starts the launcher, reaps what the
    run leaves behind, and writes how the launcher ended. Its end ends the namespace's every process."""
    _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl")
    umask = os.umask(0o022)  # the folders it makes for the mounts under /tmp are passable
    _private_mounts(tmp_binds)
    os.chdir("/")
    init_done, done = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(done)
        code = 1
        try:
            code = _launcher(stdio, status_fd, umask, init_done)
        except BaseException:  # noqa: BLE001 - whatever it is, the process ends here, said on stderr
            traceback.print_exc()
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except (OSError, ValueError):  # closed, or its pipe gone
                    pass
        os._exit(code if isinstance(code, int) else 1)
    os.close(init_done)
    # The init holds none of the process's pipes (their ends tell the agent it died), nothing of
    # the fork server's (its stdio is the agent's log) and no privilege; nobody may trace it.
    # Only then is the launcher ready.
    null = os.open("/dev/null", os.O_RDWR)
    for target in range(3):
        os.dup2(null, target)
    for fd in (*stdio, null):
        os.close(fd)
    _keep_only(set())
    _check(_libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "prctl(PR_SET_DUMPABLE)")
    os.write(done, b"+")
    os.close(done)
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            status = None
            break
        if pid == child:
            break
    if status is None:
        line = "exit 255\n"
    elif os.WIFSIGNALED(status):
        line = f"signal {os.WTERMSIG(status)}\n"
    else:
        line = f"exit {os.WEXITSTATUS(status)}\n"
    os.write(status_fd, line.encode())
    os._exit(0)


def _reap():
    """Reaps the inits that ended. Only here, between requests: an init is never reaped between
    its fork and its pidfd's opening."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _fork(control, own_pid_ns, tmp_binds, stdio, status_fd):
    """One process: its pid and a pidfd of it, or raises OSError."""
    _check(_libc.unshare(CLONE_NEWPID), "unshare(CLONE_NEWPID)")
    try:
        pid = os.fork()
        if pid == 0:
            try:
                control.close()
                os.close(own_pid_ns)
                _init(stdio, status_fd, tmp_binds)
            except BaseException:  # noqa: BLE001
                try:
                    why = " ".join(traceback.format_exc(limit=1).split())
                    os.write(status_fd, f"error {why}\nexit 127\n".encode())
                finally:
                    os._exit(127)
    finally:
        # Back to forking into this pid namespace: the next request makes a new one again.
        _check(_libc.setns(own_pid_ns, CLONE_NEWPID), "setns(pid)")
    return pid, os.pidfd_open(pid)


def serve(control):
    own_pid_ns = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    tmp_binds = _binds_under_tmp()
    while True:
        _reap()
        try:
            if not select.select([control], [], [], 1.0)[0]:
                continue
            message, fds, _, _ = socket.recv_fds(control, 64, 4)
        except OSError as e:
            print(f"scad zygote: reading a request: {e}", file=sys.stderr)
            return 1
        if not message:
            return 0  # the agent closed its end
        try:
            if message != b"fork" or len(fds) != 4:
                raise ValueError(f"bad request ({len(message)} bytes, {len(fds)} descriptors)")
            pid, pidfd = _fork(control, own_pid_ns, tmp_binds, fds[:3], fds[3])
            try:
                socket.send_fds(control, [f"pid {pid}".encode()], [pidfd])
            finally:
                os.close(pidfd)
        except Exception as e:  # noqa: BLE001 - a request that fails says why and the next one is served
            try:
                control.send(f"error {e}".encode()[:4096])
            except OSError:
                return 1
        finally:
            for fd in fds:
                os.close(fd)


def main():
    # fd 0 and 1 are /dev/null, 2 the agent's log: the children's are the ones each request brings.
    return serve(socket.socket(fileno=CONTROL_FD))


if __name__ == "__main__":
    sys.exit(main())
