"""The compiled twins of the modules every one-sided operation runs through.

scad.connect, scad.rdma, scad.tensor_transport and the helpers they share run Python on every
operation, on both sides. The build compiles those same source files with Cython (no change to
what they do: annotations are not taken as C types) and puts the extension modules in a tree of
their own beside the disagg module (`scad.compiled/scad/...`), each with a copy of the source it
was made from. A package whose compiled directory is there and whose sources are unchanged since
puts that directory first on its __path__, so that its submodules load compiled; a package edited
since the last build runs its sources (and says so once). An installed scad (pip install) has
the compiled modules beside the sources, where Python prefers them by itself.

SCAD_PURE_PYTHON=1 in the environment runs the sources of a build tree (a debugger then steps
into them); an installed scad has only its compiled modules where Python looks first.
"""
import importlib.machinery
import importlib.util
import logging
import os
from typing import List, Optional

ROOT_NAME = "scad.compiled"  # not an identifier: never imported by name from sys.path
SOURCE_SUFFIX = ".py.source"  # the copy of the source a compiled module was made from

log = logging.getLogger("scad")


def compiled_root() -> Optional[str]:
    """The tree of compiled modules the build made beside the disagg module, if there is one."""
    try:
        spec = importlib.util.find_spec("disagg")  # finds it without importing it
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    root = os.path.join(os.path.dirname(spec.origin), ROOT_NAME)
    return root if os.path.isdir(root) else None


def stale_modules(compiled_dir: str, source_dir: str) -> List[str]:
    """The modules in compiled_dir made from a source that has changed (or gone) since, or whose
    copy of its source is missing (the build writes it last: its module may be older)."""
    entries = os.listdir(compiled_dir)
    copies = {e[: -len(SOURCE_SUFFIX)] for e in entries if e.endswith(SOURCE_SUFFIX)}
    compiled = set()
    for e in entries:
        suffix = next((s for s in importlib.machinery.EXTENSION_SUFFIXES if e.endswith(s)), None)
        # (a module built for another interpreter ends in .so only, its name keeps a dot: not ours)
        if suffix is not None and "." not in e[: -len(suffix)]:
            compiled.add(e[: -len(suffix)])
    stale = sorted(compiled - copies)
    for name in sorted(copies):
        try:
            with open(os.path.join(compiled_dir, name + SOURCE_SUFFIX), "rb") as built, \
                    open(os.path.join(source_dir, name + ".py"), "rb") as now:
                if built.read() != now.read():
                    stale.append(name)
        except OSError:
            stale.append(name)
    return sorted(stale)


def prefer_compiled(package: str, path: List[str], root: Optional[str] = None) -> bool:
    """Puts `package`'s compiled directory ahead of its sources on `path` (the package's
    __path__) when every module in it was made from the sources as they are now. True if it did."""
    if os.environ.get("SCAD_PURE_PYTHON") == "1" or not path:
        return False
    root = compiled_root() if root is None else root
    if root is None:
        return False
    compiled_dir = os.path.join(root, *package.split("."))
    if not os.path.isdir(compiled_dir) or compiled_dir in path:
        return False
    stale = stale_modules(compiled_dir, path[0])
    if stale:
        log.warning("%s: the compiled %s older than the source (%s); running the sources. Rebuild "
                    "(cmake --build build) to compile them again.", package,
                    "module is" if len(stale) == 1 else "modules are", ", ".join(stale))
        return False
    path.insert(0, compiled_dir)
    return True
