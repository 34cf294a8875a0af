"""scad.tensor_transport between two real processes in the roles Ray gives them: the source actor
lends an object's tensors, the destination receives them (tests/python/tensor_peer.py)."""
import hashlib
import os

import numpy
import pytest

from peer_process import PeerProc, assert_a_thousand_leak_nothing
from scadtest import needs_torch, wait_until
from scad.tensor_transport import ScadTensorTransport
from scad.tensor_transport._metadata import ScadTransportMetadata

PEER = os.path.join(os.path.dirname(__file__), "tensor_peer.py")


def _has_rdma_device():
    try:
        return bool(os.listdir("/sys/class/infiniband"))
    except OSError:
        return False
# None: the manager's own choice (shm on this host); verbs forced where there is a device (the
# Soft-RoCE guest: tests/softroce/run).
TRANSPORTS = [None, "tcp"] + (["verbs"] if os.environ.get("LIBD_REQUIRE_VERBS") or _has_rdma_device() else [])
SHAPES = [[64, 64], [1000], [0], [3, 5, 7]]
DTYPES = ["float32", "int64", "float64", "uint8"]


@pytest.fixture
def actors(request):
    src, dst = PeerProc(PEER, request.param), PeerProc(PEER, request.param)
    src.transport = dst.transport = request.param
    yield src, dst
    src.close()
    dst.close()


def ok(reply):
    assert "error" not in reply, reply
    return reply


@pytest.mark.parametrize("actors", TRANSPORTS, indirect=True)
@pytest.mark.parametrize("into", [False, True])
def test_the_destination_receives_every_tensor_of_an_object(actors, into):
    src, dst = actors
    lent = ok(src.call(cmd="lend", obj="o1", shapes=SHAPES, dtypes=DTYPES, seed=1))
    got = ok(dst.call(cmd="recv", obj="o1", meta=lent["meta"], into=into))
    assert got["digests"] == lent["digests"]
    assert got["dtypes"] == DTYPES
    assert got["same"] is into, "given target buffers are filled in place, not replaced"
    again = ok(dst.call(cmd="recv", obj="o1", meta=lent["meta"]))  # one-sided: read as often as needed
    assert again["digests"] == lent["digests"]


@pytest.mark.parametrize("actors", TRANSPORTS, indirect=True)
def test_garbage_collection_ends_the_loan(actors):
    src, dst = actors
    lent = ok(src.call(cmd="lend", obj="o2", shapes=[[128]], dtypes=["int32"], seed=2))
    assert ok(src.call(cmd="gc", obj="o2"))["ok"]
    r = dst.call(cmd="recv", obj="o2", meta=lent["meta"])
    assert r["error"] == "PermissionError" and "dropped or expired" in r["message"], r


@pytest.mark.parametrize("actors", [None], indirect=True)
def test_a_source_that_is_gone_is_an_error(actors):
    src, dst = actors
    lent = ok(src.call(cmd="lend", obj="o3", shapes=[[16]], dtypes=["float32"], seed=3))
    src.kill()
    r = dst.call(cmd="recv", obj="o3", meta=lent["meta"])
    assert r["error"] == "ConnectionError", r


def test_targets_that_do_not_match_the_tensors_one_by_one_are_refused():
    t = ScadTensorTransport()
    lent = [numpy.arange(4, dtype=numpy.int32), numpy.arange(12, dtype=numpy.int32)]  # 16 and 48 bytes
    meta = t.extract_tensor_transport_metadata("sizes", lent)
    try:
        swapped = [numpy.zeros(12, dtype=numpy.int32), numpy.zeros(4, dtype=numpy.int32)]  # the same 64 bytes
        with pytest.raises(ValueError, match="a target of 48 bytes for tensor 0"):
            t.recv_multiple_tensors("sizes", meta, t.get_communicator_metadata(), target_buffers=swapped)
        assert not swapped[0].any() and not swapped[1].any(), "nothing was read into them"
        got = t.recv_multiple_tensors("sizes", meta, t.get_communicator_metadata())
        assert [g.tolist() for g in got] == [a.tolist() for a in lent]
    finally:
        t.garbage_collect("sizes", meta)
    # An empty tensor among them: targets in the wrong order are refused though the non-empty
    # ones would add up.
    lent = [numpy.arange(4, dtype=numpy.int32), numpy.zeros(0, dtype=numpy.int32), numpy.arange(12, dtype=numpy.int32)]
    meta = t.extract_tensor_transport_metadata("empty", lent)
    try:
        shifted = [numpy.zeros(4, dtype=numpy.int32), numpy.zeros(12, dtype=numpy.int32), numpy.zeros(0, dtype=numpy.int32)]
        with pytest.raises(ValueError, match="a target of 48 bytes for tensor 1 of 0"):
            t.recv_multiple_tensors("empty", meta, t.get_communicator_metadata(), target_buffers=shifted)
    finally:
        t.garbage_collect("empty", meta)


