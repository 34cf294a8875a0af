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
        for i in ids:  # their records are found once they have ended
            assert wait_until(lambda: p.call("GET", f"/api/v1/namespaces/_/activations/{i}")[0] == 200, 60)
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


def server_threads(p):
    with open(f"/proc/{p.proc.pid}/status") as f:
        return int(next(line for line in f if line.startswith("Threads:")).split()[1])


def test_a_wide_application_runs_on_a_bounded_number_of_threads(platform, tmp_path):
    import threading
    app = tmp_path / "wide"
    app.mkdir()
    (app / "w.py").write_text("def main(args, action): return args['_instance']\n")
    (app / "scad.yaml").write_text("name: wide\nelements:\n  w: {kind: compute, code: w.py, parallelism: 160}\n")
    assert platform.deploy(app)[0] == 200
    peak, stop = [0], threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], server_threads(platform))
            stop.wait(0.005)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        status, rec = platform.invoke("wide")
    finally:
        stop.set()
        sampler.join()
    assert status == 200 and sorted(rec["response"]["result"]["result"]) == list(range(160)), rec["response"]
    # 32 API + 16 runtime endpoint + 64 instance threads, and a few of the platform's own.
    assert peak[0] < 140, peak[0]


def test_blocking_invokes_past_the_cap_are_answered_at_once(platform):
    import threading
    assert platform.deploy(APPS / "slow")[0] == 200
    gate = Gate()
    answers, lock = [], threading.Lock()

    def invoke():
        status, body = platform.invoke("slow", {"gate": gate.address})
        with lock:
            answers.append(status)

    callers = [threading.Thread(target=invoke) for _ in range(20)]
    for c in callers:
        c.start()
    try:
        # 16 callers wait for their activations; the other 4 have their ids at once.
        assert wait_until(lambda: len(answers) == 4, 30), answers
        assert answers == [202] * 4
        releasing = threading.Event()

        def release_all():  # every activation that arrives may end at once
            while not releasing.is_set():
                try:
                    gate.wait_arrivals(1, timeout=0.2)
                except OSError:
                    continue
                gate.open()

        releaser = threading.Thread(target=release_all)
        releaser.start()
        for c in callers:
            c.join(120)
        releasing.set()
        releaser.join()
        assert sorted(answers) == [200] * 16 + [202] * 4, answers
    finally:
        gate.close()
