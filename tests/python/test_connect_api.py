"""scad.connect's objects on their own: descriptors over every kind of memory, the metadata record,
argument checks. Transfers between processes are in test_connect.py."""
import asyncio
import copy
import ctypes
import json
import os
import pickle

import numpy
import pytest

from scadtest import needs_torch
from scad.connect import (Connector, Descriptor, Device, DeviceKind, OperationKind, OperationStatus, RdmaMetadata)


def address_of(array):
    return array.__array_interface__["data"][0]


def test_descriptors_point_at_the_callers_memory_without_copying():
    arr = numpy.arange(100, dtype=numpy.uint32)
    d = Descriptor(arr)
    assert (d.ptr, d.size, d.readonly) == (address_of(arr), 400, False)
    assert d.device == Device("cpu") and d.device.kind is DeviceKind.HOST

    raw = bytearray(b"x" * 64)
    d = Descriptor(raw)
    assert d.ptr == ctypes.addressof(ctypes.c_char.from_buffer(raw)) and d.size == 64 and not d.readonly

    b = b"immutable"
    d = Descriptor(b)
    assert d.readonly and d.size == len(b)

    view = memoryview(arr)[10:20]
    d = Descriptor(view)
    assert (d.ptr, d.size) == (address_of(arr) + 40, 40)

    d = Descriptor((arr, "cpu"))
    assert d.ptr == address_of(arr) and d.data is arr

    d = Descriptor((address_of(arr), 400, Device((DeviceKind.HOST, 0)), arr))
    assert (d.ptr, d.size, d.data) == (address_of(arr), 400, arr)


def test_descriptors_refuse_what_cannot_be_moved_in_place():
    with pytest.raises(ValueError, match="C-contiguous"):
        Descriptor(numpy.zeros((4, 4))[:, 1])
    with pytest.raises(ValueError, match="at least one byte"):
        Descriptor(numpy.zeros(0))
    with pytest.raises(NotImplementedError, match="host memory"):
        Descriptor((numpy.zeros(4), "cuda:0"))
    with pytest.raises(TypeError, match="Descriptor takes"):
        Descriptor([1, 2, 3])
    with pytest.raises(ValueError, match="non-null"):
        Descriptor((0, 10, "cpu"))


def test_a_torch_tensor_is_a_descriptor_and_is_read_in_place():
    torch = needs_torch()
    t = torch.arange(10, dtype=torch.float32)
    d = Descriptor(t)
    assert (d.ptr, d.size) == (t.data_ptr(), 40)
    with pytest.raises(ValueError, match="at least one byte"):  # as an empty array or bytearray is
        Descriptor(torch.zeros(0))

    async def main():
        with Connector() as owner, Connector() as reader:
            src = torch.arange(1 << 16, dtype=torch.int64)
            dst = torch.zeros(1 << 16, dtype=torch.int64)
            with owner.create_readable(Descriptor(src)) as readable:
                with await reader.begin_read(readable.metadata(), Descriptor(dst)) as op:
                    await op.wait_for_completion(timeout=10)
                await readable.wait_for_completion(timeout=10)
            assert torch.equal(src, dst)
    asyncio.run(main())


def test_register_memory_is_idempotent_and_binds_one_connector():
    a, b = Connector(), Connector()
    d = Descriptor(numpy.zeros(8))
    d.register_memory(a)
    d.register_memory(a)
    with pytest.raises(ValueError, match="another Connector"):
        d.register_memory(b)
    # Dynamo's later names for the same binding.
    assert d.is_registered
    with pytest.raises(ValueError, match="not registered with that Connector"):
        d.deregister_with_connector(b)
    d.deregister_with_connector(a)
    assert not d.is_registered
    d.register_with_connector(b)
    assert d.is_registered
    with pytest.raises(ValueError, match="another Connector"):
        d.register_with_connector(a)
    a.close()
    b.close()


def test_a_one_descriptor_record_written_by_its_owner_is_the_general_writers_text():
    with Connector() as c:
        for make in (c.create_readable, c.create_writable):
            with make(Descriptor(numpy.zeros(64, dtype=numpy.uint8)), expires_in=30) as op:
                md = op.metadata()
                text = md.to_json()  # the text the owner wrote as it made the record
                assert text == json.dumps(md.to_dict(), separators=(",", ":"))
                again = RdmaMetadata.from_json(text)
                assert again == md and again.to_json() == text  # a parsed record writes the same


