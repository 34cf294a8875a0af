"""The per-operation modules run compiled (the build's Cython twins of the same sources), a stale
twin is never run, and SCAD_PURE_PYTHON=1 runs the sources."""
import importlib
import importlib.machinery
import logging
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

import scad
import scad.connect
import scad.rdma
import scad.tensor_transport
from scad import _compiled

SOURCES = pathlib.Path(scad.__file__).parent


def is_extension(path):
    return any(str(path).endswith(s) for s in importlib.machinery.EXTENSION_SUFFIXES)


def compiled_modules(root):
    """The modules the build compiled: those with a copy of their source in the compiled tree."""
    names = []
    for copy in pathlib.Path(root).rglob("*" + _compiled.SOURCE_SUFFIX):
        package = ".".join(copy.parent.relative_to(root).parts)
        names.append(f"{package}.{copy.name[: -len(_compiled.SOURCE_SUFFIX)]}")
    return sorted(names)


@pytest.mark.skipif(os.environ.get("SCAD_PURE_PYTHON") == "1", reason="SCAD_PURE_PYTHON=1 asks for the sources")
def test_the_per_operation_modules_load_compiled_from_the_build():
    root = _compiled.compiled_root()
    assert root is not None, "the build made no compiled modules beside the disagg module"
    names = compiled_modules(root)
    for package in ("scad", "scad.connect", "scad.rdma", "scad.tensor_transport"):
        assert any(n.rsplit(".", 1)[0] == package for n in names), f"nothing of {package} compiled"
    for name in names:
        module = importlib.import_module(name)
        assert is_extension(module.__file__) and module.__file__.startswith(root), (name, module.__file__)
    # What the build did not compile still comes from the sources.
    assert scad.connect._errors.__file__ == str(SOURCES / "connect" / "_errors.py")


def fake_root(tmp_path, source_text):
    """A compiled tree for scad.connect whose _passive was made from source_text."""
    d = tmp_path / "scad" / "connect"
    d.mkdir(parents=True)
    (d / "_passive.py.source").write_text(source_text)
    return str(tmp_path)


def test_a_package_whose_sources_match_puts_its_compiled_directory_first(tmp_path, monkeypatch):
    monkeypatch.delenv("SCAD_PURE_PYTHON", raising=False)
    root = fake_root(tmp_path, (SOURCES / "connect" / "_passive.py").read_text())
    path = [str(SOURCES / "connect")]
    assert _compiled.prefer_compiled("scad.connect", path, root=root)
    assert path == [os.path.join(root, "scad", "connect"), str(SOURCES / "connect")]
    assert not _compiled.prefer_compiled("scad.connect", path, root=root)  # once only
    assert len(path) == 2


def test_an_edited_source_runs_as_source_and_says_why(tmp_path, caplog, monkeypatch):
    monkeypatch.delenv("SCAD_PURE_PYTHON", raising=False)
    root = fake_root(tmp_path, (SOURCES / "connect" / "_passive.py").read_text() + "# edited since\n")
    path = [str(SOURCES / "connect")]
    with caplog.at_level(logging.WARNING, logger="scad"):
        assert not _compiled.prefer_compiled("scad.connect", path, root=root)
    assert path == [str(SOURCES / "connect")]
    assert "_passive" in caplog.text and "cmake --build" in caplog.text


def test_a_compiled_module_without_its_copy_counts_as_changed(tmp_path):
    # The build writes the copy last: a module without one may be older than its source.
    root = fake_root(tmp_path, (SOURCES / "connect" / "_passive.py").read_text())
    compiled_dir = tmp_path / "scad" / "connect"
    (compiled_dir / ("_active" + importlib.machinery.EXTENSION_SUFFIXES[0])).write_bytes(b"")
    (compiled_dir / "_passive.cpython-0-other.so").write_bytes(b"")  # another interpreter's: not looked at
    assert _compiled.stale_modules(str(compiled_dir), str(SOURCES / "connect")) == ["_active"]


def test_a_source_that_is_gone_counts_as_changed(tmp_path):
    root = fake_root(tmp_path, "x = 1\n")
    shutil.copy(SOURCES / "connect" / "_passive.py", tmp_path / "scad" / "connect" / "_gone.py.source")
    assert _compiled.stale_modules(os.path.join(root, "scad", "connect"), str(SOURCES / "connect")) == ["_gone", "_passive"]


def test_pure_python_on_request_runs_the_sources_and_works():
    code = ("import scad.connect as c, scad.connect._passive as p, scad._waiter as w\n"
            "import numpy\n"
            "assert p.__file__.endswith('.py') and w.__file__.endswith('.py'), (p.__file__, w.__file__)\n"
            "op = c.Connector().create_readable(c.Descriptor(numpy.zeros(8, dtype=numpy.uint8)))\n"
            "md = c.RdmaMetadata.from_json(op.metadata().to_json())\n"
            "assert md.descriptors[0].size == 8\n"
            "op.cancel()\n"
            "print('ok')\n")
    env = dict(os.environ, SCAD_PURE_PYTHON="1", PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
