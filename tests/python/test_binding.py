"""The Python action API (disagg) against real memory elements (libd-memd processes)."""
import asyncio
import contextlib
import ctypes
import gc
import os
import threading
import time
from concurrent.futures import CancelledError

import pytest

import disagg
from disagg import LibdAction

IMPLS = ["shm", "tcp"]


def client(memd_server, impl, aid="it-client", **options):
    a = LibdAction(aid, **options)
    a.add_transport(f"mem1;{impl}")
    a.config_transport("mem1", memd_server.config())
    return a, a.get_transport("mem1", "rdma")


@pytest.mark.parametrize("impl", IMPLS)
def test_scad_readme_calls(memd, impl):
    server = memd()
    action, t = client(server, impl)
    t.reg(1 << 20)
    t.buf[0:5] = b"hello"
    assert t.write(5, 0, 0) is None
    t.read(5, 0, 64)
    assert bytes(t.buf[64:69]) == b"hello"
    t.write(5, addr=100, offset=0)        # Scad's keyword names
    t.read(5, addr=100, offset=200)
    assert bytes(t.buf[200:205]) == b"hello"
    action.terminate()


def test_get_transport_errors_name_what_exists(memd):
    server = memd()
    action, _ = client(server, "tcp")
    with pytest.raises(KeyError, match="it has: mem1"):
        action.get_transport("mem2", "rdma")
    with pytest.raises(KeyError, match="'rdma', 'rdma_server'"):
        action.get_transport("mem1", "rdma_nonsense")
    with pytest.raises(KeyError, match="of type 'rdma', not 'rdma_server'"):
        action.get_transport("mem1", "rdma_server")
    with pytest.raises(ValueError, match="position 5"):
        action.add_transport("mem2")
    with pytest.raises(ValueError, match="already exists"):
        action.add_transport("mem1;tcp")


@pytest.mark.parametrize("impl", IMPLS)
def test_errors_are_exceptions_and_the_transport_stays_usable(memd, impl):
    server = memd(element="mem1=1MiB")
    action, t = client(server, impl)
    with pytest.raises(MemoryError, match="reg"):
        t.read(8, 0)
    t.reg(4096)
    with pytest.raises(ValueError, match="outside the registered buffer"):
        t.read(8, 0, 4092)
    with pytest.raises(ValueError, match="outside the granted"):
        t.read(16, (1 << 20) - 8)
    assert t.state == "READY"
    t.buf[0:4] = b"ok!!"
    t.write(4, (1 << 20) - 4)
    t.read(4, (1 << 20) - 4, 8)
    assert bytes(t.buf[8:12]) == b"ok!!"


def test_read_only_grant_refuses_writes(memd):
    server = memd(rights="r")
    for impl in IMPLS:
        action, t = client(server, impl)
        t.reg(64)
        with pytest.raises(PermissionError, match="does not allow writes"):
            t.write(8, 0)
        t.read(8, 0)
        action.terminate()


def test_unconfigured_transport_times_out_within_the_deadline():
    action = LibdAction("lonely", timeout_ms=300)
    action.add_transport("mem1;tcp")
    t = action.get_transport("mem1", "rdma")      # returns at once
    assert t.state == "INIT"
    t.reg(64)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="not configured within 300 ms"):
        t.read(8, 0)
    assert 0.25 < time.monotonic() - t0 < 2.0


def test_configuration_arriving_late_wakes_the_waiting_operation(memd):
    server = memd()
    action = LibdAction("it-client", timeout_ms=5000)
    action.add_transport("mem1;tcp")
    t = action.get_transport("mem1", "rdma")
    t.reg(64)
    errors = []

    def op():
        try:
            t.read(8, 0)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    th = threading.Thread(target=op)
    th.start()
    th.join(0.2)
    assert th.is_alive(), "the read cannot finish before the transport is configured"
    assert t.state == "INIT"
    action.config_transport("mem1", server.config())
    th.join(5)
    assert not th.is_alive() and errors == []
    assert t.state == "READY"


@pytest.mark.parametrize("impl", IMPLS)
def test_killed_memory_element_is_a_connection_error_and_recover_works_when_back(memd, impl):
    server = memd(element="mem1=8MiB")
    action, t = client(server, impl, timeout_ms=1000)
    t.reg(1 << 20)
    t.write(1 << 20, 0)
    server.kill()
    t0 = time.monotonic()
    with pytest.raises(ConnectionError):
        for _ in range(1000):          # shm learns of the death from the loop a moment later
            t.read(1 << 20, 0)
    assert time.monotonic() - t0 < 2.0
    assert t.state == "ERROR"
    assert "closed the connection" in t.error or "gone" in t.error
    with pytest.raises(ConnectionError):
        t.recover()
    server.start()                      # same addresses, same grants (restored from its file)
    t.recover()
    assert t.state == "READY"
    t.read(16, 0)
    assert bytes(t.buf[:16]) == bytes(16)