def test_metadata_round_trips_hides_its_secrets_and_refuses_anything_else():
    async def main():
        with Connector() as c:
            await c.initialize()
            assert c.name.startswith("scad-connect-") and c.hostname
            arr = numpy.zeros(1000, dtype=numpy.uint8)
            with c.create_writable([Descriptor(arr), Descriptor(bytearray(10))], expires_in=30) as op:
                assert op.status is OperationStatus.INITIALIZED
                md = op.metadata()
                text = md.to_json()
                assert RdmaMetadata.from_json(text) == md
                assert RdmaMetadata.from_dict(dict(json.loads(text), operation_kind=OperationKind.WRITE)) == md
                assert RdmaMetadata.model_validate_json(md.model_dump_json()) == md
                assert md.operation_kind == OperationKind.WRITE
                assert [d.size for d in md.descriptors] == [1000, 10]
                # One list, one grant: the second descriptor is its next range (no verbs here).
                assert len({d.grant for d in md.descriptors}) == (2 if c._endpoint["verbs"] else 1)
                for d in md.descriptors:
                    assert d.secret not in repr(md) and d.secret not in str(md) and d.secret not in repr(d)
                with pytest.raises(TypeError, match="to_json"):  # data only: no pickle form
                    pickle.dumps(md)
                assert copy.deepcopy(md) is md
                raw = json.loads(text)
                for bad in (dict(raw, version=3), dict(raw, version=True), dict(raw, extra=1), {k: v for k, v in raw.items() if k != "port"},
                            dict(raw, operation_kind=3), dict(raw, operation_kind=True), dict(raw, descriptors=[]),
                            dict(raw, notification_key="NOT-HEX-0123456"), dict(raw, path="/tmp/a;grant,x"),
                            dict(raw, descriptors=[dict(raw["descriptors"][0], grant="g;host,evil")]),
                            # a range that continues no grant before it
                            dict(raw, descriptors=[{"size": 10, "device": "cpu"}] + raw["descriptors"])):
                    with pytest.raises(ValueError):
                        RdmaMetadata.from_json(json.dumps(bad))
                with pytest.raises(ValueError, match="not JSON"):
                    RdmaMetadata.from_json(b"\x80\x04pickle")
                for field, wrong in (("port", "4242"), ("owner", 7), ("verbs", 0), ("expires_at", "soon")):
                    with pytest.raises(ValueError, match=f"field '{field}' has the wrong type"):
                        RdmaMetadata.from_json(json.dumps(dict(raw, **{field: wrong})))
                # Version 1 named the grant in every descriptor: such a record still reads, the same;
                # a version-1 record in the shorter form does not.
                first = raw["descriptors"][0]
                full = [dict(d, grant=d.get("grant", first["grant"]), secret=d.get("secret", first["secret"]))
                        for d in raw["descriptors"]]
                assert RdmaMetadata.from_json(json.dumps(dict(raw, version=1, descriptors=full))).descriptors == md.descriptors
                if len(full) != len([d for d in raw["descriptors"] if "grant" in d]):
                    with pytest.raises(ValueError):
                        RdmaMetadata.from_json(json.dumps(dict(raw, version=1)))
            assert op.status is OperationStatus.CANCELLED, "leaving the block ends an unfinished operation"
            with pytest.raises(RuntimeError, match="opens nothing"):
                op.metadata()
    asyncio.run(main())


def test_a_writable_needs_writable_memory_and_a_read_needs_writable_local_memory():
    with Connector() as c:
        with pytest.raises(ValueError, match="read-only"):
            c.create_writable(Descriptor(b"constant"))
        with c.create_readable(Descriptor(b"constant")) as op:  # bytes may be read by a peer
            md = op.metadata()
            with pytest.raises(ValueError, match="read-only"):
                c.begin_read(md, Descriptor(b"12345678"))
            with pytest.raises(ValueError, match="sizes must match"):
                c.begin_read(md, Descriptor(bytearray(7)))
            with pytest.raises(ValueError, match="pair one to one"):
                c.begin_read(md, [Descriptor(bytearray(8)), Descriptor(bytearray(8))])
            with pytest.raises(TypeError, match="RdmaMetadata"):
                c.begin_read(42, Descriptor(bytearray(8)))
        with pytest.raises(ValueError, match="empty"):
            c.create_readable([])
    with pytest.raises(ValueError, match="transport"):
        Connector(transport="carrier-pigeon")


def test_busy_polling_is_a_duration():
    with pytest.raises(ValueError, match="busy_poll_us"):
        Connector(busy_poll_us=-1)
    with Connector(busy_poll_us=300) as c:
        assert c.busy_poll_us == 300.0


def test_a_list_longer_than_one_lent_element_holds_is_lent_as_several():
    """A lent element holds up to 1024 ranges: a longer list is several elements in a row, each
    with its grant, and the peer moves every descriptor."""
    async def main():
        with Connector() as owner, Connector(transport="shm") as reader:
            src = [bytearray(bytes([i % 251]) * 3) for i in range(1100)]
            dst = [bytearray(3) for _ in range(1100)]
            with owner.create_readable([Descriptor(b) for b in src]) as readable:
                md = readable.metadata()
                grants = {d.grant for d in md.descriptors}
                assert len(grants) == (1100 if owner._endpoint["verbs"] else 2), len(grants)
                with await reader.begin_read(RdmaMetadata.from_json(md.to_json()), [Descriptor(b) for b in dst]) as op:
                    await op.wait_for_completion(timeout=30)
                await readable.wait_for_completion(timeout=30)
            assert dst == src
    asyncio.run(main())


