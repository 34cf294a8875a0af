"""scad.rdma between real processes (tests/python/rdma_peer.py): an owner lends slices of its memory
as RdmaBuffers, a peer reads and writes them; plus the registration cache in one process."""
import asyncio
import ctypes
import os
import json
import pickle
import time

import numpy
import pytest

from peer_process import PeerProc, assert_a_thousand_leak_nothing
from scadtest import needs_torch, wait_until
from scad.rdma import RdmaBuffer, RdmaManager
from scad.rdma._regions import Region, RegionCache

PEER = os.path.join(os.path.dirname(__file__), "rdma_peer.py")
KiB = 1024


def _has_rdma_device():
    try:
        return bool(os.listdir("/sys/class/infiniband"))
    except OSError:
        return False


# None: the manager's own choice (shm on this host for a whole buffer, tcp for a slice of one).
IMPLS = [None, "tcp"] + (["verbs"] if os.environ.get("LIBD_REQUIRE_VERBS") or _has_rdma_device() else [])


@pytest.fixture
def pair(request):
    owner, peer = PeerProc(PEER, request.param), PeerProc(PEER, request.param)
    yield owner, peer
    owner.close()
    peer.close()


def ok(reply):
    assert "error" not in reply, reply
    return reply


@pytest.mark.parametrize("pair", IMPLS, indirect=True)
@pytest.mark.parametrize("carried", ["json", "pickle"])
def test_a_peer_reads_and_writes_a_buffer_in_place(pair, carried):
    owner, peer = pair
    whole = ok(owner.call(cmd="array", size=256 * KiB, seed=1))["digest"]
    made = ok(owner.call(cmd="buffer"))
    buf = {"buffer": made[carried], "pickled": carried == "pickle"}
    assert ok(peer.call(cmd="read", size=256 * KiB, **buf))["digest"] == whole
    assert ok(peer.call(cmd="read", size=1000, offset=5000, **buf))["digest"] == \
        ok(owner.call(cmd="digest", start=5000, stop=6000))["digest"]
    wrote = ok(peer.call(cmd="write", size=4 * KiB, seed=9, offset=100 * KiB, **buf))["digest"]
    assert ok(owner.call(cmd="digest", start=100 * KiB, stop=104 * KiB))["digest"] == wrote, "landed in the owner's array"


@pytest.mark.parametrize("pair", IMPLS, indirect=True)
def test_a_slice_reaches_exactly_its_bytes(pair):
    owner, peer = pair
    ok(owner.call(cmd="array", size=64 * KiB, seed=2))
    ok(owner.call(cmd="buffer"))                                   # the whole array: one region
    made = ok(owner.call(cmd="buffer", start=8 * KiB, stop=12 * KiB))
    assert [r[1:] for r in made["regions"]] == [[64 * KiB, 2]], "a slice of a registered region reuses it"
    buf = {"buffer": made["json"]}
    assert ok(peer.call(cmd="read", size=4 * KiB, **buf))["digest"] == \
        ok(owner.call(cmd="digest", start=8 * KiB, stop=12 * KiB))["digest"]
    r = peer.call(cmd="read", size=4 * KiB, offset=1, **buf)
    assert r["error"] == "ValueError" and "outside the remote buffer" in r["message"]
    # A handle altered to claim more than its slice is refused by the owner's grant.
    forged = RdmaBuffer.from_json(made["json"])
    forged._size = 8 * KiB
    r = peer.call(cmd="read", size=8 * KiB, buffer=forged.to_json())
    assert "error" in r and r["error"] in ("ValueError", "OSError", "PermissionError"), r


@pytest.mark.parametrize("pair", IMPLS, indirect=True)
def test_dropping_revokes_and_the_last_drop_releases_the_region(pair):
    owner, peer = pair
    ok(owner.call(cmd="array", size=16 * KiB, seed=3))
    first = ok(owner.call(cmd="buffer"))
    ok(owner.call(cmd="buffer", start=0, stop=KiB))
    assert ok(peer.call(cmd="read", size=16 * KiB, buffer=first["json"]))["digest"]
    assert [r[2] for r in ok(owner.call(cmd="drop", index=0))["regions"]] == [1]
    r = peer.call(cmd="read", size=16 * KiB, buffer=first["json"])  # its link was cut off
    assert r["error"] in ("ConnectionError", "PermissionError"), r
    r = peer.call(cmd="read", size=16 * KiB, buffer=first["json"])  # and a new one is refused
    assert r["error"] == "PermissionError" and "dropped or expired" in r["message"], r
    assert ok(owner.call(cmd="drop", index=1))["regions"] == []


@pytest.mark.parametrize("pair", IMPLS, indirect=True)
def test_a_buffer_over_a_list_is_its_memories_end_to_end_under_one_key(pair):
    owner, peer = pair
    ok(owner.call(cmd="array", size=64 * KiB, seed=5))
    slices = [[0, 4 * KiB], [8 * KiB, 16 * KiB], [20 * KiB, 21 * KiB]]  # gaps between them stay the owner's
    made = owner.call(cmd="buffers", slices=slices)
    if _has_rdma_device():  # the owner's server serves verbs on this host, where a remote key reaches one memory
        assert made["error"] == "NotImplementedError" and "serves verbs" in made["message"], made
        return
    made = ok(made)
    record = json.loads(made["json"])
    assert record["version"] == 2 and record["ranges"] == [4 * KiB, 8 * KiB, KiB] and record["size"] == 13 * KiB
    buf = {"buffer": made["json"]}
    everything = ok(owner.call(cmd="digest", slices=slices))["digest"]
    # Into a list of arrays, one per memory; into one array across all three; into a list cut elsewhere.
    assert ok(peer.call(cmd="read", sizes=[4 * KiB, 8 * KiB, KiB], **buf))["digest"] == everything
    assert ok(peer.call(cmd="read", size=13 * KiB, **buf))["digest"] == everything
    assert ok(peer.call(cmd="read", sizes=[KiB, 10 * KiB, 2 * KiB], **buf))["digest"] == everything
    # From the middle of the first memory into the second: the two parts, none of the gap.
    assert ok(peer.call(cmd="read", size=4 * KiB, offset=2 * KiB, **buf))["digest"] == \
        ok(owner.call(cmd="digest", slices=[[2 * KiB, 4 * KiB], [8 * KiB, 10 * KiB]]))["digest"]
    gap = ok(owner.call(cmd="digest", start=4 * KiB, stop=8 * KiB))["digest"]
    # One array written across the first two memories: cut where they meet.
    wrote = ok(peer.call(cmd="write", size=6 * KiB, seed=12, offset=2 * KiB, **buf))["digest"]
    assert ok(owner.call(cmd="digest", slices=[[2 * KiB, 4 * KiB], [8 * KiB, 12 * KiB]]))["digest"] == wrote
    wrote = ok(peer.call(cmd="write", sizes=[3 * KiB, 7 * KiB], seed=11, offset=KiB, **buf))["digest"]
    assert ok(owner.call(cmd="digest", slices=[[KiB, 4 * KiB], [8 * KiB, 15 * KiB]]))["digest"] == wrote
    assert ok(owner.call(cmd="digest", start=4 * KiB, stop=8 * KiB))["digest"] == gap, "the gap was not written"
    r = peer.call(cmd="read", size=13 * KiB, offset=1, **buf)
    assert r["error"] == "ValueError" and "outside the remote buffer" in r["message"]
    ok(owner.call(cmd="drop", index=0))  # the list's own element, withdrawn with its key
    r = peer.call(cmd="read", size=13 * KiB, **buf)
    assert r["error"] in ("ConnectionError", "PermissionError"), r


