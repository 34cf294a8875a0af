"""scad.tensor_transport between two real processes in the roles Ray gives them: the source actor
lends an object's tensors, the destination receives them (tests/python/tensor_peer.py)."""
import os

import pytest

from peer_process import PeerProc
from scad.tensor_transport import ScadTensorTransport

PEER = os.path.join(os.path.dirname(__file__), "tensor_peer.py")
SHAPES = [[64, 64], [1000], [0], [3, 5, 7]]
DTYPES = ["float32", "int64", "float64", "uint8"]


@pytest.fixture
def actors(request):
    src, dst = PeerProc(PEER, request.param), PeerProc(PEER, request.param)
    yield src, dst
    src.close()
    dst.close()


def ok(reply):
    assert "error" not in reply, reply
    return reply


@pytest.mark.parametrize("actors", [None, "tcp"], indirect=True)
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


@pytest.mark.parametrize("actors", [None, "tcp"], indirect=True)
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


def test_the_interface_says_what_ray_asks():
    t = ScadTensorTransport()
    assert t.tensor_transport_backend() == "SCAD"
    assert ScadTensorTransport.is_one_sided() and ScadTensorTransport.can_abort_transport()
    assert t.actor_has_tensor_transport(object())
    t.send_multiple_tensors([], None, t.get_communicator_metadata())  # one-sided: nothing to send
    with pytest.raises(TypeError, match="torch tensors and numpy arrays"):
        t.extract_tensor_transport_metadata("x", [[1, 2, 3]])