def test_a_connector_looks_up_how_to_reach_an_owner_once(monkeypatch):
    """The transport to an owner (shm on this host, else tcp) is looked up at its first operation
    and remembered: later operations to the same owner pay no system calls for it; another owner
    is looked up afresh; a connector told its transport never looks."""
    from scad import _memserver
    looked = []
    choose = _memserver.choose_transport

    def counting(*args, **kwargs):
        looked.append(args)
        return choose(*args, **kwargs)

    monkeypatch.setattr(_memserver, "choose_transport", counting)

    async def main():
        with Connector() as one, Connector() as two, Connector() as peer, Connector(transport="tcp") as forced:
            src, dst = numpy.arange(64, dtype=numpy.uint8), numpy.zeros(64, numpy.uint8)
            for owner in (one, one, one, two):
                with owner.create_readable(Descriptor(src)) as readable:
                    op = peer.begin_read(readable.metadata(), Descriptor(dst))
                    await op.wait_for_completion(timeout=30)
                    assert op.impl == "shm" and (dst == src).all()
                    dst[:] = 0
            assert len(looked) == 2, looked  # one per owner
            with one.create_readable(Descriptor(src)) as readable:
                op = forced.begin_read(readable.metadata(), Descriptor(dst))
                await op.wait_for_completion(timeout=30)
                assert op.impl == "tcp" and (dst == src).all()
            assert len(looked) == 2
            # An owner on another host (its record names another host) is reached over tcp.
            md = RdmaMetadata.from_dict(dict(json.loads(one.create_readable(Descriptor(src)).metadata().to_json()),
                                             hostname="elsewhere.invalid"))
            assert peer._choose_transport(md) == "tcp" and len(looked) == 3

    asyncio.run(main())


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_waiting_owner_sleeps_until_the_peers_word_wakes_it(monkeypatch, transport):
    """wait_for_completion is completion-driven: the owner looks at its operation once, arms the
    eventfd libd writes when the peer's word comes, and sleeps; it looks again only when woken.
    A wait that polled (Dynamo polls every 100 ms) would look several times in the half second
    nobody reads."""
    from scad.connect import _passive
    looks = []
    wait_ready = _passive.wait_ready

    async def counting(ready, *args):
        def look():
            looks.append(1)
            return ready()
        return await wait_ready(look, *args)

    monkeypatch.setattr(_passive, "wait_ready", counting)

    async def main():
        with Connector() as owner, Connector(transport=transport) as peer:
            src, dst = numpy.arange(4096, dtype=numpy.uint8), numpy.zeros(4096, numpy.uint8)
            passive = owner.create_readable(Descriptor(src))
            waiting = asyncio.create_task(passive.wait_for_completion(timeout=30))
            await asyncio.sleep(0.5)  # the window in which nobody reads
            # It looks before it arms the eventfd and once after (no word is missed between):
            # two looks, perhaps a third; never one per interval.
            assert not waiting.done() and len(looks) <= 3, f"{len(looks)} looks while nobody read"
            await peer.begin_read(passive.metadata(), Descriptor(dst)).wait_for_completion(timeout=30)
            await asyncio.wait_for(waiting, 30)
            assert passive.status == OperationStatus.COMPLETE and (dst == src).all()
            assert len(looks) >= 3, "it returned without looking at the peer's word"

    asyncio.run(main())


def test_an_owner_that_ends_the_operation_at_the_word_before_the_peer_looks_is_a_completed_transfer(monkeypatch):
    """Over tcp a list's word goes right behind its requests, in the same write, and the peer
    takes the owner's verdict on the grant after that. An owner quick to act on the word ends
    the operation (revokes the grant, withdraws the memory) and the peer's transport is cut,
    perhaps before the peer looks: the transfers are done then, and the operation completes; it
    is not an owner out of reach. The peer's look is held here until the owner has ended the
    operation and the cut has reached the peer."""
    from scad.connect import _active
    verdicts = _active.ActiveOperation._verdicts

    async def main():
        with Connector() as owner, Connector(transport="tcp") as peer:
            dst = [numpy.zeros(4096, numpy.uint8) for _ in range(3)]
            src = [numpy.full(4096, i + 1, numpy.uint8) for i in range(3)]
            passive = owner.create_writable([Descriptor(a) for a in dst])

            def after_the_owner_ended_it(op):
                deadline = asyncio.get_event_loop().time() + 30
                while passive.status != OperationStatus.COMPLETE:  # a look collects the word
                    assert asyncio.get_event_loop().time() < deadline, "the owner never had the word"
                for t in op._transports:
                    assert t.wait_state("ERROR", timeout=30) == "ERROR"  # the owner's cut is here
                verdicts(op)

            monkeypatch.setattr(_active.ActiveOperation, "_verdicts", after_the_owner_ended_it)
            op = peer.begin_write([Descriptor(a) for a in src], passive.metadata())
            await op.wait_for_completion(timeout=30)
            assert op.status == OperationStatus.COMPLETE
            assert all((d == s).all() for d, s in zip(dst, src))

    asyncio.run(main())
