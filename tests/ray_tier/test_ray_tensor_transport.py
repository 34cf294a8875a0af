"""scad.tensor_transport registered with a real Ray: a local cluster on 127.0.0.1, the transport
registered (ray.experimental.register_tensor_transport) before the actor classes are defined,
actors with enable_tensor_transport=True and a method with tensor_transport="scad". Arrays move
between two actors (and to and from the driver); the data is checked, and the transport's counters
in the processes involved show that it moved them, not Ray's object store (which holds only the
placeholder Ray serialised in their place).

numpy arrays always; CPU torch tensors where torch is installed. Without Ray the tests are skipped,
unless SCAD_REQUIRE_RAY=1 (scripts/test sets it), which makes a missing Ray a failure; likewise
SCAD_REQUIRE_TORCH=1 for torch.
"""
import gc
import inspect
import os
import select
import shutil
import signal
import tempfile

import numpy
import pytest

from scadtest import BUILD, ROOT

if os.environ.get("SCAD_REQUIRE_RAY") == "1":
    import ray  # a missing Ray fails the tier instead of skipping it
else:
    ray = pytest.importorskip("ray")

from ray_actors import define_actors, digest, make_array  # noqa: E402
from scad.tensor_transport import ScadTensorTransport  # noqa: E402

MiB = 1 << 20
HERE = os.path.dirname(os.path.abspath(__file__))


def _torch():
    if os.environ.get("SCAD_REQUIRE_TORCH") == "1":
        import torch
        return torch
    return pytest.importorskip("torch")


@pytest.fixture(scope="module")
def cluster():
    """A Ray cluster of this machine only, on 127.0.0.1, with the transport registered."""
    temp = tempfile.mkdtemp(prefix="scad-ray-")  # short: Ray's unix sockets live below it
    try:
        with pytest.MonkeyPatch.context() as mp:
            # Ray's switch for a cluster that never leaves the machine: every address 127.0.0.1.
            # Read by the processes Ray starts, and by this one (ray_constants) when it picks the
            # node's.
            mp.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
            mp.setattr(ray._private.ray_constants, "ENABLE_RAY_CLUSTER", False)
            paths = [str(BUILD / "python"), str(ROOT / "bindings" / "python"), HERE, os.environ.get("PYTHONPATH", "")]
            mp.setenv("PYTHONPATH", os.pathsep.join(p for p in paths if p))  # what the workers import
            # The workers' temporary files (their memory servers' unix sockets, which a killed
            # actor leaves behind) go where Ray's own do, and are removed with them.
            mp.setenv("TMPDIR", temp)
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _temp_dir=temp)
            try:
                assert ray.util.get_node_ip_address() == "127.0.0.1"
                ray.experimental.register_tensor_transport("scad", ["cpu"], ScadTensorTransport, numpy.ndarray)
                actors = {"scad": define_actors("scad")}
                try:
                    torch = __import__("torch")
                except ImportError:
                    pass
                else:
                    ray.experimental.register_tensor_transport("scad_torch", ["cpu"], ScadTensorTransport,
                                                               torch.Tensor)
                    actors["scad_torch"] = define_actors("scad_torch")
                yield actors
            finally:
                ray.shutdown()
    finally:
        shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture
def pair(cluster):
    """pair(transport="scad", sinks=1): a source actor and sink actors, each a process of its own."""
    made = []

    def make(transport="scad", sinks=1):
        Source, Sink = cluster[transport]
        actors = [Source.remote()] + [Sink.remote() for _ in range(sinks)]
        made.extend(actors)
        ray.get([a.counters.remote() for a in actors])  # all running
        return actors

    yield make
    for actor in made:
        ray.kill(actor)


def moved(after, before):
    return {k: after[k] - before[k] for k in after}


def wait_gone(pid):
    """Returns once the process has exited (pidfd: no polling)."""
    fd = os.pidfd_open(pid)
    try:
        ready, _, _ = select.select([fd], [], [], 30)
        assert ready, f"process {pid} did not exit"
    finally:
        os.close(fd)


def test_the_class_is_rays_interface_as_this_ray_declares_it():
    from ray.experimental import CommunicatorMetadata, TensorTransportManager, TensorTransportMetadata
    from ray.experimental.rdt.tensor_transport_manager import FetchRequest
    from scad.tensor_transport import _manager, _metadata

    assert issubclass(ScadTensorTransport, TensorTransportManager) and not ScadTensorTransport.__abstractmethods__
    assert issubclass(_metadata.ScadTransportMetadata, TensorTransportMetadata)
    assert issubclass(_metadata.ScadCommunicatorMetadata, CommunicatorMetadata)
    assert issubclass(_manager.ScadFetchRequest, FetchRequest)
    for name, declared in inspect.getmembers(TensorTransportManager, inspect.isfunction):
        if not name.startswith("_"):  # every method by the names and in the order Ray passes them
            ours = getattr(ScadTensorTransport, name)
            assert list(inspect.signature(ours).parameters) == list(inspect.signature(declared).parameters), name
            assert isinstance(inspect.getattr_static(ScadTensorTransport, name), staticmethod) == \
                isinstance(inspect.getattr_static(TensorTransportManager, name), staticmethod), name


SPECS = [((1024, 1024), "float32", 1), ((3, 5, 7), "int64", 2), ((0,), "float64", 3), ((4096,), "uint8", 4),
         ((257,), "float16", 5), ((64,), "bool", 6)]