def test_transfers_are_cut_where_the_buffers_memories_meet():
    from scad.rdma._key_link import lay_out
    remote = RdmaBuffer(owner="o", hostname="h", host="127.0.0.1", port=1, path="", verbs=False, grant="g",
                        secret="s", offset=0, size=13, whole=True, ranges=[4, 8, 1])
    one = numpy.zeros(13, numpy.uint8)
    assert [(d.size, at) for d, at in lay_out(remote, one, 0, True)] == [(4, 0), (8, 4), (1, 12)]
    assert [(d.ptr - one.ctypes.data, d.size) for d, _ in lay_out(remote, one, 0, True)] == [(0, 4), (4, 8), (12, 1)]
    two = [numpy.zeros(3, numpy.uint8), numpy.zeros(6, numpy.uint8)]
    assert [(d.size, at) for d, at in lay_out(remote, two, 2, False)] == [(2, 2), (1, 4), (6, 5)]
    assert [(d.size, at) for d, at in lay_out(remote, numpy.zeros(8, numpy.uint8), 4, True)] == [(8, 4)]
    with pytest.raises(ValueError, match="outside"):
        lay_out(remote, one, 1, True)
    with pytest.raises(ValueError, match="read-only"):
        lay_out(remote, bytes(4), 0, True)
    assert len(lay_out(remote, bytes(4), 0, False)) == 1  # a source may be read-only
    with pytest.raises(ValueError, match="1..1024 local memories"):
        lay_out(remote, [bytearray(1)] * 1025, 0, False)
    # A buffer over one memory: one piece, placed as it is, checked as a list's are.
    single = RdmaBuffer(owner="o", hostname="h", host="127.0.0.1", port=1, path="", verbs=False, grant="g",
                        secret="s", offset=0, size=13, whole=True)
    assert [(d.ptr, d.size, at) for d, at in lay_out(single, one[2:], 1, True)] == [(one.ctypes.data + 2, 11, 1)]
    assert [(d.size, at) for d, at in lay_out(single, [one[:3], one[3:5]], 2, True)] == [(3, 2), (2, 5)]
    with pytest.raises(ValueError, match="outside"):
        lay_out(single, one, 1, True)
    with pytest.raises(ValueError, match="outside"):
        lay_out(single, bytes(4), -1, False)
    with pytest.raises(ValueError, match="read-only"):
        lay_out(single, bytes(4), 0, True)
    assert len(lay_out(single, bytes(4), 9, False)) == 1


def test_a_buffer_over_a_list_is_read_strictly():
    made = RdmaBuffer(owner="o", hostname="h", host="127.0.0.1", port=1, path="", verbs=False, grant="g",
                      secret="sesame", offset=0, size=3, whole=True, ranges=[1, 2])
    text = made.to_json()
    assert json.loads(text) == made.to_dict() and RdmaBuffer.from_json(text) == made
    assert made.range_ends() == (1, 3) and "sesame" not in repr(made)
    for ranges, size in (([1, 1], 3), ([], 3), ([0, 3], 3), ([1.5, 1.5], 3), ("3", 3), ([True, 2], 3),
                         ([1] * 1025, 1025)):
        raw = dict(made.to_dict(), ranges=ranges, size=size)
        with pytest.raises(ValueError):
            RdmaBuffer.from_json(json.dumps(raw))
    with pytest.raises(ValueError):  # a list is a whole lent element
        RdmaBuffer.from_json(json.dumps(dict(made.to_dict(), offset=1, size=3)))
    for field in ("size", "offset", "port"):  # JSON's true is no integer here
        with pytest.raises(ValueError):
            RdmaBuffer.from_json(json.dumps(dict(made.to_dict(), **{field: True})))
    with pytest.raises(ValueError):  # nor is a buffer made with ranges that do not make it up
        RdmaBuffer(**{**{k: v for k, v in made.to_dict().items() if k != "version"}, "ranges": [1, 1]})
    older = json.loads(made.to_json(with_ranges=False))  # what readers of version 1 take
    assert older["version"] == 1 and "ranges" not in older and RdmaBuffer.from_json(json.dumps(older)).ranges is None
    one = dict(made.to_dict(), version=1)  # version 1 has no ranges
    with pytest.raises(ValueError):
        RdmaBuffer.from_json(json.dumps(one))
    two = {k: v for k, v in made.to_dict().items() if k != "ranges"}  # version 2 needs them
    with pytest.raises(ValueError):
        RdmaBuffer.from_json(json.dumps(two))


@pytest.mark.parametrize("pair", IMPLS, indirect=True)
def test_a_queue_pair_is_one_per_owner_and_moves_any_of_its_buffers(pair):
    owner, peer = pair
    whole = ok(owner.call(cmd="array", size=32 * KiB, seed=4))["digest"]
    made = ok(owner.call(cmd="buffer"))
    b = ok(owner.call(cmd="lend", size=8 * KiB, seed=5))
    c = ok(owner.call(cmd="lend", size=4 * KiB, seed=6))
    r = ok(peer.call(cmd="qp", size=32 * KiB, buffer=made["json"], put=[[b["json"], 50], [c["json"], 51]]))
    assert r["same"], "request_queue_pair gave another queue pair for another buffer of the same owner"
    assert r["idle"] and r["digests"] == [whole, whole]
    assert ok(owner.call(cmd="digest_lent", index=b["index"]))["digest"] == r["put"][0]
    assert ok(owner.call(cmd="digest_lent", index=c["index"]))["digest"] == r["put"][1]