def test_a_lone_tensors_target_that_does_not_fit_is_refused_and_nothing_is_left_behind():
    """An object of one tensor into a given array: the wrong size, a read-only array, a strided
    view and an array of Python objects are each refused with what is wrong, the array untouched;
    a fitting one is filled in place, and the receive leaves no record of itself (nothing listed
    for abort_transport, no route held)."""
    t = ScadTensorTransport()
    lent = numpy.arange(16, dtype=numpy.float32)
    meta = t.extract_tensor_transport_metadata("lone", [lent])
    try:
        t.recv_multiple_tensors("lone", meta, t.get_communicator_metadata())  # the owner's server reached
        small = numpy.zeros(8, dtype=numpy.float32)
        with pytest.raises(ValueError, match="a target of 32 bytes for tensor 0 of 64"):
            t.recv_multiple_tensors("lone", meta, t.get_communicator_metadata(), target_buffers=[small])
        frozen = numpy.zeros(16, dtype=numpy.float32)
        frozen.flags.writeable = False
        with pytest.raises(ValueError, match="read-only"):
            t.recv_multiple_tensors("lone", meta, t.get_communicator_metadata(), target_buffers=[frozen])
        strided = numpy.zeros(32, dtype=numpy.float32)[::2]
        with pytest.raises(ValueError, match="C-contiguous"):
            t.recv_multiple_tensors("lone", meta, t.get_communicator_metadata(), target_buffers=[strided])
        objects = numpy.empty(16, dtype=object)
        with pytest.raises(TypeError, match="Python objects"):
            t.recv_multiple_tensors("lone", meta, t.get_communicator_metadata(), target_buffers=[objects])
        assert not small.any() and not frozen.any() and not strided.any()
        into = numpy.zeros(16, dtype=numpy.float32)
        got = t.recv_multiple_tensors("lone", meta, t.get_communicator_metadata(), target_buffers=[into])
        assert got[0] is into and (into == lent).all()
        assert not t._receiving and not t._routes
    finally:
        t.garbage_collect("lone", meta)


@pytest.mark.parametrize("tensors", [1, 3])
def test_a_source_whose_keys_cannot_be_made_lends_nothing(monkeypatch, tensors):
    """The buffers' keys are made as their records are written: a failure there takes back
    everything lent for the object (Ray would get no metadata to garbage-collect it with).
    Several tensors are lent a buffer each here, as where the server serves verbs."""
    from scad.rdma import RdmaManager
    manager = RdmaManager.get()
    t = ScadTensorTransport()
    lent = [numpy.arange(16 * (i + 1), dtype=numpy.uint8) for i in range(tensors)]
    before = manager.regions()
    monkeypatch.setattr(RdmaManager, "_request_list", lambda self, memories, required=False: None)
    made = []
    real = RdmaManager._grant_locked

    def failing_last(self, element, offset, size, rights, ttl=None):
        made.append(element)
        if len(made) == tensors:
            raise OSError(5, "the server is gone")
        return real(self, element, offset, size, rights, ttl)

    monkeypatch.setattr(RdmaManager, "_grant_locked", failing_last)
    with pytest.raises(OSError, match="the server is gone"):
        t.extract_tensor_transport_metadata("no-keys", lent)
    assert len(made) == tensors and manager.regions() == before and "no-keys" not in t._lent
    monkeypatch.setattr(RdmaManager, "_grant_locked", real)
    meta = t.extract_tensor_transport_metadata("keys", lent)
    assert [g.tolist() for g in t.recv_multiple_tensors("keys", meta, t.get_communicator_metadata())] == \
        [a.tolist() for a in lent]
    t.garbage_collect("keys", meta)
    assert manager.regions() == before


