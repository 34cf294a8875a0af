"""RdmaManager: the one object per process that owns its registrations and its connections.

As the owner of memory it runs a lending memory server (scad/_memserver.py), keeps the
registration cache (_regions.py) and hands out RdmaBuffers: slices of registered regions, each
with a grant on exactly that slice, made when the handle first needs it (LentBuffer). As a peer it keeps a link per remote buffer's key (_key_link.py),
reused, and hands out one QueuePair per owner's manager (_queue_pair.py) over those links.
"""
from __future__ import annotations

import asyncio
import collections
import errno
import os
import socket
import threading
import uuid
from concurrent.futures import CancelledError
from typing import Any, Dict, Optional

import numpy

from .. import _memserver
from ..connect import Descriptor
from .._waiter import new_eventfd, poll_operation, wait_fd, wait_in_thread
from .._memserver import MAX_RANGES, from_binding
from ._buffer import LentBuffer, RdmaBuffer, lent_record, record_head
from ._key_link import KeyLink, refusal as _refusal
from ._queue_pair import QueuePair, owner_of
from ._regions import Region, RegionCache

_buffer_info = from_binding("buffer_info")  # (address, size, readonly) of an array, in one call
_begin_transfer = from_binding("begin_transfer")  # a transfer of its own, set up and started in one call


class _Reserved:
    """A route's first transfer while it starts (RdmaManager._once): nobody else's may start."""


def _others_ready() -> bool:
    """Whether the running event loop has callbacks ready besides the caller (other tasks to
    step). asyncio's own loop keeps them in `_ready`; a loop without it (uvloop) is assumed to
    have some."""
    ready = getattr(asyncio.get_running_loop(), "_ready", None)
    return ready is None or len(ready) > 0


def _forget_after_fork() -> None:
    # A forked child does not inherit its parent's connections: it makes its own manager. The
    # parent's stays referenced, never freed here: freeing it would stop its server, whose loop
    # thread does not exist in the child, and hang. Every manager made before the fork is the
    # parent's from now on (RdmaManager._forked).
    global _fork_generation
    _fork_generation += 1
    if RdmaManager._instance is not None:
        _inherited.append(RdmaManager._instance)
    RdmaManager._instance = None


_inherited: list = []
_fork_generation = 0  # forks this process descends from (a manager made before one is its parent's)


# Idle links kept per owner's server (enough for a few buffers moved at once in a loop),
# and in all.
_IDLE_LINKS_PER_SERVER = 4
_IDLE_LINKS_TOTAL = 16