@pytest.mark.parametrize("pair", IMPLS, indirect=True)
def test_a_queue_pair_refuses_a_dropped_key_and_another_owners_buffer(pair):
    owner, peer = pair
    a = ok(owner.call(cmd="lend", size=4 * KiB, seed=7))
    b = ok(owner.call(cmd="lend", size=4 * KiB, seed=8))
    assert ok(peer.call(cmd="qp_get", buffer=a["json"]))["digest"] == a["digest"]
    ok(owner.call(cmd="drop", index=b["index"]))
    r = peer.call(cmd="qp_get", buffer=b["json"])  # the queue pair to the owner exists: b's key is refused
    assert r.get("error") == "PermissionError" and "refused" in r["message"], r
    assert ok(peer.call(cmd="qp_get", buffer=a["json"]))["digest"] == a["digest"], "a refused key ends the queue pair"
    other = PeerProc(PEER, peer.transport)
    try:
        elsewhere = ok(other.call(cmd="lend", size=KiB, seed=9))
        r = peer.call(cmd="qp", size=KiB, buffer=a["json"], put=[[elsewhere["json"], 1]])
        assert r.get("error") == "ValueError" and "request_queue_pair(remote) for that one" in r["message"], r
    finally:
        other.close()
    ok(peer.call(cmd="qp_release", buffer=a["json"]))  # closes its links; the owner's keys stay
    assert ok(peer.call(cmd="links", buffer=a["json"]))["count"] == 0, "a released queue pair left a link behind"
    assert ok(peer.call(cmd="qp_get", buffer=a["json"]))["digest"] == a["digest"]


@pytest.mark.parametrize("pair", IMPLS, indirect=True)
def test_a_link_let_go_of_serves_the_next_buffer_and_only_that_one(pair):
    owner, peer = pair
    a = ok(owner.call(cmd="lend", size=8 * KiB, seed=21))
    b = ok(owner.call(cmd="lend", size=8 * KiB, seed=22))
    first_a = ok(peer.call(cmd="read", size=8 * KiB, buffer=a["json"]))
    got_a = ok(peer.call(cmd="read", size=8 * KiB, buffer=a["json"]))
    shared = got_a["impl"] in ("shm", "tcp")  # (verbs: a link is a connection of its own per key, closed)
    # Over shm and tcp a buffer's first transfer is one of its own; moved again, it has a link.
    assert (first_a["via"], got_a["via"]) == (("once", "link") if shared else ("link", "link")), (first_a, got_a)
    assert not ok(peer.call(cmd="forget", buffer=a["json"]))["last_read_kept"], \
        "the link kept for the next buffer holds on to the memory the read went into"
    ok(peer.call(cmd="read", size=8 * KiB, buffer=b["json"]))
    got_b = ok(peer.call(cmd="read", size=8 * KiB, buffer=b["json"]))
    assert (first_a["digest"], got_a["digest"], got_b["digest"]) == (a["digest"], a["digest"], b["digest"])
    if shared:
        assert got_b["link"] == got_a["link"], "the link the peer let go of carried the next buffer"
    ok(peer.call(cmd="forget", buffer=b["json"]))
    # The idle link once held a's key: with a dropped, taking it for a is still refused.
    ok(owner.call(cmd="drop", index=a["index"]))
    r = peer.call(cmd="read", size=8 * KiB, buffer=a["json"])
    assert r.get("error") == "PermissionError" and "refused" in r["message"], r
    assert ok(peer.call(cmd="read", size=8 * KiB, buffer=b["json"]))["digest"] == b["digest"]


@pytest.mark.parametrize("pair", IMPLS, indirect=True)
def test_a_thousand_buffers_lent_read_and_dropped_leak_neither_memory_nor_descriptors(pair):
    owner, peer = pair
    ok(owner.call(cmd="array", size=64 * KiB, seed=6))
    made = [0]

    def one():
        buf = ok(owner.call(cmd="buffer", start=0, stop=32 * KiB))
        ok(peer.call(cmd="read", size=KiB, buffer=buf["json"]))
        ok(peer.call(cmd="forget", buffer=buf["json"]))
        assert ok(owner.call(cmd="drop", index=buf["index"]))["regions"] == []
        made[0] += 1

    assert_a_thousand_leak_nothing(one, [owner, peer], ["owner", "peer"])
    assert made[0] == 1200


@pytest.mark.parametrize("pair", [None], indirect=True)
def test_an_owner_that_is_gone_is_an_error(pair):
    owner, peer = pair
    ok(owner.call(cmd="array", size=KiB, seed=5))
    made = ok(owner.call(cmd="buffer"))
    owner.kill()
    r = peer.call(cmd="read", size=KiB, buffer=made["json"])
    assert r["error"] == "ConnectionError" and "cannot reach the buffer's owner" in r["message"], r


MiB = 1 << 20


# Over shm a transfer is done as it starts (cross-memory attach copies in the caller's system
# call): there is no "mid-transfer". Over tcp the owner is stopped before the peer starts its
# 64 MiB transfer (its queue pair connected already): the owner's server can neither take the
# bytes nor answer, so the transfer is on the wire, unfinished, when the owner is killed, however
# the two processes are scheduled.
@pytest.mark.parametrize("pair", ["tcp"], indirect=True)
@pytest.mark.parametrize("op", ["read", "write"])
def test_the_owner_killed_mid_transfer_fails_the_peer(pair, op):
    owner, peer = pair
    buf = ok(owner.call(cmd="lend", size=64 * MiB, seed=10))
    ok(peer.call(cmd="qp_connect", buffer=buf["json"]))
    ok(owner.call(cmd="stop"))
    owner.wait_stopped()
    assert ok(peer.call(cmd="start", op=op, buffer=buf["json"], seed=11))["impl"] == "tcp"
    owner.kill()
    r = peer.call(cmd="finish", timeout=30)
    assert r.get("error") == "ConnectionError" and "cut the transfer off" in r["message"], r
    assert ok(peer.call(cmd="usage"))["fds"] > 0  # and the peer goes on