def test_killed_mid_operation_fails_within_the_deadline(memd):
    server = memd(element="mem1=512MiB")
    action, t = client(server, "tcp", timeout_ms=2000)
    t.reg(512 << 20)
    op = t.read_async(512 << 20, 0)
    server.kill()
    t0 = time.monotonic()
    try:
        op.wait(10)
        pytest.skip("the 512 MiB read finished before the server died")
    except ConnectionError:
        pass
    assert time.monotonic() - t0 < 2.5


@pytest.mark.parametrize("impl", IMPLS)
def test_threads_hammer_one_transport_with_verified_data(memd, impl):
    server = memd(element="mem1=8MiB")
    action, t = client(server, impl)
    slice_ = 64 * 1024
    t.reg(16 * slice_)
    failures = []

    def worker(i):
        local = 2 * i * slice_
        for k in range(100):
            n = 1 + (k * 7919 + i * 104729) % slice_
            data = os.urandom(n)
            t.buf[local:local + n] = data
            t.write(n, i * slice_, local)
            t.read(n, i * slice_, local + slice_)
            if bytes(t.buf[local + slice_:local + slice_ + n]) != data:
                failures.append((i, k))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert failures == []
    stats = t.stats()
    assert stats["read_ops"] == 800 and stats["write_ops"] == 800


@pytest.mark.parametrize("impl", IMPLS)
def test_async_batches_and_asyncio(memd, impl):
    server = memd(element="mem1=4MiB")
    action, t = client(server, impl)
    t.reg(1 << 20)
    pattern = os.urandom(256 * 1024)
    t.buf[0:len(pattern)] = pattern
    ops = [t.write_async(4096, i * 4096, i * 4096) for i in range(64)]
    for op in ops:
        op.wait(10)
        assert op.done() and op.status == 0
    t.readv([(4096, i * 4096, (1 << 19) + i * 4096) for i in range(64)])
    assert bytes(t.buf[1 << 19:(1 << 19) + 256 * 1024]) == pattern
    t.writev([(100, 0, 0), (100, 1000, 100)])

    async def go():
        await t.read_async(4096, 0, 8192)
        await asyncio.gather(*(t.read_async(4096, i * 4096, 4096 * i) for i in range(8)))

    asyncio.run(go())
    with pytest.raises(ValueError):
        t.readv([(100, 0, 0), (100, 4 << 20, 0)])  # one bad entry refuses the batch
    with pytest.raises(ValueError):
        t.readv([])


def slow_fake(aid, delay_ms=300):
    """An action with a fake transport of 4 KiB whose operations take delay_ms: (action, transport)."""
    action = LibdAction(aid)
    action.add_transport("m;fake;size,4096")
    t = action.get_transport("m", "rdma")
    t.reg(4096)
    t.set("delay_ms", str(delay_ms))
    t.set("fault", "delay")
    return action, t


def test_cancel_and_wait_timeout_on_the_fake_transport():
    action, t = slow_fake("faker")
    op = t.write_async(16, 0)
    with pytest.raises(TimeoutError, match="goes on"):
        op.wait(0.01)
    op.wait(5)
    op = t.read_async(16, 0, 1024)
    assert op.cancel() is True
    with pytest.raises(disagg.CancelledError):
        op.wait()
    t.set("fault", "disconnect")
    with pytest.raises(ConnectionError):
        t.read(8, 0)
    assert t.state == "ERROR"
    t.set("fault", "none")
    t.recover()
    t.read(8, 0)


def test_poll_for_looks_until_the_operation_is_done_or_its_time_is_up():
    action, t = slow_fake("poller", delay_ms=1000)  # a stall of the test's thread shorter than that changes nothing
    op = t.write_async(16, 0)
    t0 = time.monotonic()
    assert op.poll_for(2000) is False  # 2 ms of looking at a write that takes a second
    assert time.monotonic() - t0 >= 0.002
    assert op.poll_for(0) is False  # one look
    assert op.poll_for(10_000_000) is True  # it ends within the 10 s of looking
    op.wait(0)
    t.set("fault", "none")
    assert t.write_async(16, 0).poll_for(10_000_000) is True
    action.terminate()


