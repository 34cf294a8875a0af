"""scad.ow_code's unpacking, shared by the action container (/init) and the platform's launcher:
what a zip may not do (climb out of its folder, unpack past the limit), refused before anything
is written, and what it keeps (execute bits)."""
import io
import os
import stat
import zipfile

import pytest

from scad import ow_code


def zip_bytes(entries, compression=zipfile.ZIP_STORED):
    """entries: {name: bytes} or {name: (bytes, mode)}."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression) as z:
        for name, content in entries.items():
            data, mode = content if isinstance(content, tuple) else (content, 0o644)
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFREG | mode) << 16
            info.compress_type = compression
            z.writestr(info, data)
    return buf.getvalue()


@pytest.mark.parametrize("name", ["../escape.py", "/abs.py", "a/../../escape.py", "..\\escape.py"])
def test_an_entry_outside_the_folder_is_refused_before_anything_is_written(tmp_path, name):
    folder = tmp_path / "code"
    folder.mkdir()
    with pytest.raises(ow_code.InitError, match="entry outside its folder") as e:
        ow_code.unpack(zip_bytes({"__main__.py": b"def main(a): return a\n", name: b"x = 1\n"}), str(folder))
    assert e.value.kind == "start"
    assert os.listdir(folder) == []
    assert not (tmp_path / "escape.py").exists()


def test_a_zip_that_unpacks_past_the_limit_is_refused(tmp_path):
    bomb = zip_bytes({"__main__.py": b"def main(a): return a\n", "zeros": bytes(1 << 20)}, zipfile.ZIP_DEFLATED)
    assert len(bomb) < 4096
    with pytest.raises(ow_code.InitError, match="unpacks to more than 65536 bytes"):
        ow_code.unpack(bomb, str(tmp_path), max_bytes=1 << 16)
    assert os.listdir(tmp_path) == []
    assert ow_code.unpack(bomb, str(tmp_path), max_bytes=2 << 20) == str(tmp_path / "__main__.py")
    assert ow_code.MAX_UNPACKED_BYTES == 256 << 20


def test_execute_bits_are_kept_and_exec_is_taken_for_main(tmp_path):
    ow_code.unpack(zip_bytes({"exec": b"def main(a): return a\n", "bin/tool": (b"#!/bin/sh\n", 0o755)}), str(tmp_path))
    assert (tmp_path / "__main__.py").is_file() and not (tmp_path / "exec").exists()
    assert os.access(tmp_path / "bin" / "tool", os.X_OK)
    assert not os.access(tmp_path / "__main__.py", os.X_OK)


def test_what_is_not_a_zip_says_so(tmp_path):
    with pytest.raises(ow_code.InitError, match="not a usable zip file"):
        ow_code.unpack(b"not a zip", str(tmp_path))
    with pytest.raises(ow_code.InitError, match="does not include '__main__.py'"):
        ow_code.unpack(zip_bytes({"main.py": b""}), str(tmp_path))
    with pytest.raises(ow_code.BadRequest, match="cannot decode"):
        ow_code.decode("%%%")
    assert ow_code.decode("  UEsFBgAAAAAAAAAAAAAAAAAAAAAAAA==\n").startswith(b"PK\x05\x06")