@pytest.mark.parametrize("pair", IMPLS[:2], indirect=True)
@pytest.mark.parametrize("op", ["read", "write"])
def test_a_peer_killed_mid_transfer_leaves_the_owner_serving(pair, op):
    owner, peer = pair
    buf = ok(owner.call(cmd="lend", size=64 * MiB, seed=12))
    before = ok(owner.call(cmd="usage"))["fds"]  # its server runs, no peer has come yet
    ok(peer.call(cmd="start", op=op, buffer=buf["json"], seed=13, stop=True))
    peer.wait_stopped()
    peer.kill()
    # The owner drops the buffer, lends another, and a new peer moves it; the dead peer's
    # connection goes from the owner's server.
    ok(owner.call(cmd="drop", index=buf["index"]))
    again = ok(owner.call(cmd="lend", size=MiB, seed=14))
    other = PeerProc(PEER, peer.transport)
    try:
        assert ok(other.call(cmd="read", size=MiB, buffer=again["json"]))["digest"] == again["digest"]
        ok(other.call(cmd="forget", buffer=again["json"]))
    finally:
        other.close()
    ok(owner.call(cmd="drop", index=again["index"]))
    assert wait_until(lambda: ok(owner.call(cmd="usage"))["fds"] == before, 30), \
        "the owner's server did not close the dead peer's connection within 30 s"


@pytest.mark.parametrize("pair", ["tcp"], indirect=True)
def test_the_owner_dropping_a_buffer_mid_transfer_fails_the_peer(pair):
    owner, peer = pair
    buf = ok(owner.call(cmd="lend", size=64 * MiB, seed=15))
    ok(peer.call(cmd="start", op="read", buffer=buf["json"], stop=True))
    peer.wait_stopped()
    ok(owner.call(cmd="drop", index=buf["index"]))
    peer.resume()
    r = peer.call(cmd="finish", timeout=30)
    # Cut off, never a hang; or, where the peer's loop thread took all 64 MiB before the peer
    # stopped (its main thread held off the processor that long), the whole of the bytes.
    assert r.get("error") in ("ConnectionError", "PermissionError") or r.get("digest") == buf["digest"], r


@pytest.mark.parametrize("pair", IMPLS, indirect=True)
def test_a_cancelled_transfer_leaves_the_queue_pair_working(pair):
    owner, peer = pair
    big = ok(owner.call(cmd="lend", size=64 * MiB, seed=16))
    small = ok(owner.call(cmd="lend", size=64 * KiB, seed=17))
    ok(peer.call(cmd="start", op="read", buffer=big["json"]))
    cancelled = ok(peer.call(cmd="cancel"))
    assert cancelled["stopped"], "a cancelled transfer still runs"
    assert cancelled["idle"], "the queue pair still counts the cancelled transfer"
    # The same queue pair, the same connection: what the cancelled read still had coming is not
    # taken for the next one's answer.
    assert ok(peer.call(cmd="qp_get", buffer=small["json"]))["digest"] == small["digest"]
    assert ok(peer.call(cmd="qp_get", buffer=big["json"]))["digest"] == big["digest"]


@pytest.mark.parametrize("pair", ["tcp"], indirect=True)
def test_a_buffer_dropped_here_under_a_queue_pairs_transfer_fails_its_wait(pair):
    owner, peer = pair
    buf = ok(owner.call(cmd="lend", size=64 * MiB, seed=20))
    ok(peer.call(cmd="qp_connect", buffer=buf["json"]))  # the key attached while the owner answers
    # The owner stopped before the read starts: its server takes none of it, so the read is
    # unfinished when the drop comes, however the processes are scheduled.
    ok(owner.call(cmd="stop"))
    owner.wait_stopped()
    ok(peer.call(cmd="start", op="read", buffer=buf["json"]))
    ok(peer.call(cmd="forget", buffer=buf["json"]))  # the peer's own drop closes the buffer's link
    r = peer.call(cmd="finish", timeout=30)
    assert r.get("error") == "ConnectionAbortedError" and "cancelled" in r["message"], r
    owner.resume()
    assert ok(peer.call(cmd="qp_get", buffer=buf["json"]))["digest"] == buf["digest"], "the queue pair goes on"


@pytest.mark.parametrize("pair", ["tcp"], indirect=True)
def test_a_read_past_its_timeout_is_cancelled_and_the_next_one_goes_through(pair):
    owner, peer = pair
    buf = ok(owner.call(cmd="lend", size=MiB, seed=18))
    fresh = ok(owner.call(cmd="lend", size=MiB, seed=28))
    assert ok(peer.call(cmd="read", size=MiB, buffer=buf["json"]))["digest"] == buf["digest"]
    ok(owner.call(cmd="stop"))  # its server does not answer now
    owner.wait_stopped()
    r = peer.call(cmd="read", size=MiB, buffer=buf["json"], timeout=0.5)  # its second: on a link
    assert r.get("error") == "TimeoutError" and "cancelled" in r["message"], r
    r = peer.call(cmd="read", size=MiB, buffer=fresh["json"], timeout=0.5)  # its first: a transfer of its own
    assert r.get("error") == "TimeoutError" and "cancelled" in r["message"], r
    owner.resume()
    assert ok(peer.call(cmd="read", size=MiB, buffer=buf["json"]))["digest"] == buf["digest"]
    assert ok(peer.call(cmd="read", size=MiB, buffer=fresh["json"]))["digest"] == fresh["digest"]


@pytest.mark.parametrize("pair", IMPLS, indirect=True)
def test_a_buffer_is_refused_once_its_ttl_has_passed(pair):
    owner, peer = pair
    whole = ok(owner.call(cmd="array", size=KiB, seed=19))["digest"]
    lent = time.monotonic()
    buf = ok(owner.call(cmd="buffer", ttl=5.0))
    assert ok(peer.call(cmd="read", size=KiB, buffer=buf["json"]))["digest"] == whole
    refused = []

    def expired():
        r = peer.call(cmd="read", size=KiB, buffer=buf["json"])
        refused.append(r)
        return "error" in r

    assert wait_until(expired, 30), f"the key did not expire within 30 s: {refused[-1]}"
    assert time.monotonic() - lent >= 5.0, "refused before its ttl"
    # A new link's key is refused (PermissionError); a link connected before the key expired is
    # cut off, and says why (ConnectionError, as for a buffer dropped under it: over verbs the
    # owner's server closes the link's connection, and cannot tell it more).
    r = refused[-1]
    assert (r["error"] == "PermissionError" and "dropped or expired" in r["message"]) or \
        (r["error"] == "ConnectionError" and ("let this grant expire" in r["message"]
                                              or "grant revoked or server gone" in r["message"])), r


