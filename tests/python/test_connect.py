"""scad.connect between real processes: a passive and an active peer (tests/python/connect_peer.py)
exchange metadata over pipes, through this test, and move memory over shm or tcp."""
import hashlib
import json
import os

import pytest

from peer_process import PeerProc, assert_a_thousand_leak_nothing
from scadtest import wait_until

PEER = os.path.join(os.path.dirname(__file__), "connect_peer.py")

def _has_rdma_device():
    try:
        return bool(os.listdir("/sys/class/infiniband"))
    except OSError:
        return False


# verbs runs where there is a device (the Soft-RoCE guest: tests/softroce/run). The tests that
# stop a peer mid-transfer stay on shm and tcp: an RDMA transfer goes on in the adapter while its
# process is stopped, so what the peer sees next is not determined.
IMPLS = ["shm", "tcp"]
ALL_IMPLS = IMPLS + (["verbs"] if os.environ.get("LIBD_REQUIRE_VERBS") or _has_rdma_device() else [])
# Where a transfer is still on its way when begin_* returns. Over shm the copies are done inside
# begin_*, which tells the owner there and then (test_over_shm_begin_moves_the_bytes_and_tells_the_owner).
IN_FLIGHT = [impl for impl in ALL_IMPLS if impl != "shm"]
# Where the owner hears of a cancel on the active side: over tcp the word goes with the requests
# (test_over_tcp_the_word_goes_with_the_requests), so only verbs is left.
WORD_AFTER = [impl for impl in IN_FLIGHT if impl != "tcp"]
MiB = 1 << 20


@pytest.fixture
def peers():
    made = []

    def make(transport):
        p = PeerProc(PEER, transport)
        made.append(p)
        return p

    yield make
    for p in made:
        p.close()


def expected_digests(sizes, seed):
    import numpy
    rng = numpy.random.default_rng(seed)  # as connect_peer.buffers
    return [hashlib.sha256(rng.integers(0, 256, size=s, dtype=numpy.uint8).tobytes()).hexdigest() for s in sizes]


def pair(peers, impl):
    return peers(impl), peers(impl)


@pytest.mark.parametrize("impl", ALL_IMPLS)
@pytest.mark.parametrize("style", ["direct", "await"])
def test_read_a_list_of_descriptors(peers, impl, style):
    passive, active = pair(peers, impl)
    sizes = [3, 64 * 1024, MiB + 5]
    md = passive.call(cmd="create", kind="read", sizes=sizes, seed=7)["metadata"]
    # The list is lent as one element under one grant, unless the owner serves RDMA verbs too
    # (one remote key reaches one range: a grant per descriptor there).
    # In the record, the descriptors after the first under a grant carry only size and device.
    grants = [d.get("grant") for d in json.loads(md)["descriptors"]]
    lists = len(sizes) if json.loads(md)["verbs"] else 1  # the owner serves verbs: a grant each
    assert len([g for g in grants if g]) == len(set(g for g in grants if g)) == lists, grants
    begun = active.call(cmd="begin", kind="read", metadata=md, sizes=sizes, style=style)
    assert begun == {"ok": True, "transport": impl}
    done = active.call(cmd="wait", timeout=30)
    assert (done["status"], done["error"]) == ("COMPLETE", None), done["message"]
    owner = passive.call(cmd="wait", timeout=30)
    assert (owner["status"], owner["error"]) == ("COMPLETE", None), owner["message"]
    assert done["digests"] == owner["digests"], "the reader holds exactly the owner's bytes"