@pytest.mark.parametrize("impl", IMPLS)
def test_large_transfer_verified(memd, impl):
    size = 256 << 20
    server = memd(element="mem1=256MiB")
    action, t = client(server, impl)
    t.reg(2 * size)
    np = pytest.importorskip("numpy")
    arr = t.array
    arr[:size] = np.random.default_rng(1).integers(0, 256, size, dtype=np.uint8)
    t.write(size, 0, 0)
    t.read(size, 0, size)
    assert np.array_equal(arr[:size], arr[size:])


def test_buffers_survive_terminate_and_rss_does_not_grow(memd):
    import resource  # noqa: F401 - Linux: read RSS from /proc

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def cycle():
        a = LibdAction("cycler")
        a.add_transport("m;local;size,8MiB")
        t = a.get_transport("m", "rdma")
        t.reg(8 << 20)
        t.buf[0:4] = b"data"
        t.write(8 << 20, 0)
        view = t.buf
        a.terminate()
        assert bytes(view[0:4]) == b"data"     # the memoryview outlives the action safely
        with pytest.raises(ConnectionError):
            t.read(8, 0)

    for _ in range(20):
        cycle()
    gc.collect()
    before = rss()
    for _ in range(200):
        cycle()
    gc.collect()
    grown = rss() - before
    assert grown < 32 << 20, f"RSS grew by {grown >> 20} MiB over 200 reg/terminate cycles"


def test_a_memory_element_written_in_python():
    server = LibdAction("py-element")
    server.add_transport("mem;tcp_server;size,1MiB")
    srv = server.get_transport("mem", "rdma_server")
    done = threading.Event()

    def serve():
        srv.serve()          # Scad's blocking serve
        done.set()

    th = threading.Thread(target=serve)
    th.start()
    srv.wait_state("READY", timeout=5)
    assert srv.message.startswith("host,127.0.0.1;port,")
    config = srv.grant("py-client", rights="rw")
    with LibdAction("py-client") as c:
        c.add_transport("m;tcp;" + config)
        t = c.get_transport("m", "rdma")
        t.reg(64)
        t.buf[0:3] = b"abc"
        t.write(3, 10)
        srv.prefetch()  # its own element's pages asked for, in the background
        t.read(3, 10, 32)
        assert bytes(t.buf[32:35]) == b"abc"
        assert t.remote() == (1 << 20, "rw")
    with pytest.raises(KeyError, match="no element 'nowhere'"):
        srv.prefetch("nowhere")
    lent = bytearray(4096)
    srv.expose("lent", ctypes.addressof((ctypes.c_char * len(lent)).from_buffer(lent)), len(lent))
    with pytest.raises(NotImplementedError, match="lent memory"):
        srv.prefetch("lent")
    srv.withdraw("lent")
    srv.stop()
    assert done.wait(5)
    th.join()
    assert srv.state == "TERMINATED"


def test_poll_notify_is_none_until_the_holders_word_then_the_word():
    server = LibdAction("poll-owner")
    server.add_transport("srv;tcp_server;size,0")
    srv = server.get_transport("srv", "rdma_server")
    srv.serve(block=False)
    lent = bytearray(64)
    srv.expose("lent", ctypes.addressof((ctypes.c_char * len(lent)).from_buffer(lent)), len(lent))
    config = srv.grant_ex("lent", "*", rights="rw")
    grant = dict(p.split(",", 1) for p in config.split(";"))["grant"]
    assert srv.poll_notify(grant) is None, "no word yet: None, not TimeoutError"
    with LibdAction("poll-holder") as c:
        c.add_transport("m;tcp;" + config)
        t = c.get_transport("m", "rdma")
        t.reg(64)
        t.write(8, 0)
        t.notify(0xFEED, 0)
        deadline = time.monotonic() + 10
        word = None
        while word is None and time.monotonic() < deadline:
            word = srv.poll_notify(grant)
        assert word == (0xFEED, 0)
        assert srv.poll_notify(grant) is None, "the word was taken by the look that returned it"
    with pytest.raises(KeyError):
        srv.poll_notify("g-no-such-grant")
    srv.stop()
    server.terminate()


def first_word(srv, grant, timeout=10):
    """The first word a holder of `grant` sent, polled for (None if none came in time)."""
    deadline = time.monotonic() + timeout
    word = None
    while word is None and time.monotonic() < deadline:
        word = srv.poll_notify(grant)
    return word