def test_the_handle_is_data_and_hides_its_key():
    buf = RdmaBuffer(owner="o", hostname="h", host="127.0.0.1", port=1, path="/tmp/x.sock", verbs=False,
                     grant="g1", secret="s" * 64, offset=0, size=10, whole=True)
    assert "s" * 64 not in repr(buf)
    assert RdmaBuffer.from_json(buf.to_json()) == buf
    assert pickle.loads(pickle.dumps(buf)) == buf
    assert pickle.dumps(buf).count(b"RdmaBuffer") >= 1  # rebuilt from its JSON, by name
    for bad in ('{"version": 2}', "[]", '{"x": 1}', buf.to_json().replace('"g1"', '"g;1"')):
        with pytest.raises(ValueError):
            RdmaBuffer.from_json(bad)
    assert buf.size() == 10


def test_the_cache_never_hands_out_a_stale_region():
    cache = RegionCache()
    a = Region("r1", 0x1000, 100)
    cache.add(a)
    assert cache.find(0x1000, 100) is a and cache.find(0x1010, 10) is a
    assert cache.find(0x1000, 200) is None, "a larger request at the same address is a miss"
    cache.remove(a)
    assert cache.find(0x1000, 50) is None, "a forgotten region is never found again"
    big, small = Region("r2", 0x1000, 200), Region("r3", 0x1040, 16)
    cache.add(big)
    cache.add(small)
    assert cache.find(0x1040, 8) is small and cache.find(0x1000, 8) is big and cache.find(0x10f0, 32) is None


def test_an_idle_region_answers_only_its_exact_range_and_the_oldest_go_past_the_cap():
    cache = RegionCache(max_idle=2)
    live, idle = Region("r1", 0x1000, 0x100), Region("r2", 0x1000, 0x40)
    cache.add(live)
    cache.add(idle)
    cache.hold(live, "g1", object())
    assert cache.find(0x1000, 0x40) is idle and cache.find(0x1000, 0x10) is idle
    assert cache.park(idle) == []
    assert cache.find(0x1000, 0x40) is idle, "idle: its exact range takes it back"
    assert cache.find(0x1000, 0x10) is live, "idle: a slice of it is not served from it"
    cache.hold(idle, "g2", object())
    assert cache.idle() == [] and cache.find(0x1000, 0x10) is idle, "taken back: live again"
    cache.release("g2")
    assert cache.park(idle) == []
    others = [Region(f"r{i}", 0x10000 * i, 0x100) for i in (3, 4)]
    for r in others:
        cache.add(r)
    assert cache.park(others[0]) == []
    assert cache.park(others[1]) == [idle], "past the cap, the oldest idle region goes"
    assert cache.idle() == others
    cache.remove(idle)  # as the manager does with what park returns (and withdraws it)
    assert cache.find(0x1000, 0x40) is live and cache.idle() == others, "withdrawn: the live region serves it again"


def test_a_dropped_region_kept_idle_holds_no_memory_and_the_same_range_takes_it_back():
    import gc
    import weakref

    async def main():
        manager = RdmaManager.get()
        array = numpy.arange(4 * KiB, dtype=numpy.uint8)
        addr = array.ctypes.data
        buf = manager.request_buffer(array)
        buf.drop()
        idle = manager._cache.idle()
        if manager._endpoint["verbs"]:
            assert idle == [], "a region that pins pages is withdrawn at once"
            return
        # (Regions other tests of this process dropped may be idle too, one of them perhaps at the
        # same address with another size, since freed memory is handed out again: this range is
        # looked at.)
        mine = [r for r in idle if (r.start, r.size) == (addr, 4 * KiB)]
        assert [(r.start, r.size, len(r.holders)) for r in mine] == [(addr, 4 * KiB, 0)]
        assert not [r for r in manager.regions() if r[0] == addr], "dropped: not live"
        again = manager.request_buffer(array)
        assert mine[0] not in manager._cache.idle() and manager._cache.find(addr, 4 * KiB) is mine[0], "taken back"
        assert again.whole and again.offset == 0
        dst = numpy.zeros(4 * KiB, numpy.uint8)
        await again.read_into(dst)
        assert (dst == array).all()
        again.drop()
        gone = weakref.ref(array)
        del array, buf, again
        gc.collect()
        assert gone() is None, "an idle region keeps nothing of the caller's alive"
        oldest = manager._cache.idle()[0]
        cap, manager._cache.max_idle = manager._cache.max_idle, len(manager._cache.idle())
        try:
            # A range no idle region has (one that had would be taken back, not added).
            arrays = [numpy.zeros(KiB, numpy.uint8) for _ in range(8)]
            fresh = next(a for a in arrays if manager._cache.find(a.ctypes.data, KiB) is None)
            manager.request_buffer(fresh).drop()
            assert manager._cache.idle()[-1].start == fresh.ctypes.data and oldest not in manager._cache.idle()
            assert oldest not in manager._cache.regions(), "past the cap the oldest idle region is forgotten"
        finally:
            manager._cache.max_idle = cap
    asyncio.run(main())


def test_a_reused_address_range_is_registered_afresh_at_its_new_size():
    # Real memory: the same addresses, first as 4 KiB, dropped, then as 8 KiB.
    async def main():
        manager = RdmaManager.get()
        memory = ctypes.create_string_buffer(8 * KiB)
        addr = ctypes.addressof(memory)
        small = manager.request_buffer(addr, 4 * KiB)
        assert [(r[0], r[1]) for r in manager.regions()] == [(addr, 4 * KiB)]
        inner = manager.request_buffer(addr + KiB, KiB)
        assert [r[2] for r in manager.regions()] == [2], "inside a live region: reused"
        small.drop()
        inner.drop()
        assert manager.regions() == []
        large = manager.request_buffer(addr, 8 * KiB)
        assert [(r[0], r[1]) for r in manager.regions()] == [(addr, 8 * KiB)], "not the dropped 4 KiB region"
        dst = numpy.zeros(8 * KiB, numpy.uint8)
        memory.raw = bytes(range(256)) * 32
        await large.read_into(dst)
        assert dst.tobytes() == memory.raw
        large.drop()
        assert manager.regions() == []
    asyncio.run(main())