@pytest.mark.parametrize("impl", IMPLS)
def test_an_owner_that_polls_serves_its_peer_and_then_lets_its_server_go(peers, impl):
    """The owner's wait, polling, serves the reader's requests itself (its server's loop leased).
    Once it stops polling (its next command is a blocking read of its stdin here), its server's
    own thread serves the next reader; a poll too short for the reader goes to sleep and gives
    the server back, and the word still reaches it."""
    passive, active = pair(peers, impl)
    sizes = [64, 200_000]
    for seed, poll_us, reader_first in ((1, 200_000, True), (2, 0, True), (3, 50, False)):
        md = passive.call(cmd="create", kind="read", sizes=sizes, seed=seed)["metadata"]
        if reader_first:  # the owner is not waiting: its server serves
            assert active.call(cmd="begin", kind="read", metadata=md, sizes=sizes) == {"ok": True, "transport": impl}
            done = active.call(cmd="wait", timeout=30)
            owner = passive.call(cmd="wait", timeout=30, busy_poll_us=poll_us)
        else:  # the owner waits first and polls, then sleeps
            passive.send(cmd="wait", timeout=30, busy_poll_us=poll_us)
            assert active.call(cmd="begin", kind="read", metadata=md, sizes=sizes) == {"ok": True, "transport": impl}
            done = active.call(cmd="wait", timeout=30)
            owner = passive.recv(90)
        assert (done["status"], done["error"]) == ("COMPLETE", None), done["message"]
        assert (owner["status"], owner["error"]) == ("COMPLETE", None), owner["message"]
        assert done["digests"] == owner["digests"] == expected_digests(sizes, seed)


@pytest.mark.parametrize("impl", IMPLS)
def test_an_owner_whose_poll_ran_out_hears_the_word_at_once(peers, impl):
    """A wait that stops polling and sleeps gives its server's loop back first: the word that
    comes later reaches it without waiting for the lease (a second here) to lapse."""
    passive, active = pair(peers, impl)
    for seed in (1, 2, 3):
        md = passive.call(cmd="create", kind="read", sizes=[64], seed=seed)["metadata"]
        passive.send(cmd="wait", timeout=30, busy_poll_us=100, lease_us=1_000_000)
        assert active.call(cmd="begin", kind="read", metadata=md, sizes=[64]) == {"ok": True, "transport": impl}
        done = active.call(cmd="wait", timeout=30)
        owner = passive.recv(90)
        assert (done["status"], owner["status"]) == ("COMPLETE", "COMPLETE"), (done["message"], owner["message"])
        assert owner["at"] - done["at"] < 0.5, "the owner's server stayed parked after its wait went to sleep"


@pytest.mark.parametrize("impl", IMPLS)
def test_a_polling_owner_serves_a_reader_that_comes_while_it_waits(peers, impl):
    passive, active = pair(peers, impl)
    sizes = [3, MiB]
    for seed in range(4, 9):
        md = passive.call(cmd="create", kind="read", sizes=sizes, seed=seed)["metadata"]
        passive.send(cmd="wait", timeout=30, busy_poll_us=2_000_000)  # polls through the whole read
        assert active.call(cmd="begin", kind="read", metadata=md, sizes=sizes) == {"ok": True, "transport": impl}
        done = active.call(cmd="wait", timeout=30)
        owner = passive.recv(90)
        assert (done["status"], owner["status"]) == ("COMPLETE", "COMPLETE"), (done["message"], owner["message"])
        assert done["digests"] == owner["digests"] == expected_digests(sizes, seed)


@pytest.mark.parametrize("impl", ALL_IMPLS)
def test_write_into_the_owners_memory(peers, impl):
    passive, active = pair(peers, impl)
    sizes = [4096, 2 * MiB]
    md = passive.call(cmd="create", kind="write", sizes=sizes)["metadata"]  # zeros
    assert active.call(cmd="begin", kind="write", metadata=md, sizes=sizes, seed=11)["ok"]
    done = active.call(cmd="wait", timeout=30)
    assert (done["status"], done["error"]) == ("COMPLETE", None), done["message"]
    owner = passive.call(cmd="wait", timeout=30)
    assert (owner["status"], owner["error"]) == ("COMPLETE", None), owner["message"]
    assert owner["digests"] == done["digests"], "the owner's own arrays now hold the writer's bytes"