def test_begin_transfer_moves_one_grants_memory_in_one_call_and_says_what_failed():
    """disagg.begin_transfer: the transport made, the memory registered, the transfer started and
    the owner's verdict taken in one call; the object is the transfer, the transport and the
    action. A refused grant, a bad durl and an empty memory are errors of their own, and the
    server goes on serving."""
    with lending_tcp_server("bt-owner", unix=True) as (srv, where):
        path = dict(p.split(",", 1) for p in srv.message.split(";"))["path"]
        lent = bytearray(b"0123456789abcdef")
        srv.expose("lent", ctypes.addressof((ctypes.c_char * len(lent)).from_buffer(lent)), len(lent))
        config = srv.grant_ex("lent", "*", rights="rw")
        grant = dict(p.split(",", 1) for p in config.split(";"))["grant"]
        creds = ";".join(p for p in config.split(";") if p.split(",", 1)[0] in ("grant", "secret"))
        local = bytearray(16)
        address = ctypes.addressof((ctypes.c_char * len(local)).from_buffer(local))

        t = disagg.begin_transfer("bt-reader", f"d0;tcp;{where};timeout_ms,5000;{creds}", address, 16, False, local,
                                  True, 0xBEEF)
        assert not t.told
        t.wait(5)
        assert t.done() and t.status == 0 and bytes(local) == bytes(lent)
        assert first_word(srv, grant) == (0xBEEF, 0), "the word queued behind the request reached the owner"
        t.notify(7, 0, last=True)
        assert first_word(srv, grant) == (7, 0)
        t.terminate()
        t.terminate()  # idempotent
        with pytest.raises(ConnectionError, match="terminated"):
            t.notify(1)
        assert t.done() and t.status == 0, "the outcome stays readable after terminate"

        # Over shm the copy is done as it starts: the last word goes with it, and lets go of the grant.
        local[:] = bytes(16)
        shm = disagg.begin_transfer("bt-shm", f"d0;shm;path,{path};share,1;timeout_ms,5000;{creds}", address, 16, False,
                                    local, False, 0xCAFE, True)
        assert shm.told and shm.done() and shm.status == 0 and bytes(local) == bytes(lent)
        assert first_word(srv, grant) == (0xCAFE, 0)
        shm.terminate()

        # The holder's last transfer, with its last word and without a word: the grant let go of
        # behind the request (terminate sends nothing more); the shared connection serves on.
        local[:] = bytes(16)
        t = disagg.begin_transfer("bt-last", f"d0;tcp;{where};share,1;timeout_ms,5000;{creds}", address, 16, False,
                                  local, True, 0xD00D, last=True)
        t.wait(5)
        assert t.status == 0 and bytes(local) == bytes(lent)
        assert first_word(srv, grant) == (0xD00D, 0)
        t.terminate()
        for i in range(3):
            local[:] = bytes(16)
            t = disagg.begin_transfer(f"bt-last-{i}", f"d0;tcp;{where};share,1;timeout_ms,5000;{creds}", address, 16,
                                      False, local, last=True)
            t.wait(5)
            assert t.status == 0 and bytes(local) == bytes(lent)
            t.terminate()
        for i in range(3):  # a holder that let go without a word: the owner hears that, once each
            with pytest.raises(ConnectionError, match="without saying it finished"):
                srv.poll_notify(grant)
        assert srv.poll_notify(grant) is None

        local[:] = b"x" * 16
        t = disagg.begin_transfer("bt-writer", f"d0;tcp;{where};timeout_ms,5000;{creds}", address, 16, True, local)
        t.wait(5)
        assert bytes(lent) == b"x" * 16
        t.terminate()

        srv.revoke(grant)
        with pytest.raises(PermissionError):
            disagg.begin_transfer("bt-late", f"d0;tcp;{where};timeout_ms,5000;{creds}", address, 16, False, local)
        with pytest.raises(ValueError):
            disagg.begin_transfer("bt-bad", "d0;tcp;host", address, 16, False, local)
        with pytest.raises(ValueError, match="d0"):
            disagg.begin_transfer("bt-name", f"d1;tcp;{where};{creds}", address, 16, False, local)
        with pytest.raises(ValueError, match="non-zero"):
            disagg.begin_transfer("bt-empty", f"d0;tcp;{where};{creds}", address, 0, False, local)
        # The server still serves a new grant.
        config = srv.grant_ex("lent", "*", rights="r")
        creds = ";".join(p for p in config.split(";") if p.split(",", 1)[0] in ("grant", "secret"))
        t = disagg.begin_transfer("bt-again", f"d0;tcp;{where};timeout_ms,5000;{creds}", address, 16, False, local)
        t.wait(5)
        assert bytes(local) == b"x" * 16
        del t
        srv.withdraw("lent")