def test_a_receive_of_one_tensor_is_one_transfer_of_its_own_that_leaves_no_link(monkeypatch):
    """Once the owner's server was reached, an object of one tensor is received with one transfer
    made for it (on a transport of its own, named by RdmaManager._one_shot_durl): the right
    bytes, a read counted, no link kept or parked for its buffer; a loan ended before the
    receive is refused on that path too."""
    from scad.rdma import RdmaManager
    manager = RdmaManager.get()
    t = ScadTensorTransport()
    made = []
    real = RdmaManager._one_shot_durl

    def counting(self, grant, *args, **kwargs):
        made.append(grant)
        return real(self, grant, *args, **kwargs)

    monkeypatch.setattr(RdmaManager, "_one_shot_durl", counting)

    def linked(grant):  # a link kept for the grant's buffer (a link's route ends with its grant)
        return any(route[3] == grant for route in manager._links)

    first = numpy.arange(64, dtype=numpy.float32)
    meta = t.extract_tensor_transport_metadata("one-0", [first])
    t.recv_multiple_tensors("one-0", meta, t.get_communicator_metadata())  # the server reached (perhaps now)
    t.garbage_collect("one-0", meta)
    made.clear()
    for i in range(1, 4):
        lent = numpy.arange(1000, dtype=numpy.int64) * i
        meta = t.extract_tensor_transport_metadata(f"one-{i}", [lent])
        before = t.counters()
        idle = sum(len(v) for v in manager._idle_links.values())
        got = t.recv_multiple_tensors(f"one-{i}", meta, t.get_communicator_metadata())
        after = t.counters()
        assert got[0].dtype == lent.dtype and (got[0] == lent).all()
        assert len(made) == i, "one transfer of its own per receive"
        assert not linked(made[-1]) and sum(len(v) for v in manager._idle_links.values()) == idle
        moved = {k: after[k] - before[k] for k in after}
        assert moved["received_objects"] == 1 and moved["received_bytes"] == lent.nbytes
        assert moved["shm_reads"] + moved["tcp_reads"] == 1 and moved["failed_receives"] == 0
        t.garbage_collect(f"one-{i}", meta)
    # The loan ended: the key is refused, and the receive says so.
    lent = numpy.ones(16, dtype=numpy.uint8)
    meta = t.extract_tensor_transport_metadata("one-gone", [lent])
    t.garbage_collect("one-gone", meta)
    with pytest.raises(PermissionError, match="refused"):
        t.recv_multiple_tensors("one-gone", meta, t.get_communicator_metadata())
    assert len(made) == 4 and not linked(made[-1]) and t.counters()["failed_receives"] >= 1


def test_the_interface_says_what_ray_asks():
    t = ScadTensorTransport()
    assert t.tensor_transport_backend() == "SCAD"
    assert ScadTensorTransport.is_one_sided() and ScadTensorTransport.can_abort_transport()
    assert t.actor_has_tensor_transport(object())
    t.send_multiple_tensors([], None, t.get_communicator_metadata())  # one-sided: nothing to send
    with pytest.raises(TypeError, match="torch tensors and numpy arrays"):
        t.extract_tensor_transport_metadata("x", [[1, 2, 3]])
    with pytest.raises(TypeError, match="Python objects"):
        t.extract_tensor_transport_metadata("x", [numpy.array([object()])])
    with pytest.raises(ValueError, match="C-contiguous"):
        t.extract_tensor_transport_metadata("x", [numpy.zeros((4, 4))[:, 1]])
    assert ScadTensorTransport(timeout=5)._timeout == 5
    assert type("Quick", (ScadTensorTransport,), {"timeout": 2.0})()._timeout == 2.0  # how Ray is given a timeout
    assert type("Spin", (ScadTensorTransport,), {"busy_poll_us": 200})()._busy_poll_us == 200.0
    with pytest.raises(ValueError, match="busy_poll_us"):
        ScadTensorTransport(busy_poll_us=-1)


class SlottedMetadata(ScadTransportMetadata):
    """A subclass with a slot of its own (pickled by reference: defined at module level)."""

    __slots__ = ("extra",)