@pytest.mark.parametrize("impl", ALL_IMPLS)
def test_bytes_are_lent_to_readers_and_written_from(peers, impl):
    passive, active = pair(peers, impl)
    sizes = [4096, 100]
    md = passive.call(cmd="create", kind="read", sizes=sizes, seed=21, as_bytes=True)["metadata"]
    assert active.call(cmd="begin", kind="read", metadata=md, sizes=sizes)["ok"]
    assert active.call(cmd="wait", timeout=30)["digests"] == expected_digests(sizes, 21)
    assert passive.call(cmd="wait", timeout=30)["status"] == "COMPLETE"
    md = passive.call(cmd="create", kind="write", sizes=sizes)["metadata"]
    assert active.call(cmd="begin", kind="write", metadata=md, sizes=sizes, seed=22, as_bytes=True)["ok"]
    assert active.call(cmd="wait", timeout=30)["status"] == "COMPLETE"
    assert passive.call(cmd="wait", timeout=30)["digests"] == expected_digests(sizes, 22)
    # bytes are read-only: a writable over them, or a read into them, is refused.
    r = passive.call(cmd="create", kind="write", sizes=sizes, as_bytes=True)
    assert r.get("error") == "ValueError", r
    md = passive.call(cmd="create", kind="read", sizes=sizes, seed=23)["metadata"]
    r = active.call(cmd="begin", kind="read", metadata=md, sizes=sizes, as_bytes=True)
    assert r.get("error") == "ValueError", r


@pytest.mark.parametrize("impl", ALL_IMPLS)
def test_the_wrong_pairing_is_refused(peers, impl):
    passive, active = pair(peers, impl)
    md = passive.call(cmd="create", kind="read", sizes=[4096], seed=1)["metadata"]
    r = active.call(cmd="begin", kind="write", metadata=md, sizes=[4096], seed=2)
    assert r["error"] == "ValueError" and "use connector.begin_read()" in r["message"]
    # A record altered to claim the other direction is refused by the owner's grant itself.
    forged = json.dumps(dict(json.loads(md), operation_kind=2))
    r = active.call(cmd="begin", kind="write", metadata=forged, sizes=[4096], seed=2)
    if "ok" in r:  # tcp: the owner refuses the write itself
        r = active.call(cmd="wait", timeout=30)
    assert r["error"] in ("PermissionError", "OSError"), r
    # The owner learns its peer gave up, and not one byte of its memory was written.
    owner = passive.call(cmd="wait", timeout=30)
    assert owner["status"] == "ERRORED", owner
    assert owner["digests"] == expected_digests([4096], seed=1)


@pytest.mark.parametrize("impl", ALL_IMPLS)
def test_a_finished_operations_metadata_is_refused(peers, impl):
    passive, active = pair(peers, impl)
    md = passive.call(cmd="create", kind="read", sizes=[4096], seed=1)["metadata"]
    assert active.call(cmd="begin", kind="read", metadata=md, sizes=[4096])["ok"]
    assert active.call(cmd="wait", timeout=30)["status"] == "COMPLETE"
    assert passive.call(cmd="wait", timeout=30)["status"] == "COMPLETE"
    again = active.call(cmd="begin", kind="read", metadata=md, sizes=[4096])
    assert again["error"] == "PermissionError" and "finished, was cancelled or expired" in again["message"]


@pytest.mark.parametrize("impl", ALL_IMPLS)
def test_a_cancelled_operations_metadata_is_refused(peers, impl):
    passive, active = pair(peers, impl)
    md = passive.call(cmd="create", kind="write", sizes=[4096])["metadata"]
    assert passive.call(cmd="cancel")["status"] == "CANCELLED"
    r = active.call(cmd="begin", kind="write", metadata=md, sizes=[4096], seed=3)
    assert r["error"] == "PermissionError"