class RdmaManager:
    _instance: Optional["RdmaManager"] = None
    _instance_pid = 0
    _instance_lock = threading.Lock()

    @classmethod
    def get(cls, *, host: Optional[str] = None, transport: Optional[str] = None,
            timeout: float = 30.0, busy_poll_us: float = 0.0) -> "RdmaManager":
        """This process's manager, made on first use. host: the address its memory server
        advertises (default $SCAD_RDMA_HOST, else 127.0.0.1); transport: force "shm", "tcp" or
        "verbs" for its transfers; timeout: libd's per-transfer deadline in seconds;
        busy_poll_us: how long a wait for transfers polls before it sleeps (0: sleep at once).
        Options are taken on first use only; asking for others later is an error."""
        instance = cls._instance
        if instance is not None and host is None and transport is None and timeout == 30.0 and busy_poll_us == 0.0:
            return instance  # the common call, on every transfer: no lock (a fork child's is reset)
        options = (host, transport, timeout, busy_poll_us)
        with cls._instance_lock:
            # A forked child does not inherit its parent's connections: it gets its own manager.
            if cls._instance is None or cls._instance_pid != os.getpid():
                cls._instance = cls(host=host, transport=transport, timeout=timeout, busy_poll_us=busy_poll_us)
                cls._instance_pid = os.getpid()
                cls._instance._options = options
            elif options != (None, None, 30.0, 0.0) and options != cls._instance._options:
                raise ValueError("the RdmaManager of this process already exists with other options")
            return cls._instance

    def __init__(self, *, host: Optional[str], transport: Optional[str], timeout: float,
                 busy_poll_us: float = 0.0) -> None:
        if transport not in (None, "shm", "tcp", "verbs"):
            raise ValueError(f"transport must be 'shm', 'tcp', 'verbs' or None, not {transport!r}")
        if busy_poll_us < 0:
            raise ValueError("busy_poll_us must be >= 0")
        self.busy_poll_us = float(busy_poll_us)
        self._generation = _fork_generation  # its server runs in this process only (a forked child makes its own)
        self.name = f"scad-rdma-{uuid.uuid4().hex[:16]}"
        self.hostname = socket.gethostname()
        self._host = host or os.environ.get("SCAD_RDMA_HOST", "127.0.0.1")
        self._transport = transport
        self._timeout_ms = int(timeout * 1000)
        self._verbs = _memserver.has_rdma_device()
        self._lock = threading.Lock()
        self._server = None
        self._server_action = None
        self._endpoint: dict = {}
        self._place: tuple = ()  # (owner, hostname, host, port, path, verbs) of its buffers, once it serves
        self._record_head = ""  # what the records of its buffers start with, once it serves (record_head)
        self._cache = RegionCache()
        self._lists: Dict[str, tuple] = {}  # grant -> (element, the objects owning its memory): _request_list
        self._tokens: Dict[str, str] = {}  # grant -> the token its buffer is held by in the cache (keys made)
        self._next = 0
        self._links: Dict[tuple, KeyLink] = {}
        # Per route: the transfer of its own that moved a buffer the first time (_one_transfer),
        # kept until the buffer is dropped or moved again (then by a link, which attaches the key).
        self._one_shots: Dict[tuple, Any] = {}
        # Per owner's manager: the QueuePair handed out for it (request_queue_pair).
        self._queue_pairs: Dict[tuple, QueuePair] = {}
        # Per owner's server: links let go of after a transfer, kept for the next buffer of that
        # server (a few; KeyLink.park).
        self._idle_links: "collections.OrderedDict[tuple, list]" = collections.OrderedDict()
        self._link_locks: Dict[tuple, asyncio.Lock] = {}
        # Per owner's server: how this process reaches it (transport, and the durl up to the
        # grant), decided once, not per link (the decision looks at the file system).
        self._servers: Dict[tuple, tuple] = {}
        # Per (durl of a server, polling time): the durl of a transfer of its own, up to the key.
        self._one_shot_heads: Dict[tuple, str] = {}
        self._reached_servers: set = set()  # servers a transfer of this process has reached

    # ---- the owner's side ---------------------------------------------------------------
    def request_buffer(self, memory: Any, size: Optional[int] = None, *, ttl: Optional[float] = None) -> RdmaBuffer:
        """An RdmaBuffer on local memory: request_buffer(obj) for a buffer-protocol object (numpy
        array, bytearray, memoryview, CPU tensor), request_buffer(addr, size) for raw memory the
        caller keeps valid until the buffer is dropped. The memory is served in place. ttl: seconds
        until the key expires (default: until dropped).

        request_buffer([obj, ...]): one buffer over several memories (up to 1024), their bytes end
        to end under one key, which a peer reads or writes with one transfer (read_into a list);
        whoever holds it reaches all of them. Not where this process serves verbs, i.e. on a host
        with an RDMA device (a remote key reaches one memory there): NotImplementedError."""
        if self._generation != _fork_generation:
            self._refuse_if_forked()
        if isinstance(memory, list):
            if size is not None or ttl is not None:
                raise TypeError("request_buffer([...]) takes the memories alone")
            return self._request_list(memory, required=True)
        if type(memory) is numpy.ndarray and size is None and _buffer_info is not None:
            # The common case, a whole array, without a Descriptor (0.4 µs of a lender's 4): the
            # binding reads address and size in one call; anything it refuses goes the long way,
            # for the Descriptor's own message.
            try:
                ptr, size, readonly = _buffer_info(memory)
            except (BufferError, ValueError):
                ptr = size = 0
            if size > 0:
                return self._lend(ptr, size, memory, readonly, ttl)
            size = None
        if isinstance(memory, int):
            if size is None:
                raise TypeError("request_buffer(addr, size): size is required with an address")
            d = Descriptor((memory, size, "cpu"))
        else:
            if size is not None:
                raise TypeError("request_buffer(obj) takes the object's whole memory: slice the object instead")
            d = memory if isinstance(memory, Descriptor) else Descriptor(memory)
        return self._lend(d.ptr, d.size, d.data if d.data is not None else d, d.readonly, ttl)

    def _lend_keyed(self, array: numpy.ndarray, ptr: int, size: int, readonly: bool) -> tuple:
        """A loan of a whole numpy array with bytes in it ([ptr, ptr+size), as _buffer_info gave
        them), its key made at once, in the same look under the lock, and no handle made: for a
        lender that keeps only the record it hands on (scad.tensor_transport's lone tensor).
        (token, key, record); _end_loan(token, key) ends it as drop() ends a buffer's. A key that
        cannot be made lends nothing."""
        if self._generation != _fork_generation:
            self._refuse_if_forked()
        with self._lock:
            region, token = self._hold_locked(ptr, size, array)
            offset = ptr - region.start
            try:
                key = self._grant_locked(region.element, offset, size, "r" if readonly else "rw")
            except BaseException:
                self._unhold_locked(region, token)
                raise
            self._tokens[key[0]] = token  # a handle made from the record in this process drops it too
        return token, key, lent_record(self._record_head, key, offset, size, offset == 0 and size == region.size)

    def _end_loan(self, token: str, key: Optional[tuple]) -> None:
        """Ends a loan (a LentBuffer's, or one _lend_keyed made): its key revoked if it has one,
        its region let go of when nothing else holds it. In a forked child the loan is the
        parent's: nothing to do."""
        if self._generation == _fork_generation:
            with self._lock:
                self._release_locked(token, key)

    def _hold_locked(self, ptr: int, size: int, keep: Any) -> tuple:
        """(region, token): a new hold, by `keep` (the object owning the memory), of [ptr, ptr+size)
        in the region the cache has for it, or in a new region served for exactly that."""
        srv = self._serve_locked()
        region = self._cache.find(ptr, size)
        if region is None:
            self._next += 1
            region = Region(f"r{self._next}", ptr, size)
            srv.expose(region.element, ptr, size)
            self._cache.add(region)
        self._next += 1
        token = f"t{self._next}"
        self._cache.hold(region, token, keep)
        return region, token

    def _unhold_locked(self, region: Region, token: str) -> None:
        """Undoes _hold_locked when nothing was lent after all (its key could not be made)."""
        self._cache.release(token)
        if not region.holders:
            self._forget_locked(region)

    def _lend(self, ptr: int, size: int, keep: Any, readonly: bool, ttl: Optional[float]) -> LentBuffer:
        """A buffer on [ptr, ptr+size), whose memory `keep` owns (held while the buffer lives);
        read-only memory (bytes, a read-only array or view) gets a key that only reads. Its key
        is made now if it has a ttl, else when it is first needed."""
        with self._lock:
            region, token = self._hold_locked(ptr, size, keep)
            offset = ptr - region.start
            buf = LentBuffer.__new__(LentBuffer)
            buf._lend(self, region, token, self._place, offset, size, offset == 0 and size == region.size,
                      "r" if readonly else "rw")
            if ttl is not None:  # (a ttl runs from the request: the key is made now)
                try:
                    self._mint_locked(buf, ttl)
                except BaseException:
                    self._unhold_locked(region, token)
                    raise
            return buf

    def _forked(self) -> bool:
        """Whether this manager is a forked child's copy of its parent's: its server (and its
        loop thread) runs in the parent only, and so does everything it lent."""
        return self._generation != _fork_generation

    def _refuse_if_forked(self) -> None:
        if self._forked():
            raise RuntimeError("this RdmaManager belongs to the parent process (this one was forked from it): "
                               "use RdmaManager.get() here, which makes this process's own")

    def _mint(self, buf: LentBuffer) -> tuple:
        """buf's key, made now if it has none yet (LentBuffer: on first use)."""
        if self._forked():
            # A child forked after the buffer was lent: the parent's server lends the memory,
            # and only the parent can make it a key (this copy of the server runs nowhere).
            raise RuntimeError("this buffer was lent by the parent process before fork() and has no key yet: "
                               "write its record (to_json) in the parent before forking, or lend the memory here")
        with self._lock:
            return self._mint_locked(buf)

    def _grant_locked(self, element: str, offset: int, size: int, rights: str, ttl: Optional[float] = None) -> tuple:
        """(grant id, secret) of a new key to [offset, offset+size) of a region: where every key
        this manager lends is made."""
        return self._server.grant_key(element, offset, size, rights, ttl)

    def _mint_locked(self, buf: LentBuffer, ttl: Optional[float] = None) -> tuple:
        if buf._key is not None:
            return buf._key
        if self._cache.holds(buf._region, buf.token):
            buf._key = self._grant_locked(buf._region.element, buf.offset, buf._size, buf._rights, ttl)
            self._tokens[buf._key[0]] = buf.token  # a copy of the handle in this process drops it too
        else:
            # Dropped before anyone asked for its key: one the owner never made, refused as a
            # revoked key is (a record of a dropped buffer is refused, whenever it was written).
            buf._key = (f"gdropped{uuid.uuid4().hex[:16]}", uuid.uuid4().hex + uuid.uuid4().hex)
        return buf._key

    def _request_list(self, memories: list, required: bool = False) -> Optional[RdmaBuffer]:
        """One RdmaBuffer over several buffers of this process, lent as one element (libd's list
        of ranges) under one key: its offsets run through them in order, and one transfer moves
        within one of them (lay_out cuts a transfer where they meet). None where the server also
        serves verbs (a remote key reaches one range there), or NotImplementedError if required."""
        self._refuse_if_forked()
        if not memories or len(memories) > MAX_RANGES:
            raise ValueError(f"a buffer over a list takes 1..{MAX_RANGES} memories, not {len(memories)}")
        descs = [m if isinstance(m, Descriptor) else Descriptor(m) for m in memories]
        with self._lock:
            srv = self._serve_locked()
            if self._endpoint["verbs"]:
                if required:
                    raise NotImplementedError("a buffer over several memories is not offered where this process "
                                              "serves verbs (the host has an RDMA device, and a remote key reaches "
                                              "one memory there): request a buffer for each")
                return None
            self._next += 1
            element = f"l{self._next}"
            srv.expose_ranges(element, [(d.ptr, d.size) for d in descs])
            try:
                # Read-only memory among them (bytes, a read-only array): a key that only reads.
                config = srv.grant_ex(element, "*", rights="r" if any(d.readonly for d in descs) else "rw")
            except BaseException:
                srv.withdraw(element)
                raise
            buf = self._buffer(config, 0, sum(d.size for d in descs), True, [d.size for d in descs])
            self._lists[buf.grant] = (element, [d.data if d.data is not None else d for d in descs])
            return buf

    def _buffer(self, config: str, offset: int, size: int, whole: bool, ranges: Optional[list] = None) -> RdmaBuffer:
        """The handle on a grant this process's server made (its configuration string) and where
        the grant lies (offset, size, whole, ranges)."""
        ep = self._endpoint
        buf = RdmaBuffer.__new__(RdmaBuffer)  # positionally: a keyword call of twelve costs a microsecond
        grant, secret = _memserver.grant_of(config)
        buf._fill(self.name, self.hostname, ep["host"], ep["port"], ep["path"], ep["verbs"], grant, secret,
                  offset, size, whole, ranges)
        return buf

    def progress(self, lease_us: int = 1000) -> bool:
        """Serves this process's buffers on the calling thread for a moment, as an application
        drives UCX's worker with ucp_worker_progress: runs the memory server's loop once without
        blocking and leases it for `lease_us` microseconds, while its own thread stays parked and
        requests wait for this thread's next call. For an owner whose thread polls anyway (for its
        peer's word, in its own event loop), so that the peer's transfers are served with no
        thread woken. progress(0) gives the loop back at once; otherwise it goes back when the
        lease lapses. False when nothing was run (nothing lent yet, or the first call of a lease,
        which only asks the server's thread to park)."""
        if not 0 <= lease_us <= 1_000_000:
            raise ValueError("lease_us must be within 0 .. 1000000")
        server = self._server
        if server is None:
            return False
        try:
            return server.progress(int(lease_us))
        except ConnectionError:
            return False  # the server stopped (the process is exiting): nothing to drive

    def regions(self) -> list:
        """(address, size, buffers) of every region a buffer uses (the memory this process lends
        now): for diagnostics and tests. Idle regions, kept for the same range asked for again
        and opening nothing, are not listed."""
        with self._lock:
            return [(r.start, r.size, len(r.holders)) for r in self._cache.regions() if r.holders]

    def _release_locked(self, token: Optional[str], key: Optional[tuple]) -> None:
        """Lets go of the buffer the cache holds by `token` (none: dropped already), its key
        (grant id first) revoked if it has one, and of its region once no buffer is left on it."""
        region = self._cache.release(token) if token is not None else None
        if region is None:
            return
        if key is not None:
            self._tokens.pop(key[0], None)
            try:
                self._server.revoke(key[0])
            except KeyError:
                pass  # expired and revoked already
        if not region.holders:
            self._idle_locked(region)

    def drop(self, buf: RdmaBuffer) -> None:
        if isinstance(buf, LentBuffer) and buf._key is None and buf._lender is not self:
            return  # no key made: no link to it can exist here, and only its own lender drops it
        if buf.owner == self.name:
            if self._forked():
                return  # the parent's buffer, lent by the parent's server: the parent drops it
            with self._lock:
                if isinstance(buf, LentBuffer):  # (its grant is not asked for: that would make its key)
                    token, key = buf.token, buf._key
                else:
                    lent = self._lists.pop(buf.grant, None)
                    if lent is not None:  # a list: its own element, withdrawn with its key
                        try:
                            self._server.withdraw(lent[0])
                        except KeyError:
                            pass
                        return
                    # a copy of a handle this process lent (from its record): the same buffer
                    token, key = self._tokens.get(buf.grant), (buf.grant, None)
                self._release_locked(token, key)
            return
        self._forget_link(buf.route, reuse=True)

    # ---- the peer's side ----------------------------------------------------------------
    def release_queue_pair(self, remote: RdmaBuffer) -> None:
        """Closes this process's queue pair to remote's owner (every link it made, the keys let
        go of; the owner's grants stay), or, where there is none, this process's link to remote.
        For a peer done with an owner's buffers, even in the owner's own process."""
        qp = self._queue_pairs.pop(owner_of(remote), None)
        if qp is not None:
            qp._close_links()
            return
        if isinstance(remote, LentBuffer) and remote._key is None:
            return  # no key made: no link to it can exist
        self._forget_link(remote.route, reuse=True)

    def _release_link(self, remote: RdmaBuffer) -> None:
        """This side is done with remote for now: its link is kept for the next buffer of the same
        server, or closed; one a QueuePair holds is left to it."""
        link = self._links.get(remote.route)
        if link is not None and link.exposed:
            return
        self._forget_link(remote.route, reuse=True)

    def _how(self, remote: RdmaBuffer) -> tuple:
        """(server, transport, durl of a link to it without its key) for remote's server, looked
        up once per server."""
        return self._how_server((remote.hostname, remote.host, remote.port, remote.path, remote.verbs, remote.whole))

    def _how_server(self, server: tuple) -> tuple:
        """_how for a server given as (hostname, host, port, path, verbs, whole), as a record names it."""
        how = self._servers.get(server)
        if how is None:
            hostname, host, port, path, verbs, whole = server
            impl = _memserver.choose_transport(self._transport, hostname, path, verbs, whole)
            where = _memserver.where(impl, host, port, path)
            if impl == "shm":
                # An owner waits for no word from a link (Monarch's buffers have none), so its
                # server need not hear of one: announce,0 wakes nothing there per transfer. The
                # owner's grant table still cuts the link off when the buffer is dropped.
                where += ";announce,0"
            how = self._servers[server] = (impl, f"qp;{impl};{where};timeout_ms,{self._timeout_ms};")
        return (server,) + how

    def _one_transfer(self, remote: RdmaBuffer, local: Any, busy_poll_us: float = 0.0, write: bool = False,
                      offset: int = 0, placed: Optional[tuple] = None, **options: Any) -> Any:
        """One transfer between remote[offset:] and `local` (a numpy array that fits there),
        started on a transport of its own, in one call of the binding (disagg.GrantTransfer): for
        a buffer moved once, where making, pointing and parking a link cost more than the
        transfer. shm and tcp only (the transport rides the process's shared connection to the
        owner's server); the caller waits for it (a refused key fails it) and terminates it.
        busy_poll_us: over tcp, how long a wait in libd polls the socket before it sleeps.
        placed: (transport, durl, address, size) as _once found them. options: begin_transfer's
        own (last=True: nothing more moves through this key here; over tcp the grant is let go of
        behind the request, in the same write)."""
        if placed is None:
            _, impl, durl = self._how(remote)
            address, size, _ = _buffer_info(local)
        else:
            impl, durl, address, size = placed
        return _begin_transfer(self.name, self._one_shot_durl(remote.grant, remote._secret, impl, durl, busy_poll_us),
                               address, size, write, local, raddr=remote.offset + offset, verdict=False, **options)

    def _one_shot_durl(self, grant: str, secret: str, impl: str, durl: str, busy_poll_us: float) -> str:
        """The durl of a transport of its own (transport d0) to a grant's memory, with its key:
        impl and durl as _how gives them for the grant's server; busy_poll_us: over tcp, how
        long a wait in libd polls the socket before it sleeps."""
        head = self._one_shot_heads.get((durl, busy_poll_us))
        if head is None:
            # The durl up to the key, per server and polling time: made once, not per transfer.
            head = f"d0{durl[2:]}"
            if impl == "tcp" and busy_poll_us > 0:
                head += f"busy_poll_us,{min(int(busy_poll_us), 1_000_000)};"
            if len(self._one_shot_heads) < 256:  # (a few servers and waits: bounded all the same)
                self._one_shot_heads[(durl, busy_poll_us)] = head
        return f"{head}grant,{grant};secret,{secret}"

    def _once(self, remote: RdmaBuffer, memory: Any, offset: int, read: bool) -> Optional[tuple]:
        """Whether this transfer may be the route's first, made by _one_transfer: the first on
        the route, over shm or tcp, of one numpy array that fits (anything else, or anything the
        caller got wrong, goes the link's way, which says what). If so, the route is reserved for
        it (a first transfer of another thread's meanwhile goes the link's way) and (transport,
        durl, address, size, reservation) is returned; else None."""
        route = remote.route
        if type(memory) is not numpy.ndarray or remote.ranges is not None or route in self._links \
                or route in self._one_shots or _buffer_info is None:
            return None
        _, impl, durl = self._how(remote)
        if impl != "shm" and impl != "tcp":
            return None
        try:
            address, size, readonly = _buffer_info(memory)
        except (BufferError, ValueError):
            return None
        if not (size > 0 and not (read and readonly) and 0 <= offset and offset + size <= remote.size()):
            return None
        reservation = _Reserved()
        if self._one_shots.setdefault(route, reservation) is not reservation:
            return None
        return impl, durl, address, size, reservation

    async def _transfer_once(self, remote: RdmaBuffer, memory: Any, offset: int, timeout: Optional[float],
                             read: bool, placed: tuple) -> None:
        """The route's first transfer, on a transport of its own (_one_transfer), kept until the
        buffer is dropped or moved again (it let go of the key with its request)."""
        route = remote.route
        impl, reservation = placed[0], placed[4]
        reached = self._reached(remote)
        try:
            # last: a later transfer of the buffer goes by a link, which attaches the key itself,
            # so this one lets go of it in the write that carries its request (over tcp; nothing
            # to say elsewhere), and ending it later sends nothing.
            made = self._one_transfer(remote, memory, self.busy_poll_us, not read, offset, placed[:4], last=True)
        except BaseException as e:
            self._let_go_once(route, reservation)
            if isinstance(e, (PermissionError, ConnectionError)):
                raise _refusal(e, impl, not reached) from None
            raise
        with self._lock:
            kept = self._one_shots.get(route) is reservation
            if kept:
                self._one_shots[route] = made
        try:
            if not kept:  # dropped here while it started: it ends as a transfer of a dropped buffer does
                made.cancel()
            elif not made.done():  # shm copies complete as they start: no wait at all
                if _others_ready():
                    await asyncio.sleep(0)  # as transfer(): a gather's other transfers go out first
                if not await self._wait_once(made, timeout):
                    raise TimeoutError
            made.wait(0)  # raises what it failed with
            self._mark_reached(remote)
        except TimeoutError:
            self._let_go_once(route, made)  # cancelled: the caller's memory is not written after "timed out"
            raise TimeoutError(f"the transfer did not finish within {timeout} s and was cancelled") from None
        except (ConnectionError, PermissionError) as e:
            self._let_go_once(route, made)
            raise _refusal(e, impl, not reached) from None
        except CancelledError:
            self._let_go_once(route, made)
            raise ConnectionAbortedError(errno.ECONNABORTED, "the transfer was cancelled: its buffer was dropped "
                                         "in this process, or its queue pair released") from None
        except BaseException:  # the awaiting task was cancelled: so is the transfer
            self._let_go_once(route, made)
            raise
        if not kept or route in self._links:
            self._let_go_once(route, made)  # a link holds the route now (a queue pair took it meanwhile)

    async def _wait_once(self, made: Any, timeout: Optional[float]) -> bool:
        """Waits for a transfer of its own: polls for the manager's busy_poll_us, then sleeps on
        an eventfd libd writes when it completes (closed whatever ends the wait). False if
        `timeout` seconds passed first."""
        if poll_operation(made, self.busy_poll_us if timeout is None else min(self.busy_poll_us, timeout * 1e6)):
            return True
        fd = new_eventfd()
        try:
            made.watch(fd)
            return await wait_fd(fd, made.done, timeout)
        finally:
            made.watch(-1)  # no write to it after this
            os.close(fd)

    def _let_go_once(self, route: tuple, made: Any = None, finished_only: bool = False) -> None:
        """Lets go of `made`, a transfer of its own (or the reservation for one), cancelled if it
        still runs, and of the route's entry if it is that one; made=None: of whatever the
        route's entry holds (finished_only: unless that still runs or is about to start)."""
        with self._lock:
            if made is None:
                made = self._one_shots.get(route)
                if made is None or (finished_only and (isinstance(made, _Reserved) or not made.done())):
                    return
                del self._one_shots[route]
            elif self._one_shots.get(route) is made:
                del self._one_shots[route]
        if made is not None and not isinstance(made, _Reserved):
            made.cancel()
            made.terminate()

    def _link(self, remote: RdmaBuffer, expose: bool = False) -> tuple:
        """The link to remote's route and whether it is new (made now, not connected yet: its
        first transfer connects, and learns the owner's verdict on the key then). expose: for a
        QueuePair handed to a caller: it is never kept for another buffer."""
        route = remote.route
        link = self._links.get(route)
        if link is not None:
            if expose:
                link.exposed = True
            return link, False
        once = self._one_shots.get(route)
        if once is not None and not isinstance(once, _Reserved) and once.done():
            self._let_go_once(route, once)  # the link attaches the key in its place
        server, impl, durl = self._how(remote)
        idle = self._idle_links.get(server)
        while idle:
            try:
                parked = idle.pop()
            except IndexError:  # another thread took the last one
                break
            if parked.rebind(route, remote.grant, remote._secret):
                parked.exposed = expose
                link = self._links.setdefault(route, parked)
                if link is parked:
                    return link, True  # not connected to this key yet: its first transfer attaches it
                self._park(parked)  # another thread made the same route's meanwhile
                return link, False
        from disagg import LibdAction

        # An action per link: closing it lets go of its grant entirely (an action keeps every
        # transport it ever had until it is freed). Over shm and tcp the link rides the process's
        # shared connection to the owner's server.
        action = LibdAction(self.name)
        action.add_transport(f"{durl}grant,{remote.grant};secret,{remote._secret}")
        made = KeyLink(action, action.get_transport("qp", "rdma"), route, impl)
        made.server = server
        made.exposed = expose
        link = self._links.setdefault(route, made)
        if link is not made:
            action.terminate()  # another thread made the same route's meanwhile: use that one
        return link, link is made

    async def _connect(self, remote: RdmaBuffer, link: KeyLink) -> None:
        """Connects a new link now (the owner checks the key: a refusal is an error here); the
        handshake runs in a thread, so the caller's event loop goes on meanwhile."""
        try:
            await wait_in_thread(link._t.connect)
        except (PermissionError, ConnectionError) as e:
            self._forget_link(remote.route, failed=True)
            raise _refusal(e, link.impl, True) from None

    async def request_queue_pair(self, remote: RdmaBuffer) -> QueuePair:
        """The queue pair to the manager that owns remote (made on first use, then the same
        object for every buffer of that owner), with remote's key connected: a refused key is an
        error here. Its get/put take any buffer that owner lent."""
        key = owner_of(remote)
        qp = self._queue_pairs.get(key)
        if qp is None:
            qp = self._queue_pairs.setdefault(key, QueuePair(self, key))
        link, new = self._link(remote, expose=True)  # the caller holds it: never pointed elsewhere
        qp._adopt(remote.route, link)
        if new:
            await self._connect(remote, link)
        return qp

    def _reached(self, remote: RdmaBuffer) -> bool:
        """Whether a transfer of this process has reached remote's server (its connection, which
        links to that server share, is then open: a new one connects without a handshake)."""
        return (remote.host, remote.port, remote.path) in self._reached_servers

    def _mark_reached(self, remote: RdmaBuffer) -> None:
        self._reached_servers.add((remote.host, remote.port, remote.path))

    def _mark_reached_route(self, route: tuple) -> None:
        self._reached_servers.add(route[:3])  # a route is (host, port, path, grant)

    def _transfer_start(self, remote: RdmaBuffer, memory: Any, offset: int, read: bool,
                        made: Optional[tuple] = None) -> tuple:
        """Starts a transfer on remote's link (made, and connected by this transfer, on first use;
        `made`: the (link, new) the caller took from _link already); the link and whether it was
        new."""
        link, new = made or self._link(remote)
        try:
            (link.get if read else link.put)(memory, remote, offset)  # a list of memories: one transfer
        except (PermissionError, ConnectionError) as e:
            self._forget_link(remote.route, failed=True)
            raise _refusal(e, link.impl, new and not self._reached(remote)) from None
        return link, new

    async def transfer(self, remote: RdmaBuffer, memory: Any, offset: int, timeout: Optional[float], read: bool) -> None:
        # A route's first transfer goes on a transport of its own (the route reserved for it): no
        # link, so nothing to take turns on. Others take turns on the route's link.
        placed = self._once(remote, memory, offset, read) if _begin_transfer is not None else None
        if placed is not None:
            await self._transfer_once(remote, memory, offset, timeout, read, placed)
            return
        lock = self._link_locks.get(remote.route)
        if lock is None:
            lock = self._link_locks.setdefault(remote.route, asyncio.Lock())
        async with lock:  # one read_into/write_from at a time per route: one local region at a time
            link, new = self._transfer_start(remote, memory, offset, read)
            try:
                if not link.finished():  # shm copies complete as they start: no wait at all
                    if _others_ready():
                        # One pass of the event loop first: transfers that other tasks are
                        # starting (a gather of reads) go out before this one waits (its polling
                        # holds the loop), and fly together. With nothing else to run, the pass
                        # would only poll the loop's selector: 7-10 µs of a 64-byte tcp read.
                        await asyncio.sleep(0)
                    await link.wait(timeout, self.busy_poll_us)
                self._mark_reached(remote)
                link.reusable = True  # done, nothing runs: may serve another buffer once let go of
            except TimeoutError:
                link.cancel()  # the caller's memory is not written after it was told "timed out"
                if link.broken():
                    self._forget_link(remote.route, failed=True)
                raise TimeoutError(f"the transfer did not finish within {timeout} s and was cancelled") from None
            except (ConnectionError, PermissionError) as e:
                # The connection is of no more use (the key was revoked, or the owner is gone):
                # the next transfer connects afresh and gets the owner's answer.
                self._forget_link(remote.route, failed=True)
                raise _refusal(e, link.impl, new and not self._reached(remote)) from None
            except CancelledError:
                raise ConnectionAbortedError(errno.ECONNABORTED, "the transfer was cancelled: its buffer was dropped "
                                             "in this process, or its queue pair released") from None

    # ---- internals ----------------------------------------------------------------------
    def _serve_locked(self) -> Any:
        if self._server is None:
            self._server_action, self._server, self._endpoint = _memserver.start(self.name, self._host, self._verbs)
            ep = self._endpoint
            self._place = (self.name, self.hostname, ep["host"], ep["port"], ep["path"], ep["verbs"])
            self._record_head = record_head(self._place)
        return self._server

    def _forget_link(self, route: tuple, reuse: bool = False, failed: bool = False) -> None:
        """Lets go of the link to route. reuse: the peer is done with the buffer (nothing
        failed): kept, its key let go of, for the next buffer of the same server. failed: a
        transfer on the link failed: the route's first transfer, on a transport of its own, is
        another task's and goes on if it still runs."""
        self._let_go_once(route, finished_only=failed)
        link = self._links.pop(route, None)
        self._link_locks.pop(route, None)
        if link is None:
            return
        if reuse and not link.exposed and link.impl in ("shm", "tcp"):
            self._park(link)
            return
        link.close()
        if link.queue_pair is not None:
            link.queue_pair._forget(route, link)  # it no longer holds the link (nor its memory)

    def _park(self, link: KeyLink) -> None:
        idle = self._idle_links.setdefault(link.server, [])
        if len(idle) >= _IDLE_LINKS_PER_SERVER:
            link.close()
            return
        if not link.park():
            return  # it closed itself
        idle.append(link)
        # The servers parked at most recently last; past the cap the oldest's links are closed
        # (an owner gone for good leaves at most that many behind, for a while).
        self._idle_links.move_to_end(link.server)
        if len(self._idle_links) * _IDLE_LINKS_PER_SERVER <= _IDLE_LINKS_TOTAL:
            return  # so few servers that their links cannot exceed the cap (no count per park)
        while sum(len(v) for v in self._idle_links.values()) > _IDLE_LINKS_TOTAL:
            oldest = next(iter(self._idle_links))
            try:
                victim = self._idle_links[oldest].pop(0)
            except (IndexError, KeyError):  # emptied by another thread meanwhile
                self._idle_links.pop(oldest, None)
                continue
            if not self._idle_links[oldest]:
                self._idle_links.pop(oldest, None)
            victim.close()

    def _idle_locked(self, region: Region) -> None:
        """Its last buffer was dropped (the objects owning its memory let go). Where the server
        serves verbs a region pins its pages: withdrawn at once. Elsewhere a region is an address
        range: kept idle for a request of exactly that range (a lender's loop over one array
        skips expose and withdraw, 1.4 µs of its 7), the oldest withdrawn past the cache's cap."""
        if self._endpoint.get("verbs"):
            self._forget_locked(region)
            return
        for evicted in self._cache.park(region):
            self._forget_locked(evicted)

    def _forget_locked(self, region: Region) -> None:
        self._cache.remove(region)
        try:
            self._server.withdraw(region.element)
        except KeyError:
            pass


os.register_at_fork(after_in_child=_forget_after_fork)
