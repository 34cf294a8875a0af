"""Where a run's code lives on the platform.

The agent sends the code with the run's spec and names it by its code key
("ns/kind/name/VERSION-HASH": one version of one action or application): its files ("files":
{name: text}), or for a zip action the zip ("zip": base64), unpacked with the action container's
own code (ow_code). A key is written once, into a fresh folder renamed into place when complete,
so that a warm process finds it whole and never writes or unpacks it again (the agent then sends
the spec without the code).

In the sandbox the root is /code, private to the process's mount namespace: the launcher writes
as root, makes everything read-only and then takes the tenant's uid ("uid") for good, before any
user code runs. Outside a sandbox (a host without bubblewrap) the agent names a root in its own
home ("code_root") where the processes of the host share one copy of each key; its folders are
the agent's uid's alone (0700), a tree per namespace.
"""
import os
import shutil
import tempfile

from scad import ow_code

SANDBOX_ROOT = "/code"


def place(spec):
    """Writes or unpacks the spec's code unless its key is in place already, then takes the
    tenant's uid. Returns the path of the code's file. Raises ow_code.InitError for a zip that
    cannot be unpacked, ValueError for a malformed spec."""
    key = spec["code_key"]
    if not isinstance(key, str) or not key or ".." in key.split("/") or key.startswith("/"):
        raise ValueError(f"bad code key {key!r}")
    sandboxed = "code_root" not in spec
    root = SANDBOX_ROOT if sandboxed else spec["code_root"]
    folder = os.path.join(root, key)
    if not os.path.isdir(folder):
        if "zip" not in spec and spec.get("binary"):
            raise ValueError(f"the code of {key!r} is not on this host and the spec does not carry it")
        _write(spec, root, key, sandboxed)
    _take_uid(spec.get("uid"))
    return os.path.join(folder, spec["code"])


def _write(spec, root, key, sandboxed):
    parent = _make_parents(root, os.path.dirname(key), 0o755 if sandboxed else 0o700)
    fresh = tempfile.mkdtemp(prefix=".new-", dir=parent)
    try:
        if "zip" in spec:
            try:
                data = ow_code.decode(spec["zip"])
            except ow_code.BadRequest as e:
                raise ow_code.InitError("start", f"Invalid action: {e}") from None
            ow_code.unpack(data, fresh)
        else:
            _write_files(spec.get("files") or {}, fresh)
        _seal(fresh, sandboxed)
        try:
            os.rename(fresh, os.path.join(root, key))
        except OSError:
            if not os.path.isdir(os.path.join(root, key)):
                raise
            shutil.rmtree(fresh, ignore_errors=True)  # another process of the host placed it first
    except BaseException:
        shutil.rmtree(fresh, ignore_errors=True)
        raise
    if sandboxed:  # root made them; the tenant's uid only passes through
        for path in _parents(root, os.path.join(root, key)):
            os.chmod(path, 0o555)


def _write_files(files, folder):
    for name, content in files.items():
        if not isinstance(content, str) or ".." in name.split("/") or name.startswith("/") or not name:
            raise ValueError(f"bad code file name {name!r}")
        path = os.path.join(folder, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(content)


def _seal(folder, sandboxed):
    """Read-only: in the sandbox for everyone (the tenant's uid reads what root wrote); outside,
    for the agent's uid alone, whose folders stay writable so that it can remove them."""
    file_mode, dir_mode = (0o444, 0o555) if sandboxed else (0o400, 0o700)
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in filenames:
            path = os.path.join(dirpath, name)
            if not os.path.islink(path):
                executable = os.stat(path).st_mode & 0o100
                os.chmod(path, file_mode | ((file_mode >> 2) & 0o111 if executable else 0))
        os.chmod(dirpath, dir_mode)


def _make_parents(root, relative, mode):
    """root/relative, each missing level made with mode (os.makedirs gives the levels above the
    last the umask's mode)."""
    path = root
    for part in relative.split("/"):
        path = os.path.join(path, part)
        try:
            os.mkdir(path, mode)
            os.chmod(path, mode)
        except FileExistsError:
            pass
    return path


def _parents(root, folder):
    out = []
    while True:
        folder = os.path.dirname(folder)
        if len(folder) <= len(root):
            return out
        out.append(folder)


def _take_uid(uid):
    if uid is None or os.getuid() == uid:
        return
    if os.getuid() != 0:
        raise PermissionError(f"this process already runs as uid {os.getuid()}, not {uid}")
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