@pytest.mark.parametrize("impl", ALL_IMPLS)
def test_a_dropped_operation_revokes_its_grant(peers, impl):
    passive, active = pair(peers, impl)
    md = passive.call(cmd="create", kind="read", sizes=[4096], seed=1)["metadata"]
    assert passive.call(cmd="drop")["ok"]
    r = active.call(cmd="begin", kind="read", metadata=md, sizes=[4096])
    assert r["error"] == "PermissionError"


@pytest.mark.parametrize("impl", ALL_IMPLS)
def test_an_expired_operation_ends_and_its_metadata_is_refused(peers, impl):
    passive, active = pair(peers, impl)
    md = passive.call(cmd="create", kind="read", sizes=[4096], seed=1, expires_in=0.3)["metadata"]
    owner = passive.call(cmd="wait", timeout=30)  # nobody reads: the expiry, not the timeout, ends it
    assert (owner["status"], owner["error"]) == ("ERRORED", "TimeoutError"), owner
    assert "expired" in owner["message"]
    r = active.call(cmd="begin", kind="read", metadata=md, sizes=[4096])
    assert r["error"] == "PermissionError"


@pytest.mark.parametrize("impl", ALL_IMPLS)
def test_a_wait_timeout_leaves_the_operation_running(peers, impl):
    passive, active = pair(peers, impl)
    md = passive.call(cmd="create", kind="read", sizes=[4096], seed=5)["metadata"]
    owner = passive.call(cmd="wait", timeout=0.2)
    assert (owner["status"], owner["error"]) == ("INITIALIZED", "TimeoutError")
    assert active.call(cmd="begin", kind="read", metadata=md, sizes=[4096])["ok"]
    assert active.call(cmd="wait", timeout=30)["status"] == "COMPLETE"
    assert passive.call(cmd="wait", timeout=30)["status"] == "COMPLETE"


@pytest.mark.parametrize("kind", ["read", "write"])
def test_over_shm_begin_moves_the_bytes_and_tells_the_owner(peers, kind):
    # The active side stops itself as soon as begin_* has answered: the owner's wait still ends
    # COMPLETE with every byte moved, so the copy and the word both happened inside begin_*.
    passive, active = pair(peers, "shm")
    sizes = [8 * MiB, 3]
    md = passive.call(cmd="create", kind=kind, sizes=sizes, seed=1)["metadata"]
    passive.send(cmd="wait", timeout=30)
    assert active.call(cmd="begin", kind=kind, metadata=md, sizes=sizes, seed=2, stop=True)["ok"]
    active.wait_stopped()
    owner = passive.recv(60)
    assert (owner["status"], owner["error"]) == ("COMPLETE", None), owner
    if kind == "write":
        assert owner["digests"] == expected_digests(sizes, 2)
    active.resume()
    # Over and done: a cancel now changes nothing on either side.
    assert active.call(cmd="cancel")["status"] == "COMPLETE"
    done = active.call(cmd="wait", timeout=30)
    assert (done["status"], done["error"]) == ("COMPLETE", None), done
    if kind == "read":
        assert done["digests"] == expected_digests(sizes, 1)


@pytest.mark.parametrize("kind", ["read", "write"])
def test_over_tcp_the_word_goes_with_the_requests(peers, kind):
    # The active side cancels as soon as begin_* has answered, with 8 MiB on their way: its word
    # went out with its requests, so the owner still ends COMPLETE once its memory has been
    # served (read) or written (write) in full, and a write's bytes are all there.
    passive, active = pair(peers, "tcp")
    md = passive.call(cmd="create", kind=kind, sizes=[8 * MiB], seed=1)["metadata"]
    assert active.call(cmd="begin", kind=kind, metadata=md, sizes=[8 * MiB], seed=2)["ok"]
    assert active.call(cmd="cancel")["status"] in ("CANCELLED", "COMPLETE")
    owner = passive.call(cmd="wait", timeout=30)
    assert (owner["status"], owner["error"]) == ("COMPLETE", None), owner
    if kind == "write":
        assert owner["digests"] == expected_digests([8 * MiB], 2)