def test_the_handle_is_written_as_json_would_write_it_and_read_strictly():
    buf = RdmaBuffer(owner='o"1', hostname="h", host="127.0.0.1", port=1, path="/tmp/x y.sock", verbs=True,
                     grant="g1_7", secret="ab" * 32, offset=3, size=10, whole=False)
    assert buf.to_json() == json.dumps(buf.to_dict(), separators=(",", ":"))
    raw = buf.to_dict()
    for key, wrong in (("port", "1"), ("verbs", 1), ("size", 1.5), ("grant", 7), ("whole", None)):
        with pytest.raises(ValueError, match="wrong type"):
            RdmaBuffer.from_json(json.dumps(dict(raw, **{key: wrong})))
    for key in ("host", "path", "secret"):
        with pytest.raises(ValueError, match="malformed"):
            RdmaBuffer.from_json(json.dumps(dict(raw, **{key: "a,b"})))


def test_a_lent_buffers_record_written_by_its_owner_is_the_general_writers_text():
    manager = RdmaManager.get()
    lent = numpy.zeros(256, dtype=numpy.uint8)
    whole, part = manager.request_buffer(lent), manager.request_buffer(lent[16:48])
    try:
        for buf in (whole, part):
            text = buf.to_json()  # the lender's own writer, its key made now
            assert text == json.dumps(buf.to_dict(), separators=(",", ":"))
            again = RdmaBuffer.from_json(text)
            assert again.to_json() == text and again == buf
        assert (json.loads(part.to_json())["offset"], json.loads(part.to_json())["whole"]) == (16, False)
    finally:
        whole.drop()
        part.drop()


def test_a_record_is_parsed_exactly_as_json_loads_parses_it():
    import random

    from scad._memserver import loads_record

    def outcome(parse, text):
        try:
            return ("value", parse(text))
        except Exception as e:  # the same kind of error, for every input json.loads refuses
            return ("error", type(e))

    record = RdmaBuffer(owner="o", hostname="h", host="127.0.0.1", port=1, path="/tmp/x.sock", verbs=False,
                        grant="g1_7", secret="ab" * 32, offset=0, size=10, whole=True).to_json()
    cases = [record, " " + record, record + "\n", record + "x", record[:-1], record.encode(), "", "[]", "1",
             '{"a":1}{"b":2}', '{"a":NaN}', '"\ud800"', "{" * 5000, "[" * 5000, bytearray(record.encode())]
    rng = random.Random(7)
    for _ in range(3000):  # mutations of a real record: a character dropped, doubled or replaced
        i = rng.randrange(len(record))
        cases.append(rng.choice((record[:i] + record[i + 1:], record[:i] + record[i] + record[i:],
                                 record[:i] + rng.choice(' {}[]",:0\\e-') + record[i + 1:])))
    for text in cases:
        assert outcome(loads_record, text) == outcome(json.loads, text), repr(text)[:80]
    import scad._memserver as memserver
    scan, memserver._scan_json = memserver._scan_json, None  # a Python without json's C scanner
    try:
        assert loads_record(record) == json.loads(record)
    finally:
        memserver._scan_json = scan


def test_a_grant_and_its_secret_are_read_from_any_layout_of_its_configuration():
    from scad._memserver import config_value, grant_of

    def both(config):
        try:
            return (config_value(config, "grant"), config_value(config, "secret"))
        except RuntimeError:
            return RuntimeError

    def fast(config):
        try:
            return grant_of(config)
        except RuntimeError:
            return RuntimeError

    manager = RdmaManager(host=None, transport=None, timeout=10.0)
    memory = numpy.zeros(64, dtype=numpy.uint8)
    buf = manager.request_buffer(memory)  # a configuration libd made, read through grant_of
    try:
        made = manager._server.grant_ex(manager._cache.find(memory.ctypes.data, 64).element, "*")
        manager._server.revoke(fast(made)[0])
        assert fast(made) == both(made) and made.endswith(f"grant,{fast(made)[0]};secret,{fast(made)[1]}")
        assert (buf.grant, buf._secret) != fast(made), "each grant its own id and secret"
    finally:
        manager.drop(buf)
    for config in ("grant,g1;secret,ab", "host,h;path,/p;grant,g1;secret,ab", "secret,ab;grant,g1",
                   "host,h;secret,ab;port,1;grant,g1", "host,h;xgrant,g0;secret,ab", "host,h;grant,g1",
                   "secret,ab", "host,h;grant,g1;secret,ab;extra,1", "",
                   # a key given twice: the first counts
                   "secret,a;grant,g;secret,b", "grant,a;grant,b;secret,s", "h,1;secret,a;grant,g;secret,b",
                   "h,1;grant,a;grant,b;secret,s", "xsecret,a;grant,g;secret,b"):
        assert fast(config) == both(config), config


def test_a_first_transfer_whose_task_is_cancelled_is_cancelled_and_leaves_nothing_behind():
    """A buffer's first transfer is one of its own: a task cancelled while it waits (asyncio.wait_for
    running out) cancels the transfer, closes the eventfd it slept on and frees the route, and the
    buffer's next transfer goes through."""
    owner = RdmaManager(host=None, transport=None, timeout=10.0)
    peer = RdmaManager(host=None, transport="tcp", timeout=10.0)
    memory = numpy.arange(8 * MiB, dtype=numpy.uint64).view(numpy.uint8)  # 64 MiB
    dst = numpy.zeros(64 * MiB, dtype=numpy.uint8)

    async def main():
        bufs = [RdmaBuffer.from_json(owner.request_buffer(memory).to_json()) for _ in range(4)]
        await peer.transfer(bufs[0], dst[:64], 0, 10.0, read=True)  # the owner's server reached
        fds = len(os.listdir("/proc/self/fd"))
        for buf in bufs[1:]:
            # The owner's server loop leased by this thread, which does not run it meanwhile: the
            # transfer cannot finish before the task is cancelled, however the host schedules
            # the threads (with the server free, a loop starved for the transfer's 10 ms found
            # it done beside the deadline, and wait_for returned its result).
            owner._server.progress(1_000_000)
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(peer.transfer(buf, dst, 0, 10.0, read=True), 0.001)
            assert buf.route not in peer._one_shots, "the cancelled transfer was let go of"
        owner._server.progress(0)  # the server's own thread serves again
        assert len(os.listdir("/proc/self/fd")) == fds, "an eventfd of a cancelled wait was left open"
        await peer.transfer(bufs[-1], dst, 0, 30.0, read=True)
        assert (dst == memory).all()
        for buf in bufs:
            peer.drop(buf)
            owner.drop(buf)
    asyncio.run(main())


