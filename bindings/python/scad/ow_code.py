"""An OpenWhisk action's code made into a callable main: what the action container's /init does
with it (ow_container.py) and what the platform's launcher does with a zip action (launcher.py).

Source code ("binary": false) is one Python file. A zip ("binary": true, base64) holds
`__main__.py` beside any modules it imports, and optionally `virtualenv/`, a virtual environment
whose site-packages go on the path (what openwhisk-runtime-python does with activate_this.py).

The module is imported once: its globals live as long as the container (or the warm process), as
on OpenWhisk. Failures are InitError with the runtimes' split: code that does not compile is a
build failure, anything after that (a bad zip, an import that raises, no such main) is a start
failure.
"""
import base64
import binascii
import importlib.util
import io
import os
import site
import sys
import uuid
import zipfile

# The most a zip may unpack to. The controller takes at most 48 MiB of base64 code (OpenWhisk's
# exec size limit), some 36 MiB of zip; Python code and its packages compress 3 to 5 times. On the
# platform the unpacked files sit in the sandbox's memory and count against the action's memory
# limit (docs/openwhisk.md).
MAX_UNPACKED_BYTES = 256 << 20


class InitError(Exception):
    """kind is "build" (the code does not compile) or "start" (it does, but cannot be started);
    the message is for the action's logs."""

    def __init__(self, kind, message):
        super().__init__(message)
        self.kind = kind


class BadRequest(Exception):
    """The /init body itself is wrong (not the user's code): 400."""


def load(value, folder):
    """value is /init's {"code", "binary", "main"}; folder an empty directory for the code.
    Returns main."""
    main = value.get("main") or "main"
    if not isinstance(main, str):
        raise BadRequest("\"main\" must be a string")
    if value.get("binary"):
        unpack(decode(value["code"]), folder)
    else:
        with open(os.path.join(folder, "__main__.py"), "w", encoding="utf-8") as f:
            f.write(value["code"])
    return load_folder(folder, main, binary=bool(value.get("binary")))


def decode(code):
    """The zip's bytes from its base64 text (surrounding white space allowed, as the controller
    allows it); BadRequest when it is not base64."""
    try:
        return base64.b64decode(code.strip(), validate=True)
    except (binascii.Error, ValueError) as e:
        raise BadRequest(f"cannot decode the request: {e}") from None


def unpack(data, folder, max_bytes=MAX_UNPACKED_BYTES):
    """Unzips data into folder (existing, empty). Refuses, before writing anything, a zip that is
    not one, an entry that would land outside the folder (an absolute name, a '..' part) and a zip
    that unpacks to more than max_bytes. Files keep their execute bits. Returns __main__.py's path
    (a zip may name it `exec`, as the runtimes accept)."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            entries = z.infolist()
            _check_entries(entries, max_bytes)
            z.extractall(folder)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError, NotImplementedError) as e:
        raise InitError("start", f"Invalid action: the binary code is not a usable zip file ({e})") from None
    for entry in entries:  # zipfile leaves permissions out; the runtimes' unzip keeps them
        if not entry.is_dir() and (entry.external_attr >> 16) & 0o111:
            path = os.path.join(folder, entry.filename)
            os.chmod(path, os.stat(path).st_mode | 0o111)
    main, exec_ = os.path.join(folder, "__main__.py"), os.path.join(folder, "exec")
    if os.path.isfile(exec_) and not os.path.exists(main):
        os.rename(exec_, main)
    if not os.path.isfile(main):
        raise InitError("start", "Zip file does not include '__main__.py'.")
    return main


def _check_entries(entries, max_bytes):
    total = 0
    for entry in entries:
        name = entry.filename
        if name.startswith("/") or ".." in name.replace("\\", "/").split("/") or "\x00" in name:
            raise InitError("start", f"Invalid action: the zip has an entry outside its folder: {name!r}")
        total += entry.file_size  # what zipfile writes at most: it stops reading an entry there
        if total > max_bytes:
            raise InitError("start", f"Invalid action: the zip unpacks to more than {max_bytes} bytes "
                                     f"(the limit for an action's unpacked code)")


def load_folder(folder, main="main", binary=True):
    """main of folder/__main__.py, imported by import_folder."""
    fn = getattr(import_folder(folder, binary), main, None)
    if not callable(fn):
        raise InitError("start", f"Invalid action: the code has no function {main!r}")
    return fn


def import_folder(folder, binary=True):
    """Imports folder/__main__.py with the folder first on sys.path (its other modules import by
    plain name) and, for a zip, its virtualenv's site-packages before it; a zip's folder becomes
    the working directory, as the runtime starts its action there (its bundled files open by
    relative name). Returns the module."""
    if folder not in sys.path:
        sys.path.insert(0, folder)
    if not binary:
        return _import(os.path.join(folder, "__main__.py"))
    _activate_virtualenv(folder)
    before = os.getcwd()
    os.chdir(folder)
    try:
        return _import(os.path.join(folder, "__main__.py"))
    except BaseException:
        os.chdir(before)  # a failed init's folder is removed: the process must not stay in it
        raise


def _activate_virtualenv(folder):
    """virtualenv/lib/pythonX.Y/site-packages first on the path, as activate_this.py puts it; a
    virtual environment made by `python -m venv` (no activate_this.py) works as well."""
    venv = os.path.join(folder, "virtualenv")
    if not os.path.isdir(venv):
        return
    lib = os.path.join(venv, "lib")
    ours = f"python{sys.version_info.major}.{sys.version_info.minor}"
    found = sorted(d for d in (os.listdir(lib) if os.path.isdir(lib) else [])
                   if d.startswith("python") and os.path.isdir(os.path.join(lib, d, "site-packages")))
    if not found:
        raise InitError("start", "Invalid virtualenv: Zip file has no virtualenv/lib/python*/site-packages.")
    if ours not in found:
        print(f"scad: the zip's virtualenv is for {found[0]}, this runtime runs {ours}: "
              "compiled packages may not load", file=sys.stderr)
    packages = os.path.join(lib, ours if ours in found else found[0], "site-packages")
    before = list(sys.path)
    site.addsitedir(packages)  # also runs its .pth files, as the virtual environment itself would
    added = [p for p in sys.path if p not in before]
    sys.path[:] = added + before
    os.environ["VIRTUAL_ENV"] = venv
    os.environ["PATH"] = os.path.join(venv, "bin") + os.pathsep + os.environ.get("PATH", "")


def _import(path):
    try:
        with open(path, "rb") as f:
            source = f.read()
        compile(source, path, "exec")
    except (SyntaxError, ValueError, UnicodeDecodeError) as e:
        raise InitError("build", f"Invalid action: {type(e).__name__}: {e}") from None
    name = f"scad_ow_action_{uuid.uuid4().hex}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # pickling, dataclasses and typing look the module up by name
    try:
        spec.loader.exec_module(module)
    except BaseException as e:  # noqa: BLE001 - a module that exits at import fails init, not the process
        sys.modules.pop(name, None)
        import traceback
        raise InitError("start", "Invalid action: " + "".join(traceback.format_exception(type(e), e, e.__traceback__)).rstrip()) from None
    return module