@pytest.mark.parametrize("impl", WORD_AFTER)
@pytest.mark.parametrize("kind", ["read", "write"])
@pytest.mark.parametrize("end", ["cancel", "drop"])
def test_the_active_side_cancelling_is_seen_by_the_owner(peers, impl, kind, end):
    passive, active = pair(peers, impl)
    md = passive.call(cmd="create", kind=kind, sizes=[8 * MiB], seed=1)["metadata"]
    assert active.call(cmd="begin", kind=kind, metadata=md, sizes=[8 * MiB], seed=2)["ok"]
    if end == "cancel":
        assert active.call(cmd="cancel")["status"] == "CANCELLED"
    else:  # dropped unfinished: its finaliser cancels it
        assert active.call(cmd="drop")["ok"]
    owner = passive.call(cmd="wait", timeout=30)
    assert (owner["status"], owner["error"]) == ("CANCELLED", "OperationCancelledError"), owner
    assert "the peer cancelled" in owner["message"]


@pytest.mark.parametrize("kind", ["read", "write"])
def test_the_owner_cancelling_mid_transfer_fails_the_peer(peers, kind):
    # The active side stops itself right after posting 64 MiB over tcp: the transfer is unfinished
    # unless the active side's loop thread moved all 64 MiB before the process stopped (its main
    # thread held off the processor that long). Continued, it must fail with the owner's reason,
    # never hang; or have finished the whole transfer before the cancel.
    impl = "tcp"
    passive, active = pair(peers, impl)
    md = passive.call(cmd="create", kind=kind, sizes=[64 * MiB], seed=1)["metadata"]
    assert active.call(cmd="begin", kind=kind, metadata=md, sizes=[64 * MiB], seed=2, stop=True)["ok"]
    active.wait_stopped()
    cancelled = passive.call(cmd="cancel")["status"]  # COMPLETE if the peer's word came first
    assert cancelled in ("CANCELLED", "COMPLETE")
    active.resume()
    done = active.call(cmd="wait", timeout=30)
    if done["status"] == "COMPLETE" or cancelled == "COMPLETE":
        assert done["status"] == "COMPLETE", (cancelled, done)  # the owner had the word: every byte moved
        moved = done["digests"] if kind == "read" else passive.call(cmd="wait", timeout=30)["digests"]
        assert moved == expected_digests([64 * MiB], 1 if kind == "read" else 2), "COMPLETE with the bytes not all moved"
        return
    assert (done["status"], done["error"]) == ("ERRORED", "ConnectionError"), done


def queued_to(port):
    """Bytes on their way to this host's IPv4 tcp server on `port` (/proc/net/tcp): in its
    sockets' receive queues and in its clients' send queues. What a stopped owner's server has
    been sent and has not read."""
    total = 0
    with open("/proc/net/tcp") as table:
        for line in table.readlines()[1:]:
            fields = line.split()
            tx_queue, rx_queue = (int(n, 16) for n in fields[4].split(":"))
            if int(fields[1].split(":")[1], 16) == port:
                total += rx_queue
            elif int(fields[2].split(":")[1], 16) == port:
                total += tx_queue
    return total