def test_read_once_reads_one_grants_memory_start_to_finish_and_a_cancelled_slot_stops_it():
    """disagg.read_once: a read of its own, from its start to its end in one call, over tcp and
    shm; a slot cancelled before it starts fails it with nothing written; a refused grant, a bad
    durl and an empty memory are errors of their own, and the server goes on serving."""
    with lending_tcp_server("ro-owner", unix=True) as (srv, where):
        path = dict(p.split(",", 1) for p in srv.message.split(";"))["path"]
        lent = bytearray(b"0123456789abcdef" * 4)
        srv.expose("lent", ctypes.addressof((ctypes.c_char * len(lent)).from_buffer(lent)), len(lent))

        def creds():
            config = srv.grant_ex("lent", "*", rights="r")
            return dict(p.split(",", 1) for p in config.split(";"))["grant"], \
                ";".join(p for p in config.split(";") if p.split(",", 1)[0] in ("grant", "secret"))

        local = bytearray(16)
        address = ctypes.addressof((ctypes.c_char * len(local)).from_buffer(local))
        for durl in (f"d0;tcp;{where};share,1;timeout_ms,5000;", f"d0;shm;path,{path};share,1;timeout_ms,5000;"):
            _, key = creds()
            local[:] = bytes(16)
            slot = disagg.TransferSlot()
            disagg.read_once("ro-reader", durl + key, address, 16, 16, 500.0, 5.0, slot)
            assert bytes(local) == bytes(lent[16:32]) and not slot.running and not slot.cancelled

        grant, key = creds()
        local[:] = bytes(16)
        slot = disagg.TransferSlot()
        assert slot.cancel() is False  # nothing under way
        with pytest.raises(CancelledError, match="cancelled before the read started"):
            disagg.read_once("ro-cancelled", f"d0;tcp;{where};share,1;{key}", address, 16, 0, 0.0, 5.0, slot)
        assert bytes(local) == bytes(16) and slot.cancelled and not slot.running

        srv.revoke(grant)
        with pytest.raises(PermissionError):
            disagg.read_once("ro-late", f"d0;tcp;{where};share,1;timeout_ms,5000;{key}", address, 16, 0, 0.0, 5.0,
                             disagg.TransferSlot())
        with pytest.raises(ValueError):
            disagg.read_once("ro-bad", "d0;tcp;host", address, 16, 0, 0.0, 5.0, disagg.TransferSlot())
        with pytest.raises(ValueError, match="d0"):
            disagg.read_once("ro-name", f"d1;tcp;{where};{key}", address, 16, 0, 0.0, 5.0, disagg.TransferSlot())
        with pytest.raises(ValueError, match="non-zero"):
            disagg.read_once("ro-empty", f"d0;tcp;{where};{key}", address, 0, 0, 0.0, 5.0, disagg.TransferSlot())
        with pytest.raises(TypeError):
            disagg.read_once("ro-noslot", f"d0;tcp;{where};{key}", address, 16, 0, 0.0, 5.0, None)
        assert bytes(local) == bytes(16), "a read that failed wrote nothing"
        # The server still serves a new grant.
        _, key = creds()
        disagg.read_once("ro-again", f"d0;tcp;{where};share,1;timeout_ms,5000;{key}", address, 16, 0, 0.0, 5.0,
                         disagg.TransferSlot())
        assert bytes(local) == bytes(lent[:16])
        srv.withdraw("lent")


@contextlib.contextmanager
def lending_tcp_server(name, unix=False):
    """A tcp memory server of caller memory (size,0) serving on its own thread: yields it and the
    host and port part of a durl that reaches it. unix: it also serves a unix socket (its path in
    the server's message), which shm reaches it by."""
    server = LibdAction(name)
    server.add_transport("srv;tcp_server;size,0" + (f";path,/tmp/{name}-{os.getpid()}.sock" if unix else ""))
    srv = server.get_transport("srv", "rdma_server")
    srv.serve(block=False)
    try:
        yield srv, ";".join(p for p in srv.message.split(";") if p.split(",", 1)[0] in ("host", "port"))
    finally:
        srv.stop()
        server.terminate()


