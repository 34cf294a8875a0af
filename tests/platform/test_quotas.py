"""Per-namespace quotas: memory elements (count and bytes, one page at least each), activations in
flight, and compute instances side by side. A tenant at its quota gets a clear refusal; what it
held is freed when its activations end."""
import pathlib

from scadtest import Gate, Platform, wait_until

APPS = pathlib.Path(__file__).parent / "apps"


def test_elements_past_the_quota_are_refused_and_freed_afterwards(tmp_path):
    p = Platform(tmp_path / "home", extra=["--quotas", "elements=8,memory=1MiB"])
    try:
        assert p.deploy(APPS / "hoard")[0] == 200
        status, rec = p.invoke("hoard")
        assert status == 200, rec
        result = rec["response"]["result"]
        # The manifest's element is the first of 8; every one counts as a page at least.
        assert result["taken"] == 7, result
        assert "quota of memory elements (8 of 8 elements" in result["refused"], result
        assert p.call("GET", "/api/v1/namespaces/_/elements")[1] == []
        status, hosts = p.call("GET", "/api/v1/hosts")
        assert hosts[0]["memory_pool_used"] == 0
        status, rec = p.invoke("hoard", {"most": 3})  # the quota is whole again
        assert status == 200 and rec["response"]["result"] == {"taken": 3, "refused": None}, rec
    finally:
        p.stop()


def test_bytes_count_against_the_quota(tmp_path):
    p = Platform(tmp_path / "home", extra=["--quotas", "elements=100,memory=40KiB"])
    try:
        assert p.deploy(APPS / "hoard")[0] == 200
        status, rec = p.invoke("hoard")
        assert status == 200, rec
        assert rec["response"]["result"]["taken"] == 9  # 10 pages of 4 KiB, the manifest's one included
    finally:
        p.stop()


def test_activations_in_flight_past_the_quota_get_429(tmp_path):
    p = Platform(tmp_path / "home", extra=["--quotas", "activations=2"])
    gate = Gate()
    try:
        assert p.deploy(APPS / "slow")[0] == 200
        ids = []
        for _ in range(2):
            status, body = p.invoke("slow", {"gate": gate.address}, blocking=False)
            assert status == 202
            ids.append(body["activationId"])
        gate.wait_arrivals(2)
        status, body = p.invoke("slow", {"gate": gate.address}, blocking=False)
        assert status == 429 and "quota of 2 activations in flight" in body["error"], body
        gate.open()
        for i in ids:  # their records say when they have ended
            assert wait_until(lambda: p.call("GET", f"/api/v1/namespaces/_/activations/{i}")[1]["end"], 60)
        status, body = p.invoke("slow", {"gate": gate.address}, blocking=False)
        assert status == 202, body
        gate.wait_arrivals(1)
        gate.open()
    finally:
        gate.close()
        p.stop()


def test_an_application_wider_than_the_instance_quota_is_refused(tmp_path):
    p = Platform(tmp_path / "home", extra=["--quotas", "instances=4"])
    try:
        app = tmp_path / "wide"
        app.mkdir()
        (app / "w.py").write_text("def main(args, action): return {}\n")
        (app / "scad.yaml").write_text("name: wide\nelements:\n  a: {kind: compute, code: w.py, parallelism: 3}\n"
                                       "  b: {kind: compute, code: w.py, parallelism: 2}\n")
        status, body = p.deploy(app)
        assert status == 400 and any("runs 5 compute instances side by side" in x for x in body["problems"]), body
        (app / "scad.yaml").write_text("name: wide\nelements:\n  a: {kind: compute, code: w.py, parallelism: 3, "
                                       "dependents: [b]}\n  b: {kind: compute, code: w.py, parallelism: 4}\n")
        assert p.deploy(app)[0] == 200  # one after the other: 4 at most at once
    finally:
        p.stop()