def begin_while_the_owner_is_stopped(passive, active, kind):
    """Over tcp, an active operation of 64 MiB that cannot finish: its owner is stopped (SIGSTOP)
    before the active side begins, and this returns once the active side's requests (for a write,
    and a MiB of its bytes) are on their way to the owner's socket; nothing has been served. The
    pair's connection is made first, by a small operation, so that no handshake waits for the
    owner. (Stopping the active side right after begin_* instead leaves a race: the word goes with
    the requests, and its loop thread may have moved all 64 MiB before the process stops.)
    The active side's answer to "begin" comes once the owner is back, or dies."""
    small = passive.call(cmd="create", kind=kind, sizes=[4096], seed=3)["metadata"]
    assert active.call(cmd="begin", kind=kind, metadata=small, sizes=[4096], seed=4)["ok"]
    assert active.call(cmd="wait", timeout=30)["status"] == passive.call(cmd="wait", timeout=30)["status"] == "COMPLETE"
    md = passive.call(cmd="create", kind=kind, sizes=[64 * MiB], seed=1)["metadata"]
    port = json.loads(md)["port"]
    assert wait_until(lambda: queued_to(port) == 0, 30), "the owner did not read what the first operation sent"
    passive.stop()
    active.send(cmd="begin", kind=kind, metadata=md, sizes=[64 * MiB], seed=2)
    # An ATTACH alone is over 100 bytes; a write's payload follows its requests.
    least = MiB if kind == "write" else 100
    assert wait_until(lambda: queued_to(port) >= least, 30), "the active side's requests never reached the stopped owner"


@pytest.mark.parametrize("impl", IN_FLIGHT)
@pytest.mark.parametrize("kind", ["read", "write"])
def test_the_active_side_killed_mid_transfer_fails_the_owners_wait(peers, impl, kind):
    passive, active = pair(peers, impl)
    if impl == "tcp":
        begin_while_the_owner_is_stopped(passive, active, kind)
        active.kill()
        passive.resume()
    else:
        md = passive.call(cmd="create", kind=kind, sizes=[64 * MiB], seed=1)["metadata"]
        assert active.call(cmd="begin", kind=kind, metadata=md, sizes=[64 * MiB], seed=2, stop=True)["ok"]
        active.wait_stopped()
        active.kill()
    owner = passive.call(cmd="wait", timeout=30)
    assert (owner["status"], owner["error"]) == ("ERRORED", "ConnectionError"), owner
    assert "closed before it said it finished" in owner["message"]


@pytest.mark.parametrize("kind", ["read", "write"])
def test_the_owner_killed_mid_transfer_fails_the_active_side(peers, kind):
    passive, active = pair(peers, "tcp")
    begin_while_the_owner_is_stopped(passive, active, kind)
    passive.kill()
    # The owner never answered: begin_* fails (it waits for the owner's verdict on the grant),
    # or, had the verdict come, the wait does.
    begun = active.recv(60)
    if "error" in begun:
        assert begun["error"] == "ConnectionError", begun
        return
    done = active.call(cmd="wait", timeout=30)
    assert (done["status"], done["error"]) == ("ERRORED", "ConnectionError"), done


@pytest.mark.parametrize("impl", ALL_IMPLS)
def test_an_owner_that_is_gone_is_an_error_at_once(peers, impl):
    passive, active = pair(peers, impl)
    md = passive.call(cmd="create", kind="read", sizes=[4096], seed=1)["metadata"]
    passive.kill()
    r = active.call(cmd="begin", kind="read", metadata=md, sizes=[4096])
    assert r["error"] == "ConnectionError" and "cannot reach the owner" in r["message"], r


@pytest.mark.parametrize("impl", ALL_IMPLS)
@pytest.mark.parametrize("kind", ["read", "write"])
def test_a_thousand_operations_leak_neither_memory_nor_descriptors(peers, impl, kind):
    passive, active = pair(peers, impl)

    def one():
        md = passive.call(cmd="create", kind=kind, sizes=[4096, 100], seed=3)["metadata"]
        assert active.call(cmd="begin", kind=kind, metadata=md, sizes=[4096, 100], seed=4)["ok"]
        assert active.call(cmd="wait", timeout=30)["status"] == "COMPLETE"
        assert passive.call(cmd="wait", timeout=30)["status"] == "COMPLETE"

    assert_a_thousand_leak_nothing(one, [passive, active], ["owner", "reader"])
