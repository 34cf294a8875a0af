"""An OpenWhisk action's code as /init hands it over, made into a callable main.

Source code ("binary": false) is one Python file. A zip ("binary": true, base64) holds
`__main__.py` beside any modules it imports, and optionally `virtualenv/`, a virtual environment
whose site-packages go on the path (what openwhisk-runtime-python does with activate_this.py).

The module is imported here, once: its globals live as long as the container, as on OpenWhisk.
Failures are InitError with the runtimes' split: code that does not compile is a build failure,
anything after that (an import that raises, no such main) is a start failure.
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
        entry = _unzip(value["code"], folder)
        _activate_virtualenv(folder)
    else:
        entry = os.path.join(folder, "__main__.py")
        with open(entry, "w", encoding="utf-8") as f:
            f.write(value["code"])
    # The zip's other modules (and a source action's neighbours, none) import by plain name.
    if folder not in sys.path:
        sys.path.insert(0, folder)
    module = _import(entry)
    fn = getattr(module, main, None)
    if not callable(fn):
        raise InitError("start", f"Invalid action: the code has no function {main!r}")
    return fn


def _unzip(code, folder):
    try:
        data = base64.b64decode(code, validate=True)
    except (binascii.Error, ValueError) as e:
        raise BadRequest(f"cannot decode the request: {e}") from None
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            # zipfile drops absolute paths and "..": nothing lands outside the folder.
            z.extractall(folder)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError) as e:
        raise InitError("start", f"Invalid action: the binary code is not a usable zip file ({e})") from None
    if os.path.exists(os.path.join(folder, "exec")) and not os.path.exists(os.path.join(folder, "__main__.py")):
        os.rename(os.path.join(folder, "exec"), os.path.join(folder, "__main__.py"))  # the runtimes accept either
    entry = os.path.join(folder, "__main__.py")
    if not os.path.isfile(entry):
        raise InitError("start", "Zip file does not include '__main__.py'.")
    return entry


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
        print(f"scad proxy: the zip's virtualenv is for {found[0]}, this runtime runs {ours}: "
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
    except BaseException as e:  # noqa: BLE001 - a module that exits at import fails init, not the proxy
        sys.modules.pop(name, None)
        import traceback
        raise InitError("start", "Invalid action: " + "".join(traceback.format_exception(type(e), e, e.__traceback__)).rstrip()) from None
    return module
