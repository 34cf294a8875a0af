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


@pytest.fixture
def runtime(monkeypatch):
    """A test runtime endpoint (tests/python/runtime_server.py) that action.runtime reaches."""
    from runtime_server import RuntimeEndpoint  # beside the binding's tests, which use it

    rt = RuntimeEndpoint()
    monkeypatch.setenv("SCAD_RUNTIME_URL", rt.url)
    monkeypatch.setenv("SCAD_RUNTIME_TOKEN", rt.token)
    yield rt
    rt.close()