def test_the_metadata_pickles_as_its_fields_and_comes_back_the_same():
    import pickle

    from scad.tensor_transport._metadata import _rebuild, _rebuild_one

    plain = [numpy.dtype(d) for d in ("float32", ">i8", "bool", "complex64", "uint8", "<f2")]
    meta = ScadTransportMetadata(tensor_meta=[((2, i + 1), d) for i, d in enumerate(plain)], tensor_device="cpu",
                                 buffers=['{"a":1}', ""], lent_list="")
    data = pickle.dumps(meta)
    assert b"numpy" not in data, "plain dtypes travel by name"
    back = pickle.loads(data)
    assert type(back) is ScadTransportMetadata and back == meta
    assert [d.str for _, d in back.tensor_meta] == [d.str for d in plain], "byte order and size kept"
    # One tensor through one buffer (the common record) goes flat, and comes back the same.
    for dtype in plain:
        one = ScadTransportMetadata(tensor_meta=[((3, 2), dtype)], tensor_device="cpu", buffers=['{"b":2}'])
        data = pickle.dumps(one)
        assert b"_rebuild_one" in data and b"numpy" not in data
        back = pickle.loads(data)
        assert type(back) is ScadTransportMetadata and back == one and back.tensor_meta[0][1].str == dtype.str
    # A structured dtype travels as itself, and so does a record with an attribute of its own.
    odd = ScadTransportMetadata(tensor_meta=[((3,), numpy.dtype([("a", "<i4"), ("b", "<f8")]))], buffers=[""])
    odd.note = "kept"
    back = pickle.loads(pickle.dumps(odd))
    assert back.tensor_meta == odd.tensor_meta and back.tensor_meta[0][1].names == ("a", "b") and back.note == "kept"

    # Records extract does not make pickle as a dataclass does, and come back as they were: dtypes
    # given as strings, shapes in a tuple, no shapes at all, a subclass with slots of its own.
    for other in (ScadTransportMetadata(tensor_meta=[((4,), "float32")], tensor_device="cpu", buffers=[""]),
                  ScadTransportMetadata(tensor_meta=(((4,), numpy.dtype("f4")),), buffers=[""]),
                  ScadTransportMetadata(tensor_meta=None)):
        for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
            back = pickle.loads(pickle.dumps(other, protocol))
            assert back == other and type(back.tensor_meta) is type(other.tensor_meta)
        assert back.tensor_meta is None or type(back.tensor_meta[0][1]) is type(other.tensor_meta[0][1])

    slotted = SlottedMetadata(tensor_meta=[((1,), numpy.dtype("u1"))], buffers=[""])
    slotted.extra = 9
    back = pickle.loads(pickle.dumps(slotted))
    assert type(back) is SlottedMetadata and back.extra == 9 and back == slotted

    class Forged:  # a record whose dtype name is not a plain numpy dtype's
        def __init__(self, name):
            self.name = name

        def __reduce__(self):
            return (_rebuild, ([((1,), self.name)], "cpu", [""], ""))

    class ForgedOne(Forged):
        def __reduce__(self):
            return (_rebuild_one, ((1,), self.name, "cpu", ""))

    for name in ("O", "V8", "(2,)i4", "<U4", "no such dtype", "foo", "(2,", "\x00", "float32", "f4", "i4,i4"):
        for forged in (Forged(name), ForgedOne(name)):
            with pytest.raises(ValueError, match="not a plain numpy dtype"):
                pickle.loads(pickle.dumps(forged))


@pytest.mark.parametrize("actors", TRANSPORTS, indirect=True)
def test_the_counters_say_what_moved_and_how(actors):
    src, dst = actors
    lent = ok(src.call(cmd="lend", obj="o4", shapes=SHAPES, dtypes=DTYPES, seed=4))
    size = sum(numpy.zeros(s, d).nbytes for s, d in zip(SHAPES, DTYPES))
    ok(dst.call(cmd="recv", obj="o4", meta=lent["meta"]))
    ok(src.call(cmd="gc", obj="o4"))
    ok(src.call(cmd="gc", obj="o4"))  # a second time: nothing was lent any more
    s, d = ok(src.call(cmd="counters")), ok(dst.call(cmd="counters"))
    assert (s["lent_objects"], s["lent_tensors"], s["lent_bytes"], s["released_objects"]) == (1, 4, size, 1)
    assert (d["received_objects"], d["received_tensors"], d["received_bytes"], d["failed_receives"]) == (1, 3, size, 0)
    # The empty tensor moves nothing; the others were lent as one list and are read with one
    # transfer (a transfer each where the source serves RDMA verbs), over shm on one host unless
    # tcp is forced.
    reads = 3 if _has_rdma_device() else 1
    assert d[f"{src.transport or 'shm'}_reads"] == reads, d


