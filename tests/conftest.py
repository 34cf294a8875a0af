"""Fixtures for the Python test tiers (helpers live in scadtest.py: conftest modules of several
folders would shadow each other when imported by name)."""
import pytest

from scadtest import Memd, Platform


@pytest.fixture
def memd(tmp_path):
    servers = []

    def start(*extra, **kw):
        m = Memd(tmp_path, *extra, **kw)
        servers.append(m)
        return m

    yield start
    for m in servers:
        m.stop()


@pytest.fixture
def platform(tmp_path):
    p = Platform(tmp_path / "home")
    yield p
    p.stop()