def test_a_transfer_refused_beside_a_buffers_first_one_leaves_that_one_running():
    """A buffer's first transfer runs on a transport of its own, so a second transfer of the same
    buffer may start while it runs (on the buffer's link): that one refused (a write with a key
    that only reads) leaves the first to finish. (Both ride one connection, whose answers come in
    order: the refusal comes after the first's bytes.)"""
    owner = RdmaManager(host=None, transport=None, timeout=10.0)
    peer = RdmaManager(host=None, transport="tcp", timeout=10.0)
    memory = numpy.arange(8 * MiB, dtype=numpy.uint64).view(numpy.uint8)  # 64 MiB, read only
    memory.flags.writeable = False
    dst = numpy.zeros(64 * MiB, dtype=numpy.uint8)

    async def main():
        warm = RdmaBuffer.from_json(owner.request_buffer(memory).to_json())
        await peer.transfer(warm, dst[:64], 0, 10.0, read=True)  # the owner's server reached
        buf = RdmaBuffer.from_json(owner.request_buffer(memory).to_json())
        first = asyncio.ensure_future(peer.transfer(buf, dst, 0, 30.0, read=True))
        await asyncio.sleep(0)  # the first starts (64 MiB: it runs on while the second is refused)
        assert buf.route in peer._one_shots
        with pytest.raises(PermissionError, match="read-only"):
            await peer.transfer(buf, numpy.full(64, 7, dtype=numpy.uint8), 0, 10.0, read=False)
        await first  # neither cancelled nor failed by the refusal beside it
        assert (dst == memory).all()
        for b in (warm, buf):
            peer.drop(b)
            owner.drop(b)
    asyncio.run(main())


def test_a_failed_link_leaves_the_routes_running_first_transfer_alone():
    """What a link's failure lets go of: the route's first transfer (another task's, on a
    transport of its own) only once it has finished; a drop lets go of it whatever it does."""
    peer = RdmaManager(host=None, transport="tcp", timeout=10.0)

    class OneShot:
        def __init__(self, done):
            self._done, self.cancelled, self.terminated = done, False, False

        def done(self):
            return self._done

        def cancel(self):
            self.cancelled = True

        def terminate(self):
            self.terminated = True

    route = ("127.0.0.1", 1, "", "g1")
    running = OneShot(False)
    peer._one_shots[route] = running
    peer._forget_link(route, failed=True)
    assert peer._one_shots.get(route) is running and not running.cancelled and not running.terminated
    finished = OneShot(True)
    peer._one_shots[route] = finished
    peer._forget_link(route, failed=True)
    assert route not in peer._one_shots and finished.terminated
    peer._one_shots[route] = running
    peer._forget_link(route, reuse=True)  # the buffer dropped here: what still runs is cancelled
    assert route not in peer._one_shots and running.cancelled and running.terminated


def test_a_buffers_key_is_made_when_the_buffer_first_leaves_its_owner():
    """Registration makes no key (as NIXL's makes none until its metadata is exported): the
    record makes it, once; a copy of the handle in the owner's process is the same buffer, whose
    drop revokes it; a handle dropped before anyone asked for its key gives a record the owner
    refuses, as a dropped buffer's."""
    owner = RdmaManager(host=None, transport=None, timeout=10.0)
    peer = RdmaManager(host=None, transport="tcp", timeout=10.0)
    memory = numpy.arange(64, dtype=numpy.uint8)
    buf = owner.request_buffer(memory)
    assert not buf.has_key() and owner.regions() == [(memory.ctypes.data, 64, 1)]
    record = buf.to_json()
    assert buf.has_key() and buf.to_json() == record and pickle.loads(pickle.dumps(buf)).to_json() == record
    dst = numpy.zeros(64, dtype=numpy.uint8)
    asyncio.run(peer.transfer(RdmaBuffer.from_json(record), dst, 0, 10.0, read=True))
    assert (dst == memory).all()
    owner.drop(RdmaBuffer.from_json(record))  # a copy: the same buffer, dropped
    assert owner.regions() == []
    with pytest.raises(KeyError):
        owner._server.revoke(buf.grant)  # revoked already
    with pytest.raises((PermissionError, ConnectionError)):
        asyncio.run(peer.transfer(RdmaBuffer.from_json(record), dst, 0, 10.0, read=True))
    buf.drop()  # the original, after its copy: nothing left to do

    never_sent = owner.request_buffer(memory)
    peer.drop(never_sent)  # another manager (a peer) lets go of a link it cannot have: no key made for that
    peer.release_queue_pair(never_sent)
    assert not never_sent.has_key() and owner.regions() == [(memory.ctypes.data, 64, 1)]
    assert type(type(never_sent).from_json(record)) is RdmaBuffer and RdmaBuffer.from_json(record).has_key()
    with pytest.raises(TypeError, match="request_buffer"):
        type(never_sent)(owner="o", hostname="h", host="h", port=1, path="", verbs=False, grant="g", secret="s",
                         offset=0, size=1, whole=True)
    never_sent.drop()
    assert owner.regions() == [] and not never_sent.has_key()
    late = RdmaBuffer.from_json(never_sent.to_json())
    with pytest.raises(PermissionError, match="dropped or expired"):
        asyncio.run(peer.transfer(late, dst, 0, 10.0, read=True))