@pytest.mark.parametrize("actors", [None], indirect=True)
def test_a_fetch_runs_until_it_is_waited_for_and_an_abort_cancels_it(actors):
    src, dst = actors
    lent = ok(src.call(cmd="lend", obj="o5", shapes=[[4096]], dtypes=["float64"], seed=5))
    ok(src.call(cmd="stop"))
    src.wait_stopped()  # the source cannot answer: a receive cannot finish
    assert ok(dst.call(cmd="fetch", obj="o5", meta=lent["meta"], into=True, poll=0.2))["pending"]
    ok(dst.call(cmd="abort", obj="o5"))
    src.resume()
    r = dst.call(cmd="wait", obj="o5")
    assert r["error"] == "ConnectionAbortedError", r
    zeros = numpy.zeros(4096, numpy.float64)
    assert r["targets"] == [hashlib.sha256(zeros.tobytes()).hexdigest()], "an aborted receive wrote its target"
    assert ok(dst.call(cmd="counters"))["failed_receives"] == 1
    # The loan stays: the destination, or another, may read the object again.
    assert ok(dst.call(cmd="recv", obj="o5", meta=lent["meta"]))["digests"] == lent["digests"]


@pytest.mark.parametrize("actors", ["tcp"], indirect=True)
def test_an_abort_ends_a_receive_waiting_in_its_own_read(actors):
    """A receive of one tensor from an owner reached before is one read of its own, waited for
    in libd in the caller's thread: abort_transport from another thread ends it, and its target
    is not written, though the owner answers afterwards."""
    src, dst = actors
    first = ok(src.call(cmd="lend", obj="a0", shapes=[[16]], dtypes=["float64"], seed=10))
    assert ok(dst.call(cmd="recv", obj="a0", meta=first["meta"]))["digests"] == first["digests"]  # reached
    lent = ok(src.call(cmd="lend", obj="a1", shapes=[[4096]], dtypes=["int64"], seed=11))
    ok(src.call(cmd="stop"))
    src.wait_stopped()  # its server does not answer now
    assert ok(dst.call(cmd="recv_aside", obj="a1", meta=lent["meta"]))["running"]
    before = ok(dst.call(cmd="counters"))
    ok(dst.call(cmd="abort", obj="a1"))
    src.resume()
    r = dst.call(cmd="joined", obj="a1")
    assert r.get("error") == "ConnectionAbortedError" and "was aborted" in r["message"], r
    zeros = numpy.zeros(4096, numpy.int64)
    assert r["targets"] == [hashlib.sha256(zeros.tobytes()).hexdigest()], "an aborted receive wrote its target"
    after = ok(dst.call(cmd="counters"))
    assert after["failed_receives"] == before["failed_receives"] + 1
    assert after["received_objects"] == before["received_objects"]
    # The loan stays, and the next receive of the object goes through.
    assert ok(dst.call(cmd="recv", obj="a1", meta=lent["meta"]))["digests"] == lent["digests"]


@pytest.mark.parametrize("actors", [None], indirect=True)
def test_a_fetch_not_finished_within_a_wait_goes_on(actors):
    src, dst = actors
    lent = ok(src.call(cmd="lend", obj="o6", shapes=[[4096]], dtypes=["int32"], seed=6))
    ok(src.call(cmd="stop"))
    src.wait_stopped()
    assert ok(dst.call(cmd="fetch", obj="o6", meta=lent["meta"], into=True, poll=0.2))["pending"]
    src.resume()
    r = ok(dst.call(cmd="wait", obj="o6"))
    assert r["digests"] == lent["digests"] and r["same"]


MiB = 1 << 20


@pytest.mark.parametrize("actors", TRANSPORTS, indirect=True)
def test_a_thousand_objects_lent_received_and_collected_leak_neither_memory_nor_descriptors(actors):
    src, dst = actors
    count = [0]

    def one():
        obj = f"loop-{count[0]}"
        lent = ok(src.call(cmd="lend", obj=obj, shapes=[[256], [16]], dtypes=["float32", "int64"], seed=count[0]))
        assert ok(dst.call(cmd="recv", obj=obj, meta=lent["meta"], into=True))["digests"] == lent["digests"]
        ok(src.call(cmd="gc", obj=obj))
        count[0] += 1

    assert_a_thousand_leak_nothing(one, [src, dst], ["source", "destination"])
    counters = ok(src.call(cmd="counters"))
    assert (counters["lent_objects"], counters["released_objects"]) == (1200, 1200), counters