def test_lend_serves_memory_in_place_under_one_grant_and_leaves_nothing_when_refused():
    with lending_tcp_server("lend-owner") as (srv, where):
        lent = bytearray(b"lent memory, in place")
        address = ctypes.addressof((ctypes.c_char * len(lent)).from_buffer(lent))
        with pytest.raises(ValueError, match="rights"):
            srv.lend("el", address, len(lent), rights="")
        # Refused: the element went with it, so the name is free again.
        grant, secret = srv.lend("el", address, len(lent), rights="r", ttl=60)
        assert grant and len(secret) >= 32 and ";" not in grant + secret and "," not in grant + secret
        with pytest.raises(ValueError, match="exists"):
            srv.lend("el", address, len(lent))
        with LibdAction("lend-reader") as c:
            c.add_transport(f"m;tcp;{where};timeout_ms,5000;grant,{grant};secret,{secret}")
            t = c.get_transport("m", "rdma")
            t.reg(len(lent))
            t.read(len(lent), 0)
            assert bytes(t.buf) == bytes(lent)
            with pytest.raises(PermissionError):
                t.write(4, 0)  # the grant reads only
        srv.withdraw("el")  # the grant goes with the element
        with pytest.raises(KeyError):
            srv.revoke(grant)


def test_grant_key_is_grant_ex_as_id_and_secret_for_exactly_its_slice():
    with lending_tcp_server("key-owner") as (srv, where):
        lent = bytearray(b"0123456789abcdef")
        address = ctypes.addressof((ctypes.c_char * len(lent)).from_buffer(lent))
        srv.expose("el", address, len(lent))
        grant, secret = srv.grant_key("el", 4, 8, "r")
        assert grant.startswith("g") and len(secret) == 64 and int(secret, 16) >= 0
        with pytest.raises(KeyError):
            srv.grant_key("no-such-element", 0, 0, "rw")
        with LibdAction("key-reader") as c:
            c.add_transport(f"m;tcp;{where};timeout_ms,5000;grant,{grant};secret,{secret}")
            t = c.get_transport("m", "rdma")
            t.reg(8)
            t.read(8, 4)  # remote addresses are the element's: the grant is [4, 12)
            assert bytes(t.buf) == b"456789ab"
            with pytest.raises(ValueError, match="outside the granted"):
                t.read(8, 0)
            with pytest.raises(PermissionError):
                t.write(1, 4)  # the key reads only
        srv.revoke(grant)
        with pytest.raises(KeyError):
            srv.revoke(grant)
        srv.withdraw("el")


def test_reg_shares_another_transports_buffer_and_with_releases(memd):
    server = memd()
    action, t = client(server, "tcp")
    action.add_transport("mem1b;shm;" + server.config())
    t2 = action.get_transport("mem1b", "rdma")
    t.reg(1 << 16)
    t2.reg(4096, t)                       # Scad: reg(size, other) shares other's buffer
    t.buf[0:6] = b"shared"
    t2.write(6, 500)                      # written from the shared buffer over shm
    t.read(6, 500, 100)                   # read back over tcp
    assert bytes(t.buf[100:106]) == b"shared"
    assert bytes(t2.buf[0:6]) == b"shared"
    with pytest.raises(ValueError, match="larger than"):
        t2.reg(1 << 20, t)
    with pytest.raises(MemoryError, match="no registered buffer"):
        t.reg(64, _unregistered(action))
    with t2:
        t2.read(6, 500)
    assert t2.state == "TERMINATED"
    with pytest.raises(ConnectionError, match="terminated"):
        t2.read(6, 500)
    t.read(6, 500)                        # the other transport is untouched


def _unregistered(action):
    action.add_transport("spare;local;size,4096")
    return action.get_transport("spare", "rdma")


def test_caps_say_once_what_each_transport_can_do(memd):
    server = memd()
    _, shm = client(server, "shm")
    _, tcp = client(server, "tcp")
    assert shm.caps == {"nowait", "notify"}
    assert tcp.caps == {"notify"}
    a = LibdAction("caps-local")
    a.add_transport("m;local;size,4096")
    assert a.get_transport("m", "rdma").caps == {"nowait"}
    srv = LibdAction("caps-server")
    srv.add_transport(f"s;tcp_server;size,4096;path,/tmp/caps-{os.getpid()}.sock")
    assert srv.get_transport("s", "rdma_server").caps == {"server"}
    # The nowait forms are not tried on tcp (its caps say no), and a read still works there.
    tcp.reg(64)
    tcp.read(64, 0)