def expected(specs):
    return [digest(make_array(shape, dtype, seed)) for shape, dtype, seed in specs]


def test_arrays_move_between_two_actors_through_the_transport(pair):
    src, dst = pair()
    ref = src.make.remote(SPECS)
    got = ray.get(dst.describe.remote(ref))
    assert got["step"] == 7
    assert got["digests"] == expected(SPECS)
    assert got["dtypes"] == [dtype for _, dtype, _ in SPECS]
    assert got["shapes"] == [list(shape) for shape, _, _ in SPECS]
    assert all(got["writeable"]), "arrays from Ray's object store would be read-only views of it"

    size = sum(make_array(*spec).nbytes for spec in SPECS)
    lent, received = ray.get(src.counters.remote()), got["counters"]
    assert (lent["lent_objects"], lent["lent_tensors"], lent["lent_bytes"]) == (1, len(SPECS), size)
    assert (received["received_objects"], received["received_tensors"], received["received_bytes"]) == (1, 5, size)
    # Two actors of one host: libd's shm, the object's tensors lent as one list and read with one
    # transfer (the empty array moves nothing).
    assert received["shm_reads"] == 1
    # What Ray stored for the object is its placeholder, not the 4 MiB it stands for.
    assert ray.experimental.get_object_locations([ref])[ref]["object_size"] < 16 * 1024 < size


def test_every_destination_reads_the_object_itself(pair):
    src, dst, other = pair(sinks=2)
    ref = src.make.remote(SPECS[:2])
    first, second = ray.get([dst.describe.remote(ref), other.describe.remote(ref)])
    assert first["digests"] == second["digests"] == expected(SPECS[:2])
    assert first["counters"]["received_objects"] == second["counters"]["received_objects"] == 1
    assert ray.get(src.counters.remote())["lent_objects"] == 1, "lent once, read twice"


def test_the_driver_gets_and_puts_through_the_transport(pair):
    src, dst = pair()
    before = ScadTensorTransport.counters()
    obj = ray.get(src.make.remote(SPECS[:1]))
    assert [digest(t) for t in obj["tensors"]] == expected(SPECS[:1])
    array = make_array((512, 512), "int32", 9)
    put = ray.get(dst.describe.remote(ray.put({"tensors": [array], "step": 7}, _tensor_transport="scad")))
    assert put["digests"] == [digest(array)] and put["counters"]["received_bytes"] == array.nbytes
    d = moved(ScadTensorTransport.counters(), before)
    assert (d["received_objects"], d["received_bytes"], d["lent_objects"], d["lent_bytes"]) == (1, 4 * MiB, 1, array.nbytes)


def test_the_loan_ends_when_ray_frees_the_object(pair):
    src, dst = pair()
    ref = src.make.remote(SPECS[:2])
    assert ray.get(dst.describe.remote(ref))["digests"] == expected(SPECS[:2])
    assert ray.get(src.counters.remote())["released_objects"] == 0
    del ref  # the last reference: Ray has the source garbage-collect the object
    assert ray.get(src.wait_freed.remote())["released_objects"] == 1


def test_a_source_that_is_gone_fails_the_receive(pair):
    src, dst = pair()
    ref = src.make.remote(SPECS[:1])
    ray.wait([ref], fetch_local=False)  # lent (a local copy would start the receive)
    pid = ray.get(src.pid.remote())
    os.kill(pid, signal.SIGKILL)
    wait_gone(pid)
    with pytest.raises(ConnectionError, match="cannot reach the buffer's owner"):
        ray.get(dst.describe.remote(ref))
    assert ray.get(dst.counters.remote())["failed_receives"] == 1
    with pytest.raises(ConnectionError, match="cannot reach the buffer's owner"):
        ray.get(ref)  # the driver: the same


def test_a_get_that_times_out_leaves_nothing_behind(pair):
    src, _ = pair()
    ref = src.make.remote(SPECS[:1])
    ray.wait([ref], fetch_local=False)  # lent (a local copy would start the receive)
    pid = ray.get(src.pid.remote())
    before = ScadTensorTransport.counters()
    os.kill(pid, signal.SIGSTOP)  # the source cannot answer: the receive cannot finish
    try:
        with pytest.raises(ray.exceptions.GetTimeoutError):
            ray.get(ref, timeout=0.5)
        gc.collect()  # Ray has dropped its fetch request: the receive is cancelled
    finally:
        os.kill(pid, signal.SIGCONT)
    obj = ray.get(ref)  # a fetch of its own, once the cancelled one has ended
    assert [digest(t) for t in obj["tensors"]] == expected(SPECS[:1])
    d = moved(ScadTensorTransport.counters(), before)
    assert (d["failed_receives"], d["received_objects"]) == (1, 1), d


def test_cpu_torch_tensors_move_between_two_actors(pair):
    torch = _torch()
    src, dst = pair("scad_torch")
    specs = SPECS[:2] + SPECS[3:4]
    for dtype in ("float32", "bfloat16", "int64"):
        got = ray.get(dst.describe.remote(src.make.remote(specs, dtype)))
        assert got["torch"] == [f"torch.{dtype}"] * len(specs)
        want = [digest(torch.from_numpy(make_array(*s)).to(getattr(torch, dtype)).to(torch.float64).numpy())
                for s in specs]
        assert got["digests"] == want
    assert got["counters"]["received_objects"] == 3 and got["counters"]["shm_reads"] == 3  # a list read per object