# Over tcp: the destination reaches the source's server once (a first receive), then the source
# is stopped before the 64 MiB receive starts: its server can neither send the bytes nor answer,
# so the read is on the wire, unfinished, when the source is killed, however the processes are
# scheduled. (Over shm a read is done as it starts.)
@pytest.mark.parametrize("actors", ["tcp"], indirect=True)
def test_the_source_killed_mid_transfer_fails_the_receive(actors):
    src, dst = actors
    first = ok(src.call(cmd="lend", obj="k0", shapes=[[16]], dtypes=["float64"], seed=6))
    assert ok(dst.call(cmd="recv", obj="k0", meta=first["meta"]))["digests"] == first["digests"]
    lent = ok(src.call(cmd="lend", obj="k1", shapes=[[8 * MiB]], dtypes=["float64"], seed=7))
    ok(src.call(cmd="stop"))
    src.wait_stopped()
    assert ok(dst.call(cmd="fetch", obj="k1", meta=lent["meta"], into=True, poll=0))["pending"]
    src.kill()
    r = dst.call(cmd="wait", obj="k1")
    assert r.get("error") == "ConnectionError" and "cut the transfer off" in r["message"], r
    assert ok(dst.call(cmd="counters"))["failed_receives"] == 1


@pytest.mark.parametrize("actors", TRANSPORTS, indirect=True)
def test_a_destination_killed_mid_transfer_leaves_the_source_serving(actors):
    src, dst = actors
    lent = ok(src.call(cmd="lend", obj="k2", shapes=[[8 * MiB]], dtypes=["float64"], seed=8))
    before = ok(src.call(cmd="usage"))["fds"]  # its server runs, no destination has come yet
    assert ok(dst.call(cmd="fetch", obj="k2", meta=lent["meta"], into=True, stop=True))["pending"]
    dst.wait_stopped()
    dst.kill()
    other = PeerProc(PEER, src.transport)
    try:
        assert ok(other.call(cmd="recv", obj="k2", meta=lent["meta"]))["digests"] == lent["digests"]
    finally:
        other.close()
    ok(src.call(cmd="gc", obj="k2"))
    assert wait_until(lambda: ok(src.call(cmd="usage"))["fds"] == before, 30), \
        "the source's server did not close the dead destinations' connections within 30 s"


@pytest.mark.parametrize("actors", ["tcp"], indirect=True)
def test_a_receive_past_the_transports_timeout_is_cancelled_and_the_next_goes_through(actors):
    src, dst = actors
    lent = ok(src.call(cmd="lend", obj="t1", shapes=[[MiB]], dtypes=["uint8"], seed=9))
    assert ok(dst.call(cmd="recv", obj="t1", meta=lent["meta"]))["digests"] == lent["digests"]
    ok(src.call(cmd="stop"))
    src.wait_stopped()  # its server does not answer now
    r = dst.call(cmd="recv", obj="t1", meta=lent["meta"], timeout=0.5)
    assert r.get("error") == "TimeoutError" and "longer than 0.5 s and was cancelled" in r["message"], r
    src.resume()
    assert ok(dst.call(cmd="recv", obj="t1", meta=lent["meta"]))["digests"] == lent["digests"]


@pytest.mark.parametrize("into", [False, True])
def test_torch_tensors_are_lent_and_received_as_torch_tensors(into):
    torch = needs_torch()
    transport = ScadTensorTransport()
    lent = [torch.arange(64 * 64, dtype=torch.float32).reshape(64, 64), torch.tensor([1, 2, 3], dtype=torch.int64),
            torch.ones(5, dtype=torch.bfloat16)]
    meta = transport.extract_tensor_transport_metadata("torch-obj", lent)
    assert [dtype for _, dtype in meta.tensor_meta] == [torch.float32, torch.int64, torch.bfloat16]
    targets = [torch.zeros_like(t) for t in lent] if into else None
    try:
        got = transport.recv_multiple_tensors("torch-obj", meta, transport.get_communicator_metadata(), targets)
        assert all(type(g) is torch.Tensor for g in got)
        assert [g.shape for g in got] == [t.shape for t in lent] and all(torch.equal(g, t) for g, t in zip(got, lent))
        if into:
            assert all(g is t for g, t in zip(got, targets)), "given targets are filled in place"
    finally:
        transport.garbage_collect("torch-obj", meta)