FORKED_LENDER = r"""
import asyncio, os, sys
import numpy
from scad.rdma import RdmaBuffer, RdmaManager
manager = RdmaManager.get()
memory = numpy.arange(64, dtype=numpy.uint8)
sent, unsent = manager.request_buffer(memory), manager.request_buffer(memory[:32])
record = sent.to_json()
pid = os.fork()
if pid == 0:  # the child: the parent's buffers, its own manager
    code = 0
    try:
        assert sent.to_json() == record
        try:
            unsent.to_json()
            code = 3
        except RuntimeError as e:
            code = 0 if "before fork" in str(e) else 4
        try:
            manager.request_buffer(memory)  # the parent's manager: its server runs in the parent only
            code = code or 7
        except RuntimeError as e:
            code = code or (0 if "parent process" in str(e) else 8)
        sent.drop()
        unsent.drop()  # neither reaches the parent's server (its copy here runs nowhere): no hang
        manager.drop(sent)  # nor through the parent's manager
        dst = numpy.zeros(64, dtype=numpy.uint8)
        asyncio.run(RdmaManager.get().transfer(RdmaBuffer.from_json(record), dst, 0, 10.0, read=True))
        code = code or (0 if (dst == memory).all() else 5)
    except BaseException as e:
        print(repr(e), file=sys.stderr)
        code = 6
    os._exit(code)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, os.waitstatus_to_exitcode(status)
assert [r[2] for r in manager.regions()] == [2], "the child's drops left the parent's buffers alone"
assert unsent.to_json() and not sent.drop() and not unsent.drop() and manager.regions() == []
print("ok")
"""


def test_a_child_forked_after_the_lending_neither_makes_keys_nor_drops_the_parents_buffers():
    import subprocess
    import sys
    from scadtest import BUILD, ROOT
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(BUILD / "python"), str(ROOT / "bindings" / "python")]))
    done = subprocess.run([sys.executable, "-c", FORKED_LENDER], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


@pytest.mark.parametrize("transport", [None, "tcp"])
def test_read_only_memory_is_lent_with_a_key_that_only_reads(transport):
    owner = RdmaManager(host=None, transport=None, timeout=10.0)
    peer = RdmaManager(host=None, transport=transport, timeout=10.0)
    frozen = numpy.arange(64, dtype=numpy.uint8)
    frozen.flags.writeable = False
    for memory in (frozen, bytes(range(64))):
        buf = owner.request_buffer(memory)
        remote = RdmaBuffer.from_json(buf.to_json())
        dst = numpy.zeros(64, dtype=numpy.uint8)
        asyncio.run(peer.transfer(remote, dst, 0, 10.0, read=True))
        assert dst.tobytes() == bytes(range(64))
        with pytest.raises(PermissionError, match="read-only"):
            asyncio.run(peer.transfer(remote, numpy.full(64, 7, dtype=numpy.uint8), 0, 10.0, read=False))
        assert bytes(memory) == bytes(range(64)), "nothing was written"
        buf.drop()
    if not owner._endpoint["verbs"]:  # a list (not offered where the server serves verbs): read only if any is
        both = owner.request_buffer([frozen, bytearray(16)])
        remote = RdmaBuffer.from_json(both.to_json())
        with pytest.raises(PermissionError, match="read-only"):
            asyncio.run(peer.transfer(remote, numpy.full(16, 7, dtype=numpy.uint8), 64, 10.0, read=False))
        dst = numpy.zeros(80, dtype=numpy.uint8)
        asyncio.run(peer.transfer(remote, dst, 0, 10.0, read=True))
        assert dst[:64].tobytes() == bytes(range(64)) and not dst[64:].any()
        owner.drop(both)
    writable = owner.request_buffer(numpy.zeros(64, dtype=numpy.uint8))  # the same manager: rights per buffer
    asyncio.run(peer.transfer(RdmaBuffer.from_json(writable.to_json()), numpy.full(64, 7, dtype=numpy.uint8), 0,
                              10.0, read=False))
    writable.drop()


def test_an_owner_that_polls_serves_the_peers_transfers_on_its_own_thread():
    import threading
    import time

    owner = RdmaManager(host=None, transport=None, timeout=10.0)
    peer = RdmaManager(host=None, transport="tcp", timeout=10.0)
    assert owner.progress() is False, "nothing lent yet: no server to drive"
    src = numpy.frombuffer(os.urandom(64 * KiB), dtype=numpy.uint8).copy()
    buf = owner.request_buffer(src)
    with pytest.raises(ValueError, match="lease_us"):
        owner.progress(-1)

    def reader(dst):
        t = threading.Thread(target=lambda: asyncio.run(peer.transfer(buf, dst, 0, 10.0, read=True)))
        t.start()
        return t

    # While the owner's thread drives its server, the peer connects and reads: the bytes arrive.
    dst = numpy.zeros(64 * KiB, dtype=numpy.uint8)
    t = reader(dst)
    while t.is_alive():
        owner.progress()
    t.join()
    assert dst.tobytes() == src.tobytes()
    # The lease is real: taken for 1 s and not driven, the server's own thread stays parked and
    # the read is served only once the lease lapses.
    while not owner.progress(1_000_000):
        pass
    again = numpy.zeros(64 * KiB, dtype=numpy.uint8)
    t0 = time.monotonic()
    t = reader(again)
    t.join()
    assert time.monotonic() - t0 >= 0.5, "served while the owner held its server"
    assert again.tobytes() == src.tobytes()
    # Given back, the server's own thread serves at once.
    owner.progress(0)
    third = numpy.zeros(64 * KiB, dtype=numpy.uint8)
    reader(third).join()
    assert third.tobytes() == src.tobytes()
    owner.drop(buf)


def test_busy_polling_is_a_duration():
    with pytest.raises(ValueError, match="busy_poll_us"):
        RdmaManager(host=None, transport=None, timeout=30.0, busy_poll_us=-1)
    assert RdmaManager(host=None, transport=None, timeout=30.0, busy_poll_us=250).busy_poll_us == 250.0


def test_a_torch_tensor_is_lent_read_into_and_written_from_in_place():
    torch = needs_torch()
    manager = RdmaManager.get()
    weights = torch.arange(1 << 12, dtype=torch.float32)
    buf = manager.request_buffer(weights)
    assert buf.size() == weights.numel() * 4
    row = torch.zeros(256, dtype=torch.float32)

    async def main():
        await buf.read_into(row, offset=1024 * 4)
        await buf.write_from(torch.full((4,), -1.0), offset=0)
    try:
        asyncio.run(main())
        assert torch.equal(row, torch.arange(1024, 1280, dtype=torch.float32))
        assert weights[:4].tolist() == [-1.0] * 4 and weights[4] == 4.0, "written into the owner's own tensor"
    finally:
        manager.release_queue_pair(buf)
        buf.drop()
